//! What evictd reads from and writes to the Kubernetes API, checked against the test's API
//! double (no API server can run on these machines; see `evictd_tests::api_double`): the
//! watch on the node's pods, the exact bodies written, the order, retries with back-off while
//! the server fails or is down, calls it refuses for good, and that queuing a report never
//! waits for the server. evictd's real client (kube-rs, from a kubeconfig) talks to the
//! double over HTTP.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use evictd::{
    cluster::{
        connect::{self, ApiOptions},
        pods::spawn_pod_watch,
        reporter::{Reporter, ReporterTask, Retry},
        taints::{NodeTaints, TaintEffect, TaintTask},
    },
    report::metrics::Metrics,
    runtime::inventory::{ApiPod, ApiPods, ApiPodsReceiver},
    vocab::monotonic_ns,
};
use evictd_policy::{podspec::Pod, policy::NodeCondition};
use evictd_tests::api_double::{self, ApiDouble, Recorded, api_options, eviction_record};
use serde_json::json;

const WITHIN: Duration = Duration::from_secs(10);

/// evictd's client and reporter for the API server `kubeconfig` names, with quick retries.
async fn reporter(kubeconfig: &str, retry: Retry) -> (Reporter, ReporterTask, Arc<Metrics>) {
    let opts = api_options(kubeconfig);
    let client = connect::client(&opts).await.expect("a client for the double");
    let metrics = Arc::new(Metrics::default());
    let (r, task) = Reporter::spawn(client, opts.node_name, retry, metrics.api.clone());
    (r, task, metrics)
}

/// The value of one series in Prometheus text; a missing series fails the test.
fn counter(text: &str, series: &str) -> f64 {
    let line =
        text.lines().find_map(|l| l.strip_prefix(series)).unwrap_or_else(|| panic!("no {series}:\n{text}"));
    line.trim().parse().unwrap_or_else(|e| panic!("{series}: {line:?}: {e}"))
}

fn quick() -> Retry {
    Retry {
        first: Duration::from_millis(50),
        max: Duration::from_millis(400),
        give_up: Duration::from_secs(30),
        check_after: Duration::from_millis(500),
        resend: Duration::from_secs(600),
    }
}

fn status_patches(r: &[Recorded]) -> Vec<&Recorded> {
    r.iter().filter(|r| r.path.starts_with("/api/v1/namespaces/shop/pods/web-1/status")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_is_recorded_as_the_kubelet_records_it() {
    let api = ApiDouble::start();
    let (r, task, metrics) = reporter(api.kubeconfig(), quick()).await;
    r.pod_evicted(&eviction_record(), monotonic_ns());
    let seen = api.wait_for("three calls", WITHIN, |r| r.len() >= 3);
    task.flush(Duration::from_secs(1)).await;
    let pod_calls: Vec<&Recorded> = seen.iter().filter(|r| r.path.contains("/namespaces/shop/")).collect();
    assert_eq!(pod_calls.len(), 2, "{seen:?}");

    // First the status, which makes the eviction stick; a strategic merge with the uid.
    let patch = pod_calls[0];
    assert_eq!(patch.method, "PATCH");
    assert_eq!(patch.path.split('?').next(), Some("/api/v1/namespaces/shop/pods/web-1/status"));
    assert_eq!(patch.content_type, "application/strategic-merge-patch+json");
    let msg = eviction_record().message;
    let mut body = patch.body.clone();
    let when = body["status"]["conditions"][0]
        .as_object_mut()
        .and_then(|c| c.remove("lastTransitionTime"))
        .expect("a transition time");
    assert!(when.as_str().is_some_and(|t| t.ends_with('Z')), "{when}");
    assert_eq!(
        body,
        json!({
            "metadata": {"uid": "6f1d7c1e-0000-4000-8000-000000000001"},
            "status": {"phase": "Failed", "reason": "Evicted", "message": msg,
                       "conditions": [{"type": "DisruptionTarget", "status": "True",
                                       "reason": "TerminationByEvictd", "message": msg}]},
        })
    );

    // Then the pod's event, with the kubelet's annotations.
    let event = pod_calls[1];
    assert_eq!(
        (event.method.as_str(), event.path.split('?').next()),
        ("POST", Some("/api/v1/namespaces/shop/events"))
    );
    let e = &event.body;
    assert_eq!((e["type"].as_str(), e["reason"].as_str()), (Some("Warning"), Some("Evicted")));
    assert_eq!(e["message"], msg);
    assert_eq!(e["involvedObject"]["kind"], "Pod");
    assert_eq!(e["involvedObject"]["uid"], "6f1d7c1e-0000-4000-8000-000000000001");
    assert_eq!(e["metadata"]["annotations"]["offending_containers"], "app");
    assert_eq!(e["metadata"]["annotations"]["offending_containers_usage"], "600Mi");
    assert_eq!(e["metadata"]["annotations"]["starved_resource"], "memory");
    assert_eq!(e["source"]["component"], "evictd");
    assert_eq!(e["source"]["host"], "node-a");

    // And the node's, on a queue of its own.
    let node = seen.iter().find(|r| r.path.contains("/namespaces/default/")).expect("the node's event");
    assert_eq!(node.path.split('?').next(), Some("/api/v1/namespaces/default/events"));
    assert_eq!(node.body["reason"], "EvictionThresholdMet");
    assert_eq!(node.body["message"], "Attempting to reclaim memory");
    assert_eq!(node.body["involvedObject"]["kind"], "Node");
    assert_eq!(node.body["involvedObject"]["name"], "node-a");

    let text = metrics.encode();
    assert!(text.contains("evictd_kube_api_calls_total{call=\"pod_status\",outcome=\"ok\"} 1"), "{text}");
    assert!(text.contains("evictd_kube_api_calls_total{call=\"event\",outcome=\"ok\"} 2"), "{text}");
    assert!(text.contains("evictd_eviction_recorded_seconds_count 1"), "{text}");
}

/// A pod over its own storage limit is recorded as the kubelet's `localStorageEviction`
/// records it: the status without a `DisruptionTarget` condition, the pod's event, and no
/// node event (no node threshold was met).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_eviction_is_recorded_without_condition_or_node_event() {
    use evictd::vocab::EvictionCause;
    use evictd_policy::local_storage::LimitKind;
    let api = ApiDouble::start();
    let (r, task, _) = reporter(api.kubeconfig(), quick()).await;
    let msg = "Usage of EmptyDir volume \"scratch\" exceeds the limit \"20Mi\". ";
    let rec = evictd::vocab::EvictionRecord {
        signal: EvictionCause::Limit(LimitKind::EmptyDir),
        message: msg.into(),
        annotations: Default::default(),
        ..eviction_record()
    };
    r.pod_evicted(&rec, monotonic_ns());
    api.wait_for("two calls", WITHIN, |r| r.len() >= 2);
    // The flush sends everything queued, a node event included if there were one.
    task.flush(Duration::from_secs(1)).await;
    let seen = api.requests();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(
        seen[0].body["status"],
        json!({"phase": "Failed", "reason": "Evicted", "message": msg}),
        "no DisruptionTarget"
    );
    assert_eq!(
        (seen[1].body["reason"].as_str(), seen[1].body["message"].as_str()),
        (Some("Evicted"), Some(msg))
    );
    assert!(seen.iter().all(|r| !r.path.contains("/namespaces/default/")), "no node event: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_conditions_are_patched_under_evictds_own_types() {
    let api = ApiDouble::start();
    let (r, task, _) = reporter(api.kubeconfig(), quick()).await;
    r.node_conditions(&[NodeCondition::MemoryPressure]);
    let seen = api.wait_for("the node status patch", WITHIN, |r| !r.is_empty());
    task.flush(Duration::from_secs(1)).await;
    assert_eq!(seen[0].method, "PATCH");
    assert_eq!(seen[0].path.split('?').next(), Some("/api/v1/nodes/node-a/status"));
    assert_eq!(seen[0].content_type, "application/strategic-merge-patch+json");
    let conds = seen[0].body["status"]["conditions"].as_array().expect("conditions");
    let by_type: BTreeMap<&str, &str> =
        conds.iter().map(|c| (c["type"].as_str().unwrap(), c["status"].as_str().unwrap())).collect();
    assert_eq!(
        by_type,
        BTreeMap::from([
            ("EvictdDiskPressure", "False"),
            ("EvictdMemoryPressure", "True"),
            ("EvictdPIDPressure", "False")
        ])
    );
}

/// The pod `eviction_record()` names, Running, as the double holds it.
fn web_1(api: &ApiDouble) -> String {
    let rec = eviction_record();
    api.put_pod(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": rec.name, "namespace": rec.namespace, "uid": rec.uid},
        "spec": {"nodeName": "node-a", "containers": [{"name": "app"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}));
    rec.uid
}

fn phase(api: &ApiDouble, uid: &str) -> String {
    api.pod(uid).expect("the pod")["status"]["phase"].as_str().unwrap_or_default().to_owned()
}

/// The `DisruptionTarget` condition is written before the stop, alone (a Job's pod failure
/// policy sees it whichever terminal status lands first, the kubelet's or evictd's), the
/// phase once the containers are dead; other conditions stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disruption_target_is_written_before_the_stop_and_the_phase_after() {
    let api = ApiDouble::start();
    let uid = web_1(&api);
    let (r, task, _) = reporter(api.kubeconfig(), quick()).await;
    r.pod_disruption(&eviction_record());
    api.wait_for("the condition", WITHIN, |r| !status_patches(r).is_empty());
    let pod = api.pod(&uid).unwrap();
    assert_eq!(pod["status"]["phase"], "Running", "the phase waits for the kill");
    let types: Vec<&str> =
        pod["status"]["conditions"].as_array().unwrap().iter().map(|c| c["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["Ready", "DisruptionTarget"]);
    r.pod_evicted(&eviction_record(), monotonic_ns());
    api.wait_for("the status", WITHIN, |r| status_patches(r).len() >= 2);
    assert_eq!(phase(&api, &uid), "Failed");
    task.flush(Duration::from_secs(1)).await;
}

/// A stop that failed takes the condition back (False): the pod runs on, and a condition
/// left True would make its next, unrelated failure count as a disruption.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_stop_takes_the_disruption_target_back() {
    let api = ApiDouble::start();
    let uid = web_1(&api);
    let (r, task, _) = reporter(api.kubeconfig(), quick()).await;
    r.pod_disruption(&eviction_record());
    r.pod_disruption_failed(&eviction_record(), "StopContainer: deadline exceeded");
    api.wait_for("both patches", WITHIN, |r| status_patches(r).len() >= 2);
    let pod = api.pod(&uid).unwrap();
    let target = pod["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "DisruptionTarget")
        .cloned();
    assert_eq!(target.as_ref().map(|c| c["status"].clone()), Some(json!("False")), "{pod}");
    assert!(target.unwrap()["message"].as_str().unwrap().contains("deadline exceeded"));
    assert_eq!(phase(&api, &uid), "Running");
    task.flush(Duration::from_secs(1)).await;
}

/// The record is read back a while after it landed: one the node reverted (the pod Running
/// again: the kubelet restarted it before it saw the status) is written again and counted;
/// one that stuck is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_the_node_reverted_is_written_again_and_counted() {
    let api = ApiDouble::start();
    let uid = web_1(&api);
    let (r, task, metrics) = reporter(api.kubeconfig(), quick()).await;
    let reverted = "evictd_eviction_records_reverted_total";
    assert_eq!(counter(&metrics.encode(), reverted), 0.0, "a series from the start");
    r.pod_evicted(&eviction_record(), monotonic_ns());
    api.wait_for("the status", WITHIN, |r| !status_patches(r).is_empty());
    assert_eq!(phase(&api, &uid), "Failed");
    // The node's kubelet restarts the pod and writes its own status over evictd's.
    let mut pod = api.pod(&uid).unwrap();
    pod["status"]["phase"] = json!("Running");
    api.put_pod(pod);
    api.wait_for("the record written again", WITHIN, |r| status_patches(r).len() >= 2);
    assert_eq!(phase(&api, &uid), "Failed");
    assert_eq!(counter(&metrics.encode(), reverted), 1.0);
    // Read back once more, it stuck: nothing more is written.
    let check = "evictd_kube_api_calls_total{call=\"pod_check\",outcome=\"ok\"}";
    let until = std::time::Instant::now() + evictd_tests::patience::patience(WITHIN);
    while counter(&metrics.encode(), check) < 2.0 {
        assert!(std::time::Instant::now() < until, "the second read back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status_patches(&api.requests()).len(), 2);
    assert_eq!(counter(&metrics.encode(), reverted), 1.0);
    task.flush(Duration::from_secs(1)).await;
}

/// evictd's taint writer for node `node-a` of the double, with quick retries.
async fn taints(api: &ApiDouble, effect: TaintEffect) -> (NodeTaints, TaintTask, Arc<Metrics>) {
    let opts = api_options(api.kubeconfig());
    let client = connect::client(&opts).await.expect("a client for the double");
    let metrics = Arc::new(Metrics::default());
    let (t, task) = NodeTaints::spawn(client, opts.node_name, effect, quick(), metrics.api.clone());
    (t, task, metrics)
}

/// Node `node-a` carrying `taints` (key, effect).
fn node_with(taints: &[(&str, &str)]) -> serde_json::Value {
    let taints: Vec<_> = taints.iter().map(|(k, e)| json!({"key": k, "effect": e})).collect();
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}, "spec": {"taints": taints}})
}

/// The Node's taints as (key, effect), in order.
fn taints_of(api: &ApiDouble) -> Vec<(String, String)> {
    let node = api.node("node-a").expect("node-a");
    let taints = node["spec"]["taints"].as_array().cloned().unwrap_or_default();
    taints.iter().map(|t| (t["key"].as_str().unwrap().into(), t["effect"].as_str().unwrap().into())).collect()
}

/// Waits until the double's Node carries exactly `want`.
async fn wait_taints(api: &ApiDouble, what: &str, want: &[(&str, &str)]) {
    let want: Vec<(String, String)> = want.iter().map(|(k, e)| ((*k).into(), (*e).into())).collect();
    let until = std::time::Instant::now() + evictd_tests::patience::patience(WITHIN);
    while taints_of(api) != want {
        let seen: Vec<String> = api.requests().iter().map(|r| format!("{} {}", r.method, r.path)).collect();
        assert!(
            std::time::Instant::now() < until,
            "{what}: the node has {:?}; requests {seen:#?}",
            taints_of(api)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits for the taint gauge to read `want`: evictd sets it once the API server has answered
/// the patch, a moment after the double shows the taints.
async fn wait_gauge(metrics: &Metrics, gauge: &str, want: f64) {
    let until = std::time::Instant::now() + evictd_tests::patience::patience(WITHIN);
    while counter(&metrics.encode(), gauge) != want {
        assert!(std::time::Instant::now() < until, "{gauge} is not {want}:\n{}", metrics.encode());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// While evictd's condition is true the Node carries evictd's taint, written with the list
/// read as the write's precondition (it cannot drop a taint written meanwhile); every
/// other taint stays, in its place; the taint comes off with the condition. The gauge says
/// which taints are on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictds_taint_follows_its_condition_and_keeps_every_other_taint() {
    let api = ApiDouble::start();
    api.put_node(node_with(&[("dedicated", "NoSchedule")]));
    let (t, task, metrics) = taints(&api, TaintEffect::NoSchedule).await;
    let gauge = "evictd_node_taint{taint=\"evictd.io/memory-pressure\"}";
    assert_eq!(counter(&metrics.encode(), gauge), 0.0, "a series from the start");
    t.want(&[NodeCondition::MemoryPressure]);
    wait_taints(
        &api,
        "under memory pressure",
        &[("dedicated", "NoSchedule"), ("evictd.io/memory-pressure", "NoSchedule")],
    )
    .await;
    let patch = api.requests().into_iter().find(|r| r.method == "PATCH").expect("the patch");
    assert_eq!(patch.path.split('?').next(), Some("/api/v1/nodes/node-a"));
    assert_eq!(patch.content_type, "application/json-patch+json");
    assert_eq!(patch.body[0]["op"], "test", "the list read is the precondition: {}", patch.body);
    assert_eq!(patch.body[0]["value"], json!([{"key": "dedicated", "effect": "NoSchedule"}]));
    wait_gauge(&metrics, gauge, 1.0).await;
    // Another controller adds a taint while evictd's is on.
    let mut node = api.node("node-a").unwrap();
    node["spec"]["taints"].as_array_mut().unwrap().push(json!({"key": "later", "effect": "NoExecute"}));
    api.put_node(node);
    t.want(&[]);
    wait_taints(&api, "out of pressure", &[("dedicated", "NoSchedule"), ("later", "NoExecute")]).await;
    wait_gauge(&metrics, gauge, 0.0).await;
    task.remove_and_stop(Duration::from_secs(2)).await;
}

/// A taint an earlier run left (evictd died under pressure) comes off once the first pass
/// finds no pressure, not before; a Node already as wanted is read, never written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taint_left_by_an_earlier_run_comes_off_at_start() {
    let api = ApiDouble::start();
    api.put_node(node_with(&[("evictd.io/disk-pressure", "NoSchedule"), ("dedicated", "NoSchedule")]));
    let (t, task, _) = taints(&api, TaintEffect::NoSchedule).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        api.requests().is_empty(),
        "nothing before the first pass decided: a run starting under pressure keeps it"
    );
    t.want(&[]);
    wait_taints(&api, "after the first pass", &[("dedicated", "NoSchedule")]).await;
    task.remove_and_stop(Duration::from_secs(2)).await;
    let patches = api.requests().iter().filter(|r| r.method == "PATCH").count();
    assert_eq!(patches, 1, "the one write at start; none at shutdown, nothing to remove");
}

/// Another controller's taint written between evictd's read and its write is kept: the
/// write tests the list it read, fails, and evictd reads again. A write that only moved the
/// Node's resource version (the kubelet's status heartbeat) does not fail it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taint_written_between_evictds_read_and_write_is_kept() {
    let api = ApiDouble::start();
    api.put_node(node_with(&[("dedicated", "NoSchedule")]));
    api.after_next_node_get(node_with(&[("dedicated", "NoSchedule"), ("later", "NoExecute")]));
    let (t, task, _) = taints(&api, TaintEffect::NoSchedule).await;
    t.want(&[NodeCondition::MemoryPressure]);
    wait_taints(
        &api,
        "after the race",
        &[("dedicated", "NoSchedule"), ("later", "NoExecute"), ("evictd.io/memory-pressure", "NoSchedule")],
    )
    .await;
    let patches: Vec<Recorded> = api.requests().into_iter().filter(|r| r.method == "PATCH").collect();
    assert_eq!(patches.len(), 2, "the first write failed its test");
    assert_eq!(patches[0].content_type, "application/json-patch+json");
    // The kubelet's heartbeat between the read and the write: same taints, new version.
    api.after_next_node_get(api.node("node-a").unwrap());
    t.want(&[]);
    wait_taints(&api, "out of pressure", &[("dedicated", "NoSchedule"), ("later", "NoExecute")]).await;
    let patches = api.requests().iter().filter(|r| r.method == "PATCH").count();
    assert_eq!(patches, 3, "one write: a status write is no conflict");
    task.remove_and_stop(Duration::from_secs(2)).await;
}

/// A write that conflicts with another writer's (409) is not forced: evictd reads the Node
/// again and writes from what it read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_taint_write_reads_the_node_again() {
    let api = ApiDouble::start();
    api.put_node(node_with(&[]));
    api.fail_next(1, 409, "PATCH /api/v1/nodes/node-a");
    let (t, task, metrics) = taints(&api, TaintEffect::PreferNoSchedule).await;
    t.want(&[NodeCondition::PidPressure]);
    wait_taints(&api, "after the conflict", &[("evictd.io/pid-pressure", "PreferNoSchedule")]).await;
    let calls: Vec<String> = api.requests().iter().map(|r| format!("{} {}", r.method, r.path)).collect();
    assert_eq!(calls.len(), 4, "read, conflict, read again, write: {calls:?}");
    assert!(calls[0].ends_with("resourceVersion=0"), "the first read from the API server's cache: {calls:?}");
    assert!(!calls[2].contains("resourceVersion=0"), "after a conflict, a fresh read: {calls:?}");
    let retried = "evictd_kube_api_calls_total{call=\"node_taints\",outcome=\"retried\"}";
    assert_eq!(counter(&metrics.encode(), retried), 1.0, "the conflict is counted");
    task.remove_and_stop(Duration::from_secs(2)).await;
}

/// At shutdown evictd takes its taints off: an uninstalled evictd must not leave a node
/// nobody schedules to. With effect `none` it writes no taint at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taints_come_off_at_shutdown_and_effect_none_writes_none() {
    let api = ApiDouble::start();
    api.put_node(node_with(&[]));
    let (t, task, _) = taints(&api, TaintEffect::NoSchedule).await;
    t.want(&[NodeCondition::MemoryPressure, NodeCondition::DiskPressure]);
    wait_taints(
        &api,
        "under pressure",
        &[("evictd.io/memory-pressure", "NoSchedule"), ("evictd.io/disk-pressure", "NoSchedule")],
    )
    .await;
    task.remove_and_stop(Duration::from_secs(2)).await;
    assert_eq!(taints_of(&api), [] as [(String, String); 0], "off at shutdown");

    let api = ApiDouble::start();
    api.put_node(node_with(&[]));
    let (t, task, _) = taints(&api, TaintEffect::None).await;
    t.want(&[NodeCondition::MemoryPressure]);
    api.wait_for("the Node read", WITHIN, |r| r.iter().filter(|r| r.method == "GET").count() >= 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    task.remove_and_stop(Duration::from_secs(2)).await;
    assert!(api.requests().iter().all(|r| r.method == "GET"), "{:?}", api.requests());
}

/// evictd's conditions count as sent once the API accepted them: a patch refused (a 403
/// while the ClusterRole is being fixed, a webhook) or failing is tried again after a
/// back-off, never dropped; accepted ones are written again every `resend`, with a
/// transition time only on the first; at shutdown they turn `Unknown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_conditions_are_kept_until_accepted_rewritten_and_unknown_at_exit() {
    let api = ApiDouble::start();
    api.fail_next(1, 403, "/api/v1/nodes/node-a/status");
    let opts = api_options(api.kubeconfig());
    let client = connect::client(&opts).await.expect("a client for the double");
    let retry = Retry { resend: Duration::from_millis(300), ..quick() };
    let (r, task) = Reporter::spawn(client, opts.node_name, retry, Metrics::default().api);
    r.node_conditions(&[NodeCondition::PidPressure]);
    let node_patches = |r: &[Recorded]| -> Vec<Recorded> {
        r.iter().filter(|r| r.path.starts_with("/api/v1/nodes/node-a/status")).cloned().collect()
    };
    let seen =
        api.wait_for("the refused patch, its retry and a rewrite", WITHIN, |r| node_patches(r).len() >= 3);
    let patches = node_patches(&seen);
    let pid = |p: &Recorded| p.body["status"]["conditions"][2].clone();
    assert_eq!(pid(&patches[1])["status"], "True");
    assert!(pid(&patches[1]).get("lastTransitionTime").is_some(), "the first accepted: a transition");
    assert!(
        pid(&patches[2]).get("lastTransitionTime").is_none(),
        "a rewrite is no transition: {}",
        patches[2].body
    );
    task.flush(Duration::from_secs(2)).await;
    let last = node_patches(&api.requests()).pop().unwrap();
    assert_eq!(last.body["status"]["conditions"][0]["status"], "Unknown", "{}", last.body);
}

/// One object's call the server keeps failing (a webhook answering 500 to one pod's patch)
/// holds up only that object's later calls: another pod's record lands meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failing_pod_does_not_delay_the_other_pods_records() {
    let api = ApiDouble::start();
    api.fail_next(1000, 500, "/pods/web-1/status");
    let (r, task, _) = reporter(api.kubeconfig(), quick()).await;
    r.pod_evicted(&eviction_record(), monotonic_ns());
    let mut other = eviction_record();
    other.name = "web-2".into();
    other.uid = "6f1d7c1e-0000-4000-8000-000000000002".into();
    r.pod_evicted(&other, monotonic_ns());
    let seen = api.wait_for("web-2's status and event", WITHIN, |r| {
        r.iter().any(|r| r.path.contains("/pods/web-2/status"))
            && r.iter().any(|r| r.body["involvedObject"]["name"] == "web-2")
    });
    assert!(
        !seen.iter().any(|r| r.body["involvedObject"]["name"] == "web-1"),
        "web-1's event waits behind its status"
    );
    drop(task);
}

/// 500s are retried, each wait about twice the one before, until the call goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_server_gets_the_report_again_with_back_off() {
    let api = ApiDouble::start();
    api.fail_next(3, 500, "/pods/web-1/status");
    let (r, task, metrics) = reporter(api.kubeconfig(), quick()).await;
    r.pod_evicted(&eviction_record(), monotonic_ns());
    let seen =
        api.wait_for("the status patch answered after 3 failures, then the events", WITHIN, |r| r.len() >= 6);
    task.flush(Duration::from_secs(1)).await;
    let patches = status_patches(&seen);
    assert_eq!(patches.len(), 4, "3 failed tries and the one that went through");
    let gaps: Vec<Duration> = patches.windows(2).map(|w| w[1].at - w[0].at).collect();
    // The waits are 50, 100, 200 ms: each at least its back-off, and growing.
    for (gap, least) in gaps.iter().zip([50, 100, 200]) {
        assert!(*gap >= Duration::from_millis(least), "gaps {gaps:?}");
    }
    assert!(gaps[2] > gaps[0], "back-off grows: {gaps:?}");
    let pod_event =
        seen.iter().position(|r| r.path.contains("/namespaces/shop/events")).expect("the pod's event");
    let last_patch = seen.iter().rposition(|r| r.path.contains("/pods/web-1/status")).expect("a patch");
    assert!(pod_event > last_patch, "the pod's event follows its status");
    let text = metrics.encode();
    assert!(
        text.contains("evictd_kube_api_calls_total{call=\"pod_status\",outcome=\"retried\"} 3"),
        "{text}"
    );
    assert!(text.contains("evictd_kube_api_calls_total{call=\"pod_status\",outcome=\"ok\"} 1"), "{text}");
}

/// The API server is down when the eviction happens, and comes up later: the report waits
/// and arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_waits_for_a_server_that_is_down() {
    let port = api_double::free_port();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api_double::kubeconfig_for(&format!("http://127.0.0.1:{port}"), dir.path());
    let (r, task, metrics) = reporter(kubeconfig.to_str().unwrap(), quick()).await;
    r.pod_evicted(&eviction_record(), monotonic_ns());
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The series exists at 0 from the start: only a count shows the retries.
    let retried =
        counter(&metrics.encode(), "evictd_kube_api_calls_total{call=\"pod_status\",outcome=\"retried\"}");
    assert!(retried >= 1.0, "the tries against the server that is down are counted: {retried}");
    let api = ApiDouble::start_on(port);
    let seen = api.wait_for("the reports once the server is up", WITHIN, |r| r.len() >= 3);
    task.flush(Duration::from_secs(1)).await;
    let patches = status_patches(&seen);
    assert_eq!(patches.len(), 1);
    assert_eq!(patches[0].body["status"]["reason"], "Evicted");
}

/// 409 (the uid precondition: the pod was replaced by one of the same name) is final: not
/// retried, and the calls after it still go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_report_is_not_retried() {
    let api = ApiDouble::start();
    api.fail_next(1, 409, "/pods/web-1/status");
    let (r, task, metrics) = reporter(api.kubeconfig(), quick()).await;
    r.pod_evicted(&eviction_record(), monotonic_ns());
    let seen = api.wait_for("the status patch and both events", WITHIN, |r| r.len() >= 3);
    tokio::time::sleep(Duration::from_millis(300)).await;
    task.flush(Duration::from_secs(1)).await;
    assert_eq!(status_patches(&api.requests()).len(), 1, "not retried: {seen:?}");
    let text = metrics.encode();
    assert!(
        text.contains("evictd_kube_api_calls_total{call=\"pod_status\",outcome=\"refused\"} 1"),
        "{text}"
    );
}

/// Queuing a report returns while the server holds its answer: the caller (the act step)
/// never waits for the API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queuing_a_report_never_waits_for_the_server() {
    let api = ApiDouble::start();
    api.hold();
    let (r, task, _) = reporter(api.kubeconfig(), quick()).await;
    for _ in 0..5 {
        r.pod_evicted(&eviction_record(), monotonic_ns());
    }
    api.wait_for("the first status patch, held", WITHIN, |r| !r.is_empty());
    assert_eq!(api.answered(), 0, "every call returned before the server answered one");
    api.release();
    api.wait_for("all 15 calls", WITHIN, |r| r.len() >= 15);
    task.flush(Duration::from_secs(1)).await;
}

/// At shutdown, what is queued gets one more try, bounded: a server that never answers
/// cannot hold evictd's exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flush_at_shutdown_is_bounded() {
    let api = ApiDouble::start();
    api.hold();
    let (r, task, _) = reporter(api.kubeconfig(), quick()).await;
    r.pod_evicted(&eviction_record(), monotonic_ns());
    api.wait_for("the held status patch", WITHIN, |r| !r.is_empty());
    let t = std::time::Instant::now();
    task.flush(Duration::from_millis(300)).await;
    assert!(t.elapsed() < Duration::from_secs(2), "flush took {:?}", t.elapsed());
}

fn api_pod(uid: &str, node: &str, priority: i32) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{uid}"), "namespace": "shop", "uid": uid},
        "spec": {"nodeName": node, "priority": priority,
                 "containers": [{"name": "app", "resources": {"requests": {"memory": "64Mi"}}}]},
        "status": {"phase": "Running"}
    })
}

/// Waits until the watch's snapshot satisfies `pred`.
async fn wait_snapshot(rx: &mut ApiPodsReceiver, what: &str, pred: impl Fn(&ApiPods) -> bool) {
    let seen = tokio::time::timeout(WITHIN, rx.wait_for(|s| s.as_ref().is_some_and(&pred)))
        .await
        .is_ok_and(|r| r.is_ok());
    let uids = rx.borrow().as_ref().map(|s| s.keys().cloned().collect::<Vec<_>>());
    assert!(seen, "the pod watch never showed {what}: {uids:?}");
}

/// The specs of the pods bound to this node come from a list and watch with the kubelet's
/// field selector; a pod added, changed or deleted later reaches the snapshot the inventory
/// reads, and pods of other nodes never do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_watch_follows_this_nodes_pods() {
    let api = ApiDouble::start();
    api.put_pod(api_pod("a", "node-a", 100));
    api.put_pod(api_pod("elsewhere", "node-b", 0));
    let opts = api_options(api.kubeconfig());
    let client = connect::client(&opts).await.expect("a client for the double");
    let mut rx = spawn_pod_watch(client, &opts.node_name, Metrics::default().api);
    wait_snapshot(&mut rx, "the first list", |s| s.contains_key("a")).await;
    assert!(!rx.borrow().as_ref().unwrap().contains_key("elsewhere"), "another node's pod");
    let list = api.requests().into_iter().find(|r| r.method == "GET").expect("a list");
    assert!(list.path.contains("fieldSelector=spec.nodeName%3Dnode-a"), "{}", list.path);

    api.put_pod(api_pod("b", "node-a", 7));
    let priority = |s: &ApiPods, uid: &str| s.get(uid).and_then(ApiPod::spec).map(Pod::priority);
    wait_snapshot(&mut rx, "a pod added later", |s| priority(s, "b") == Some(7)).await;
    api.put_pod(api_pod("a", "node-a", 5000));
    wait_snapshot(&mut rx, "a changed priority", |s| priority(s, "a") == Some(5000)).await;
    // Evicted: kept as finished, with no spec, until the server deletes it.
    let mut failed = api_pod("b", "node-a", 7);
    failed["status"] = json!({"phase": "Failed", "reason": "Evicted"});
    api.put_pod(failed);
    wait_snapshot(&mut rx, "a pod finished", |s| s.get("b") == Some(&ApiPod::Finished("Failed"))).await;
    api.delete_pod("b");
    wait_snapshot(&mut rx, "a deleted pod gone", |s| !s.contains_key("b") && s.contains_key("a")).await;
    assert!(api.requests().iter().any(|r| r.path.contains("watch=true")), "a watch, not polling");
    assert!(
        api.requests().iter().all(|r| r.method == "GET"),
        "the watch only reads: {:?}",
        api.requests().iter().map(|r| format!("{} {}", r.method, r.path)).collect::<Vec<_>>()
    );
}

/// A real cluster's API server speaks TLS, with a certificate from the cluster's CA that the
/// kubeconfig (or the service account's `ca.crt`) names, and takes a bearer token. Both of
/// evictd's clients, the watch's and the requests', verify the server with that CA and send
/// the token: the watch lists and follows the node's pods, and an eviction's record lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_and_the_records_speak_tls_with_the_kubeconfigs_ca_and_token() {
    let api = ApiDouble::start_tls();
    assert!(api.url().starts_with("https://127.0.0.1:"), "{}", api.url());
    api.put_pod(api_pod("a", "node-a", 100));
    let opts = api_options(api.kubeconfig());
    let client = connect::watch_client(&opts).await.expect("a watch client for the TLS double");
    let mut rx = spawn_pod_watch(client, &opts.node_name, Metrics::default().api);
    wait_snapshot(&mut rx, "the first list over TLS", |s| s.contains_key("a")).await;
    api.put_pod(api_pod("b", "node-a", 7));
    wait_snapshot(&mut rx, "a pod added later, over the TLS watch", |s| s.contains_key("b")).await;

    let (r, task, _) = reporter(api.kubeconfig(), quick()).await;
    r.pod_evicted(&eviction_record(), monotonic_ns());
    api.wait_for("the eviction's status patch over TLS", WITHIN, |r| !status_patches(r).is_empty());
    task.flush(Duration::from_secs(1)).await;
    let bearer = format!("Bearer {}", api_double::API_TOKEN);
    let requests = api.requests();
    assert!(requests.iter().any(|r| r.path.contains("watch=true")), "a watch over TLS");
    for r in &requests {
        assert_eq!(r.authorization, bearer, "{} {}", r.method, r.path);
    }
}

/// A server whose certificate the kubeconfig's CA did not sign (a man in the middle, or a
/// kubeconfig of another cluster) is never read: no request reaches it, the watch counts
/// the error and publishes nothing, and the record is not sent there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_the_kubeconfigs_ca_did_not_sign_is_never_read() {
    let api = ApiDouble::start_tls();
    api.put_pod(api_pod("a", "node-a", 100));
    // The record goes to a server of its own, so that its refused handshakes are its own.
    let records = ApiDouble::start_tls();
    let other = ApiDouble::start_tls();
    let wrong_ca = other.ca_pem().expect("a TLS double's CA");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = |server: &ApiDouble, name: &str| {
        let dir = dir.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        api_double::kubeconfig_tls(&server.url(), wrong_ca, api_double::API_TOKEN, &dir).display().to_string()
    };
    let opts = api_options(&kubeconfig(&api, "watch"));
    let metrics = Arc::new(Metrics::default());
    let client = connect::watch_client(&opts).await.expect("a client (no request is made yet)");
    let rx = spawn_pod_watch(client, &opts.node_name, metrics.api.clone());
    let series = "evictd_kube_api_calls_total{call=\"watch_pods\",outcome=\"error\"}";
    let t = std::time::Instant::now();
    while counter(&metrics.encode(), series) < 1.0 || api.handshakes_failed() < 1 {
        assert!(t.elapsed() < WITHIN, "the refused certificate was never counted as the watch's error");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (r, task, reporter_metrics) = reporter(&kubeconfig(&records, "records"), quick()).await;
    r.pod_evicted(&eviction_record(), monotonic_ns());
    let retried = "evictd_kube_api_calls_total{call=\"pod_status\",outcome=\"retried\"}";
    while counter(&reporter_metrics.encode(), retried) < 1.0 || records.handshakes_failed() < 1 {
        assert!(t.elapsed() < WITHIN, "the record's refused handshake was never retried");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(task);
    assert!(rx.borrow().is_none(), "nothing published from a server not trusted");
    for server in [&api, &records] {
        assert!(
            server.requests().is_empty(),
            "no request over an untrusted connection: {:?}",
            server.requests()
        );
    }
}

/// In a pod, as the DaemonSet runs it: no kubeconfig, only what the kubelet gives every pod
/// — `KUBERNETES_SERVICE_HOST` and `_PORT`, and the service account's token and the
/// cluster's CA under /var/run/secrets/kubernetes.io/serviceaccount — and the pod's UID
/// from the downward API. evictd runs in a
/// private mount namespace with a tmpfs there holding the TLS double's CA and a token, and
/// lists the node's pods from the double over TLS with that token (a dry run reads the API
/// and writes nothing).
#[test]
fn in_a_pod_evictd_reaches_the_api_with_its_service_account() {
    const TEST: &str = "in_a_pod_evictd_reaches_the_api_with_its_service_account";
    if !evictd_tests::privileged(TEST) {
        return;
    }
    let api = ApiDouble::start_tls();
    api.put_pod(api_pod("a", "node-a", 100));
    let account = tempfile::tempdir().unwrap();
    let token = "service-account-token";
    std::fs::write(account.path().join("token"), token).unwrap();
    std::fs::write(account.path().join("ca.crt"), api.ca_pem().expect("the double's CA")).unwrap();
    std::fs::write(account.path().join("namespace"), "kube-system").unwrap();
    let _mount_point = evictd_tests::MachineDir::note("/var/run/secrets", &[], true);
    let port = api.url().rsplit(':').next().expect("a port").to_owned();
    let as_in_a_pod = r#"
        mount -t tmpfs evictd-test-secrets /var/run/secrets &&
        mkdir -p /var/run/secrets/kubernetes.io/serviceaccount &&
        cp "$ACCOUNT"/token "$ACCOUNT"/ca.crt "$ACCOUNT"/namespace /var/run/secrets/kubernetes.io/serviceaccount/ &&
        exec timeout -s KILL 60 "$@""#;
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", as_in_a_pod, "sh"])
        .arg(evictd_tests::evictd_binary())
        .args(["--dry-run", "--cri-endpoint", "none", "--duration", "3s", "--node-name", "node-a"])
        .args(["--eviction-hard", "memory.available<1Mi"])
        .env("ACCOUNT", account.path())
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", &port)
        // deploy/daemonset.yaml's downward API: evictd refuses to run in a pod it cannot name.
        .env("POD_UID", "evictd-pod-uid")
        .env_remove("KUBECONFIG");
    let out = evictd_tests::dies_with_harness(&mut cmd).output().expect("running unshare");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("pod specs from the Kubernetes API"), "{stderr}");
    let lists: Vec<Recorded> =
        api.requests().into_iter().filter(|r| r.path.starts_with("/api/v1/pods?")).collect();
    assert!(!lists.is_empty(), "no list or watch of the node's pods: {stderr}");
    for r in &lists {
        assert!(r.path.contains("fieldSelector=spec.nodeName%3Dnode-a"), "{}", r.path);
        assert_eq!(r.authorization, format!("Bearer {token}"), "{} {}", r.method, r.path);
    }
}

/// A quiet cluster: the watch stays open however long no pod changes. A read deadline on
/// the watch would tear it down after every quiet second here, and each time the pod
/// watch would count an error and list the node's pods again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_watch_survives_a_quiet_cluster() {
    let api = ApiDouble::start();
    api.put_pod(api_pod("a", "node-a", 1));
    let opts = ApiOptions { timeout: Duration::from_secs(1), ..api_options(api.kubeconfig()) };
    let client = connect::watch_client(&opts).await.expect("a client for the double");
    let metrics = Metrics::default();
    let mut rx = spawn_pod_watch(client, &opts.node_name, metrics.api.clone());
    wait_snapshot(&mut rx, "the first list", |s| s.contains_key("a")).await;
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let watches = api.requests().iter().filter(|r| r.path.contains("watch=true")).count();
    let lists = api.requests().iter().filter(|r| !r.path.contains("watch=true")).count();
    assert_eq!((lists, watches), (1, 1), "one list and one watch over 3.5 quiet seconds");
    let errors =
        counter(&metrics.encode(), "evictd_kube_api_calls_total{call=\"watch_pods\",outcome=\"error\"}");
    assert_eq!(errors, 0.0);
    // And it still follows the node.
    api.put_pod(api_pod("b", "node-a", 2));
    wait_snapshot(&mut rx, "a pod added after the quiet", |s| s.contains_key("b")).await;
}

/// An API server that is down at the start: no snapshot (the inventory keeps the pods file's
/// or inferred specs), and the watch lists as soon as the server is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_watch_starts_when_the_api_server_comes_up() {
    let port = api_double::free_port();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api_double::kubeconfig_for(&format!("http://127.0.0.1:{port}"), dir.path());
    let opts = api_options(kubeconfig.to_str().unwrap());
    let client = connect::client(&opts).await.expect("a client");
    let metrics = Metrics::default();
    let mut rx = spawn_pod_watch(client, &opts.node_name, metrics.api.clone());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(rx.borrow().is_none(), "no snapshot while the server is down");
    // The series exists at 0 from the start: only a count shows that the watch failed.
    let errors =
        counter(&metrics.encode(), "evictd_kube_api_calls_total{call=\"watch_pods\",outcome=\"error\"}");
    assert!(errors >= 1.0, "the failed watch is counted: {errors}");
    let api = ApiDouble::start_on(port);
    api.put_pod(api_pod("a", "node-a", 1));
    wait_snapshot(&mut rx, "the list once the server is up", |s| s.contains_key("a")).await;
}
