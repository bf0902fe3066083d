//! `--kubelet-config auto` against a kubelet process on this host: evictd finds it in /proc,
//! reads its command line, and reads its files through its root and working directory.
//!
//! The kubelet is a stand-in (`evictd-kubelet-stand-in`, copied to a file named `kubelet`):
//! no kubelet can run here without an API server, and evictd reads nothing of the kubelet
//! but its process. Its command line is a real node's (kubeadm's flags, EKS's drop-in
//! directory). One test runs every case, one kubelet at a time: a second kubelet on the host
//! is itself a case (evictd refuses to choose).

use std::{
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use evictd_tests::{
    TestCgroup, api_double::free_port, dies_with_harness, evictd_binary, http_get,
    kubelet_stand_in::StandInKubelet, privileged, skip,
};
use serde_json::Value;

fn evictd(args: &[&str]) -> Output {
    Command::new(evictd_binary()).args(args).output().expect("running evictd")
}

fn check_config_json(extra: &[&str]) -> Value {
    let mut args = vec!["check-config", "--kubelet-config", "auto", "--output", "json"];
    args.extend(extra);
    let o = evictd(&args);
    assert!(o.status.success(), "check-config failed: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("check-config's JSON")
}

const CONF: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

#[test]
fn kubelet_config_auto_reads_what_the_running_kubelet_enforces() {
    let d = tempfile::tempdir().unwrap();
    let (etc, work) = (d.path().join("etc"), d.path().join("work"));
    std::fs::create_dir_all(work.join("config.d")).unwrap();
    std::fs::create_dir_all(&etc).unwrap();
    let main = etc.join("config.yaml");
    std::fs::write(
        &main,
        format!(
            "{CONF}cgroupDriver: systemd\nmergeDefaultEvictionSettings: true\nevictionHard:\n  memory.available: 500Mi\n\
             evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: 1m\n"
        ),
    )
    .unwrap();
    std::fs::write(
        work.join("config.d/10-nodeadm.conf"),
        format!("{CONF}evictionHard:\n  nodefs.available: 12%\n"),
    )
    .unwrap();
    let main_arg = format!("--config={}", main.display());
    if !privileged("kubelet_config_auto_reads_what_the_running_kubelet_enforces") {
        return;
    }
    // A host that runs a real kubelet cannot show what evictd does without one, nor with two.
    let host_kubelet = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "kubelet"));
    if host_kubelet {
        let test = "kubelet_config_auto_reads_what_the_running_kubelet_enforces";
        return skip(
            test,
            "a kubelet runs on this host: the cases without one, and with two, cannot be shown",
        );
    }
    // Without a kubelet: an error that says what to do instead.
    let o = evictd(&["check-config", "--kubelet-config", "auto"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("no kubelet process") && err.contains("--config"), "{err}");
    // A process named kubelet in a pod's cgroup (as a tenant's, with hostPID) is not the
    // node's kubelet: it is named, and not read.
    let cg = TestCgroup::new(None);
    let pods = cg.child("kubepods");
    let tenant = StandInKubelet::start(d.path(), &work, &["--config=/tenant/config.yaml"]);
    pods.add_pid(tenant.pid());
    let o = evictd(&["check-config", "--kubelet-config", "auto"]);
    let err = String::from_utf8_lossy(&o.stderr);
    let said = format!("PID {} (in a pod's cgroup", tenant.pid());
    assert!(!o.status.success() && err.contains("no kubelet process") && err.contains(&said), "{err}");

    // kubeadm's and EKS's forms: `--flag=value`, `--flag value`, a relative --config-dir
    // (the kubelet's working directory), flags evictd does not read, map flags repeated.
    let kubelet = StandInKubelet::start(
        d.path(),
        &work,
        &[
            "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
            "--kubeconfig",
            "/etc/kubernetes/kubelet.conf",
            &main_arg,
            "--config-dir",
            "config.d",
            "--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
            "--v=2",
            "--eviction-pressure-transition-period",
            "45s",
        ],
    );
    let pid = kubelet.pid();
    let v = check_config_json(&[]);
    let values = &v["values"];
    let from = |k: &str| values[k]["from"].as_str().unwrap_or_else(|| panic!("{k} in {values}")).to_owned();
    let value = |k: &str| values[k]["value"].as_str().unwrap().to_owned();
    assert_eq!(value("evictionHard[memory.available]"), "500Mi");
    assert!(from("evictionHard[memory.available]").ends_with("etc/config.yaml"), "{values}");
    assert_eq!(value("evictionHard[nodefs.available]"), "12%");
    assert!(from("evictionHard[nodefs.available]").ends_with("10-nodeadm.conf"), "{values}");
    assert!(
        from("evictionHard[nodefs.available]").starts_with(&format!("/proc/{pid}/cwd/")),
        "the relative --config-dir is the kubelet's working directory's: {values}"
    );
    assert_eq!(from("evictionHard[imagefs.available]"), "default", "mergeDefaultEvictionSettings: {values}");
    assert_eq!(value("evictionSoftGracePeriod[memory.available]"), "1m0s");
    assert_eq!(value("evictionPressureTransitionPeriod"), "45s");
    assert_eq!(
        from("evictionPressureTransitionPeriod"),
        format!("flag --eviction-pressure-transition-period of the kubelet (PID {pid})")
    );

    // evictd's own flags still override the kubelet's, and say so.
    let v = check_config_json(&["--eviction-hard", "memory.available<1Gi"]);
    assert_eq!(v["values"]["evictionHard[memory.available]"]["from"], "flag --eviction-hard");
    assert!(v["values"].get("evictionHard[nodefs.available]").is_none(), "a map flag replaces the map");

    // The table: each value with where it came from.
    let o = evictd(&["check-config", "--kubelet-config", "auto"]);
    let table = String::from_utf8_lossy(&o.stdout);
    let line = table.lines().find(|l| l.starts_with("evictionHard[nodefs.available]")).unwrap_or("");
    assert!(line.contains("12%") && line.ends_with("10-nodeadm.conf"), "{table}");

    // A second kubelet: evictd does not choose.
    let other = StandInKubelet::start(d.path(), &work, &["--config=/nonexistent.yaml"]);
    let o = evictd(&["check-config", "--kubelet-config", "auto"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("2 kubelet processes"), "{err}");
    drop(other);

    // The tenant's "kubelet" is still running: it neither counts nor is read.
    drop(tenant);
    drop(pods);
    // A kubelet whose file evictd cannot read: the error names the file; no policy.
    drop(kubelet);
    let gone = StandInKubelet::start(d.path(), &work, &["--config", "/nonexistent/kubelet.yaml"]);
    let o = evictd(&["check-config", "--kubelet-config", "auto"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("/nonexistent/kubelet.yaml"), "{err}");
    drop(gone);

    // The daemon enforces the kubelet's policy, and after the kubelet restarts with another
    // configuration, a SIGHUP finds the new kubelet and its new policy.
    let kubelet = StandInKubelet::start(d.path(), &work, &[&main_arg]);
    let node = TestCgroup::new(Some(4 << 30));
    let addr = format!("127.0.0.1:{}", free_port());
    let mut daemon = dies_with_harness(&mut Command::new(evictd_binary()))
        .args(["--kubelet-config", "auto", "--dry-run", "--cri-endpoint", "none", "--duration", "120s"])
        .args(["--metrics-addr", &addr, "--no-kube-api"])
        .arg("--node-cgroup")
        .arg(&node.dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting evictd");
    let hard = |bytes: u64| {
        format!(
            "evictd_eviction_threshold_bytes{{eviction_signal=\"memory.available\",threshold=\"hard\"}} {bytes}\n"
        )
    };
    let wait_metrics = |want: &str| {
        let t = Instant::now();
        loop {
            let m = std::net::TcpStream::connect(&addr).is_ok().then(|| http_get(&addr, "/metrics"));
            if m.as_deref().is_some_and(|m| m.contains(want)) {
                return;
            }
            assert!(t.elapsed() < Duration::from_secs(60), "never saw {want}: {m:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_metrics(&hard(500 << 20));
    drop(kubelet);
    std::fs::write(&main, format!("{CONF}evictionHard:\n  memory.available: 700Mi\n")).unwrap();
    let _restarted = StandInKubelet::start(d.path(), &work, &[&main_arg]);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon.id() as i32), nix::sys::signal::Signal::SIGHUP)
        .unwrap();
    wait_metrics(&hard(700 << 20));
    assert!(daemon.try_wait().unwrap().is_none(), "evictd keeps running");
    // Ours, by PID.
    let _ = daemon.kill();
    let _ = daemon.wait();
}
