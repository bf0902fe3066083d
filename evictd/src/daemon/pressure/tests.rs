//! Pressure passes on fixture cgroup trees: what is ranked, and what is recorded.

use std::path::Path;

use evictd_policy::flags::PolicyArgs;

use super::*;
use crate::{
    daemon::urgency::EmergencyLevel,
    node::{cgroups::CgroupVersion, memory::MemoryCgroup},
    runtime::inventory::tests::{container, list, record},
};

/// A Pressure on a fixture cgroup v1 tree at `root`, with no runtime.
fn pressure(root: &Path) -> Pressure {
    pressure_with(root, &PolicyArgs::default(), None)
}

fn pressure_with(root: &Path, args: &PolicyArgs, client: Option<CriClient>) -> Pressure {
    let cgroups =
        CgroupMounts { memory_root: root.into(), memory_version: CgroupVersion::V1, unified_root: None };
    let signals = NodeSignalSources {
        node: MemoryCgroup::new(root, CgroupVersion::V1, true),
        kubepods: None,
        nodefs: "/".into(),
        imagefs: "/".into(),
        containerfs: None,
        pids: crate::node::signals::PidSources::default(),
    };
    let opts = PressureOptions {
        signals,
        fs_layout: FsLayout::SingleFs,
        cri_endpoint: None,
        cri_timeout: Duration::from_secs(1),
        runtime_request_timeout: Duration::from_secs(120),
        annotation_trust: Default::default(),
        dry_run: true,
        pods_file: None,
        inventory_interval: Duration::from_secs(1),
        release_timeout: Duration::from_secs(1),
        kill: KillOptions { fast_kill: false, hard_grace_seconds: 1, emergency: EmergencyLevel::HalfHard },
        own_pod_uid: None,
        evict_inferred_kube_system: false,
        storage_limit_period: Duration::from_secs(10),
        volume_stats_period: Duration::from_secs(60),
    };
    let (policy, _) = args.policy().unwrap();
    let escalate = watch::channel(Escalation::default()).1;
    Pressure::new(policy, PressureOptions { dry_run: client.is_none(), ..opts }, cgroups, client, escalate)
}

/// The fixture node's /proc/meminfo: 4 GiB, `used` bytes of it anonymous memory.
fn node_using(root: &Path, used: u64) {
    let meminfo = format!(
        "MemTotal: 4194304 kB\nMemFree: 0 kB\nAnonPages: {} kB\nCached: 0 kB\nBuffers: 0 kB\nSwapCached: 0 kB\n\
         Inactive(file): 0 kB\n",
        used >> 10
    );
    std::fs::write(root.join("meminfo"), meminfo).unwrap();
}

/// A Pressure on a fixture node at `root` of 4 GiB with 2 GiB in use, under the hard
/// threshold `memory.available<75%` (3 GiB), which is met.
fn under_pressure(root: &Path, client: Option<CriClient>) -> Pressure {
    under_pressure_with(root, PolicyArgs::default(), client)
}

/// `under_pressure` with other settings beside its threshold.
fn under_pressure_with(root: &Path, args: PolicyArgs, client: Option<CriClient>) -> Pressure {
    node_using(root, 2 << 30);
    let args = PolicyArgs { eviction_hard: Some("memory.available<75%".into()), ..args };
    let mut p = pressure_with(root, &args, client);
    p.signals.node.meminfo = root.join("meminfo");
    p
}

/// A Pressure on a fixture node at `root` of 4 GiB with 1 MiB in use, far from the kubelet's
/// default thresholds, with a reader.
fn far_from_pressure(root: &Path) -> Pressure {
    node_using(root, 1 << 20);
    let mut p = pressure(root);
    p.signals.node.meminfo = root.join("meminfo");
    p.reader = crate::daemon::realtime::Reader::spawn(0);
    p
}

/// A CRI client of a scripted runtime listening in `dir`, whose stops take effect at once.
fn scripted_client(dir: &Path) -> CriClient {
    use crate::runtime::cri::scripted::{Script, scripted_runtime};
    let sock = dir.join("cri.sock");
    scripted_runtime(&sock, Script { running_polls: Some(0), ..Script::default() });
    CriClient::new(sock.to_str().unwrap(), Duration::from_millis(500)).unwrap()
}

/// A readable v1 memory cgroup at `dir` using `usage` bytes.
fn memcg(dir: &Path, usage: u64) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("memory.usage_in_bytes"), format!("{usage}\n")).unwrap();
    std::fs::write(dir.join("memory.stat"), "total_inactive_file 0\n").unwrap();
    std::fs::write(dir.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
}

/// `file` replaced by a FIFO: a read of it waits until a writer comes (`feed`).
fn fifo_in_place_of(file: &Path) {
    let _ = std::fs::remove_file(file);
    nix::unistd::mkfifo(file, nix::sys::stat::Mode::S_IRWXU).unwrap();
}

/// Writes `text` to the FIFO for a reader waiting on it; an error (ENXIO) when no reader is.
fn feed(fifo: &Path, text: &[u8]) -> std::io::Result<()> {
    use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
    std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(fifo)?.write_all(text)
}

fn pod(name: &str, parent: Option<&str>) -> PodRecord {
    let mut r = record(parent.unwrap_or(""), vec![container(None, None)]);
    r.name = name.into();
    r.sandbox_id = format!("sb-{name}");
    r.cgroup_parent = parent.map(Into::into);
    r
}

/// A pod whose usage cannot be read must not be ranked at all
/// (ranked "without stats" it would be the first victim).
#[tokio::test(flavor = "current_thread")]
async fn pods_whose_usage_cannot_be_read_are_not_candidates() {
    let d = tempfile::tempdir().unwrap();
    memcg(&d.path().join("kubepods/pod-ok"), 1 << 20);
    // Its cgroup is there, but its memory files cannot be read.
    std::fs::create_dir_all(d.path().join("kubepods/pod-broken")).unwrap();
    let pods = list([
        pod("ok", Some("/kubepods/pod-ok")),
        pod("broken", Some("/kubepods/pod-broken")),
        pod("nowhere", None),
    ]);
    let mut p = pressure(d.path());
    let names: Vec<&str> = p
        .candidates(&pods, false, usage::Reads::ranking(Resource::Memory))
        .await
        .iter()
        .map(|(r, _)| r.name.as_str())
        .collect();
    assert_eq!(names, ["ok"]);
}

/// Ranking reads each pod's own memory cgroup and nothing more: a bystander's container
/// files are never opened (a FIFO there would hold the read), while the chosen pod's
/// containers are read for its record, whose annotations name them as the kubelet's do.
#[tokio::test(flavor = "current_thread")]
async fn ranking_reads_only_the_pods_memory_and_the_record_names_the_chosen_pods_containers() {
    let d = tempfile::tempdir().unwrap();
    memcg(&d.path().join("kubepods/pod-big"), 600 << 20);
    memcg(&d.path().join("kubepods/pod-big/c"), 600 << 20);
    memcg(&d.path().join("kubepods/pod-small"), 1 << 20);
    let fifo = d.path().join("kubepods/pod-small/c/memory.usage_in_bytes");
    memcg(fifo.parent().unwrap(), 1 << 20);
    fifo_in_place_of(&fifo);
    let mut p = under_pressure(d.path(), None);
    p.reader = crate::daemon::realtime::Reader::spawn(0);
    // Its spec names its container, as the API's would: the annotations follow the spec.
    let mut big = pod("big", Some("/kubepods/pod-big"));
    big.spec = crate::runtime::infer::infer_spec(&big, 4 << 30);
    let pods = list([big, pod("small", Some("/kubepods/pod-small"))]);
    let passed = tokio::time::timeout(Duration::from_secs(5), p.pass(&pods, || 1, None, false)).await;
    // A reader waiting on the FIFO is let go; with none, a non-blocking open finds no reader.
    let read_for_ranking = feed(&fifo, b"0\n").is_ok();
    assert!(!read_for_ranking, "a bystander's container memory was read to rank the pods");
    let (records, _) = passed.expect("the pass ended");
    assert_eq!(records.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["big"], "{records:?}");
    let note = |k: &str| records[0].annotations.get(k).map(String::as_str);
    assert_eq!(note("offending_containers"), Some("app"), "{records:?}");
    assert_eq!(note("offending_containers_usage"), Some("600Mi"), "{records:?}");
}

/// A failed kill is recorded (and counted as a
/// failed eviction); when the runtime itself is down, no other pod is tried, since it
/// would fail the same way or be stopped once the runtime is back.
#[tokio::test(flavor = "current_thread")]
async fn a_failed_kill_is_recorded_and_a_down_runtime_tries_no_other_pod() {
    let d = tempfile::tempdir().unwrap();
    // The node: 4 GiB, 2 GiB used, so memory.available<75% (3 GiB) is met.
    let names = ["a", "b", "c"];
    for n in names {
        memcg(&d.path().join(format!("kubepods/pod-{n}")), 100 << 20);
    }
    let pods: Vec<PodRecord> = names.iter().map(|n| pod(n, Some(&format!("/kubepods/pod-{n}")))).collect();
    // A runtime that is not there: StopContainer fails.
    let client = CriClient::new("unix:///nonexistent/evictd-test.sock", Duration::from_millis(200)).unwrap();
    let mut p = under_pressure(d.path(), Some(client));
    let (records, _) = p.pass(&list(pods), || 1, None, false).await;
    assert_eq!(records.len(), 1, "one failed kill, no other pod tried: {records:?}");
    assert!(records[0].error.as_deref().is_some_and(|e| e.contains("StopContainer")), "{records:?}");
}

/// Evictd's own pod is never chosen, even as the largest; the next pod is.
#[tokio::test(flavor = "current_thread")]
async fn evictds_own_pod_is_never_chosen() {
    let d = tempfile::tempdir().unwrap();
    memcg(&d.path().join("kubepods/pod-evictd"), 900 << 20);
    memcg(&d.path().join("kubepods/pod-app"), 100 << 20);
    let mut me = pod("evictd", Some("/kubepods/pod-evictd"));
    me.uid = "uid-of-evictd".into();
    let mut app = pod("app", Some("/kubepods/pod-app"));
    app.uid = "uid-of-app".into();
    let mut p = under_pressure(d.path(), None);
    p.own_pod_uid = Some("uid-of-evictd".into());
    let (records, _) = p.pass(&list([me.clone(), app.clone()]), || 1, None, false).await;
    assert_eq!(records.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["app"], "{records:?}");
    // Without knowing its own pod, the largest (evictd's) would be first: the test can fail.
    let (records, _) = under_pressure(d.path(), None).pass(&list([me, app]), || 1, None, false).await;
    assert_eq!(records[0].name, "evictd", "{records:?}");
}

/// Only live pods are candidates: one the API says has finished (Failed, Succeeded) is not
/// ranked, even as the largest; a pod being deleted still is (its containers still hold
/// memory, as in the kubelet's active pods).
#[tokio::test(flavor = "current_thread")]
async fn finished_pods_are_not_candidates() {
    let d = tempfile::tempdir().unwrap();
    memcg(&d.path().join("kubepods/pod-done"), 900 << 20);
    memcg(&d.path().join("kubepods/pod-ok"), 800 << 20);
    memcg(&d.path().join("kubepods/pod-app"), 100 << 20);
    let mut done = pod("done", Some("/kubepods/pod-done"));
    done.spec.status.phase = Some("Failed".into());
    let mut ok = pod("ok", Some("/kubepods/pod-ok"));
    ok.spec.status.phase = Some("Succeeded".into());
    let app = pod("app", Some("/kubepods/pod-app"));
    let (records, _) =
        under_pressure(d.path(), None).pass(&list([done.clone(), ok, app]), || 1, None, false).await;
    assert_eq!(records.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["app"], "{records:?}");
    // Running again, the largest would be first: the test can fail.
    done.spec.status.phase = Some("Running".into());
    let (records, _) = under_pressure(d.path(), None).pass(&list([done]), || 1, None, false).await;
    assert_eq!(records[0].name, "done", "{records:?}");
}

/// The specs' keys a decision ranks by stay with their pods when pods before them are left
/// out: a finished pod first, then a critical pod larger than any, never read nor taken for
/// one that may be evicted; the largest pod that may goes.
#[tokio::test(flavor = "current_thread")]
async fn a_pod_left_out_does_not_lend_its_keys_to_the_next() {
    let d = tempfile::tempdir().unwrap();
    for (name, usage) in
        [("done", 100u64 << 20), ("static", 900 << 20), ("big", 500 << 20), ("small", 50 << 20)]
    {
        memcg(&d.path().join(format!("kubepods/pod-{name}")), usage);
    }
    let mut done = pod("done", Some("/kubepods/pod-done"));
    done.spec.status.phase = Some("Succeeded".into());
    let mut critical = pod("static", Some("/kubepods/pod-static"));
    critical.spec.metadata.annotations.insert("kubernetes.io/config.source".into(), "file".into());
    let pods =
        [done, critical, pod("big", Some("/kubepods/pod-big")), pod("small", Some("/kubepods/pod-small"))];
    let (records, _) = under_pressure(d.path(), None).pass(&list(pods), || 1, None, false).await;
    assert_eq!(records.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["big"], "{records:?}");
}

/// An evicted pod stays out of the ranking while the inventory still lists its stopped
/// containers (a stale record must not be evicted twice), and comes back once new
/// containers run in its sandbox (the kubelet restarted a pod whose sandbox the runtime
/// failed to stop): evictd must be able to evict it again.
#[test]
fn an_evicted_pod_is_a_candidate_again_only_when_its_containers_run_again() {
    let d = tempfile::tempdir().unwrap();
    let mut p = pressure(d.path());
    let evicted = pod("a", Some("/kubepods/pod-a"));
    p.gone.insert(evicted.sandbox_id.clone(), evicted.containers.iter().map(|c| c.id.clone()).collect());
    assert!(!p.inventory_updated(&list([evicted.clone()])));
    assert!(p.gone.contains_key("sb-a"), "the same stopped containers: still evicted");
    let mut restarted = evicted.clone();
    restarted.containers[0].id = "c-restarted".into();
    restarted.containers[0].attempt = 1;
    assert!(!p.inventory_updated(&list([restarted])));
    assert!(!p.gone.contains_key("sb-a"), "running again: a candidate again");
    p.gone.insert("sb-a".into(), BTreeSet::new());
    assert!(!p.inventory_updated(&[]));
    assert!(p.gone.is_empty(), "no longer listed: forgotten");
}

/// A kube-system pod whose spec is only inferred is never chosen (its
/// priority is unknown), unless --evict-inferred-kube-system says otherwise.
#[tokio::test(flavor = "current_thread")]
async fn inferred_kube_system_pods_are_protected_unless_told_otherwise() {
    let d = tempfile::tempdir().unwrap();
    memcg(&d.path().join("kubepods/pod-dns"), 900 << 20);
    memcg(&d.path().join("kubepods/pod-app"), 100 << 20);
    let mut dns = pod("coredns", Some("/kubepods/pod-dns"));
    dns.namespace = "kube-system".into();
    let app = pod("app", Some("/kubepods/pod-app"));
    assert!(dns.spec_inferred() && app.spec_inferred());
    let pods = list([dns, app]);
    for (allowed, victim) in [(false, "app"), (true, "coredns")] {
        let mut p = under_pressure(d.path(), None);
        p.evict_inferred_kube_system = allowed;
        let (records, _) = p.pass(&pods, || 1, None, false).await;
        assert_eq!(records[0].name, victim, "allowed={allowed}: {records:?}");
    }
}

/// A Burstable pod the kubelet marked system-node-critical (oom_score_adj
/// −997), with an inferred spec, is never chosen even as the largest pod over its request.
/// (Not on the real containerd here: without CAP_SYS_RESOURCE the test runtime must clamp
/// oom_score_adj, so no container can show −997.)
#[tokio::test(flavor = "current_thread")]
async fn an_inferred_node_critical_pod_is_never_chosen() {
    let d = tempfile::tempdir().unwrap();
    memcg(&d.path().join("kubepods/burstable/pod-dns"), 900 << 20);
    memcg(&d.path().join("kubepods/besteffort/pod-app"), 100 << 20);
    let mut dns = pod("coredns", Some("/kubepods/burstable/pod-dns"));
    dns.containers = vec![container(None, Some(-997))];
    dns.spec = crate::runtime::infer::infer_spec(&dns, 4 << 30);
    let mut app = pod("app", Some("/kubepods/besteffort/pod-app"));
    app.spec = crate::runtime::infer::infer_spec(&app, 4 << 30);
    let mut p = under_pressure(d.path(), None);
    let (records, _) = p.pass(&list([dns, app]), || 1, None, false).await;
    assert_eq!(records.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["app"], "{records:?}");
}

/// The pods' usage is read off the daemon's one thread, on the decision's reader. A pod
/// cgroup file whose read blocks (a FIFO here; on a node, a cgroup file stuck behind a
/// kernel lock) must not stop the loop: on this current-thread runtime another task keeps
/// running while the read waits, and the read's value is used once it comes.
#[tokio::test(flavor = "current_thread")]
async fn a_stuck_usage_read_does_not_stall_the_daemons_thread() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("kubepods/pod-stuck");
    memcg(&dir, 0);
    let fifo = dir.join("memory.usage_in_bytes");
    fifo_in_place_of(&fifo);
    let pods = list([pod("stuck", Some("/kubepods/pod-stuck"))]);
    let ticks = Arc::new(AtomicU32::new(0));
    let t = ticks.clone();
    let ticker = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(10)).await;
            t.fetch_add(1, Ordering::Relaxed);
        }
    });
    // The read's answer comes 300 ms on, from a thread of its own (once a reader is there:
    // a non-blocking open, so that a read that never starts fails the test, not hangs it).
    #[allow(clippy::disallowed_methods, reason = "sleeps on the writer's own thread, not tokio's")]
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match feed(&fifo, b"1048576\n") {
                Ok(()) => return,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => panic!("nobody opened the pod's usage file to read it: {e}"),
            }
        }
    });
    let mut p = pressure(d.path());
    p.reader = crate::daemon::realtime::Reader::spawn(0);
    let read = p.candidates(&pods, false, usage::Reads::ranking(Resource::Memory)).await;
    let during = ticks.load(Ordering::Relaxed);
    ticker.abort();
    writer.join().unwrap();
    assert!(
        during >= 10,
        "the loop stood still while a pod's usage read waited: {during} ticks of 10 ms in 300 ms"
    );
    let usage: Vec<(&str, Option<u64>)> = read
        .iter()
        .map(|(r, s)| (r.name.as_str(), s.memory.as_ref().and_then(|m| m.working_set_bytes)))
        .collect();
    assert_eq!(usage, [("stuck", Some(1 << 20))]);
}

/// A memory decision on a node of many pods reads the working set (memory.stat) only of
/// the pods whose usage could rank them first: here 119 small pods' memory.stat are FIFOs,
/// which a read would wait on until the decision gave up, with nobody evicted. The pod
/// that grew is chosen, and its working set (not its usage) is what it was ranked by.
#[tokio::test(flavor = "current_thread")]
async fn a_memory_decision_reads_the_working_set_only_of_pods_that_can_rank_first() {
    let d = tempfile::tempdir().unwrap();
    let mut pods = Vec::new();
    let mut fifos = Vec::new();
    for i in 0..119 {
        let dir = d.path().join(format!("kubepods/pod-{i}"));
        memcg(&dir, 40 << 20);
        fifo_in_place_of(&dir.join("memory.stat"));
        fifos.push(dir.join("memory.stat"));
        pods.push(pod(&format!("small-{i}"), Some(&format!("/kubepods/pod-{i}"))));
    }
    let big = d.path().join("kubepods/pod-big");
    memcg(&big, 900 << 20);
    std::fs::write(big.join("memory.stat"), format!("total_inactive_file {}\n", 100u64 << 20)).unwrap();
    pods.insert(60, pod("big", Some("/kubepods/pod-big")));
    let mut p = under_pressure(d.path(), None);
    p.reader = crate::daemon::realtime::Reader::spawn(0);
    let pods = list(pods);
    let passed = tokio::time::timeout(Duration::from_secs(5), p.pass(&pods, || 1, None, false)).await;
    // Whatever happened, no reader is left waiting on a FIFO.
    for f in &fifos {
        let _ = feed(f, b"total_inactive_file 0\n");
    }
    let (records, _) = passed.expect("the pass did not end");
    assert_eq!(names(&records), ["big"], "{records:?}");
    let contenders = p.memory_candidates(&pods, Signal::MemoryAvailable, &BTreeSet::new()).await;
    let read: Vec<(&str, Option<u64>)> = contenders
        .iter()
        .map(|(r, s)| (r.name.as_str(), s.memory.as_ref().and_then(|m| m.working_set_bytes)))
        .collect();
    assert_eq!(read, [("big", Some(800 << 20))]);
    assert_eq!(p.usage_files.lock().unwrap().open(), 120, "each pod's usage file is kept open");
}

/// evictd's programs loaded and counting, watching the machine's root as the daemon watches
/// its node (the count does not depend on it); `None` (the test skipped, loudly) where they
/// do not load.
fn counting_probes(test: &str) -> Option<(crate::kernel::ebpf::KernelProbes, crate::kernel::ebpf::WakeRing)> {
    let (mut probes, ring) = match crate::kernel::ebpf::KernelProbes::load(&Default::default()) {
        Ok(loaded) => loaded,
        Err(e) => {
            crate::skip(test, &format!("evictd's eBPF programs do not load: {e}"));
            return None;
        }
    };
    let root = CgroupMounts::detect().unwrap().memory_root;
    probes.watch(crate::node::cgroup_names::cgroup_id(&root).unwrap()).unwrap();
    probes.rearm(1 << 50).unwrap();
    Some((probes, ring))
}

/// On a node of many pods, a memory decision after a pass that read their usage under the
/// node's charge count reads again only the pods whose bound (that read plus what the node
/// was charged since) could rank them first: here one of 250, where it read all 250. A pod
/// found past its bound (its usage file rewritten, a growth no charge counted) makes the
/// decision read every pod again. The count is the kernel's (evictd's programs, loaded).
#[tokio::test(flavor = "current_thread")]
async fn a_memory_decision_reads_again_only_pods_whose_bound_could_rank_them_first() {
    let Some((probes, _ring)) =
        counting_probes("a_memory_decision_reads_again_only_pods_whose_bound_could_rank_them_first")
    else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let mut pods = Vec::new();
    for i in 0..249 {
        memcg(&d.path().join(format!("kubepods/pod-{i}")), 40 << 20);
        pods.push(pod(&format!("small-{i}"), Some(&format!("/kubepods/pod-{i}"))));
    }
    let big = d.path().join("kubepods/pod-big");
    memcg(&big, 900 << 20);
    std::fs::write(big.join("memory.stat"), format!("total_inactive_file {}\n", 100u64 << 20)).unwrap();
    pods.insert(100, pod("big", Some("/kubepods/pod-big")));
    let pods = list(pods);
    // Far from the threshold: the pass decides nothing, and reads the pods after it.
    let mut p = far_from_pressure(d.path());
    p.charge_clock = Some(probes.charge_clock());
    let (records, _) = p.pass(&pods, || 1, None, false).await;
    assert!(records.is_empty(), "{records:?}");
    // The refresh goes in chunks, each queued behind what came meanwhile (a decision goes
    // first): a look queued behind it sees one more chunk done each. The look runs on the
    // reader, as the chunks do: one from this thread could hold the files as a chunk tries
    // them, which ends the refresh there.
    let mut remembered = 0;
    for _ in 0..250 {
        let files = p.usage_files.clone();
        remembered = p
            .read_for_decision(Duration::from_secs(2), move || files.lock().unwrap().remembered())
            .await
            .unwrap();
        if remembered == 250 {
            break;
        }
    }
    assert_eq!(remembered, 250, "every pod read after the pass, under the charge count");
    let reads = |p: &Pressure| p.usage_files.lock().unwrap().reads();
    let before = reads(&p);
    let ranked = |c: &[(&PodRecord, PodStats)]| -> Vec<(String, Option<u64>)> {
        c.iter().map(|(r, s)| (r.name.clone(), s.memory.as_ref().and_then(|m| m.working_set_bytes))).collect()
    };
    let contenders = p.memory_candidates(&pods, Signal::MemoryAvailable, &BTreeSet::new()).await;
    assert_eq!(ranked(&contenders), [("big".to_string(), Some(800 << 20))]);
    assert_eq!(reads(&p) - before, 1, "the decision read more than the pod that ranks first");
    // The big pod's usage rewritten to 2 GiB: past its bound, so every pod is read again.
    std::fs::write(big.join("memory.usage_in_bytes"), format!("{}\n", 2u64 << 30)).unwrap();
    let before = reads(&p);
    let contenders = p.memory_candidates(&pods, Signal::MemoryAvailable, &BTreeSet::new()).await;
    assert_eq!(ranked(&contenders), [("big".to_string(), Some((2048 - 100) << 20))]);
    assert!(reads(&p) - before > 250, "{} reads after a bound was missed", reads(&p) - before);
}

/// A pass reads the charge count just before it reads the node, for the daemon to take what
/// was charged since off the distance its sources re-arm on (what the count sees of a pod's
/// growth: `kernel_wake::the_charge_count_bounds_a_pods_growth_until_the_programs_come_off`).
#[tokio::test(flavor = "current_thread")]
async fn a_pass_reads_the_charge_count_before_the_node() {
    let Some((probes, _ring)) = counting_probes("a_pass_reads_the_charge_count_before_the_node") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let mut p = far_from_pressure(d.path());
    p.charge_clock = Some(probes.charge_clock());
    assert_eq!(p.charged_since_read(), None, "no pass has read the node");
    let (records, _) = p.pass(&list(Vec::new()), || 1, None, false).await;
    assert!(records.is_empty(), "{records:?}");
    assert!(p.charged_since_read().is_some(), "the count read with the node");
    drop(probes);
    assert_eq!(p.charged_since_read(), None, "no count without the programs");
}

/// The usage files of a new pod list are opened after a pass, before any decision needs
/// them, and those of pods gone are closed.
#[tokio::test(flavor = "current_thread")]
async fn usage_files_are_opened_for_each_new_pod_list_after_the_pass() {
    let d = tempfile::tempdir().unwrap();
    for n in ["a", "b"] {
        memcg(&d.path().join(format!("kubepods/pod-{n}")), 1 << 20);
    }
    // A node far from its threshold: no decision reads anything.
    let mut p = far_from_pressure(d.path());
    let open_after = async |p: &mut Pressure, pods: Vec<PodRecord>| {
        let (records, _) = p.pass(&list(pods), || 1, None, false).await;
        assert!(records.is_empty(), "{records:?}");
        // Queued on the reader: a read behind it sees it done.
        p.read_for_decision(Duration::from_secs(2), || ()).await;
        p.usage_files.lock().unwrap().open()
    };
    let both = vec![pod("a", Some("/kubepods/pod-a")), pod("b", Some("/kubepods/pod-b"))];
    assert_eq!(open_after(&mut p, both).await, 2);
    assert_eq!(open_after(&mut p, vec![pod("a", Some("/kubepods/pod-a"))]).await, 1);
}

/// A read stuck past its deadline costs that decision its read, not the next ones: the
/// reader is replaced, so the next read does not queue behind the stuck one (which ends
/// when its read returns).
#[tokio::test(flavor = "current_thread")]
async fn a_stuck_read_is_given_up_and_the_next_read_answers() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("memory.stat");
    fifo_in_place_of(&fifo);
    let mut p = pressure(d.path());
    p.reader = crate::daemon::realtime::Reader::spawn(0);
    let f = fifo.clone();
    let stuck =
        p.read_for_decision(Duration::from_millis(100), move || std::fs::read_to_string(&f).ok()).await;
    assert_eq!(stuck, None);
    let next = p.read_for_decision(Duration::from_secs(2), || 7).await;
    // Let the stuck reader go: it is waiting to read.
    let released = feed(&fifo, b"x");
    assert!(released.is_ok(), "the stuck read was not waiting: {released:?}");
    assert_eq!(next, Some(7), "the next read waited behind the stuck one");
}

/// Three pods under pressure and a runtime that stops every pod it is asked to.
async fn three_pods_and_a_runtime(d: &Path) -> (Pressure, PodList) {
    three_pods_and_a_runtime_with(d, PolicyArgs::default()).await
}

async fn three_pods_and_a_runtime_with(d: &Path, args: PolicyArgs) -> (Pressure, PodList) {
    use crate::runtime::cri::scripted::{Script, scripted_runtime};
    let sock = d.join("cri.sock");
    scripted_runtime(&sock, Script { running_polls: Some(0), ..Script::default() });
    let client = CriClient::new(sock.to_str().unwrap(), Duration::from_millis(500)).unwrap();
    let names = ["a", "b", "c"];
    for (i, n) in names.iter().enumerate() {
        memcg(&d.join(format!("kubepods/pod-{n}")), (300 - 100 * i as u64) << 20);
    }
    let pods = names.iter().map(|n| pod(n, Some(&format!("/kubepods/pod-{n}"))));
    (under_pressure_with(d, args, Some(client)), list(pods))
}

fn names(records: &[EvictionRecord]) -> Vec<&str> {
    records.iter().map(|r| r.name.as_str()).collect()
}

/// One eviction per pressure: while the evicted pod's memory stays charged (a tmpfs it
/// filled outlives its processes), the node's signal has not moved, and deciding again
/// would take a second pod for the same pressure. The next eviction waits until the charge
/// drops (or the cgroup is gone).
#[tokio::test(flavor = "current_thread")]
async fn the_next_eviction_waits_for_the_evicted_pods_memory() {
    let d = tempfile::tempdir().unwrap();
    let (mut p, pods) = three_pods_and_a_runtime(d.path()).await;
    let (records, _) = p.pass(&pods, || 1_000_000_000, None, false).await;
    assert_eq!(names(&records), ["a"], "one eviction, the node still under pressure: {records:?}");
    assert!(records[0].error.is_none(), "{records:?}");
    let (records, _) = p.pass(&pods, || 2_000_000_000, None, false).await;
    assert_eq!(names(&records), [] as [&str; 0], "a's 300 MiB still charged");
    assert!(p.cleanup_recheck().is_some(), "a pass looks again without a wake");
    // a's charge drops to 100 MiB, a third of what it was chosen with: the memory is back.
    memcg(&d.path().join("kubepods/pod-a"), 100 << 20);
    let (records, _) = p.pass(&pods, || 3_000_000_000, None, false).await;
    assert_eq!(names(&records), ["b"], "{records:?}");
    // b's cgroup removed (the kubelet tore the pod down): back as well.
    std::fs::remove_dir_all(d.path().join("kubepods/pod-b")).unwrap();
    let (records, _) = p.pass(&pods, || 4_000_000_000, None, false).await;
    assert_eq!(names(&records), ["c"], "{records:?}");
}

/// The wait is for the evicted pod's memory, not for the pressure: a dip below the threshold
/// (the victim's own pages freed, a hair) does not end it, and pressure back while that memory
/// is still charged is the same pressure, which evicts nobody else. While no threshold is met
/// no pass looks again without a wake.
#[tokio::test(flavor = "current_thread")]
async fn a_dip_below_the_threshold_does_not_end_the_wait() {
    let d = tempfile::tempdir().unwrap();
    let (mut p, pods) = three_pods_and_a_runtime(d.path()).await;
    let (records, _) = p.pass(&pods, || 1_000_000_000, None, false).await;
    assert_eq!(names(&records), ["a"], "{records:?}");
    // 512 MiB of 4 GiB in use: 3.5 GiB available, over the 3 GiB threshold.
    node_using(d.path(), 512 << 20);
    let (records, _) = p.pass(&pods, || 2_000_000_000, None, false).await;
    assert_eq!(names(&records), [] as [&str; 0]);
    assert_eq!(p.cleanup_recheck(), None, "no pass without a wake while no threshold is met");
    // Back to 2 GiB, short of the emergency level, a's 300 MiB still charged.
    node_using(d.path(), 2 << 30);
    let (records, _) = p.pass(&pods, || 3_000_000_000, None, false).await;
    assert_eq!(names(&records), [] as [&str; 0], "a second pod for the same pressure: {records:?}");
    assert!(p.cleanup_recheck().is_some(), "a pass looks again for a's memory");
    memcg(&d.path().join("kubepods/pod-a"), 100 << 20);
    let (records, _) = p.pass(&pods, || 4_000_000_000, None, false).await;
    assert_eq!(names(&records), ["b"], "{records:?}");
}

/// One eviction per pass, even at an emergency where nothing waits: the pass's pod list is
/// the one it began with, and a pod started since (maybe the one whose growth is the
/// pressure) is not in it. The next pass, on the inventory read after the eviction, takes
/// the next pod.
#[tokio::test(flavor = "current_thread")]
async fn a_pass_evicts_one_pod_and_the_next_decides_on_a_new_list() {
    let d = tempfile::tempdir().unwrap();
    let (mut p, pods) = three_pods_and_a_runtime(d.path()).await;
    // 3.9 of 4 GiB in use: below the emergency level, so no wait for the evicted pod's memory.
    node_using(d.path(), 3994 << 20);
    // A clock that moves, as the daemon's does: every observation is newer than the last.
    let clock = std::sync::atomic::AtomicI64::new(0);
    let now = || clock.fetch_add(1_000_000_000, std::sync::atomic::Ordering::Relaxed) + 1_000_000_000;
    let (records, _) = p.pass(&pods, now, None, false).await;
    assert_eq!(names(&records), ["a"], "{records:?}");
    let (records, _) = p.pass(&pods, now, None, false).await;
    assert_eq!(names(&records), ["b"], "{records:?}");
}

/// An emergency does not wait: with memory.available below half the hard threshold, the
/// kernel's OOM killer is close, and the next pod goes at once.
#[tokio::test(flavor = "current_thread")]
async fn an_emergency_evicts_without_waiting_for_the_last_pods_memory() {
    let d = tempfile::tempdir().unwrap();
    let (mut p, pods) = three_pods_and_a_runtime(d.path()).await;
    let (records, _) = p.pass(&pods, || 1_000_000_000, None, false).await;
    assert_eq!(names(&records), ["a"], "{records:?}");
    // 3.9 of 4 GiB in use: 0.1 GiB available, under half of the 3 GiB threshold.
    node_using(d.path(), 3994 << 20);
    let (records, _) = p.pass(&pods, || 2_000_000_000, None, false).await;
    assert_eq!(names(&records)[0], "b", "{records:?}");
}

/// A fixed emergency level ends the wait too when the pods' cgroup is that close to its own
/// limit, where the kernel's OOM killer acts as it does for the node — if a threshold watches
/// allocatableMemory.available (the kubelet's copy of the hard memory.available one, made
/// with `enforceNodeAllocatable: pods`). With `none` the pods' cgroup is still read (it has a
/// limit), but nothing evicts on it, and the wait holds.
#[tokio::test(flavor = "current_thread")]
async fn the_pods_cgroup_near_its_limit_ends_the_wait_only_where_a_threshold_watches_it() {
    for (enforce, second) in [("pods", vec!["b"]), ("none", vec![])] {
        let d = tempfile::tempdir().unwrap();
        let args = PolicyArgs { enforce_node_allocatable: Some(enforce.into()), ..Default::default() };
        let (mut p, pods) = three_pods_and_a_runtime_with(d.path(), args).await;
        let kubepods = d.path().join("kubepods");
        // 40 MiB from a 1 GiB limit, under a 50 MiB level; the node has 2 GiB available.
        memcg(&kubepods, (1 << 30) - (40 << 20));
        std::fs::write(kubepods.join("memory.limit_in_bytes"), format!("{}\n", 1u64 << 30)).unwrap();
        p.signals.kubepods = Some(MemoryCgroup::new(&kubepods, CgroupVersion::V1, false));
        p.kill.emergency = EmergencyLevel::Bytes(50 << 20);
        let (records, _) = p.pass(&pods, || 1_000_000_000, None, false).await;
        assert_eq!(names(&records), ["a"], "{enforce}: {records:?}");
        // a's 300 MiB still charged.
        let (records, _) = p.pass(&pods, || 2_000_000_000, None, false).await;
        assert_eq!(names(&records), second, "{enforce}: {records:?}");
    }
}

/// The wait is bounded: memory still charged when the window ends (a tmpfs nobody tears
/// down) holds the next eviction no longer, as the kubelet's 30 s do not.
#[tokio::test(flavor = "current_thread")]
async fn the_wait_for_an_evicted_pods_memory_ends_with_its_window() {
    let d = tempfile::tempdir().unwrap();
    let (mut p, pods) = three_pods_and_a_runtime(d.path()).await;
    p.cleanup_window = Duration::from_millis(300);
    let (records, _) = p.pass(&pods, || 1_000_000_000, None, false).await;
    assert_eq!(names(&records), ["a"], "{records:?}");
    let (records, _) = p.pass(&pods, || 2_000_000_000, None, false).await;
    assert_eq!(names(&records), [] as [&str; 0]);
    let recheck = p.cleanup_recheck().expect("a recheck while waiting");
    assert!(recheck <= tokio::time::Instant::now() + Duration::from_millis(300), "never past the window");
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(p.cleanup_recheck(), None, "no recheck past the window: the loop would spin");
    let (records, _) = p.pass(&pods, || 3_000_000_000, None, false).await;
    assert_eq!(names(&records), ["b"], "{records:?}");
}

/// With specs from the API server, a pod it has not listed (its spec only inferred: the
/// first list is late, the pod newer than the last event) is not evicted short of an
/// emergency: its priority is unknown. A decision it tops evicts nobody (the next, listed
/// pod would be a bystander); one a listed pod tops goes ahead; below the emergency level
/// the guess may go too.
#[tokio::test(flavor = "current_thread")]
async fn a_pod_the_api_has_not_listed_is_evicted_only_at_an_emergency() {
    let d = tempfile::tempdir().unwrap();
    let (mut p, pods) = three_pods_and_a_runtime(d.path()).await;
    let mut pods: Vec<PodRecord> = pods.iter().map(|p| (**p).clone()).collect();
    for listed in &mut pods[1..] {
        listed.spec_source = crate::vocab::SpecSource::Api;
    }
    let pods = list(pods);
    // Without an API every spec is what evictd has: the largest (inferred) goes first.
    std::fs::create_dir_all(d.path().join("no-api")).unwrap();
    let (mut no_api, _) = three_pods_and_a_runtime(&d.path().join("no-api")).await;
    let (records, _) = no_api.pass(&pods, || 1_000_000_000, None, false).await;
    assert_eq!(names(&records), ["a"], "{records:?}");
    p.specs_from_api = true;
    let (records, _) = p.pass(&pods, || 1_000_000_000, None, false).await;
    assert_eq!(names(&records), [] as [&str; 0], "the guess tops the ranking: nobody, not a bystander");
    // The guess shrinks below b: the listed pod tops the ranking and goes.
    memcg(&d.path().join("kubepods/pod-a"), 150 << 20);
    let (records, _) = p.pass(&pods, || 2_000_000_000, None, false).await;
    assert_eq!(names(&records), ["b"], "{records:?}");
    // The guess grows back; 3.9 of 4 GiB in use: an emergency, and it goes.
    memcg(&d.path().join("kubepods/pod-b"), 1 << 20);
    memcg(&d.path().join("kubepods/pod-a"), 300 << 20);
    node_using(d.path(), 3994 << 20);
    let (records, _) = p.pass(&pods, || 3_000_000_000, None, false).await;
    assert_eq!(names(&records)[0], "a", "{records:?}");
}

/// The emergency that lets an unlisted pod go is memory's, for a memory decision: a disk
/// decision it tops waits for the pod list even with memory below the emergency level (no
/// OOM killer races a full disk, and the pod may be anyone's).
#[tokio::test(flavor = "current_thread")]
async fn an_unlisted_pod_waits_for_a_disk_decision_even_at_a_memory_emergency() {
    use evictd_policy::observations::Observation;
    let d = tempfile::tempdir().unwrap();
    let mut p = under_pressure(d.path(), None);
    p.specs_from_api = true;
    let guess = pod("guess", Some("/kubepods/pod-guess"));
    assert!(guess.spec_inferred());
    let mut obs = Observations::new();
    // 10 MiB of 4 GiB available: under half of the 3 GiB hard threshold.
    obs.insert(
        Signal::MemoryAvailable,
        Observation { available: 10 << 20, capacity: 4 << 30, time_ns: None },
    );
    assert!(!p.guesses_wait(&guess, Signal::MemoryAvailable, &obs), "memory's emergency: it goes");
    for signal in [Signal::NodeFsAvailable, Signal::ImageFsAvailable, Signal::PidAvailable] {
        assert!(p.guesses_wait(&guess, signal, &obs), "{signal:?}: it waits");
    }
}

/// The storage-limit check runs in a pass any housekeeping wake of its batch asked for,
/// also when a charge came first (a steady stream of kernel wakes must not starve it), never
/// in a pass only memory woke (whose decision must not wait behind its evictions), and reads
/// the disk walker's last walk instead of walking in the pass.
#[tokio::test(flavor = "current_thread")]
async fn the_storage_limit_check_runs_when_the_batch_asks_from_the_last_walk() {
    use crate::vocab::WakeCause;
    let d = tempfile::tempdir().unwrap();
    let client = scripted_client(d.path());
    memcg(&d.path().join("kubepods/pod-over"), 10 << 20);
    let mut over = pod("over", Some("/kubepods/pod-over"));
    over.uid = "over".into();
    over.spec = serde_json::from_value(serde_json::json!({"spec": {"volumes": [
        {"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}]}}))
    .unwrap();
    let kubelet = d.path().join("kubelet");
    let vol = kubelet.join("pods/over/volumes/kubernetes.io~empty-dir/scratch");
    std::fs::create_dir_all(&vol).unwrap();
    std::fs::write(vol.join("fill"), vec![1u8; 2 << 20]).unwrap();
    let pods = list([over]);
    let walker = walked(&pods, kubelet, Duration::from_secs(3600)).await;
    let mut p = pressure_with(d.path(), &PolicyArgs::default(), Some(client));
    p.disk_walker = Some(walker);
    let charge = Some(Wake::now(WakeCause::Charge));
    let (records, _) = p.pass(&pods, || 1_000_000_000, charge, false).await;
    assert_eq!(names(&records), [] as [&str; 0], "a pass only memory woke: {records:?}");
    let (records, _) = p.pass(&pods, || 1_000_000_000, charge, true).await;
    assert_eq!(names(&records), ["over"], "checked on a charge wake: {records:?}");
    assert!(records[0].message.contains("exceeds the limit"), "{}", records[0].message);
}

/// A disk walker of `pods` under the kubelet root `kubelet`, walking every `period`, once its
/// first walk is done.
async fn walked(pods: &PodList, kubelet: std::path::PathBuf, period: Duration) -> DiskWalker {
    let (wakes, _) = tokio::sync::mpsc::channel(4);
    let walker = DiskWalker::spawn(watch::channel(pods.clone()).1, kubelet, period, true, wakes).unwrap();
    while walker.last().at.is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    walker
}

/// A tenant can start many pods over their own storage limits, each ignoring SIGTERM: their
/// stops, one after another, each a grace period and the wait for its memory, would hold a
/// memory eviction for as many seconds. A hard memory threshold met ends the check after the
/// first: the pass ends there, and the next (which waits for a newer pod list) decides on
/// memory even where a housekeeping wake came meanwhile; then the check goes on, a pod at a
/// time while memory is short.
#[tokio::test(flavor = "current_thread")]
async fn a_hard_memory_threshold_goes_before_the_rest_of_the_pods_over_their_storage_limits() {
    use crate::vocab::EvictionCause;
    let d = tempfile::tempdir().unwrap();
    let client = scripted_client(d.path());
    let kubelet = d.path().join("kubelet");
    let over = |name: &str| {
        memcg(&d.path().join(format!("kubepods/pod-{name}")), 10 << 20);
        let mut p = pod(name, Some(&format!("/kubepods/pod-{name}")));
        p.uid = name.into();
        p.spec = serde_json::from_value(serde_json::json!({"spec": {"volumes": [
            {"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}]}}))
        .unwrap();
        let vol = kubelet.join(format!("pods/{name}/volumes/kubernetes.io~empty-dir/scratch"));
        std::fs::create_dir_all(&vol).unwrap();
        std::fs::write(vol.join("fill"), vec![1u8; 2 << 20]).unwrap();
        p
    };
    memcg(&d.path().join("kubepods/pod-hog"), 900 << 20);
    let hog = pod("hog", Some("/kubepods/pod-hog"));
    let pods = list([over("a"), over("b"), over("c"), hog]);
    let walker = walked(&pods, kubelet, Duration::from_secs(3600)).await;
    let limits_then_memory = |records: &[EvictionRecord]| {
        records.iter().map(|r| matches!(r.signal, EvictionCause::Limit(_))).collect::<Vec<_>>()
    };

    // memory.available<75% of 4 GiB, 2 GiB in use: met.
    let mut p = under_pressure(d.path(), Some(client.clone()));
    p.disk_walker = Some(walker.clone());
    let (records, _) = p.pass(&pods, || 1_000_000_000, None, true).await;
    assert_eq!(limits_then_memory(&records), [true], "one over its limit, and the pass ends: {records:?}");
    assert!(p.limits_checked.is_none(), "the check is due at the next housekeeping wake");
    // A housekeeping wake queued during that stop: memory still goes first.
    let (records, _) = p.pass(&pods, || 2_000_000_000, None, true).await;
    assert_eq!(limits_then_memory(&records), [false], "memory's decision next: {records:?}");
    assert_eq!(names(&records), ["hog"], "{records:?}");
    let (records, _) = p.pass(&pods, || 3_000_000_000, None, true).await;
    assert_eq!(limits_then_memory(&records), [true], "then the next pod over its limit: {records:?}");

    // No memory threshold met: every pod over its limit in one check, and no other eviction.
    let mut p = far_from_pressure(d.path());
    p.client = Some(client);
    p.dry_run = false;
    p.disk_walker = Some(walker);
    let (records, _) = p.pass(&pods, || 1_000_000_000, None, true).await;
    assert_eq!(limits_then_memory(&records), [true, true, true], "{records:?}");
}

/// A disk decision does not rank a pod as using nothing while the runtime's stats call that
/// follows its listing is still out: the inventory publishes a pod list before it asks for
/// the layers, and a decision in between would evict a smaller pod in the bigger one's
/// place. It waits; the next pod list (with the layers) decides again.
#[tokio::test(flavor = "current_thread")]
async fn a_disk_decision_waits_for_the_writable_layers_it_ranks_by() {
    disk_decision_beside_an_unmeasured_layer(false).await;
}

/// A finished pod (Failed in the API, its sandbox not yet torn down) is never ranked: its
/// unmeasured layer holds no disk decision.
#[tokio::test(flavor = "current_thread")]
async fn a_finished_pods_unmeasured_layer_holds_no_disk_decision() {
    disk_decision_beside_an_unmeasured_layer(true).await;
}

/// A pod `name` (uid `name`, 1 MiB of memory) with `volume_bytes` in its emptyDir `scratch`,
/// under the kubelet root `<root>/kubelet`.
fn pod_with_volume(root: &Path, name: &str, volume_bytes: usize) -> PodRecord {
    memcg(&root.join(format!("kubepods/pod-{name}")), 1 << 20);
    let mut p = pod(name, Some(&format!("/kubepods/pod-{name}")));
    p.uid = name.into();
    p.spec = serde_json::from_value(serde_json::json!({"spec": {"volumes": [
        {"name": "scratch", "emptyDir": {}}]}}))
    .unwrap();
    let vol = root.join(format!("kubelet/pods/{name}/volumes/kubernetes.io~empty-dir/scratch"));
    std::fs::create_dir_all(&vol).unwrap();
    std::fs::write(vol.join("fill"), vec![1u8; volume_bytes]).unwrap();
    p
}

/// `small` with 1 MiB in its volume, `big` with 64 MiB in a writable layer the runtime has
/// not reported yet; `big_finished`: the API says big has finished.
async fn disk_decision_beside_an_unmeasured_layer(big_finished: bool) {
    use crate::{runtime::disk_usage::DiskWalker, vocab::WakeCause};
    let d = tempfile::tempdir().unwrap();
    let client = scripted_client(d.path());
    let kubelet = d.path().join("kubelet");
    let made = |name: &str, volume_bytes: usize| pod_with_volume(d.path(), name, volume_bytes);
    // `small` writes 1 MiB to its volume; `big` 64 MiB to its writable layer, not yet reported.
    let small = made("small", 1 << 20);
    let mut big = made("big", 0);
    big.containers[0].layer_pending = true;
    if big_finished {
        big.spec.status.phase = Some("Failed".into());
    }
    let listed = list([small.clone(), big.clone()]);
    let (wakes, _woken) = tokio::sync::mpsc::channel(4);
    let walker =
        DiskWalker::spawn(watch::channel(listed.clone()).1, kubelet, Duration::from_secs(3600), true, wakes)
            .unwrap();
    // Any filesystem with something on it has less than 99.99 % available.
    let args = PolicyArgs { eviction_hard: Some("nodefs.available<99.99%".into()), ..Default::default() };
    let mut p = pressure_with(d.path(), &args, Some(client));
    p.disk_walker = Some(walker.clone());
    let wake = Some(Wake::now(WakeCause::Timer));
    while walker.last_began().is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let before = walker.last_began();
    // The first pass asks for a walk begun after the pressure, and waits for it.
    let (records, _) = p.pass(&listed, || 1_000_000_000, wake, false).await;
    assert_eq!(names(&records), [] as [&str; 0], "no walk since the pressure began: {records:?}");
    while walker.last_began() == before {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (records, _) = p.pass(&listed, || 2_000_000_000, wake, false).await;
    if big_finished {
        assert_eq!(names(&records), ["small"], "big is not ranked, so not waited for: {records:?}");
        return;
    }
    assert_eq!(names(&records), [] as [&str; 0], "big's layer unknown, not empty: {records:?}");
    let mut reported = big;
    reported.containers[0].rootfs = Some((64 << 20, 1));
    reported.containers[0].layer_pending = false;
    let listed = list([small, reported]);
    assert!(p.inventory_updated(&listed), "the list with the layers decides again");
    let (records, _) = p.pass(&listed, || 3_000_000_000, wake, false).await;
    assert_eq!(names(&records), ["big"], "{records:?}");
}

/// A runtime with no containers and no images, whose every answer takes `delay`, and how
/// many sandbox lists it was asked for: one per node-level reclaim.
fn empty_runtime(dir: &Path, delay: Duration) -> (CriClient, Arc<std::sync::atomic::AtomicUsize>) {
    let sock = dir.join("cri.sock");
    let lists = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = lists.clone();
    crate::runtime::cri::scripted::answering(&sock, move |path| {
        if path.ends_with("/ListPodSandbox") {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        (Ok(Vec::new()), delay)
    });
    (CriClient::new(sock.to_str().unwrap(), Duration::from_secs(10)).unwrap(), lists)
}

/// Node-level reclaim's runtime calls hold the pass, and with it a memory crossing: while it
/// finds nothing to remove it runs once per housekeeping period, not on every pass a disk
/// threshold still met brings (one a second), and again after a pod is evicted.
#[tokio::test(flavor = "current_thread")]
async fn node_level_reclaim_that_finds_nothing_waits_a_housekeeping_period() {
    let d = tempfile::tempdir().unwrap();
    let (client, lists) = empty_runtime(d.path(), Duration::ZERO);
    // Any filesystem with something on it has less than 99.99 % available.
    let args = PolicyArgs { eviction_hard: Some("nodefs.available<99.99%".into()), ..Default::default() };
    let mut p = pressure_with(d.path(), &args, Some(client));
    let pods = list([]);
    let reclaims = || lists.load(std::sync::atomic::Ordering::SeqCst);
    p.pass(&pods, || 1_000_000_000, None, false).await;
    assert_eq!(reclaims(), 1, "the first pass under disk pressure reclaims");
    for s in 2..6 {
        p.pass(&pods, || s * 1_000_000_000, None, false).await;
    }
    assert_eq!(reclaims(), 1, "nothing was removed: not again within the housekeeping period");
    p.reclaimed_in_vain = Some(Instant::now() - p.storage_limit_period);
    p.pass(&pods, || 6_000_000_000, None, false).await;
    assert_eq!(reclaims(), 2, "a period later it runs again");
}

/// A memory emergency ends node-level reclaim at once: a runtime slow to answer its lists
/// must not hold the memory eviction that comes next. An emergency with no hard memory
/// threshold met (the kernel's direct reclaim on a node whose disk fills by writing, or with
/// a soft memory threshold still in its grace period) makes no memory eviction, and does not
/// cut it: disk evictions would never come.
#[tokio::test(flavor = "current_thread")]
async fn a_memory_emergency_cuts_node_level_reclaim_short() {
    use crate::vocab::{EmergencyCause, Urgency};
    let disk = "nodefs.available<99.99%";
    // (hard thresholds, soft thresholds, memory past 75 % during reclaim, cut short)
    let cases = [
        (format!("memory.available<75%,{disk}"), None, false, false),
        (format!("memory.available<75%,{disk}"), None, true, true),
        (disk.to_string(), Some("memory.available<75%"), true, false),
    ];
    for (hard, soft, memory_up, cut) in cases {
        let d = tempfile::tempdir().unwrap();
        let delay = if cut { Duration::from_secs(5) } else { Duration::from_millis(300) };
        let (client, lists) = empty_runtime(d.path(), delay);
        // 4 GiB, 1 MiB in use: memory.available<75% (3 GiB) is not met; the disk's is.
        node_using(d.path(), 1 << 20);
        let args = PolicyArgs {
            eviction_hard: Some(hard.clone()),
            eviction_soft: soft.map(Into::into),
            eviction_soft_grace_period: soft.map(|_| "memory.available=1m".into()),
            ..Default::default()
        };
        let mut p = pressure_with(d.path(), &args, Some(client));
        p.signals.node.meminfo = d.path().join("meminfo");
        let (escalate, rx) = watch::channel(Escalation::default());
        p.escalate = rx;
        let root = d.path().to_path_buf();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if memory_up {
                node_using(&root, 2 << 30);
            }
            let urgency = Urgency::Emergency;
            escalate.send_replace(Escalation { urgency, emergency: Some(EmergencyCause::DirectReclaim) });
            // Kept until the pass is over: a closed channel is no emergency.
            tokio::time::sleep(Duration::from_secs(10)).await;
        });
        let t = Instant::now();
        let (records, _) = p.pass(&list([]), || 1_000_000_000, None, false).await;
        let case = format!("hard {hard}, soft {soft:?}, memory up {memory_up}");
        assert!(records.is_empty(), "{case}: {records:?}");
        assert_eq!(lists.load(std::sync::atomic::Ordering::SeqCst), 1, "{case}: reclaim had begun");
        if cut {
            assert!(t.elapsed() < Duration::from_secs(2), "{case}: the pass waited {:?}", t.elapsed());
            assert_eq!(p.reclaimed_in_vain, None, "{case}: cut short is not in vain: the next pass reclaims");
        } else {
            assert!(t.elapsed() >= delay, "{case}: reclaim was cut at {:?}", t.elapsed());
            assert!(p.reclaimed_in_vain.is_some(), "{case}: reclaim ran to its end");
        }
    }
}

/// The usage files are opened for a new pod list by one job on the reader at a time: a reader
/// stuck in a read (a tenant's FIFO, a hung filesystem) does not pile up a job, and with it a
/// whole pod list, for every list the inventory publishes meanwhile.
#[tokio::test(flavor = "current_thread")]
async fn a_stuck_reader_holds_one_opening_of_the_usage_files_not_one_a_list() {
    let d = tempfile::tempdir().unwrap();
    let mut p = pressure(d.path());
    p.reader = crate::daemon::realtime::Reader::spawn(0);
    let (unblock, blocked) = std::sync::mpsc::channel::<()>();
    p.reader.as_ref().expect("a reader").submit(move || {
        let _ = blocked.recv();
    });
    let lists: Vec<PodList> =
        (0..3).map(|i| list([pod(&format!("p{i}"), Some(&format!("/kubepods/pod-{i}")))])).collect();
    let opened_for = |p: &Pressure| p.usage_files_for.clone();
    p.open_usage_files(&lists[0]);
    assert!(opened_for(&p).is_some_and(|l| Arc::ptr_eq(&l, &lists[0])));
    for l in &lists[1..] {
        p.open_usage_files(l);
    }
    assert!(
        opened_for(&p).is_some_and(|l| Arc::ptr_eq(&l, &lists[0])),
        "a second opening was queued behind the stuck one"
    );
    unblock.send(()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while p.usage_files_following.load(std::sync::atomic::Ordering::Relaxed) {
        assert!(Instant::now() < deadline, "the opening never ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    p.open_usage_files(&lists[2]);
    assert!(
        opened_for(&p).is_some_and(|l| Arc::ptr_eq(&l, &lists[2])),
        "the newest list, once the reader is back"
    );
}

/// One disk pressure, one eviction: an emptyDir's files are freed only when the kubelet tears
/// the evicted pod's volume down, seconds after its stop, so the next disk eviction waits for
/// that teardown (the kubelet's `waitForPodsCleanup`), not just the 2 s settle after which a
/// second pod would go for the same pressure.
#[tokio::test(flavor = "current_thread")]
async fn the_next_disk_eviction_waits_for_the_evicted_pods_volumes_to_be_torn_down() {
    use crate::{runtime::disk_usage::DiskWalker, vocab::WakeCause};
    let d = tempfile::tempdir().unwrap();
    let client = scripted_client(d.path());
    let kubelet = d.path().join("kubelet");
    let made = |name: &str, volume_bytes: usize| pod_with_volume(d.path(), name, volume_bytes);
    let listed = list([made("a", 8 << 20), made("b", 4 << 20)]);
    let (wakes, _woken) = tokio::sync::mpsc::channel(4);
    let walker = DiskWalker::spawn(
        watch::channel(listed.clone()).1,
        kubelet.clone(),
        Duration::from_secs(3600),
        true,
        wakes,
    )
    .unwrap();
    // Any filesystem with something on it has less than 99.99 % available.
    let args = PolicyArgs { eviction_hard: Some("nodefs.available<99.99%".into()), ..Default::default() };
    let mut p = pressure_with(d.path(), &args, Some(client));
    p.signals.nodefs = kubelet.clone();
    p.disk_walker = Some(walker.clone());
    let wake = Some(Wake::now(WakeCause::Timer));
    let mut evicted = Vec::new();
    for s in 1..=10 {
        let (records, _) = p.pass(&listed, || s * 1_000_000_000, wake, false).await;
        evicted.extend(records.iter().map(|r| r.name.clone()));
        if !evicted.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(evicted, ["a"], "the pod using the most disk");
    // The settle after the eviction over; a's volume is still on the disk.
    p.disk_settle = None;
    let (records, _) = p.pass(&listed, || 20_000_000_000, wake, false).await;
    assert_eq!(names(&records), [] as [&str; 0], "a's volume is not torn down yet: {records:?}");
    // The kubelet tears a's volume down; the pressure is still there.
    std::fs::remove_dir_all(kubelet.join("pods/a/volumes/kubernetes.io~empty-dir/scratch")).unwrap();
    p.disk_settle = None;
    let (records, _) = p.pass(&listed, || 21_000_000_000, wake, false).await;
    assert_eq!(names(&records), ["b"], "{records:?}");
}

/// A thread of this process frozen by the v1 freezer (its TID alone moved into a freezer
/// cgroup of the test's own): it does not run until dropped, which thaws it and moves it
/// back. (A frozen thread would also hold the process's exit: the drop runs on a panic too.)
struct FrozenThread {
    tid: String,
    dir: std::path::PathBuf,
    home: std::path::PathBuf,
}

impl FrozenThread {
    #[expect(clippy::disallowed_methods, reason = "waits for the freezer on a test thread")]
    fn freeze(freezer_root: &Path, tid: &str) -> FrozenThread {
        let line = std::fs::read_to_string(format!("/proc/self/task/{tid}/cgroup")).unwrap();
        let home = line.lines().find_map(|l| l.split_once(":freezer:")).map(|(_, p)| p.to_owned()).unwrap();
        let dir = freezer_root.join(format!("evictd-frozen-walk-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let frozen = FrozenThread {
            tid: tid.into(),
            dir: dir.clone(),
            home: freezer_root.join(home.trim_start_matches('/')),
        };
        std::fs::write(dir.join("tasks"), tid).unwrap();
        // Should the test block on something the frozen thread holds, it is thawed anyway,
        // so that the test fails rather than hang (the drop thaws it on a panic; a process
        // ending without the drop would still wait for it: a frozen task ignores SIGKILL).
        let state = dir.join("freezer.state");
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(60));
            let _ = std::fs::write(state, "THAWED");
        });
        std::fs::write(dir.join("freezer.state"), "FROZEN").unwrap();
        let t = Instant::now();
        while std::fs::read_to_string(dir.join("freezer.state")).unwrap().trim() != "FROZEN" {
            assert!(t.elapsed() < Duration::from_secs(5), "the walker thread did not freeze");
            std::thread::sleep(Duration::from_millis(5));
        }
        frozen
    }
}

impl Drop for FrozenThread {
    #[expect(clippy::disallowed_methods, reason = "waits for the kernel to let go of a test cgroup")]
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("freezer.state"), "THAWED");
        let _ = std::fs::write(self.home.join("tasks"), &self.tid);
        let t = Instant::now();
        while std::fs::remove_dir(&self.dir).is_err() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The TID of this process's thread named `name` (one only: the test runs in a process of
/// its own).
fn thread_named(name: &str) -> Option<String> {
    std::fs::read_dir("/proc/self/task").ok()?.flatten().find_map(|t| {
        let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
        (comm.trim() == name).then(|| t.file_name().to_string_lossy().into_owned())
    })
}

use rusty_fork::rusty_fork_test;

rusty_fork_test! {
    /// A walk that does not end (a disk that stopped answering; here, for real, the walker's
    /// thread frozen by the kernel's freezer) gives way, after one walk period, to the last
    /// walk — only where that walk began at most a period before the pressure and measured
    /// every pod the decision may rank; else the wait goes on. (In a process of its own: the
    /// walker's thread is found by its name.)
    #[test]
    fn a_stuck_walk_gives_way_after_a_period_to_a_recent_complete_one() {
        let test = "a_stuck_walk_gives_way_after_a_period_to_a_recent_complete_one";
        let Some(layout) = crate::runtime::kill::tests::layout_or_skip(test) else { return };
        let freezer = layout.memory_root.parent().map(|p| p.join("freezer")).filter(|f| f.join("tasks").exists());
        let Some(freezer) = freezer else {
            crate::skip(test, "no cgroup v1 freezer to hold the walker's thread");
            return;
        };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(stuck_walk(&freezer));
    }
}

/// Passes of `p` on `pods` every 50 ms for `d` (engine time from `*s` seconds on); the pods
/// evicted.
async fn passes_for(p: &mut Pressure, pods: &PodList, d: Duration, s: &mut i64) -> Vec<String> {
    let (mut evicted, t) = (Vec::new(), Instant::now());
    while evicted.is_empty() && t.elapsed() < d {
        tokio::time::sleep(Duration::from_millis(50)).await;
        *s += 1;
        let now = *s * 1_000_000_000;
        let (records, _) = p.pass(pods, || now, Some(Wake::now(crate::vocab::WakeCause::Timer)), false).await;
        evicted.extend(records.iter().map(|r| r.name.clone()));
    }
    evicted
}

async fn stuck_walk(freezer: &Path) {
    let d = tempfile::tempdir().unwrap();
    let client = scripted_client(d.path());
    let kubelet = d.path().join("kubelet");
    let listed = list([pod_with_volume(d.path(), "a", 8 << 20), pod_with_volume(d.path(), "b", 4 << 20)]);
    let period = Duration::from_secs(1);
    let walker = walked(&listed, kubelet.clone(), period).await;
    let _frozen = FrozenThread::freeze(freezer, &thread_named("evictd-disk").expect("the walker's thread"));
    let args = PolicyArgs { eviction_hard: Some("nodefs.available<99.99%".into()), ..Default::default() };
    let pressure = || {
        let mut p = pressure_with(d.path(), &args, Some(client.clone()));
        p.signals.nodefs = kubelet.clone();
        p.disk_walker = Some(walker.clone());
        p
    };
    let mut p = pressure();
    let (t, mut s) = (Instant::now(), 0);
    // The pressure begins after the last walk did: a new one is asked for, and waited for.
    let none = passes_for(&mut p, &listed, period / 2, &mut s).await;
    assert_eq!(none, [] as [&str; 0], "the new walk is waited for, within the period");
    // A pod the last walk did not measure (maybe the one filling the disk) keeps the wait
    // going: ranked without it, a bystander would go.
    let newer =
        list(listed.iter().map(|p| PodRecord::clone(p)).chain([pod_with_volume(d.path(), "c", 1 << 20)]));
    let none = passes_for(&mut p, &newer, period, &mut s).await;
    assert_eq!(none, [] as [&str; 0], "a pod the last walk missed");
    assert!(t.elapsed() > period, "past the period");
    let evicted = passes_for(&mut p, &listed, period, &mut s).await;
    assert_eq!(evicted, ["a"], "the pod using the most disk by the last walk, once every pod is measured");
    // A pressure beginning more than a period after the last walk: that walk is not recent
    // enough to rank on, however long the new one takes.
    let mut later = pressure();
    let none = passes_for(&mut later, &listed, period * 3 / 2, &mut s).await;
    assert_eq!(none, [] as [&str; 0], "a walk from before the period is not ranked on");
}
