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
        admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
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
                Some("ValidatingAdmissionPolicy") => {
                    drop(object::<ValidatingAdmissionPolicy>(file, "ValidatingAdmissionPolicy"))
                }
                Some("ValidatingAdmissionPolicyBinding") => {
                    drop(object::<ValidatingAdmissionPolicyBinding>(file, "ValidatingAdmissionPolicyBinding"))
                }
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
    if cli.run.policy.kubelet_config.is_some() {
        assert_eq!(pod.host_pid, Some(true), "--kubelet-config auto finds the kubelet in the host's /proc");
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

/// The Dockerfile makes the image `cargo xtask image` writes: FROM scratch (no base image to
/// pull), the static binary `cargo xtask image` builds copied to where PATH finds it, run as
/// the entry point.
#[test]
fn the_dockerfile_is_the_static_binary_from_scratch() {
    let text = std::fs::read_to_string(deploy_dir().join("Dockerfile")).unwrap();
    let lines: Vec<&str> =
        text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    assert_eq!(
        lines,
        [
            "FROM scratch",
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "COPY target/x86_64-unknown-linux-gnu/release/evictd /usr/local/bin/evictd",
            "ENTRYPOINT [\"/usr/local/bin/evictd\"]"
        ]
    );
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

/// One request as the admission policy sees it.
struct Admission {
    user: &'static str,
    /// The token's node-name claim (`None`: a token without it).
    node: Option<&'static str>,
    resource: &'static str,
    sub_resource: &'static str,
    object: serde_json::Value,
    old: serde_json::Value,
}

/// What `deploy/admission-policy.yaml` answers `req`: `Ok` when admitted, else the failed
/// validation's message. Expressions are CEL, evaluated as the API server does: the match
/// conditions first (not matched: admitted), then the variables in order (one that fails
/// is left out, failing only the validations that use it), then every validation; an
/// expression that fails denies (`failurePolicy: Fail`).
fn admit(policy: &serde_json::Value, req: &Admission) -> Result<(), String> {
    use cel_interpreter::{Context, Program, Value};
    let extra = match req.node {
        Some(n) => serde_json::json!({"authentication.kubernetes.io/node-name": [n]}),
        None => serde_json::json!({}),
    };
    let mut ctx = Context::default();
    let request = serde_json::json!({
        "userInfo": {"username": req.user, "extra": extra},
        "resource": {"group": "", "version": "v1", "resource": req.resource},
        "subResource": req.sub_resource,
    });
    ctx.add_variable("request", request).unwrap();
    ctx.add_variable("object", req.object.clone()).unwrap();
    ctx.add_variable("oldObject", req.old.clone()).unwrap();
    let eval = |ctx: &Context, e: &serde_json::Value| -> Result<Value, String> {
        let e = e.as_str().expect("an expression");
        let program = Program::compile(e).map_err(|err| format!("{e}: does not compile: {err}"))?;
        program.execute(ctx).map_err(|err| format!("{e}: {err}"))
    };
    let spec = &policy["spec"];
    for m in spec["matchConditions"].as_array().unwrap() {
        if eval(&ctx, &m["expression"])? != Value::Bool(true) {
            return Ok(());
        }
    }
    let mut variables = serde_json::Map::new();
    for v in spec["variables"].as_array().unwrap() {
        ctx.add_variable("variables", serde_json::Value::Object(variables.clone())).unwrap();
        if let Ok(value) = eval(&ctx, &v["expression"]) {
            variables.insert(v["name"].as_str().unwrap().into(), value.json().expect("a JSON value"));
        }
    }
    ctx.add_variable("variables", serde_json::Value::Object(variables)).unwrap();
    for v in spec["validations"].as_array().unwrap() {
        let why = v["message"].as_str().map_or_else(|| v["messageExpression"].to_string(), String::from);
        match eval(&ctx, &v["expression"]) {
            Ok(Value::Bool(true)) => {}
            Ok(other) => return Err(format!("{why} ({other:?})")),
            Err(e) => return Err(format!("{why} (error: {e})")),
        }
    }
    Ok(())
}

fn node(name: &str, taints: serde_json::Value, labels: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints},
        "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "MemoryPressure", "status": "False"},
                                  {"type": "EvictdMemoryPressure", "status": "False"}]}})
}

/// The admission policy lets each evictd write only for its own node — the node its token
/// names: pods bound there, its own Node's evictd.io taints and Evictd conditions, events it
/// reports from there — and leaves everyone else alone. Each refused case is a write the
/// ClusterRole alone would allow.
#[test]
fn the_admission_policy_scopes_evictd_to_its_own_node() {
    use serde_json::json;
    let policy = documents("admission-policy.yaml")
        .into_iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .unwrap();
    let evictd = "system:serviceaccount:kube-system:evictd";
    let pod = |node: &str| json!({"metadata": {"name": "web-1"}, "spec": {"nodeName": node}, "status": {"phase": "Failed"}});
    let labels = json!({"kubernetes.io/hostname": "node-a"});
    let before = node("node-a", json!([{"key": "dedicated", "effect": "NoSchedule"}]), labels.clone());
    let tainted = |effect: &str| {
        node(
            "node-a",
            json!([{"key": "dedicated", "effect": "NoSchedule"}, {"key": "evictd.io/memory-pressure", "effect": effect}]),
            labels.clone(),
        )
    };
    let with_conditions = |memory: &str, evictd_memory: &str| {
        let mut n = before.clone();
        n["status"]["conditions"][1]["status"] = json!(memory);
        n["status"]["conditions"][2]["status"] = json!(evictd_memory);
        n
    };
    // What the API server changes itself differs too.
    let versioned = |mut n: serde_json::Value| {
        n["metadata"]["resourceVersion"] = json!("8");
        n["metadata"]["managedFields"] = json!([{"manager": "evictd"}]);
        n
    };
    let req = |resource, sub_resource, object, old| Admission {
        user: evictd,
        node: Some("node-a"),
        resource,
        sub_resource,
        object,
        old,
    };
    let admitted = [
        ("its pod's status", req("pods", "status", pod("node-a"), pod("node-a"))),
        ("its taint on", req("nodes", "", versioned(tainted("NoSchedule")), before.clone())),
        ("its taint off", req("nodes", "", before.clone(), tainted("PreferNoSchedule"))),
        ("its condition", req("nodes", "status", with_conditions("False", "True"), before.clone())),
        ("its event", req("events", "", json!({"reportingInstance": "node-a"}), serde_json::Value::Null)),
        (
            "the kubelet, untouched",
            Admission {
                user: "system:node:node-b",
                node: None,
                ..req("nodes", "", tainted("NoExecute"), before.clone())
            },
        ),
    ];
    for (what, r) in &admitted {
        assert_eq!(admit(&policy, r), Ok(()), "{what} must be admitted");
    }
    let mut relabelled = tainted("NoSchedule");
    relabelled["metadata"]["labels"]["role"] = json!("db");
    let mut cordoned = before.clone();
    cordoned["spec"]["unschedulable"] = json!(true);
    let mut annotated = tainted("NoSchedule");
    annotated["metadata"]["annotations"] = json!({"x": "y"});
    let mut relabelled_status = with_conditions("False", "True");
    relabelled_status["metadata"]["labels"]["node-role.kubernetes.io/trusted"] = json!("");
    let mut labelled_pod = pod("node-a");
    labelled_pod["metadata"]["labels"] = json!({"app": "other"});
    let mut capacity = with_conditions("False", "True");
    capacity["status"]["allocatable"] = json!({"memory": "1Ti"});
    let refused = [
        ("another node's pod", req("pods", "status", pod("node-b"), pod("node-b"))),
        (
            "another Node",
            req(
                "nodes",
                "",
                node("node-b", json!([]), json!({})),
                node("node-b", json!([{"key": "x", "effect": "NoSchedule"}]), json!({})),
            ),
        ),
        (
            "another taint removed",
            req("nodes", "", node("node-a", json!([]), labels.clone()), before.clone()),
        ),
        ("a NoExecute taint", req("nodes", "", tainted("NoExecute"), before.clone())),
        ("a label", req("nodes", "", relabelled, before.clone())),
        ("a cordon", req("nodes", "", cordoned, before.clone())),
        ("an annotation", req("nodes", "", annotated, before.clone())),
        ("the Node's allocatable", req("nodes", "status", capacity, before.clone())),
        ("a label through the Node's status", req("nodes", "status", relabelled_status, before.clone())),
        ("a label through a pod's status", req("pods", "status", labelled_pod, pod("node-a"))),
        ("the kubelet's condition", req("nodes", "status", with_conditions("True", "True"), before.clone())),
        (
            "another node's event",
            req("events", "", json!({"reportingInstance": "node-b"}), serde_json::Value::Null),
        ),
        (
            "a token naming no node",
            Admission { node: None, ..req("pods", "status", pod("node-a"), pod("node-a")) },
        ),
    ];
    for (what, r) in &refused {
        let why = admit(&policy, r).expect_err(what);
        // Refused by a validation that said no, not by an expression that failed to evaluate.
        assert!(!why.contains("(error:"), "{what}: {why}");
        println!("refused {what}: {why}");
    }
    // A refusal is a 403 (evictd reports it as refused, not a conflict to retry), and the
    // binding names the policy (a typo would disable it without a word).
    for v in policy["spec"]["validations"].as_array().unwrap() {
        assert_eq!(v["reason"], "Forbidden", "{v}");
    }
    let binding = documents("admission-policy.yaml")
        .into_iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
        .unwrap();
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    // It covers every write the ClusterRole grants.
    let role: ClusterRole = object("rbac.yaml", "ClusterRole");
    let rules = policy["spec"]["matchConstraints"]["resourceRules"].as_array().unwrap();
    let covered = |resource: &str, operation: &str| {
        rules.iter().any(|r| {
            r["resources"].as_array().unwrap().iter().any(|x| x == resource)
                && r["operations"].as_array().unwrap().iter().any(|o| o == operation)
        })
    };
    for rule in role.rules.unwrap_or_default() {
        for resource in rule.resources.unwrap_or_default() {
            for verb in &rule.verbs {
                let operation = match verb.as_str() {
                    "patch" | "update" => "UPDATE",
                    "create" => "CREATE",
                    "delete" => "DELETE",
                    _ => continue,
                };
                assert!(covered(&resource, operation), "the policy does not cover {verb} {resource}");
            }
        }
    }
}
