//! What the kubelet writes to the API server when it evicts a pod, built for evictd's
//! evictions (pure: bodies only, no I/O). The kubelet's record is what makes an eviction
//! stick: a pod whose status is terminal on the API server is never restarted by its
//! kubelet, and its controller replaces it elsewhere (`../shared/kubelet-eviction.md` §15).

use std::collections::BTreeMap;

use evictd_policy::signal::NodeCondition;
use k8s_openapi::{
    api::core::v1::{Event, EventSource, ObjectReference, Pod},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};
use serde_json::{Value, json};

/// The `DisruptionTarget` condition's reason. The kubelet writes `TerminationByKubelet`;
/// evictd says that it was evictd, so that an operator can tell the two apart. Controllers
/// (a Job's pod failure policy, say) match on the condition's type, which is the kubelet's.
pub const DISRUPTION_REASON: &str = "TerminationByEvictd";
/// The component evictd's events name as their source.
pub const COMPONENT: &str = "evictd";

/// The strategic-merge patch of `pods/status` that records an eviction as the kubelet's
/// status manager does: phase Failed, reason Evicted, the eviction message, and the
/// `DisruptionTarget` condition (`disruption_target`: for thresholds; the kubelet sets none
/// for a pod over its own storage limit). `metadata.uid` is a precondition: a pod of the same name
/// created since (a StatefulSet's) is left alone, the API server answering 409.
/// A strategic merge keeps the other conditions (merged by `type`); a JSON merge patch
/// would replace the whole list.
pub fn pod_evicted_patch(uid: &str, message: &str, disruption_target: bool, now: Timestamp) -> Value {
    let mut patch = json!({
        "metadata": { "uid": uid },
        "status": { "phase": "Failed", "reason": "Evicted", "message": message },
    });
    if disruption_target {
        patch["status"]["conditions"] = json!([disruption_condition(true, message, now)]);
    }
    patch
}

fn disruption_condition(on: bool, message: &str, now: Timestamp) -> Value {
    json!({
        "type": "DisruptionTarget",
        "status": if on { "True" } else { "False" },
        "reason": DISRUPTION_REASON,
        "message": message,
        "lastTransitionTime": Time(now),
    })
}

/// The patch written before a pod's stop: the `DisruptionTarget` condition alone, so that a
/// Job's pod failure policy sees it whichever terminal status lands first, the kubelet's
/// own (it sees the containers die) or evictd's. `on: false` takes it back when the stop
/// failed and the pod runs on: a condition left True would make its later, unrelated
/// failure count as a disruption.
pub fn disruption_target_patch(uid: &str, on: bool, message: &str, now: Timestamp) -> Value {
    json!({
        "metadata": { "uid": uid },
        "status": { "conditions": [disruption_condition(on, message, now)] },
    })
}

/// Whether a pod read back some time after its eviction was recorded has lost the record:
/// the same pod (uid), no longer terminal. A pod gone, replaced (another uid) or terminal
/// (evictd's Failed, or the kubelet's own) keeps the eviction.
pub fn record_reverted(pod: &Pod, uid: &str) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.uid.as_deref() == Some(uid) && evictd_policy::podspec::terminal_phase(phase).is_none()
}

/// Who an event is about.
pub struct Involved<'a> {
    pub kind: &'a str,
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    pub uid: &'a str,
}

/// A core/v1 Warning event as client-go's recorder makes it: named `<object>.<nanoseconds
/// in hex>`, in the object's namespace (`default` for a node), count 1.
pub fn warning_event(
    about: &Involved,
    reason: &str,
    message: &str,
    annotations: BTreeMap<String, String>,
    node: &str,
    now: Timestamp,
) -> Event {
    let namespace = about.namespace.unwrap_or("default");
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{}.{:x}", about.name, now.as_nanosecond())),
            namespace: Some(namespace.into()),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some(about.kind.into()),
            namespace: about.namespace.map(Into::into),
            name: Some(about.name.into()),
            uid: Some(about.uid.into()),
            ..Default::default()
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some("Warning".into()),
        count: Some(1),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        source: Some(EventSource { component: Some(COMPONENT.into()), host: Some(node.into()) }),
        reporting_component: Some(COMPONENT.into()),
        reporting_instance: Some(node.into()),
        ..Default::default()
    }
}

/// The pod's `Warning Evicted <message>` event, with the kubelet's annotations.
pub fn pod_evicted_event(
    pod: &Involved,
    message: &str,
    annotations: BTreeMap<String, String>,
    node: &str,
    now: Timestamp,
) -> Event {
    warning_event(pod, "Evicted", message, annotations, node, now)
}

/// The node's `Warning EvictionThresholdMet "Attempting to reclaim <resource>"` event. The
/// kubelet refers to its node by name, also as the uid.
pub fn threshold_met_event(node: &str, resource: &str, now: Timestamp) -> Event {
    let about = Involved { kind: "Node", namespace: None, name: node, uid: node };
    warning_event(
        &about,
        "EvictionThresholdMet",
        &format!("Attempting to reclaim {resource}"),
        BTreeMap::new(),
        node,
        now,
    )
}

/// evictd's own node condition types: the kubelet owns `MemoryPressure`, `DiskPressure` and
/// `PIDPressure` and rewrites them, so evictd reports under names of its own.
pub fn condition_type(c: NodeCondition) -> &'static str {
    match c {
        NodeCondition::MemoryPressure => "EvictdMemoryPressure",
        NodeCondition::DiskPressure => "EvictdDiskPressure",
        NodeCondition::PidPressure => "EvictdPIDPressure",
    }
}

fn condition_reason(c: NodeCondition, pressure: bool) -> &'static str {
    match (c, pressure) {
        (NodeCondition::MemoryPressure, true) => "EvictdHasInsufficientMemory",
        (NodeCondition::MemoryPressure, false) => "EvictdHasSufficientMemory",
        (NodeCondition::DiskPressure, true) => "EvictdHasDiskPressure",
        (NodeCondition::DiskPressure, false) => "EvictdHasNoDiskPressure",
        (NodeCondition::PidPressure, true) => "EvictdHasInsufficientPID",
        (NodeCondition::PidPressure, false) => "EvictdHasSufficientPID",
    }
}

fn condition_message(c: NodeCondition, pressure: bool) -> String {
    let what = match c {
        NodeCondition::MemoryPressure => "memory",
        NodeCondition::DiskPressure => "disk",
        NodeCondition::PidPressure => "PID",
    };
    match pressure {
        true => {
            format!("evictd: an eviction threshold on {what} is met, or was within the transition period")
        }
        false => format!("evictd: no eviction threshold on {what} is met"),
    }
}

/// evictd's three conditions `Unknown`, as the node lifecycle controller marks a kubelet
/// that stopped reporting: written at evictd's exit, so that no stale `True` (or `False`)
/// outlives the daemon that judged it.
pub fn node_conditions_unknown_patch(now: Timestamp) -> Value {
    let conditions: Vec<Value> = NodeCondition::ALL
        .into_iter()
        .map(|c| {
            json!({
                "type": condition_type(c),
                "status": "Unknown",
                "reason": "EvictdStopped",
                "message": "evictd stopped: it no longer judges this node's pressure",
                "lastHeartbeatTime": Time(now),
                "lastTransitionTime": Time(now),
            })
        })
        .collect();
    json!({ "status": { "conditions": conditions } })
}

/// The strategic-merge patch of `nodes/status` that sets evictd's three conditions (merged
/// by `type`, so the kubelet's and other agents' conditions stay): `True` for those in
/// `pressure`, `False` for the rest. `changed` are the ones whose status just flipped (or
/// all of them, at start): only those get a new `lastTransitionTime`.
pub fn node_conditions_patch(pressure: &[NodeCondition], changed: &[NodeCondition], now: Timestamp) -> Value {
    let conditions: Vec<Value> = NodeCondition::ALL
        .into_iter()
        .map(|c| {
            let on = pressure.contains(&c);
            let mut v = json!({
                "type": condition_type(c),
                "status": if on { "True" } else { "False" },
                "reason": condition_reason(c, on),
                "message": condition_message(c, on),
                "lastHeartbeatTime": Time(now),
            });
            if changed.contains(&c) {
                v["lastTransitionTime"] = json!(Time(now));
            }
            v
        })
        .collect();
    json!({ "status": { "conditions": conditions } })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    #[test]
    fn the_status_patch_is_the_kubelets_with_a_uid_precondition() {
        let p = pod_evicted_patch("u-1", "The node was low on resource: memory. ", true, t0());
        assert_eq!(
            p,
            json!({
                "metadata": {"uid": "u-1"},
                "status": {
                    "phase": "Failed", "reason": "Evicted",
                    "message": "The node was low on resource: memory. ",
                    "conditions": [{
                        "type": "DisruptionTarget", "status": "True", "reason": "TerminationByEvictd",
                        "message": "The node was low on resource: memory. ",
                        "lastTransitionTime": "2027-01-15T08:00:00Z",
                    }],
                },
            })
        );
    }

    /// The kubelet's local-storage evictions set no condition: only phase, reason, message.
    #[test]
    fn the_disruption_target_goes_first_alone_and_can_be_taken_back() {
        let on = disruption_target_patch("u-1", true, "The node was low on resource: memory. ", t0());
        assert_eq!(on["metadata"]["uid"], "u-1");
        assert!(on["status"].get("phase").is_none(), "the phase waits for the containers' death: {on}");
        assert_eq!(on["status"]["conditions"][0]["type"], "DisruptionTarget");
        assert_eq!(on["status"]["conditions"][0]["status"], "True");
        let off = disruption_target_patch("u-1", false, "the stop failed", t0());
        assert_eq!(off["status"]["conditions"][0]["status"], "False");
    }

    #[test]
    fn a_record_is_reverted_only_on_the_same_pod_running_again() {
        let pod = |uid: &str, phase: &str| -> Pod {
            serde_json::from_value(json!({"metadata": {"uid": uid}, "status": {"phase": phase}})).unwrap()
        };
        assert!(record_reverted(&pod("u-1", "Running"), "u-1"));
        assert!(record_reverted(&pod("u-1", "Pending"), "u-1"));
        assert!(!record_reverted(&pod("u-1", "Failed"), "u-1"));
        assert!(!record_reverted(&pod("u-1", "Succeeded"), "u-1"));
        assert!(!record_reverted(&pod("u-2", "Running"), "u-1"), "another pod of the same name");
    }

    #[test]
    fn a_limit_evictions_status_patch_has_no_disruption_target() {
        let msg = "Usage of EmptyDir volume \"v\" exceeds the limit \"1Mi\". ";
        let p = pod_evicted_patch("u-1", msg, false, t0());
        assert_eq!(
            p,
            json!({"metadata": {"uid": "u-1"}, "status": {"phase": "Failed", "reason": "Evicted", "message": msg}})
        );
    }

    #[test]
    fn the_pod_event_carries_the_kubelets_annotations_and_names() {
        let annotations = BTreeMap::from([("starved_resource".to_string(), "memory".to_string())]);
        let pod = Involved { kind: "Pod", namespace: Some("ns"), name: "web-1", uid: "u-1" };
        let e = pod_evicted_event(&pod, "msg", annotations, "node-a", t0());
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["metadata"]["name"], format!("web-1.{:x}", 1_800_000_000_000_000_000u64));
        assert_eq!(v["metadata"]["namespace"], "ns");
        assert_eq!(v["metadata"]["annotations"]["starved_resource"], "memory");
        assert_eq!(
            v["involvedObject"],
            json!({"apiVersion": "v1", "kind": "Pod", "namespace": "ns", "name": "web-1", "uid": "u-1"})
        );
        assert_eq!(
            (v["type"].as_str(), v["reason"].as_str(), v["message"].as_str()),
            (Some("Warning"), Some("Evicted"), Some("msg"))
        );
        assert_eq!(v["source"], json!({"component": "evictd", "host": "node-a"}));
    }

    #[test]
    fn the_node_event_is_in_the_default_namespace() {
        let v = serde_json::to_value(threshold_met_event("node-a", "memory", t0())).unwrap();
        assert_eq!(v["metadata"]["namespace"], "default");
        assert_eq!(v["involvedObject"]["kind"], "Node");
        assert_eq!(v["involvedObject"]["uid"], "node-a");
        assert_eq!(v["reason"], "EvictionThresholdMet");
        assert_eq!(v["message"], "Attempting to reclaim memory");
        assert!(v["involvedObject"].get("namespace").is_none());
    }

    #[test]
    fn node_conditions_are_evictds_own_and_only_changed_ones_transition() {
        let p =
            node_conditions_patch(&[NodeCondition::MemoryPressure], &[NodeCondition::MemoryPressure], t0());
        let conds = p["status"]["conditions"].as_array().unwrap();
        let types: Vec<&str> = conds.iter().map(|c| c["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["EvictdMemoryPressure", "EvictdDiskPressure", "EvictdPIDPressure"]);
        assert!(!types.iter().any(|t| ["MemoryPressure", "DiskPressure", "PIDPressure"].contains(t)));
        assert_eq!(conds[0]["status"], "True");
        assert_eq!(conds[0]["reason"], "EvictdHasInsufficientMemory");
        assert!(conds[0].get("lastTransitionTime").is_some());
        assert_eq!(conds[1]["status"], "False");
        assert!(conds[1].get("lastTransitionTime").is_none(), "{}", conds[1]);
    }
}
