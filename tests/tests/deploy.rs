//! What `deploy/` ships, checked against the code it deploys: every manifest reads as the
//! Kubernetes API types (k8s-openapi), the DaemonSet's arguments are flags evictd accepts, the
//! container sees every host path evictd opens with those flags, its probes and port are the
//! ones evictd serves, and the ClusterRole grants exactly the calls evictd makes — recorded by
//! the test's API double (no API server can run here) from evictd's own watch and reporter,
//! the only code that talks to the API.

use std::{collections::BTreeSet, path::Path, time::Duration};

use clap::Parser as _;
use evictd::{
    cli::Cli,
    cluster::{
        connect,
        pods::spawn_pod_watch,
        reporter::{Reporter, Retry},
        taints::NodeTaints,
    },
    report::metrics::Metrics,
    vocab::monotonic_ns,
};
use evictd_policy::policy::NodeCondition;
use evictd_tests::api_double::{ApiDouble, Recorded, api_options, eviction_record};
use k8s_openapi::{
    api::{
        apps::v1::DaemonSet,
        core::v1::{Container, ServiceAccount},
        rbac::v1::{ClusterRole, ClusterRoleBinding},
    },
    apimachinery::pkg::util::intstr::IntOrString,
};
use serde::Deserialize as _;

fn deploy_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Every YAML document of `deploy/<file>`, as JSON values.
fn documents(file: &str) -> Vec<serde_json::Value> {
    let text =
        std::fs::read_to_string(deploy_dir().join(file)).unwrap_or_else(|e| panic!("deploy/{file}: {e}"));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde_json::Value::deserialize(d).unwrap_or_else(|e| panic!("deploy/{file}: {e}")))
        .collect()
}

/// The one document of `kind` in `file`, read as the API type `T` (unknown fields are an
/// error: a misspelt field would otherwise be dropped by the API server without a word).
fn object<T: serde::de::DeserializeOwned + serde::Serialize>(file: &str, kind: &str) -> T {
    let docs: Vec<serde_json::Value> = documents(file).into_iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(docs.len(), 1, "deploy/{file}: one {kind}");
    let doc = &docs[0];
    let back = serde_json::to_value(
        serde_json::from_value::<T>(doc.clone()).unwrap_or_else(|e| panic!("{kind}: {e}")),
    )
    .expect("serialises");
    assert_no_field_dropped(doc, &back, kind);
    serde_json::from_value(doc.clone()).expect("read above")
}

/// Every field of `written` survives a round trip through the API type.
fn assert_no_field_dropped(written: &serde_json::Value, typed: &serde_json::Value, at: &str) {
    match (written, typed) {
        (serde_json::Value::Object(w), serde_json::Value::Object(t)) => {
            for (k, v) in w {
                let t = t.get(k).unwrap_or_else(|| panic!("{at}.{k}: not a field of the API type"));
                assert_no_field_dropped(v, t, &format!("{at}.{k}"));
            }
        }
        (serde_json::Value::Array(w), serde_json::Value::Array(t)) => {
            for (i, (w, t)) in w.iter().zip(t).enumerate() {
                assert_no_field_dropped(w, t, &format!("{at}[{i}]"));
            }
        }
        _ => {}
    }
}

fn evictd_container(ds: &DaemonSet) -> Container {
    let spec = ds.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("a pod template");
    spec.containers.iter().find(|c| c.name == "evictd").cloned().expect("the evictd container")
}

#[test]
fn every_manifest_reads_as_the_api_types() {
    let files: Vec<String> = std::fs::read_dir(deploy_dir())
        .expect("deploy/")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|f| f.ends_with(".yaml"))
        .collect();
    assert!(files.len() >= 2, "{files:?}");
    for file in &files {
        for doc in documents(file) {
            match doc["kind"].as_str() {
                Some("DaemonSet") => drop(object::<DaemonSet>(file, "DaemonSet")),
                Some("ServiceAccount") => drop(object::<ServiceAccount>(file, "ServiceAccount")),
                Some("ClusterRole") => drop(object::<ClusterRole>(file, "ClusterRole")),
                Some("ClusterRoleBinding") => drop(object::<ClusterRoleBinding>(file, "ClusterRoleBinding")),
                other => panic!("deploy/{file}: a {other:?} this test does not know"),
            }
        }
    }
    let binding: ClusterRoleBinding = object("rbac.yaml", "ClusterRoleBinding");
    let sa: ServiceAccount = object("rbac.yaml", "ServiceAccount");
    let ds: DaemonSet = object("daemonset.yaml", "DaemonSet");
    let pod = ds.spec.as_ref().and_then(|s| s.template.spec.as_ref()).unwrap();
    assert_eq!(pod.service_account_name, sa.metadata.name, "the DaemonSet runs as the ServiceAccount");
    assert_eq!(ds.metadata.namespace, sa.metadata.namespace);
    let subject = &binding.subjects.as_ref().unwrap()[0];
    assert_eq!(
        (Some(&subject.name), &subject.namespace),
        (sa.metadata.name.as_ref(), &sa.metadata.namespace)
    );
    assert_eq!(binding.role_ref.name, "evictd");
    assert_eq!(pod.priority_class_name.as_deref(), Some("system-node-critical"));
    assert_eq!(pod.host_pid, Some(true), "pidfds and process_mrelease need the host's PIDs");
}

/// The container's arguments are flags evictd accepts, and every host path evictd opens
/// with them is mounted from the host at the same path.
#[test]
fn the_daemonset_mounts_every_path_evictd_opens() {
    let ds: DaemonSet = object("daemonset.yaml", "DaemonSet");
    let c = evictd_container(&ds);
    let args = std::iter::once("evictd".to_owned()).chain(c.args.clone().unwrap_or_default());
    let cli = Cli::try_parse_from(args).unwrap_or_else(|e| panic!("the DaemonSet's args: {e}"));
    assert!(cli.command.is_none(), "the DaemonSet runs the daemon");
    let pod = ds.spec.as_ref().and_then(|s| s.template.spec.as_ref()).unwrap();
    let volumes = pod.volumes.clone().unwrap_or_default();
    let mounts = c.volume_mounts.clone().unwrap_or_default();
    let host_path_of = |mount: &str| {
        let m = mounts.iter().find(|m| m.mount_path == mount)?;
        volumes.iter().find(|v| v.name == m.name)?.host_path.as_ref().map(|h| h.path.clone())
    };
    for p in cli.run.host_paths() {
        let covering = mounts
            .iter()
            .map(|m| Path::new(&m.mount_path))
            .filter(|m| p.path.starts_with(m))
            .max_by_key(|m| m.components().count())
            .unwrap_or_else(|| panic!("{} ({}) is not mounted", p.path.display(), p.why));
        let host = host_path_of(&covering.display().to_string());
        assert_eq!(
            host.as_deref().map(Path::new),
            Some(covering),
            "{} is mounted from another host path: evictd would read the wrong one",
            covering.display()
        );
    }
    let env: Vec<String> = c.env.clone().unwrap_or_default().into_iter().map(|e| e.name).collect();
    assert!(env.contains(&"NODE_NAME".into()) && env.contains(&"POD_UID".into()), "{env:?}");
    assert_eq!(c.security_context.as_ref().and_then(|s| s.privileged), Some(true));
}

/// The ports are the ones `--metrics-addr` and `--probe-addr` give evictd, and the probes
/// point at the probe port: connections no metrics client can take from them.
#[test]
fn the_probes_and_port_are_evictds() {
    let ds: DaemonSet = object("daemonset.yaml", "DaemonSet");
    let c = evictd_container(&ds);
    let args = std::iter::once("evictd".to_owned()).chain(c.args.clone().unwrap_or_default());
    let cli = Cli::try_parse_from(args).unwrap();
    let ports = c.ports.as_ref().expect("ports");
    let named =
        |name: &str| ports.iter().find(|p| p.name.as_deref() == Some(name)).expect(name).container_port;
    let metrics = cli.run.metrics_addr.expect("--metrics-addr");
    assert_eq!(named("metrics"), i32::from(metrics.port()));
    let probes = cli.run.probe_addr.expect("--probe-addr, for the probes");
    assert_eq!(named("probes"), i32::from(probes.port()));
    for (probe, path) in [(&c.liveness_probe, "/healthz"), (&c.readiness_probe, "/readyz")] {
        let get = probe.as_ref().and_then(|p| p.http_get.as_ref()).expect("an HTTP probe");
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.port, IntOrString::String("probes".into()));
    }
}

/// (group, resource[/subresource], verb) of one recorded request.
fn access(r: &Recorded) -> (String, String, String) {
    let (path, query) = r.path.split_once('?').unwrap_or((&r.path, ""));
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let resource = match parts.as_slice() {
        ["api", "v1", "pods"] => "pods".to_owned(),
        ["api", "v1", "nodes", _] => "nodes".to_owned(),
        ["api", "v1", "namespaces", _, kind] | ["api", "v1", "namespaces", _, kind, _] => (*kind).to_owned(),
        ["api", "v1", "namespaces", _, kind, _, sub] | ["api", "v1", kind, _, sub] => format!("{kind}/{sub}"),
        _ => panic!("a request this test cannot name: {} {}", r.method, r.path),
    };
    let verb = match r.method.as_str() {
        "GET" if query.split('&').any(|kv| kv == "watch=true" || kv == "watch=1") => "watch",
        "GET" if parts.len() % 2 == 1 => "list",
        "GET" => "get",
        "POST" => "create",
        "PATCH" => "patch",
        "PUT" => "update",
        "DELETE" => "delete",
        m => panic!("method {m}"),
    };
    (String::new(), resource, verb.to_owned())
}

/// The ClusterRole grants exactly what evictd's API code uses: the watch on the node's pods,
/// everything the reporter sends (an eviction's condition and status patches, two events,
/// the read back of the evicted pod, the node's conditions), and the taints' read and write
/// of the Node — nothing missing (a 403 would
/// lose the record) and nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_role_grants_exactly_the_calls_evictd_makes() {
    let api = ApiDouble::start();
    let opts = api_options(api.kubeconfig());
    let client = connect::client(&opts).await.unwrap();
    let metrics = Metrics::default();
    let mut pods = spawn_pod_watch(client.clone(), &opts.node_name, metrics.api.clone());
    let listed = tokio::time::timeout(Duration::from_secs(10), pods.wait_for(Option::is_some)).await;
    assert!(matches!(listed, Ok(Ok(_))), "the first list");
    api.put_node(serde_json::json!({"metadata": {"name": opts.node_name}}));
    // The evicted pod is read back at once, not after the default 15 s.
    let retry = Retry { check_after: Duration::ZERO, ..Retry::default() };
    let (reporter, task) =
        Reporter::spawn(client.clone(), opts.node_name.clone(), retry, metrics.api.clone());
    let (taints, taint_task) =
        NodeTaints::spawn(client, opts.node_name.clone(), opts.taint_effect, Retry::default(), metrics.api);
    reporter.pod_disruption(&eviction_record());
    reporter.pod_evicted(&eviction_record(), monotonic_ns());
    reporter.node_conditions(&[NodeCondition::MemoryPressure]);
    taints.want(&[NodeCondition::MemoryPressure]);
    let pod = "/api/v1/namespaces/shop/pods/web-1";
    api.wait_for(
        "the watch, the records, the read back, the conditions and the taint",
        Duration::from_secs(10),
        |r| {
            r.iter().any(|r| r.path.contains("watch=true"))
                && r.iter().any(|r| r.method == "GET" && r.path.split('?').next() == Some(pod))
                && r.iter().filter(|r| r.method != "GET").count() >= 6
        },
    );
    task.flush(Duration::from_secs(2)).await;
    taint_task.remove_and_stop(Duration::from_secs(2)).await;
    let made: BTreeSet<(String, String, String)> = api.requests().iter().map(access).collect();

    let role: ClusterRole = object("rbac.yaml", "ClusterRole");
    let mut granted = BTreeSet::new();
    for rule in role.rules.unwrap_or_default() {
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none(), "{rule:?}");
        for group in rule.api_groups.clone().unwrap_or_default() {
            for resource in rule.resources.clone().unwrap_or_default() {
                for verb in &rule.verbs {
                    assert!(group != "*" && resource != "*" && verb != "*", "a wildcard: {rule:?}");
                    granted.insert((group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
    let missing: Vec<_> = made.difference(&granted).collect();
    let unused: Vec<_> = granted.difference(&made).collect();
    assert!(missing.is_empty(), "evictd makes calls deploy/rbac.yaml does not grant: {missing:?}");
    assert!(unused.is_empty(), "deploy/rbac.yaml grants what evictd never uses: {unused:?}");
}

/// The systemd unit runs the daemon with flags evictd accepts, without an API (it is for
/// nodes without Kubernetes), and with the self-protection evictd asks for.
#[test]
fn the_systemd_unit_runs_evictd_with_valid_flags() {
    let unit = std::fs::read_to_string(deploy_dir().join("evictd.service")).expect("deploy/evictd.service");
    let exec = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("an ExecStart line");
    let cli = Cli::try_parse_from(exec.split_whitespace()).unwrap_or_else(|e| panic!("ExecStart: {e}"));
    assert!(cli.command.is_none() && cli.run.no_kube_api, "{exec}");
    for line in ["OOMScoreAdjust=-999", "LimitMEMLOCK=infinity", "Restart=always"] {
        assert!(unit.lines().any(|l| l == line), "{line} missing");
    }
}
