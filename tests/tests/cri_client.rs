//! The CRI client against a real containerd: every call the daemon uses, errors that name
//! the endpoint and call, and reconnection when the runtime restarts.

use std::time::Duration;

use evictd_tests::{
    containerd::{self, Containerd, PodSpec},
    privileged,
};

fn skip(test: &str) -> bool {
    if !privileged(test) {
        return true;
    }
    if let Some(why) = containerd::unavailable() {
        if std::env::var("EVICTD_REQUIRE_PRIVILEGED").is_ok_and(|v| v == "1") {
            panic!("{test}: {why}");
        }
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
        return true;
    }
    false
}

fn pod(name: &str) -> PodSpec<'_> {
    PodSpec {
        name,
        qos: "burstable",
        memory_limit: Some(256 << 20),
        oom_score_adj: 500,
        annotations: Default::default(),
        ignore_sigterm: false,
        termination_grace_seconds: 30,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_the_daemon_uses_works_on_containerd() {
    if skip("every_call_the_daemon_uses_works_on_containerd") {
        return;
    }
    let mut ctd = Containerd::start(2 << 30);
    let c = ctd.client();
    let v = c.version().await.expect("Version");
    assert_eq!(v.runtime_api_version, "v1");
    let p = ctd.run_pod(pod("web")).await;
    p.set_mib(32);
    p.wait_usage_at_least(32 << 20, Duration::from_secs(10));

    let sandboxes = c.list_pod_sandboxes().await.expect("ListPodSandbox");
    let sb = sandboxes.iter().find(|s| s.id == p.sandbox_id).expect("our sandbox is listed");
    assert_eq!(sb.labels.get("io.kubernetes.pod.uid"), Some(&p.uid));
    let status = c.pod_sandbox_status(&p.sandbox_id).await.expect("PodSandboxStatus");
    println!("sandbox info: {:?}", status.info);
    let containers = c.list_containers().await.expect("ListContainers");
    assert!(containers.iter().any(|x| x.id == p.container_id && x.pod_sandbox_id == p.sandbox_id));
    let cs = c.container_status(&p.container_id).await.expect("ContainerStatus");
    println!("container info: {:?}", cs.info);
    let stats = c.list_pod_sandbox_stats().await.expect("ListPodSandboxStats");
    println!("pod stats: {stats:?}");
    let cstats = c.list_container_stats().await.expect("ListContainerStats");
    assert!(cstats.iter().any(|s| s.attributes.as_ref().is_some_and(|a| a.id == p.container_id)));
    let fs = c.image_fs_info().await.expect("ImageFsInfo");
    assert!(!fs.image_filesystems.is_empty());
    let images = c.list_images().await.expect("ListImages");
    assert!(images.iter().any(|i| i.repo_tags.iter().any(|t| t.contains("evictd.test/tools"))));

    c.stop_container(&p.container_id, 5).await.expect("StopContainer");
    c.stop_pod_sandbox(&p.sandbox_id).await.expect("StopPodSandbox");
    c.stop_pod_sandbox(&p.sandbox_id).await.expect("StopPodSandbox is idempotent");
    c.remove_container(&p.container_id).await.expect("RemoveContainer");
    c.remove_pod_sandbox(&p.sandbox_id).await.expect("RemovePodSandbox");
    c.remove_pod_sandbox("no-such-sandbox").await.expect("NotFound counts as removed");
    assert!(!ctd.sandbox_ready(&p.sandbox_id).await);
}
