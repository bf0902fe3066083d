//! What the kubelet asks the container runtime for, given a pod's spec: the CRI's sandbox and
//! container configurations derived from a `PodSpec` (as the kubelet's `kuberuntime` builds
//! them), so that a test runs a manifest of deploy/ as a node would, not a restatement of it.
//!
//! Every field set in the template, down to its leaves (`securityContext.privileged`,
//! `resources.limits.memory`), is either translated or named below as one the node does not
//! act on (the scheduler's); a field neither translated nor named fails, so a manifest that
//! gains one cannot pass a test that silently runs without it. The manifest's hostPaths are
//! mounted only where the test node maps them to directories of its own, or where they are
//! kernel interfaces (`MACHINE_PATHS`): nothing of the machine's own is made or written.
//!
//! What differs from a node, because a test node is not one: the host paths the manifest names
//! (other than kernel interfaces) are mapped to the test node's own directories (its containerd's socket and root, its
//! kubelet root, its pod logs), and no service account token is mounted (no API server runs
//! here; the pod sees no `KUBERNETES_SERVICE_HOST`, as on a node without one).

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    time::Duration,
};

use evictd::runtime::cri::api as cri;
use k8s_openapi::{
    api::core::v1::{Container, PodSpec, PodTemplateSpec, Probe},
    apimachinery::pkg::api::resource::Quantity,
};
use procfs::Current as _;

/// Fields of a pod's spec the node does not act on: the scheduler's (tolerations, priority
/// class — its effect on the node, the OOM score, is translated), the service account (its
/// token, see the module's note). Each entry names a field and everything below it.
const POD_FIELDS_NOT_ON_THE_NODE: &[&str] = &["tolerations", "serviceAccountName", "priorityClassName"];
/// Fields of a pod's spec, down to the leaves, that the translation carries to the runtime
/// (`containers` is checked on its own, against `CONTAINER_FIELDS_TRANSLATED`).
const POD_FIELDS_TRANSLATED: &[&str] = &[
    "hostPID",
    "hostNetwork",
    "terminationGracePeriodSeconds",
    "containers",
    "volumes.name",
    "volumes.hostPath.path",
    "volumes.hostPath.type",
];
/// The template's metadata: its labels and annotations go to the sandbox and the container.
const TEMPLATE_FIELDS_TRANSLATED: &[&str] = &["labels", "annotations"];
/// A container's fields, down to the leaves, that the translation carries to the runtime or
/// to the test's prober. Anything else set below them (a CPU limit's quota, a `subPath`, a
/// probe's `initialDelaySeconds`, a `hostPort` without a portmap plugin, a security context
/// beyond `privileged`) fails rather than being run without.
const CONTAINER_FIELDS_TRANSLATED: &[&str] = &[
    "name",
    "image",
    "imagePullPolicy",
    "args",
    "env.name",
    "env.value",
    "env.valueFrom.fieldRef.fieldPath",
    "env.valueFrom.fieldRef.apiVersion",
    "ports.name",
    "ports.containerPort",
    "ports.protocol",
    "livenessProbe.httpGet.path",
    "livenessProbe.httpGet.port",
    "livenessProbe.periodSeconds",
    "livenessProbe.timeoutSeconds",
    "livenessProbe.failureThreshold",
    "readinessProbe.httpGet.path",
    "readinessProbe.httpGet.port",
    "readinessProbe.periodSeconds",
    "readinessProbe.timeoutSeconds",
    "readinessProbe.failureThreshold",
    "resources.requests.cpu",
    "resources.requests.memory",
    "resources.limits.cpu",
    "resources.limits.memory",
    "securityContext.privileged",
    "volumeMounts.name",
    "volumeMounts.mountPath",
    "volumeMounts.readOnly",
    "volumeMounts.mountPropagation",
];

/// hostPaths the test node shares with the machine: kernel interfaces, which a pod reads and
/// writes as on any node. Any other hostPath must be mapped to a directory of the test's
/// (`Node::host_paths`): the translation never creates or mounts the machine's own.
const MACHINE_PATHS: &[&str] = &["/sys/fs/cgroup", "/sys/kernel/btf", "/sys/kernel/tracing"];

/// The kubelet's OOM score for Guaranteed pods and node-critical ones (`system-node-critical`),
/// whatever the latter's QoS class.
const CRITICAL_OOM_SCORE_ADJ: i64 = -997;

/// The node the pod lands on, as the test node presents it.
pub struct Node<'a> {
    pub name: &'a str,
    /// A manifest's hostPath → the test node's directory playing it. Of the paths not named,
    /// only `MACHINE_PATHS` may be mounted.
    pub host_paths: BTreeMap<String, PathBuf>,
    /// The kubelet's pod log root (`/var/log/pods` on a node).
    pub pod_logs: PathBuf,
}

/// An HTTP probe the kubelet runs against the pod's IP.
#[derive(Clone, Debug)]
pub struct HttpProbe {
    pub path: String,
    pub port: u16,
    pub period: Duration,
    pub timeout: Duration,
    pub failure_threshold: u32,
}

/// One pod as the kubelet hands it to the runtime.
pub struct KubeletPod {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    /// `guaranteed`, `burstable` or `besteffort`: where its cgroup goes.
    pub qos: &'static str,
    /// The pod cgroup's memory limit (the sum of its containers'), if every container has one.
    pub memory_limit: Option<u64>,
    pub sandbox: cri::PodSandboxConfig,
    pub container: cri::ContainerConfig,
    /// The container log's directory under the pod's log directory (the kubelet makes it).
    pub container_log_dir: PathBuf,
    pub liveness: Option<HttpProbe>,
    pub readiness: Option<HttpProbe>,
    /// The container's named ports.
    pub ports: BTreeMap<String, u16>,
}

/// Why a spec cannot be run as given.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("pod spec field {0:?} is neither translated to the CRI nor known to be off the node")]
    UnhandledField(String),
    #[error("{0}")]
    Unsupported(String),
}

fn unsupported(what: impl Into<String>) -> SpecError {
    SpecError::Unsupported(what.into())
}

/// The sandbox and container configurations the kubelet would send for the one container of
/// a pod made from `template`. `cgroup_parent` is filled in by the caller, which makes the pod
/// cgroup.
pub fn translate(
    template: &PodTemplateSpec,
    (namespace, name, uid): (&str, &str, &str),
    node: &Node,
) -> Result<KubeletPod, SpecError> {
    let spec = template.spec.as_ref().ok_or_else(|| unsupported("a pod template without a spec"))?;
    let meta = template.metadata.clone().unwrap_or_default();
    check_fields(&meta, TEMPLATE_FIELDS_TRANSLATED, &[])?;
    check_fields(spec, POD_FIELDS_TRANSLATED, POD_FIELDS_NOT_ON_THE_NODE)?;
    let [container] = spec.containers.as_slice() else {
        return Err(unsupported("one container per pod (the DaemonSet's shape)"));
    };
    check_fields(container, CONTAINER_FIELDS_TRANSLATED, &[])?;
    let mut pod_labels: HashMap<String, String> = meta.labels.unwrap_or_default().into_iter().collect();
    let annotations: HashMap<String, String> = meta.annotations.unwrap_or_default().into_iter().collect();
    pod_labels.extend([
        ("io.kubernetes.pod.name".to_owned(), name.to_owned()),
        ("io.kubernetes.pod.namespace".to_owned(), namespace.to_owned()),
        ("io.kubernetes.pod.uid".to_owned(), uid.to_owned()),
    ]);
    let pod_log_dir = node.pod_logs.join(format!("{namespace}_{name}_{uid}"));
    let privileged = privileged(container);
    let mode = |host: Option<bool>| {
        if host == Some(true) { cri::NamespaceMode::Node } else { cri::NamespaceMode::Pod }
    };
    let sandbox = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: uid.into(),
            namespace: namespace.into(),
            attempt: 0,
        }),
        log_directory: pod_log_dir.display().to_string(),
        labels: pod_labels.clone(),
        annotations: annotations.clone(),
        port_mappings: ports(container)?,
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: mode(spec.host_network) as i32,
                    pid: if spec.host_pid == Some(true) {
                        cri::NamespaceMode::Node as i32
                    } else {
                        cri::NamespaceMode::Container as i32
                    },
                    ipc: cri::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                privileged,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let (qos, memory_limit, resources) = resources(container, node_critical(spec))?;
    let mut container_labels = pod_labels;
    container_labels.insert("io.kubernetes.container.name".into(), container.name.clone());
    let config = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata { name: container.name.clone(), attempt: 0 }),
        image: Some(cri::ImageSpec { image: image(container)?, ..Default::default() }),
        args: container.args.clone().unwrap_or_default(),
        envs: env(container, node.name, uid)?,
        mounts: mounts(spec, container, node)?,
        labels: container_labels,
        annotations: annotations
            .into_iter()
            .chain([(
                "io.kubernetes.pod.terminationGracePeriod".to_owned(),
                spec.termination_grace_period_seconds.unwrap_or(30).to_string(),
            )])
            .collect(),
        log_path: format!("{}/0.log", container.name),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(resources),
            security_context: Some(cri::LinuxContainerSecurityContext { privileged, ..Default::default() }),
        }),
        ..Default::default()
    };
    let probe = |p: &Option<Probe>| p.as_ref().map(|p| http_probe(p, container)).transpose();
    Ok(KubeletPod {
        uid: uid.into(),
        name: name.into(),
        namespace: namespace.into(),
        qos,
        memory_limit,
        sandbox,
        container_log_dir: pod_log_dir.join(&container.name),
        container: config,
        ports: container
            .ports
            .iter()
            .flatten()
            .filter_map(|p| Some((p.name.clone()?, u16::try_from(p.container_port).ok()?)))
            .collect(),
        liveness: probe(&container.liveness_probe)?,
        readiness: probe(&container.readiness_probe)?,
    })
}

/// Every field set in `value` (as the API writes it), down to its leaves (list items are
/// checked each; a map's keys are fields), is one `translated` or `off_node` names or lies
/// below one of them.
fn check_fields<T: serde::Serialize>(
    value: &T,
    translated: &[&str],
    off_node: &[&str],
) -> Result<(), SpecError> {
    let json = serde_json::to_value(value).map_err(|e| unsupported(e.to_string()))?;
    let mut leaves = Vec::new();
    leaf_fields(&json, "", &mut leaves);
    let named = |path: &str, list: &[&str]| {
        list.iter().any(|f| path == *f || path.strip_prefix(f).is_some_and(|rest| rest.starts_with('.')))
    };
    match leaves.into_iter().find(|p| !named(p, translated) && !named(p, off_node)) {
        Some(field) => Err(SpecError::UnhandledField(field)),
        None => Ok(()),
    }
}

/// The dotted paths of `value`'s leaves below `prefix`; an empty object or list sets nothing.
fn leaf_fields(value: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
    use serde_json::Value;
    match value {
        Value::Object(fields) => {
            for (k, v) in fields {
                let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                leaf_fields(v, &path, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| leaf_fields(v, prefix, out)),
        _ => out.push(prefix.to_owned()),
    }
}

fn privileged(c: &Container) -> bool {
    c.security_context.as_ref().and_then(|s| s.privileged).unwrap_or(false)
}

/// The kubelet's `IsNodeCriticalPod`: the one priority class whose pods the OOM killer takes
/// last (`system-cluster-critical` pods get their QoS class's score).
fn node_critical(spec: &PodSpec) -> bool {
    spec.priority_class_name.as_deref() == Some("system-node-critical")
}

/// `IfNotPresent` and `Never` run the image the node has; `Always` would pull (no registry
/// here).
fn image(c: &Container) -> Result<String, SpecError> {
    let image = c.image.clone().ok_or_else(|| unsupported("a container without an image"))?;
    match c.image_pull_policy.as_deref() {
        Some("IfNotPresent" | "Never") => Ok(image),
        other => Err(unsupported(format!("imagePullPolicy {other:?}: no registry to pull from"))),
    }
}

fn ports(c: &Container) -> Result<Vec<cri::PortMapping>, SpecError> {
    let mut out = Vec::new();
    for p in c.ports.iter().flatten() {
        let protocol = match p.protocol.as_deref().unwrap_or("TCP") {
            "TCP" => cri::Protocol::Tcp,
            "UDP" => cri::Protocol::Udp,
            "SCTP" => cri::Protocol::Sctp,
            other => return Err(unsupported(format!("port protocol {other}"))),
        };
        // The kubelet passes every declared port; only a hostPort (refused above: no portmap
        // plugin here) would make the runtime map one.
        out.push(cri::PortMapping {
            protocol: protocol as i32,
            container_port: p.container_port,
            ..Default::default()
        });
    }
    Ok(out)
}

/// `value`, and the downward API's `spec.nodeName` and `metadata.uid`.
fn env(c: &Container, node_name: &str, uid: &str) -> Result<Vec<cri::KeyValue>, SpecError> {
    let mut out = Vec::new();
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), None) => v.clone(),
            (None, Some(from)) => match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                Some("spec.nodeName") => node_name.to_owned(),
                Some("metadata.uid") => uid.to_owned(),
                other => return Err(unsupported(format!("env {}: valueFrom {other:?}", e.name))),
            },
            _ => String::new(),
        };
        out.push(cri::KeyValue { key: e.name.clone(), value });
    }
    Ok(out)
}

/// The QoS class (the kubelet's `GetPodQOS`), the pod's memory limit and the container's
/// resources: CPU shares from the request (`MilliCPUToShares`), the memory limit, and the
/// OOM score (`GetContainerOOMScoreAdjust`: -997 for a critical pod).
fn resources(
    c: &Container,
    critical: bool,
) -> Result<(&'static str, Option<u64>, cri::LinuxContainerResources), SpecError> {
    let r = c.resources.as_ref();
    let get = |m: Option<&BTreeMap<String, Quantity>>, k: &str| -> Result<Option<f64>, SpecError> {
        m.and_then(|m| m.get(k))
            .map(|q| {
                evictd_policy::quantity::Quantity::parse(&q.0)
                    .map(|q| q.nanos() as f64 / 1e9)
                    .map_err(|e| unsupported(format!("resource {k}: {e}")))
            })
            .transpose()
    };
    let requests = r.and_then(|r| r.requests.as_ref());
    let limits = r.and_then(|r| r.limits.as_ref());
    let (cpu_req, mem_req) = (get(requests, "cpu")?, get(requests, "memory")?);
    let (cpu_lim, mem_lim) = (get(limits, "cpu")?, get(limits, "memory")?);
    let qos = match (cpu_req.or(cpu_lim), mem_req.or(mem_lim), cpu_lim, mem_lim) {
        (None, None, None, None) => "besteffort",
        (_, _, Some(cl), Some(ml)) if cpu_req.is_none_or(|r| r == cl) && mem_req.is_none_or(|r| r == ml) => {
            "guaranteed"
        }
        _ => "burstable",
    };
    let shares = cpu_req.or(cpu_lim).map_or(2, |cores| ((cores * 1024.0) as i64).max(2));
    let oom_score_adj = match (critical, qos) {
        (true, _) | (_, "guaranteed") => CRITICAL_OOM_SCORE_ADJ,
        (_, "besteffort") => 1000,
        _ => {
            let capacity = procfs::Meminfo::current().map_err(|e| unsupported(e.to_string()))?.mem_total;
            burstable_oom_score_adj(mem_req.unwrap_or(0.0) as u64, capacity)
        }
    };
    let resources = cri::LinuxContainerResources {
        cpu_shares: shares,
        // `milliCPUToQuota`: the limit's share of a 100 ms period, at least 1 ms.
        cpu_period: if cpu_lim.is_some() { CPU_PERIOD_US } else { 0 },
        cpu_quota: cpu_lim.map_or(0, |cores| ((cores * CPU_PERIOD_US as f64) as i64).max(1000)),
        memory_limit_in_bytes: mem_lim.unwrap_or(0.0) as i64,
        oom_score_adj,
        ..Default::default()
    };
    Ok((qos, mem_lim.map(|m| m as u64), resources))
}

/// The CFS period the kubelet sets with a CPU limit, in microseconds.
const CPU_PERIOD_US: i64 = 100_000;

/// `GetContainerOOMScoreAdjust` for a Burstable container: 1000 less its memory request's
/// share of the node's memory, kept above Guaranteed pods' (at least 3) and below BestEffort
/// pods' (at most 999).
fn burstable_oom_score_adj(memory_request: u64, capacity: u64) -> i64 {
    let share = (1000 * u128::from(memory_request) / u128::from(capacity.max(1))) as i64;
    (1000 - share).clamp(1000 + CRITICAL_OOM_SCORE_ADJ, 999)
}

/// hostPath volumes at their mount points: the type checked (`Directory` must exist,
/// `DirectoryOrCreate` is made), `readOnly`, and `HostToContainer` as rslave.
fn mounts(spec: &PodSpec, c: &Container, node: &Node) -> Result<Vec<cri::Mount>, SpecError> {
    let mut out = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == m.name)
            .ok_or_else(|| unsupported(format!("volumeMount {}: no such volume", m.name)))?;
        let host = volume
            .host_path
            .as_ref()
            .ok_or_else(|| unsupported(format!("volume {}: only hostPath volumes", volume.name)))?;
        let path = match node.host_paths.get(&host.path) {
            Some(mapped) => mapped.clone(),
            None if MACHINE_PATHS.contains(&host.path.as_str()) => PathBuf::from(&host.path),
            None => {
                return Err(unsupported(format!(
                    "volume {}: hostPath {} is neither mapped to the test node's nor a kernel \
                     interface the test may share with the machine",
                    volume.name, host.path
                )));
            }
        };
        check_host_path(&volume.name, &path, host.type_.as_deref())?;
        let propagation = match m.mount_propagation.as_deref() {
            None | Some("None") => cri::MountPropagation::PropagationPrivate,
            Some("HostToContainer") => cri::MountPropagation::PropagationHostToContainer,
            Some("Bidirectional") => cri::MountPropagation::PropagationBidirectional,
            Some(other) => return Err(unsupported(format!("mountPropagation {other}"))),
        };
        out.push(cri::Mount {
            container_path: m.mount_path.clone(),
            host_path: path.display().to_string(),
            readonly: m.read_only.unwrap_or(false),
            propagation: propagation as i32,
            ..Default::default()
        });
    }
    Ok(out)
}

/// The kubelet's hostPath type check, before the container is created.
fn check_host_path(volume: &str, path: &Path, kind: Option<&str>) -> Result<(), SpecError> {
    match kind.unwrap_or("") {
        "" => Ok(()),
        "Directory" if path.is_dir() => Ok(()),
        "Directory" => {
            Err(unsupported(format!("volume {volume}: hostPath {} is not a directory", path.display())))
        }
        "DirectoryOrCreate" => std::fs::create_dir_all(path)
            .map_err(|e| unsupported(format!("volume {volume}: {}: {e}", path.display()))),
        other => Err(unsupported(format!("volume {volume}: hostPath type {other}"))),
    }
}

/// An `httpGet` probe, its port by name or number.
fn http_probe(p: &Probe, c: &Container) -> Result<HttpProbe, SpecError> {
    let get = p.http_get.as_ref().ok_or_else(|| unsupported("only httpGet probes"))?;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let port = match &get.port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| p.container_port)
            .ok_or_else(|| unsupported(format!("probe port {name}: no such port")))?,
    };
    let secs = |v: Option<i32>, default: i32| Duration::from_secs(v.unwrap_or(default).max(1) as u64);
    Ok(HttpProbe {
        path: get.path.clone().unwrap_or_else(|| "/".into()),
        port: u16::try_from(port).map_err(|_| unsupported(format!("probe port {port}")))?,
        period: secs(p.period_seconds, 10),
        timeout: secs(p.timeout_seconds, 1),
        failure_threshold: p.failure_threshold.unwrap_or(3).max(1) as u32,
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::DaemonSet;

    use super::*;

    fn daemonset_template() -> PodTemplateSpec {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/daemonset.yaml");
        let ds: DaemonSet = serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        ds.spec.unwrap().template
    }

    fn spec_of(t: &mut PodTemplateSpec) -> &mut PodSpec {
        t.spec.as_mut().unwrap()
    }

    /// Every hostPath of the manifest played by a directory of the test's.
    fn node(dir: &Path) -> Node<'static> {
        let host_paths = daemonset_template()
            .spec
            .unwrap()
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.host_path.as_ref())
            .map(|h| {
                let d = dir.join(h.path.trim_start_matches('/'));
                std::fs::create_dir_all(&d).unwrap();
                (h.path.clone(), d)
            })
            .collect();
        Node { name: "node-a", host_paths, pod_logs: dir.join("pod-logs") }
    }

    fn translate_with(template: &PodTemplateSpec, dir: &Path) -> Result<KubeletPod, SpecError> {
        translate(template, ("kube-system", "evictd-x", "uid-1"), &node(dir))
    }

    fn refused_field(template: &PodTemplateSpec) -> String {
        let dir = tempfile::tempdir().unwrap();
        match translate_with(template, dir.path()) {
            Err(SpecError::UnhandledField(f)) => f,
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(_) => panic!("translated"),
        }
    }

    #[test]
    fn the_daemonset_is_what_the_kubelet_asks_the_runtime_for() {
        let dir = tempfile::tempdir().unwrap();
        let pod = translate_with(&daemonset_template(), dir.path()).unwrap();
        let ns = pod.sandbox.linux.as_ref().unwrap().security_context.as_ref().unwrap();
        let modes = ns.namespace_options.as_ref().unwrap();
        assert_eq!(modes.pid, cri::NamespaceMode::Node as i32, "hostPID");
        assert_eq!(modes.network, cri::NamespaceMode::Pod as i32, "a pod network");
        assert!(ns.privileged);
        let c = &pod.container;
        assert!(c.linux.as_ref().unwrap().security_context.as_ref().unwrap().privileged);
        let r = c.linux.as_ref().unwrap().resources.as_ref().unwrap();
        assert_eq!((r.cpu_shares, r.memory_limit_in_bytes, r.oom_score_adj), (51, 128 << 20, -997));
        assert_eq!((pod.qos, pod.memory_limit), ("burstable", Some(128 << 20)));
        let env: BTreeMap<&str, &str> = c.envs.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect();
        assert_eq!(env["NODE_NAME"], "node-a");
        assert_eq!(env["POD_UID"], "uid-1");
        let kubelet = c.mounts.iter().find(|m| m.container_path == "/var/lib/kubelet").unwrap();
        assert!(kubelet.readonly);
        assert_eq!(kubelet.propagation, cri::MountPropagation::PropagationHostToContainer as i32);
        assert!(kubelet.host_path.starts_with(&dir.path().display().to_string()), "mapped: {kubelet:?}");
        assert_eq!(pod.readiness.as_ref().unwrap().port, pod.ports["probes"]);
        assert_eq!(pod.liveness.as_ref().unwrap().path, "/healthz");
    }

    #[test]
    fn a_field_neither_translated_nor_off_the_node_is_refused() {
        let mut t = daemonset_template();
        spec_of(&mut t).dns_policy = Some("ClusterFirstWithHostNet".into());
        assert_eq!(refused_field(&t), "dnsPolicy");
        let mut t = daemonset_template();
        spec_of(&mut t).containers[0].working_dir = Some("/".into());
        assert_eq!(refused_field(&t), "workingDir");
    }

    /// A field set deep in the container is refused as one at the top is: the test never runs
    /// a manifest without part of what it declares.
    #[test]
    fn a_nested_field_not_translated_is_refused() {
        type Change = fn(&mut Container);
        let changes: [(Change, &str); 5] = [
            (|c| c.security_context.as_mut().unwrap().run_as_user = Some(0), "securityContext.runAsUser"),
            (|c| c.volume_mounts.as_mut().unwrap()[0].sub_path = Some("x".into()), "volumeMounts.subPath"),
            (|c| c.ports.as_mut().unwrap()[0].host_port = Some(9101), "ports.hostPort"),
            (
                |c| c.liveness_probe.as_mut().unwrap().initial_delay_seconds = Some(5),
                "livenessProbe.initialDelaySeconds",
            ),
            (
                |c| {
                    let limits = c.resources.as_mut().unwrap().limits.as_mut().unwrap();
                    limits.insert("ephemeral-storage".into(), Quantity("1Gi".into()));
                },
                "resources.limits.ephemeral-storage",
            ),
        ];
        for (change, field) in changes {
            let mut t = daemonset_template();
            change(&mut spec_of(&mut t).containers[0]);
            assert_eq!(refused_field(&t), field);
        }
        let mut t = daemonset_template();
        t.metadata.as_mut().unwrap().generate_name = Some("x-".into());
        assert_eq!(refused_field(&t), "generateName");
    }

    #[test]
    fn a_cpu_limit_is_a_cfs_quota_and_template_annotations_reach_the_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = daemonset_template();
        t.metadata.as_mut().unwrap().annotations = Some([("a".to_owned(), "b".to_owned())].into());
        let c = &mut spec_of(&mut t).containers[0];
        let limits = c.resources.as_mut().unwrap().limits.as_mut().unwrap();
        limits.insert("cpu".into(), Quantity("250m".into()));
        let pod = translate_with(&t, dir.path()).unwrap();
        let r = pod.container.linux.as_ref().unwrap().resources.as_ref().unwrap();
        assert_eq!((r.cpu_period, r.cpu_quota), (100_000, 25_000));
        assert_eq!(pod.sandbox.annotations["a"], "b");
        assert_eq!(pod.container.annotations["a"], "b");
    }

    #[test]
    fn only_node_critical_pods_get_the_guaranteed_oom_score() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = daemonset_template();
        spec_of(&mut t).priority_class_name = Some("system-cluster-critical".into());
        let pod = translate_with(&t, dir.path()).unwrap();
        let r = pod.container.linux.as_ref().unwrap().resources.as_ref().unwrap();
        assert!(r.oom_score_adj > 0, "a Burstable score: {}", r.oom_score_adj);
        let gib = 1 << 30;
        assert_eq!(burstable_oom_score_adj(0, gib), 999);
        assert_eq!(burstable_oom_score_adj(gib / 2, gib), 500);
        assert_eq!(burstable_oom_score_adj(gib, gib), 3);
    }

    #[test]
    fn a_hostpath_of_the_machine_is_not_mounted_or_made() {
        use k8s_openapi::api::core::v1::{HostPathVolumeSource, Volume, VolumeMount};
        let dir = tempfile::tempdir().unwrap();
        let machine = dir.path().join("machine-state");
        let mut t = daemonset_template();
        let spec = spec_of(&mut t);
        spec.volumes.as_mut().unwrap().push(Volume {
            name: "state".into(),
            host_path: Some(HostPathVolumeSource {
                path: machine.display().to_string(),
                type_: Some("DirectoryOrCreate".into()),
            }),
            ..Default::default()
        });
        spec.containers[0].volume_mounts.as_mut().unwrap().push(VolumeMount {
            name: "state".into(),
            mount_path: "/state".into(),
            ..Default::default()
        });
        let err = translate_with(&t, dir.path()).err().expect("refused");
        assert!(err.to_string().contains("volume state"), "{err}");
        assert!(!machine.exists(), "made {}", machine.display());
    }

    #[test]
    fn a_missing_directory_hostpath_fails_as_the_kubelet_fails_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut node = node(dir.path());
        node.host_paths.insert("/sys/kernel/btf".into(), dir.path().join("nonexistent"));
        let err = translate(&daemonset_template(), ("kube-system", "evictd-x", "uid-1"), &node)
            .err()
            .expect("refused");
        assert!(err.to_string().contains("volume btf"), "{err}");
    }
}
