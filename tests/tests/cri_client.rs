//! The CRI client against a real containerd: every call the daemon uses, errors that name
//! the endpoint and call, and reconnection when the runtime restarts.

use std::time::{Duration, Instant};

use evictd_tests::containerd::{self, Containerd, PodSpec};

fn pod(name: &str) -> PodSpec<'_> {
    PodSpec {
        name,
        qos: "burstable",
        memory_limit: Some(256 << 20),
        oom_score_adj: 500,
        annotations: Default::default(),
        ignore_sigterm: false,
        termination_grace_seconds: 30,
        hog_args: None,
        empty_dir_under: None,
        empty_dir_in_memory: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_the_daemon_uses_works_on_containerd() {
    if !containerd::available("every_call_the_daemon_uses_works_on_containerd") {
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
    // containerd 1.6 names no container filesystem: never the split layout (KEP-4191).
    assert_eq!(evictd::runtime::cri::separate_container_fs(&fs), None, "{fs:?}");
    assert_eq!(c.separate_container_fs().await, None);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inventory_infers_specs_from_the_node_without_a_pods_file() {
    if !containerd::available("inventory_infers_specs_from_the_node_without_a_pods_file") {
        return;
    }
    let mut ctd = Containerd::start(2 << 30);
    let capacity: i64 = 1000 << 20;
    let guaranteed = ctd
        .run_pod(PodSpec {
            qos: "guaranteed",
            memory_limit: Some(128 << 20),
            oom_score_adj: -997,
            ..pod("db")
        })
        .await;
    let burstable = ctd.run_pod(PodSpec { oom_score_adj: 900, memory_limit: None, ..pod("web") }).await;
    let mut annotations = std::collections::BTreeMap::new();
    annotations.insert("kubernetes.io/config.source".to_owned(), "file".to_owned());
    let besteffort = ctd
        .run_pod(PodSpec {
            qos: "besteffort",
            memory_limit: None,
            oom_score_adj: 1000,
            annotations,
            ..pod("proxy")
        })
        .await;
    let mut inv = evictd::runtime::inventory::Inventory::new(None, capacity);
    inv.refresh(&ctd.client()).await.expect("refresh");
    let find = |uid: &str| inv.pods().find(|p| p.uid == uid).expect("pod in inventory").clone();
    let db = find(&guaranteed.uid);
    assert!(db.spec_inferred());
    assert_eq!(
        db.spec.request_nanos("memory"),
        (128i128 << 20) * 1_000_000_000,
        "guaranteed: request = limit"
    );
    assert_eq!(db.spec.spec.termination_grace_period_seconds, Some(30));
    assert!(
        db.cgroup_parent.as_deref().is_some_and(|c| c.ends_with(&format!("kubepods/pod{}", guaranteed.uid)))
    );
    let web = find(&burstable.uid);
    // oom_score_adj 900 = 1000 − 1000·request/capacity → request = capacity / 10.
    assert_eq!(web.spec.request_nanos("memory"), i128::from(capacity / 10) * 1_000_000_000);
    let proxy = find(&besteffort.uid);
    assert_eq!(proxy.spec.request_nanos("memory"), 0);
    assert!(proxy.spec.is_critical(), "the static annotation reaches the sandbox");
    // The pod cgroups are where evictd looks for them.
    let layout = evictd::node::cgroups::CgroupMounts::detect().unwrap();
    web.containers.iter().for_each(|c| assert!(c.running, "{c:?}"));
    burstable.set_mib(16);
    burstable.wait_usage_at_least(16 << 20, Duration::from_secs(10));
    let cg = evictd::runtime::usage::pod_cgroups(&web, &layout).expect("cgroups");
    let stats =
        evictd::runtime::usage::pod_stats(&web, Some(&cg), &layout, None, evictd::runtime::usage::Reads::ALL)
            .expect("stats");
    let ws = stats.memory.and_then(|m| m.working_set_bytes).unwrap();
    assert!(ws >= 16 << 20, "working set {ws}");
    // The pause container has its own cgroup under the pod too: pause + hog.
    assert_eq!(stats.process_stats.and_then(|p| p.process_count), Some(2));
}

/// Node-level reclaim is the kubelet's container GC, then image GC. In a running pod the
/// newest dead instance of a container stays (restart count, `logs --previous`) and older
/// ones go; a pod whose sandbox is stopped loses every dead container; images no container
/// or sandbox uses go once they are `imageMinimumGCAge` old, images in use stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_level_reclaim_removes_dead_containers_and_unused_images_only() {
    if !containerd::available("node_level_reclaim_removes_dead_containers_and_unused_images_only") {
        return;
    }
    use evictd::runtime::reclaim;
    use evictd_policy::rank::NodeReclaim;
    let mut ctd = Containerd::start(2 << 30);
    ctd.import("evictd.test/unused:1", &[("marker", b"not used by anything".to_vec())]);
    let mut app = ctd.run_pod(pod("app")).await;
    let first = app.container_id.clone();
    ctd.restart_container(&mut app).await;
    let second = app.container_id.clone();
    ctd.restart_container(&mut app).await;
    let gone = ctd.run_pod(pod("gone")).await;
    let c = ctd.client();
    c.stop_container(&gone.container_id, 0).await.expect("StopContainer");
    c.stop_pod_sandbox(&gone.sandbox_id).await.expect("StopPodSandbox");
    let mut inv = evictd::runtime::inventory::Inventory::new(None, 1 << 30);
    inv.refresh(&c).await.expect("refresh");
    let sandbox_images = inv.pods().filter_map(|p| p.sandbox_image.clone()).collect();
    let two_minutes = Duration::from_secs(120);
    // The first listing's images count as old, as for the kubelet; one that appears after it
    // is younger than imageMinimumGCAge: kept.
    let ages = reclaim::SharedImageAges::default();
    let before: Vec<String> =
        c.list_images().await.unwrap().into_iter().map(|i| i.id).filter(|id| !id.is_empty()).collect();
    let unused = ctd
        .client()
        .list_images()
        .await
        .unwrap()
        .into_iter()
        .find(|i| i.repo_tags.iter().any(|t| t.contains("evictd.test/unused")));
    let unused = unused.expect("the unused image").id;
    ages.lock()
        .unwrap()
        .detect(before.iter().map(String::as_str).filter(|id| **id != unused), Instant::now());
    let images = reclaim::ImagePolicy { sandbox_images: &sandbox_images, ages: &ages, min_age: two_minutes };
    let young = reclaim::reclaim(&c, &[NodeReclaim::UnusedImages], images).await;
    assert_eq!((young.images_removed, young.errors.len()), (0, 0), "{young:?}");
    assert_eq!(young.images_too_young, 1, "only the unused image is too young: {young:?}");
    // Seen at the first listing: old enough.
    let ages = reclaim::SharedImageAges::default();
    ages.lock().unwrap().detect(before.iter().map(String::as_str), Instant::now());
    let images = reclaim::ImagePolicy { sandbox_images: &sandbox_images, ages: &ages, min_age: two_minutes };
    let report =
        reclaim::reclaim(&c, &[NodeReclaim::UnusedContainers, NodeReclaim::UnusedImages], images).await;
    assert_eq!(report.errors, Vec::<String>::new());
    let ids: Vec<String> = c.list_containers().await.unwrap().into_iter().map(|c| c.id).collect();
    assert!(!ids.contains(&first), "the older dead instance is removed: {ids:?}");
    assert!(ids.contains(&second), "the newest dead instance of a running pod stays: {ids:?}");
    assert!(ids.contains(&app.container_id), "the running instance stays: {ids:?}");
    assert!(!ids.contains(&gone.container_id), "a stopped pod's dead container is removed: {ids:?}");
    assert_eq!(report.containers_removed, 2, "{report:?}");
    assert_eq!(report.images_removed, 1, "{report:?}");
    let tags: Vec<String> = c.list_images().await.unwrap().into_iter().flat_map(|i| i.repo_tags).collect();
    assert!(tags.iter().any(|t| t.contains("evictd.test/tools")), "the sandbox's image stays: {tags:?}");
    assert!(!tags.iter().any(|t| t.contains("evictd.test/unused")), "{tags:?}");
    assert!(ctd.sandbox_ready(&app.sandbox_id).await, "reclaim never touches running pods");
}

/// A node whose sandboxes carry large annotations (any tenant can add them) answers
/// ListPodSandbox with more than tonic's default 4 MiB. evictd accepts what the kubelet
/// accepts (16 MiB), so the inventory keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_pod_sandbox_response_over_4_mib_is_read() {
    if !containerd::available("a_list_pod_sandbox_response_over_4_mib_is_read") {
        return;
    }
    let mut ctd = Containerd::start(2 << 30);
    let mut spec = pod("annotated");
    spec.annotations.insert("example.com/blob".into(), "x".repeat(5 << 20));
    let p = ctd.run_pod(spec).await;
    let c = ctd.client();
    let sandboxes = c.list_pod_sandboxes().await.expect("a ListPodSandbox response over 4 MiB");
    assert!(sandboxes.iter().any(|s| s.id == p.sandbox_id));
    let mut inv = evictd::runtime::inventory::Inventory::new(None, 2 << 30);
    inv.refresh(&c).await.expect("an inventory refresh over 4 MiB");
    assert!(inv.pods().any(|r| r.sandbox_id == p.sandbox_id), "the annotated pod is in the inventory");
}

/// After an eviction the daemon holds the next decision until the inventory sends a list
/// read after it (one eviction per list), and asks for one at once. The inventory sends only
/// lists that changed — except that one: were it held back for being unchanged (the evicted
/// pod still listed while it stops), the next decision would wait for the hold's end (2 s)
/// instead of one refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_asked_for_after_an_eviction_is_sent_even_when_unchanged() {
    if !containerd::available("the_list_asked_for_after_an_eviction_is_sent_even_when_unchanged") {
        return;
    }
    use evictd::runtime::inventory::{Inventory, spawn_refresh};
    let mut ctd = Containerd::start(1 << 30);
    let p = ctd.run_pod(pod("steady")).await;
    let kick = std::sync::Arc::new(tokio::sync::Notify::new());
    // No refresh of its own within the test: only the kick asks for one.
    let mut rx =
        spawn_refresh(ctd.client(), Inventory::new(None, 1 << 30), Duration::from_secs(3600), kick.clone());
    // The borrow `wait_for` returns is let go at once: held, it would block the sender.
    let listed = tokio::time::timeout(
        Duration::from_secs(20),
        rx.wait_for(|pods| pods.iter().any(|r| r.sandbox_id == p.sandbox_id)),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    assert!(listed, "the first list names the pod");
    // The writable layers' sizes follow the first list; then nothing changes.
    while matches!(tokio::time::timeout(Duration::from_secs(2), rx.changed()).await, Ok(Ok(()))) {}
    let before = rx.borrow_and_update().clone();
    kick.notify_one();
    let sent = tokio::time::timeout(Duration::from_secs(10), rx.changed()).await;
    assert!(matches!(sent, Ok(Ok(()))), "no list sent after the kick");
    let after = rx.borrow_and_update().clone();
    // The writable layers' sizes, refreshed after the list, may well have changed since:
    // only the pod list read at once, sent for the kick, equals the one before.
    assert_eq!(*after, *before, "the first list sent after the kick is not the unchanged one read for it");
    assert!(!std::sync::Arc::ptr_eq(&after, &before), "a list read after the kick, not the old one");
}
