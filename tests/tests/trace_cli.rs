//! `evictd --trace --json` as a user runs it: the binary, a test cgroup playing the node,
//! a workload allocating in it, and the JSON Lines contract checked line by line.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    time::Duration,
};

use evictd_tests::{
    MemHog, TestCgroup, api_double::free_port, dies_with_harness, evictd_binary, http_get, privileged,
};

#[test]
fn trace_json_reports_charge_in_the_node_cgroup() {
    if !privileged("trace_json_reports_charge_in_the_node_cgroup") {
        return;
    }
    let cg = TestCgroup::new(Some(1 << 30));
    let mut hog = MemHog::spawn_in(&cg);
    let mut evictd = dies_with_harness(&mut Command::new(evictd_binary()))
        .args(["--trace", "--json", "--bpf-watermark", "16Mi", "--duration", "4s", "--eviction-hard"])
        .arg("memory.available<100Mi")
        .arg("--node-cgroup")
        .arg(&cg.dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting evictd");
    let mut lines = BufReader::new(evictd.stdout.take().expect("stdout")).lines();
    // The first summary line means the probes are attached and armed.
    let first = lines.next().expect("evictd printed nothing").expect("read");
    let first: serde_json::Value = serde_json::from_str(&first).expect("JSON line");
    assert_eq!(first["type"], "summary", "{first}");
    hog.alloc(128);
    std::thread::sleep(Duration::from_millis(200));
    let mut events = Vec::new();
    let mut summaries = 1;
    for line in lines {
        let v: serde_json::Value = serde_json::from_str(&line.expect("read")).expect("every line is JSON");
        match v["type"].as_str() {
            Some("event") => events.push(v),
            Some("summary") => summaries += 1,
            other => panic!("unknown line type {other:?}: {v}"),
        }
    }
    let status = evictd.wait().expect("evictd exit");
    assert!(status.success(), "evictd exited with {status}");
    assert!(summaries >= 3, "one summary a second over 4 s, got {summaries}");
    let ours: Vec<_> =
        events.iter().filter(|e| e["cause"] == "charge" && e["cgroup"] == cg.rel_path()).collect();
    assert!(!ours.is_empty(), "no charge event for {} in {events:?}", cg.rel_path());
    let e = ours[0];
    assert_eq!(e["cgroup_id"], cg.id());
    assert_eq!(e["threshold"], "memory.available<100Mi");
    let avail = e["memory_available_bytes"].as_i64().expect("available is a number");
    assert!(avail > 0 && avail < 1 << 30, "available {avail} must be within the 1 GiB node cgroup");
    assert_eq!(e["threshold_distance_bytes"].as_i64(), Some(avail - (100 << 20)));
}

/// Watching the whole node (no --node-cgroup), charge in any cgroup wakes evictd, whichever
/// charge tier the kernel gives: the memcg tracepoints count every memcg here, and in the
/// VMs the batched hook watches the root's page counter, which every charge reaches through
/// the ancestors (the root itself is never charged directly).
#[test]
fn charge_anywhere_on_the_node_wakes_evictd() {
    if !privileged("charge_anywhere_on_the_node_wakes_evictd") {
        return;
    }
    let cg = TestCgroup::new(None);
    let mut hog = MemHog::spawn_in(&cg);
    let (mut evictd, rx, reader) = evictd_traced(Command::new(evictd_binary()).args([
        "--dry-run",
        "--wake-sources",
        "ebpf",
        "--bpf-watermark",
        "16Mi",
        "--duration",
        "60s",
    ]));
    // The first summary: the programs are loaded and armed (seconds under the VMs' TCG).
    wait_first_summary(&rx, Duration::from_secs(60));
    hog.alloc(128);
    let until = std::time::Instant::now() + evictd_tests::patience::patience(Duration::from_secs(10));
    let mut ours = None;
    while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(v) if v["type"] == "event" && v["cause"] == "charge" && v["cgroup"] == cg.rel_path() => {
                ours = Some(v);
                break;
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    let _ = evictd.kill();
    let _ = evictd.wait();
    let _ = reader.join();
    drop(hog);
    let e = ours.unwrap_or_else(|| panic!("no charge event naming {} for 128 MiB", cg.rel_path()));
    assert_eq!(e["cgroup_id"], cg.id());
    assert!(e["amount_bytes"].as_i64().is_some_and(|b| b > 0), "{e}");
}

/// The summary line shows memory.available as read that second, and the tuning view names
/// the cgroup that grew. With no wake at all (only a timer that never fires), a workload
/// growing by 256 MiB in a child of the node cgroup must show in both.
#[test]
fn the_summary_shows_memory_as_read_that_second() {
    if !privileged("the_summary_shows_memory_as_read_that_second") {
        return;
    }
    let node = TestCgroup::new(Some(1 << 30));
    let grower = node.child("grower");
    let mut hog = MemHog::spawn_in(&grower);
    let (mut evictd, rx, reader) =
        evictd_on(&node, &["--wake-sources", "disk", "--housekeeping-interval", "1h", "--duration", "60s"]);
    let is_summary = |v: &serde_json::Value| v["type"] == "summary";
    let next_summary = || loop {
        let v = rx.recv_timeout(Duration::from_secs(60)).expect("evictd stopped early");
        if is_summary(&v) {
            return v;
        }
    };
    let available =
        |v: &serde_json::Value| v["memory_available_bytes"].as_i64().expect("memory.available is read");
    let before = available(&next_summary());
    hog.alloc(256);
    // Summaries that came while the workload allocated (several under the VM matrix's TCG),
    // then two whole seconds after it.
    let mut summaries: Vec<serde_json::Value> = rx.try_iter().filter(|v| is_summary(v)).collect();
    let (a, b) = (next_summary(), next_summary());
    let _ = evictd.kill();
    let _ = evictd.wait();
    let _ = reader.join();
    drop(hog);
    let after = available(&a).min(available(&b));
    assert!(before - after >= 200 << 20, "summary must follow the node: {before} → {after}");
    summaries.extend([a, b]);
    let grew: Vec<&serde_json::Value> =
        summaries.iter().flat_map(|s| s["top_growth"].as_array().into_iter().flatten()).collect();
    let grower_bytes: i64 =
        grew.iter().filter(|g| g["cgroup"] == "/grower").filter_map(|g| g["bytes"].as_i64()).sum();
    assert!(grower_bytes >= 200 << 20, "the tuning view must name /grower for its 256 MiB: {grew:?}");
}

/// `evictd --trace --json` on `node` with `memory.available<100Mi`, no runtime, and `args`.
fn evictd_on(node: &TestCgroup, args: &[&str]) -> Traced {
    let mut cmd = Command::new(evictd_binary());
    cmd.args(["--eviction-hard", "memory.available<100Mi"]).args(args).arg("--node-cgroup").arg(&node.dir);
    evictd_traced(&mut cmd)
}

/// A running `evictd --trace --json`, the receiver of its parsed lines, and their reader.
type Traced =
    (std::process::Child, std::sync::mpsc::Receiver<serde_json::Value>, std::thread::JoinHandle<()>);

/// Waits for evictd's first line, which must be its first summary (it is loaded and armed).
fn wait_first_summary(rx: &std::sync::mpsc::Receiver<serde_json::Value>, within: Duration) {
    let first = rx.recv_timeout(evictd_tests::patience::patience(within)).expect("evictd printed nothing");
    assert_eq!(first["type"], "summary", "{first}");
}

/// `cmd` (an evictd command) with `--trace --json` and no runtime, started as the harness's
/// child; its stdout read line by line on a thread of its own.
fn evictd_traced(cmd: &mut Command) -> Traced {
    let mut evictd = dies_with_harness(cmd.args(["--trace", "--json", "--cri-endpoint", "none"]))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting evictd");
    let (tx, rx) = std::sync::mpsc::channel::<serde_json::Value>();
    let stdout = evictd.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let v: serde_json::Value = serde_json::from_str(&line).expect("JSON line");
            if tx.send(v).is_err() {
                return;
            }
        }
    });
    (evictd, rx, reader)
}

/// The adaptive poll alone (no kernel source, the timer an hour away) wakes evictd once
/// usage passes half the distance to the threshold, not before, and again and again, in
/// smaller steps, until a pass sees the threshold crossed.
#[test]
fn the_adaptive_poll_alone_wakes_at_half_the_distance_until_the_crossing() {
    if !privileged("the_adaptive_poll_alone_wakes_at_half_the_distance_until_the_crossing") {
        return;
    }
    let node = TestCgroup::new(Some(1 << 30));
    let mut hog = MemHog::spawn_in(&node);
    let (mut evictd, rx, reader) =
        evictd_on(&node, &["--wake-sources", "poll", "--housekeeping-interval", "1h", "--duration", "60s"]);
    let polls_within = |d: Duration| -> Vec<serde_json::Value> {
        let until = std::time::Instant::now() + d;
        let mut got = Vec::new();
        while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
            match rx.recv_timeout(left) {
                Ok(v) if v["type"] == "event" && v["cause"] == "poll" => got.push(v),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        got
    };
    // Armed after the first pass: the level is half of the ~924 MiB to the threshold away.
    wait_first_summary(&rx, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(300));
    let _ = polls_within(Duration::from_millis(100));
    hog.alloc(128);
    let early = polls_within(Duration::from_millis(500));
    assert!(early.is_empty(), "128 MiB is below half the distance, yet the poll woke evictd: {early:?}");
    hog.alloc(400);
    let half = polls_within(Duration::from_millis(500));
    assert!(!half.is_empty(), "528 MiB is past half the distance, and the poll did not wake evictd");
    // The last ~400 MiB in steps, each given time for a poll: the steps down to the crossing
    // are then seen however fast the allocation or slow the machine (the VM matrix runs
    // this under QEMU's TCG).
    let mut near = Vec::new();
    for _ in 0..6 {
        hog.alloc(70);
        near.extend(polls_within(Duration::from_millis(300)));
    }
    let _ = evictd.kill();
    let _ = evictd.wait();
    drop(hog);
    let _ = reader.join();
    let distance = |v: &serde_json::Value| v["threshold_distance_bytes"].as_i64().expect("distance read");
    assert!(
        near.len() >= 2,
        "approaching the threshold, the poll wakes again in smaller steps; got {} wakes",
        near.len()
    );
    assert!(
        near.iter().any(|v| distance(v) < 0),
        "a poll wake must see the threshold crossed: distances {:?}",
        near.iter().map(distance).collect::<Vec<_>>()
    );
}

/// Within twice the watermark's 1 MiB floor of a threshold, the poll's level is the whole
/// distance, so the wake lands on the threshold: the node approaching in 128 KiB steps, each
/// followed by a timer pass that re-arms the poll where memory then is, is seen crossed by a
/// poll wake within two steps and one charge batch of the threshold (the kernel charges a
/// cgroup's counter 64 pages at a time per CPU, so its usage moves in 256 KiB steps). With a
/// level of the floor past every pass, no step after the last pass reaches it, and only the
/// timer sees the crossing.
#[test]
fn near_a_threshold_the_poll_wakes_on_it_not_a_floor_past_it() {
    wakes_on_the_threshold("near_a_threshold_the_poll_wakes_on_it_not_a_floor_past_it", "poll", "poll", 128);
}

/// The same for the eBPF charge programs, whose watermark is the poll's step, in steps of
/// two charge batches (the kernel charges a counter 64 pages at a time per CPU, and the
/// batched hook of kernels with BPF trampolines sees only those).
#[test]
fn near_a_threshold_the_charge_programs_wake_on_it_not_a_floor_past_it() {
    wakes_on_the_threshold(
        "near_a_threshold_the_charge_programs_wake_on_it_not_a_floor_past_it",
        "ebpf",
        "charge",
        512,
    );
}

/// The node approaching the threshold in steps of `step_kib`, a timer pass after each: some
/// wake of `source` (its `cause`) must see the threshold crossed, by at most two steps and a
/// batch. A timer pass can come between the crossing step and the source's wake (its read,
/// or its ring buffer's delivery, under QEMU's TCG milliseconds), see the crossing first and
/// re-arm at the floor: then the approach is made once more, with a new workload. The
/// memcg stat tracepoints count pages put to use, and the kernel charges usage a 64-page
/// batch ahead of them: a charge wake on the threshold or less than a batch above it, whose
/// step's last batch then crossed it with pages not yet used, lands where it must (the
/// timer sees the rest). On the old rule, a floor of 1 MiB re-armed by a timer pass after
/// every step of 512 KiB, no charge wake comes at all, and every approach fails.
fn wakes_on_the_threshold(test: &str, source: &str, cause: &str, step_kib: usize) {
    if !privileged(test) {
        return;
    }
    let node = TestCgroup::new(Some(1 << 30));
    let sources = format!("{source},timer");
    let (mut evictd, rx, reader) = evictd_on(
        &node,
        &["--wake-sources", &sources, "--housekeeping-interval", "150ms", "--duration", "180s"],
    );
    // The first summary: evictd has loaded its programs (seconds in the VM matrix's TCG).
    wait_first_summary(&rx, Duration::from_secs(60));
    // The passes' lines for `d`: (cause, distance to the threshold).
    let passes_for = |d: Duration| -> Vec<(String, i64)> {
        let until = std::time::Instant::now() + d;
        let mut got = Vec::new();
        while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
            match rx.recv_timeout(left) {
                Ok(v) if v["type"] == "event" => {
                    let distance = v["threshold_distance_bytes"].as_i64().expect("distance read");
                    got.push((v["cause"].as_str().unwrap_or_default().to_owned(), distance));
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        got
    };
    let within = -((2 * step_kib + 256) as i64) << 10;
    let mut attempts = Vec::new();
    for _ in 0..2 {
        let mut hog = MemHog::spawn_in(&node);
        // Steps of exactly what is allocated: a khugepaged collapse of the hog's small pages
        // would read as a 2 MiB spike past the threshold, and back.
        hog.no_huge_pages();
        let last_distance =
            passes_for(Duration::from_millis(500)).last().map(|(_, d)| *d).expect("a timer pass");
        // To a few MiB from the threshold, then the steps.
        hog.alloc(usize::try_from(last_distance >> 20).expect("below the threshold") - 3);
        let _ = passes_for(Duration::from_millis(500));
        let mut seen = Vec::new();
        for _ in 0..(6 << 10) / step_kib {
            hog.alloc_kib(step_kib);
            // At least one timer pass after each step, which re-arms where memory then is
            // (a stalled timer would let two steps add up against one arming).
            let step_began = seen.len();
            let until = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                seen.extend(passes_for(Duration::from_millis(400)));
                if seen[step_began..].iter().any(|(c, _)| c == "timer") {
                    break;
                }
                assert!(std::time::Instant::now() < until, "no timer pass within 10 s of a step: {seen:?}");
            }
            if seen.iter().any(|(_, d)| *d < 0) {
                break;
            }
        }
        drop(hog);
        let crossed: Vec<&(String, i64)> = seen.iter().filter(|(_, d)| *d < 0).collect();
        assert!(!crossed.is_empty(), "6 MiB of steps and no pass saw the threshold crossed: {seen:?}");
        // The poll reads usage itself: its wake must see the crossing.
        let precharge: i64 = if cause == "charge" { 256 << 10 } else { 0 };
        if seen.iter().any(|(c, d)| c == cause && (within..precharge).contains(d)) {
            attempts.clear();
            break;
        }
        attempts.push(seen.into_iter().filter(|(_, d)| *d < 4 << 20).collect::<Vec<_>>());
    }
    let _ = evictd.kill();
    let _ = evictd.wait();
    let _ = reader.join();
    assert!(
        attempts.is_empty(),
        "no {cause} wake landed on the threshold (crossed by at most two {step_kib} KiB steps and a charge \
         batch, or for charge wakes less than a batch above it), in two approaches; the passes near it (cause, \
         distance): {attempts:?}"
    );
}

/// With the poll running, the eBPF charge programs are attached only within the band below
/// the threshold (here 1 GiB/s × 120 ms ≈ 123 MiB; detached beyond twice that): detached far
/// away — growth there sends no charge event —, attached near, where charge events flow,
/// and detached again once memory is back far away. The memcg tracepoint tier is forced:
/// kernels with BPF trampolines (Debian's 7.x in the VM matrix) would otherwise use the
/// batched hook, which is not moved.
#[test]
fn charge_probes_are_attached_only_near_a_threshold() {
    if !privileged("charge_probes_are_attached_only_near_a_threshold") {
        return;
    }
    let node = TestCgroup::new(Some(1 << 30));
    let mut hog = MemHog::spawn_in(&node);
    let (mut evictd, rx, reader) = evictd_on(
        &node,
        &[
            "--wake-sources",
            "ebpf,poll,timer",
            "--poll-fill-rate",
            "1Gi",
            "--housekeeping-interval",
            "300ms",
            "--bpf-watermark",
            "8Mi",
            "--charge-tier",
            "memcg-tracepoints",
            "--duration",
            "60s",
        ],
    );
    // The first summary: evictd has loaded its programs (seconds in the VM matrix's TCG).
    wait_first_summary(&rx, Duration::from_secs(60));
    // Lines for `d`: the charge events, and the last summary's attached state.
    let lines_for = |d: Duration| -> (usize, Option<bool>) {
        let until = std::time::Instant::now() + d;
        let (mut charges, mut attached) = (0, None);
        while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
            match rx.recv_timeout(left) {
                Ok(v) if v["type"] == "event" && v["cause"] == "charge" => charges += 1,
                Ok(v) if v["type"] == "summary" => attached = v["charge_probes_attached"].as_bool(),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        (charges, attached)
    };
    let (_, far) = lines_for(Duration::from_millis(1500));
    assert_eq!(far, Some(false), "~924 MiB from the threshold, the charge programs must be detached");
    hog.alloc(128);
    let (charges, _) = lines_for(Duration::from_millis(500));
    assert_eq!(charges, 0, "detached programs sent charge events");
    hog.alloc(720);
    // The band is entered at the next reading (1 ms – 1 s away); on a loaded machine the
    // summary that shows it may come a little later: up to 3 s of summaries.
    let near = (0..3).map(|_| lines_for(Duration::from_millis(1000)).1).find(|a| *a == Some(true)).flatten();
    assert_eq!(near, Some(true), "~76 MiB from the threshold, the charge programs must be attached");
    hog.alloc(16);
    let (charges, _) = lines_for(Duration::from_millis(500));
    assert!(charges > 0, "attached programs sent no charge event for 16 MiB of growth");
    drop(hog);
    let (_, after) = lines_for(Duration::from_millis(1500));
    // Ours, by PID: the test has seen what it needs (--duration is only a safety net).
    let _ = evictd.kill();
    let _ = evictd.wait();
    let _ = reader.join();
    assert_eq!(after, Some(false), "memory back far away, the charge programs must be detached again");
}

/// SIGHUP reads the `--config` file again. A new threshold is in force at once (the metrics
/// show it), and one the emergency level reaches is warned of as at the start; a file that no
/// longer reads leaves the policy in force and says why; the daemon keeps running throughout.
#[test]
fn sighup_reads_the_policy_again_and_keeps_it_when_the_file_is_bad() {
    if !privileged("sighup_reads_the_policy_again_and_keeps_it_when_the_file_is_bad") {
        return;
    }
    let cg = TestCgroup::new(Some(1 << 30));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kubelet-config.yaml");
    let write = |hard: &str| {
        let text = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionHard:\n  memory.available: \"{hard}\"\n"
        );
        std::fs::write(&config, text).unwrap();
    };
    write("300Mi");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut evictd = dies_with_harness(&mut Command::new(evictd_binary()))
        .args(["--dry-run", "--cri-endpoint", "none", "--duration", "120s", "--metrics-addr", &addr])
        .args(["--emergency-available", "200Mi"])
        .arg("--config")
        .arg(&config)
        .arg("--node-cgroup")
        .arg(&cg.dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting evictd");
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let stderr = evictd.stderr.take().expect("stderr");
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            sink.lock().unwrap().push_str(&(line + "\n"));
        }
    });
    let threshold = |bytes: u64| {
        format!(
            "evictd_eviction_threshold_bytes{{eviction_signal=\"memory.available\",threshold=\"hard\"}} {bytes}\n"
        )
    };
    let wait_metrics = |want: &str| {
        let t = std::time::Instant::now();
        loop {
            let m = std::net::TcpStream::connect(&addr).is_ok().then(|| http_get(&addr, "/metrics"));
            if m.as_deref().is_some_and(|m| m.contains(want)) {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "never saw {want}: {m:?}\n{}",
                log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let hup = || {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(evictd.id() as i32),
            nix::sys::signal::Signal::SIGHUP,
        )
        .unwrap()
    };
    // The emergency level reaches the new threshold: said when the policy comes in force.
    let reached = "is at or above the threshold memory.available<100Mi";
    wait_metrics(&threshold(300 << 20));
    assert!(!log.lock().unwrap().contains(reached), "{}", log.lock().unwrap());
    write("100Mi");
    hup();
    wait_metrics(&threshold(100 << 20));
    let t = std::time::Instant::now();
    while !log.lock().unwrap().contains(reached) {
        assert!(t.elapsed() < Duration::from_secs(30), "no word of the level:\n{}", log.lock().unwrap());
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::write(&config, "evictionHard: [not, a, map\n").unwrap();
    hup();
    let t = std::time::Instant::now();
    while !log.lock().unwrap().contains("the policy does not read") {
        assert!(t.elapsed() < Duration::from_secs(30), "no word of the bad file:\n{}", log.lock().unwrap());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(http_get(&addr, "/metrics").contains(&threshold(100 << 20)), "the policy in force stays");
    assert!(evictd.try_wait().unwrap().is_none(), "evictd keeps running:\n{}", log.lock().unwrap());
    let _ = evictd.kill();
    let _ = evictd.wait();
}

/// The disk poll alone (no timer for an hour) sees a nodefs threshold crossed within
/// moments, not at the next housekeeping tick; wakes nobody while the filesystem is above
/// it; while it stays met looks again about once a second (not back to back), and no more
/// once the space is back. (The transition period is 1 s: with 0 the kubelet, and so
/// evictd, never reports a condition at all.)
#[test]
fn the_disk_poll_alone_sees_a_nodefs_threshold_crossed() {
    if !privileged("the_disk_poll_alone_sees_a_nodefs_threshold_crossed") {
        return;
    }
    let fs = evictd_tests::TestTmpfs::new(64 << 20);
    let mut cmd = Command::new(evictd_binary());
    cmd.args(["--eviction-hard", "nodefs.available<16Mi", "--eviction-pressure-transition-period", "1s"])
        .args(["--wake-sources", "disk", "--housekeeping-interval", "1h", "--duration", "60s"])
        .arg("--nodefs-path")
        .arg(&fs.dir)
        .arg("--imagefs-path")
        .arg(&fs.dir);
    let (mut evictd, rx, reader) = evictd_traced(&mut cmd);
    let lines_within = |d: Duration, kind: &str| -> Vec<serde_json::Value> {
        let until = std::time::Instant::now() + d;
        let mut got = Vec::new();
        while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
            match rx.recv_timeout(left) {
                Ok(v) if v["type"] == kind => got.push(v),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        got
    };
    wait_first_summary(&rx, Duration::from_secs(10));
    fs.append("ballast", 40 << 20);
    let early = lines_within(Duration::from_millis(1500), "event");
    assert!(early.is_empty(), "~24 MiB left is above the 16 MiB threshold, yet a pass was woken: {early:?}");
    fs.append("fill", 10 << 20);
    let crossed = std::time::Instant::now();
    let on = lines_within(Duration::from_secs(3), "condition");
    let seen = crossed.elapsed();
    assert!(
        on.iter().any(|c| c["condition"] == "DiskPressure" && c["status"] == true),
        "~14 MiB left: DiskPressure must be seen without the timer; got {on:?}"
    );
    // The other lines of those 3 s are gone; the re-checks while the pressure stays:
    let rechecks = lines_within(Duration::from_millis(2500), "event");
    assert!(
        (1..=4).contains(&rechecks.len()) && rechecks.iter().all(|e| e["cause"] == "disk"),
        "while the threshold stays met, a look about once a second: {rechecks:?}"
    );
    fs.remove("fill");
    let _ = lines_within(Duration::from_millis(1200), "event");
    let after = lines_within(Duration::from_secs(2), "event");
    let _ = evictd.kill();
    let _ = evictd.wait();
    let _ = reader.join();
    assert!(after.is_empty(), "the space back, the disk poll must wake nobody: {after:?}");
    eprintln!("disk poll: DiskPressure reported within {seen:?} of the write that crossed");
}

/// A node full of page cache: anonymous memory displacing the cache leaves usage flat at the
/// limit while the working set (usage less the inactive file pages, what memory.available
/// subtracts) climbs to the threshold. evictd sees the crossing within the same window as
/// each step of growth without cache would give it, without the timer (an hour away): with
/// every wake source (the kernel's reclaim of the cache wakes it; the batched hook compares
/// usage, which does not move here)...
#[test]
fn anonymous_memory_displacing_page_cache_wakes_at_the_working_set_crossing() {
    displacing_page_cache_wakes(
        "anonymous_memory_displacing_page_cache_wakes_at_the_working_set_crossing",
        &[],
    );
}

/// ...and with the adaptive poll alone, as on a node whose cache is reclaimed by kswapd, which
/// no reclaim tracepoint of evictd's sees: the poll's level is a working set, not a usage.
#[test]
fn the_poll_alone_sees_anonymous_memory_displacing_page_cache() {
    displacing_page_cache_wakes(
        "the_poll_alone_sees_anonymous_memory_displacing_page_cache",
        &["--wake-sources", "poll"],
    );
}

fn displacing_page_cache_wakes(test: &str, args: &[&str]) {
    const MIB: u64 = 1 << 20;
    if !privileged(test) {
        return;
    }
    let Some(dir) = evictd_tests::page_cache_dir(test) else { return };
    let limit = 512 * MIB;
    let node = TestCgroup::new(Some(limit));
    no_swap(&node);
    let mut hog = MemHog::spawn_in(&node);
    hog.cache(448, &dir.path().join("cache"));
    let memory = evictd::node::memory::MemoryCgroup::new(&node.dir, node.layout.memory_version, false);
    let working_set = || memory.read().expect("the node cgroup's memory").working_set();
    let before = memory.read().expect("the node cgroup's memory");
    assert!(
        before.usage >= 400 * MIB && before.working_set() < 200 * MIB,
        "the cache must fill the node without being working set: {before:?}"
    );
    let args = [&["--housekeeping-interval", "1h", "--duration", "120s"], args].concat();
    let (mut evictd, rx, reader) = evictd_on(&node, &args);
    // Loaded and armed at its first summary (a wake of the cache's reclaim may come first).
    let armed = std::time::Instant::now() + evictd_tests::patience::patience(Duration::from_secs(10));
    while rx.recv_timeout(armed.saturating_duration_since(std::time::Instant::now())).expect("no summary")["type"]
        != "summary"
    {}
    // The crossing: memory.available (limit − working set) below 100 MiB.
    let crossing = limit - 100 * MIB;
    let window = evictd_tests::patience::patience(Duration::from_secs(1));
    let crossed_seen = |rx: &std::sync::mpsc::Receiver<serde_json::Value>, within: Duration| {
        let until = std::time::Instant::now() + within;
        while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
            match rx.recv_timeout(left) {
                Ok(v)
                    if v["type"] == "event"
                        && v["threshold_distance_bytes"].as_i64().is_some_and(|d| d < 0) =>
                {
                    return Some(v);
                }
                Ok(_) => {}
                Err(_) => return None,
            }
        }
        None
    };
    let mut steps = Vec::new();
    let mut seen = None;
    for _ in 0..40 {
        hog.alloc(16);
        let usage = memory.read().expect("the node cgroup's memory").usage;
        let ws = working_set();
        steps.push((usage / MIB, ws / MIB));
        // evictd may read the crossing before this test does: that counts.
        let within = if ws > crossing { window } else { Duration::from_millis(50) };
        seen = crossed_seen(&rx, within);
        if seen.is_some() || ws > crossing {
            break;
        }
    }
    let _ = evictd.kill();
    let _ = evictd.wait();
    drop(hog);
    let _ = reader.join();
    let (usage, ws) = *steps.last().expect("a step");
    assert!(
        seen.is_some() || ws > crossing / MIB,
        "the working set never crossed; steps (usage, working set MiB): {steps:?}"
    );
    assert!(
        seen.is_some(),
        "the working set crossed ({ws} MiB of {} MiB, usage {usage} MiB) and evictd did not see it \
         within {window:?}; steps (usage, working set MiB): {steps:?}",
        limit / MIB
    );
}

/// Anonymous memory of the cgroup is never swapped out: reclaim must take the page cache.
fn no_swap(cg: &TestCgroup) {
    let (file, value) = match cg.layout.memory_version {
        evictd::node::cgroups::CgroupVersion::V1 => ("memory.swappiness", "0"),
        evictd::node::cgroups::CgroupVersion::V2 => ("memory.swap.max", "0"),
    };
    // Absent without swap accounting: the machine's own swappiness holds then.
    let path = cg.dir.join(file);
    if path.exists() {
        std::fs::write(&path, value).unwrap_or_else(|e| panic!("writing {value} to {}: {e}", path.display()));
    }
}

/// Output nobody reads holds no decision: a log pipe behind a full disk (the runtime's shim
/// writes evictd's stderr to a file), a paused pager on `--trace`. With both pipes a page
/// each and a writer of each waiting in write(2), the node crossing its threshold still gets
/// its pass: the node condition turns on in the metrics. Stopped, it still exits.
#[test]
fn output_nobody_reads_holds_no_decision() {
    const MIB: u64 = 1 << 20;
    if !privileged("output_nobody_reads_holds_no_decision") {
        return;
    }
    let limit = 512 * MIB;
    let node = TestCgroup::new(Some(limit));
    no_swap(&node);
    let mut hog = MemHog::spawn_in(&node);
    let (stdout, stdout_w) = small_pipe();
    let (stderr, stderr_w) = small_pipe();
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut evictd = dies_with_harness(&mut Command::new(evictd_binary()))
        .args(["--trace", "--json", "--cri-endpoint", "none", "--dry-run", "--duration", "120s"])
        .args(["--eviction-hard", "memory.available<100Mi", "--metrics-addr", &metrics])
        .arg("--node-cgroup")
        .arg(&node.dir)
        .env("RUST_LOG", "debug")
        .stdout(Stdio::from(stdout_w))
        .stderr(Stdio::from(stderr_w))
        .spawn()
        .expect("starting evictd");
    let pid = evictd.id();
    let stalled = |fd: u64| writing_to(pid, fd);
    let until = std::time::Instant::now() + evictd_tests::patience::patience(Duration::from_secs(30));
    while !(stalled(1) && stalled(2)) && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    let waiting = (stalled(1), stalled(2));
    let condition = "evictd_node_condition{condition=\"MemoryPressure\"} 1";
    let mut seen = false;
    if waiting.0 || waiting.1 {
        hog.alloc(448);
        let until = std::time::Instant::now() + evictd_tests::patience::patience(Duration::from_secs(10));
        while !seen && std::time::Instant::now() < until {
            seen =
                evictd_tests::try_http_get(&metrics, "/metrics").is_ok_and(|text| text.contains(condition));
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // Stopped, it exits though neither pipe takes its last lines.
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
    let until = std::time::Instant::now() + evictd_tests::patience::patience(Duration::from_secs(10));
    let mut exited = None;
    while exited.is_none() && std::time::Instant::now() < until {
        exited = evictd.try_wait().expect("evictd's status");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = evictd.kill();
    let _ = evictd.wait();
    drop(hog);
    drop((stdout, stderr));
    assert!(
        seen,
        "no pass saw the crossing while the output was stalled (writers waiting on stdout, stderr: {waiting:?})"
    );
    assert!(exited.is_some(), "evictd did not exit on SIGTERM with its output stalled");
    assert!(
        waiting == (true, true),
        "evictd never waited on both of its pipes (stdout, stderr: {waiting:?})"
    );
}

/// A pipe of one page, Linux's smallest: (read end, write end). The read end is kept and
/// never read.
fn small_pipe() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    let (r, w) = nix::unistd::pipe().expect("a pipe");
    nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(4096)).expect("F_SETPIPE_SZ");
    (r, w)
}

/// Whether a thread of `pid` waits in write(2) on its descriptor `fd`.
fn writing_to(pid: u32, fd: u64) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.flatten().any(|t| {
        // "<syscall number> <first argument> ...", hexadecimal arguments.
        let call = std::fs::read_to_string(t.path().join("syscall")).unwrap_or_default();
        let mut words = call.split_whitespace();
        words.next() == Some(&libc::SYS_write.to_string())
            && words.next().and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok()) == Some(fd)
    })
}

/// A fixed emergency level at or above a memory threshold makes each eviction on it a kill
/// that waits for nothing: the start names the threshold, and is silent where the level is
/// below every one.
#[test]
fn a_fixed_emergency_level_above_a_threshold_is_warned_of_at_the_start() {
    if !privileged("a_fixed_emergency_level_above_a_threshold_is_warned_of_at_the_start") {
        return;
    }
    let node = TestCgroup::new(Some(1 << 30));
    let start = |level: &str| {
        let out = dies_with_harness(&mut Command::new(evictd_binary()))
            .args(["--cri-endpoint", "none", "--no-kube-api", "--dry-run", "--duration", "2s"])
            .args(["--eviction-hard", "memory.available<100Mi", "--eviction-soft", "memory.available<300Mi"])
            .args(["--eviction-soft-grace-period", "memory.available=10s", "--emergency-available", level])
            .arg("--node-cgroup")
            .arg(&node.dir)
            .stdout(Stdio::null())
            .output()
            .expect("running evictd");
        assert!(
            out.status.success(),
            "evictd exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let warned =
        |log: &str, t: &str| log.lines().any(|l| l.contains(&format!("is at or above the threshold {t}")));
    let log = start("200Mi");
    assert!(warned(&log, "memory.available<100Mi"), "{log}");
    assert!(!warned(&log, "memory.available<300Mi"), "{log}");
    let log = start("50Mi");
    assert!(!log.contains("is at or above the threshold"), "{log}");
}
