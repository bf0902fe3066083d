//! A real containerd, private to one test: its own config, root, state, sockets and runc
//! root under temporary directories; a locally built image (static pause and hog binaries)
//! imported without a registry; pods created the way the kubelet creates them (labels,
//! annotations, cgroup parents under a test node cgroup, limits — with either of the
//! kubelet's cgroup drivers, `CgroupDriver`); and a teardown that runs
//! also when the test fails: sandboxes stopped and removed, containerd ended by PID,
//! leftover shims and container processes (ours, found by our socket path and our cgroups)
//! killed by PID, mounts detached, cgroup trees removed depth-first in every hierarchy.

use std::{
    collections::BTreeMap,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use evictd::{
    node::cgroups::CgroupVersion,
    runtime::cri::{CriClient, api as cri},
};

use crate::{
    cleanup::{
        RUN_PREFIX, detach_mounts_under, pids_in_tree, pids_with_cmdline, remove_cgroup_trees,
        remove_what_killed_runs_left,
    },
    fs_available, mount_tmpfs,
};

pub const IMAGE: &str = "evictd.test/tools:1";
static SEQ: AtomicUsize = AtomicUsize::new(0);

/// Whether a containerd test can run here: privileged (see `crate::privileged`) and with
/// containerd, runc and gcc installed. Otherwise says why on stderr (or, in CI, fails).
pub fn available(test: &str) -> bool {
    if !crate::privileged(test) {
        return false;
    }
    let Some(why) = unavailable() else { return true };
    crate::skip(test, &why);
    false
}

/// Where prebuilt static `pause` and `hog` binaries are, when the test machine has no gcc to
/// build them (the VM matrix ships them in its initramfs).
const IMAGE_BIN_ENV: &str = "EVICTD_TEST_IMAGE_BIN";

/// Why a containerd test cannot run here, if it cannot (checked before anything starts).
pub fn unavailable() -> Option<String> {
    let gcc: &[&str] = if std::env::var_os(IMAGE_BIN_ENV).is_some() { &[] } else { &["gcc"] };
    for bin in ["containerd", "ctr", "runc"].iter().chain(gcc) {
        if which(bin).is_none() {
            return Some(format!("{bin} is not installed (cargo xtask setup installs it)"));
        }
    }
    None
}

fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
}

/// How pod cgroups are named and made: the kubelet's `cgroupDriver`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupDriver {
    /// Paths under a node cgroup of the test's own (`<node>/kubepods/<qos>/pod<uid>`), made
    /// by the harness as the kubelet makes them.
    Cgroupfs,
    /// systemd slices (`kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid>.slice`),
    /// made and limited through systemd as the kubelet does, with runc asking systemd for
    /// each container's scope. `kubepods.slice` plays the node. Needs systemd as PID 1 and
    /// cgroup v2 (the VM matrix's trixie-systemd boot).
    Systemd,
}

/// The systemd driver's top slice, which the kubelet makes under the root.
const KUBEPODS_SLICE: &str = "kubepods.slice";

pub struct Containerd {
    pub name: String,
    pub driver: CgroupDriver,
    pub tmp: PathBuf,
    pub run: PathBuf,
    pub socket: PathBuf,
    child: Option<Child>,
    /// The memory cgroup that plays the node, relative to each hierarchy's root.
    pub node_cgroup: String,
    pub memory_root: PathBuf,
    memory_version: CgroupVersion,
    pub sandboxes: Vec<String>,
    /// Slices given properties through systemd (`CgroupDriver::Systemd`), reverted at
    /// teardown.
    slices: Vec<String>,
    /// containerd's root directory (images and writable layers: imagefs).
    pub root: PathBuf,
    /// The pod cgroups are the machine's own (`start_as_node`): `kubepods` at the root.
    at_root: bool,
    /// The pod network's bridge, when pods get a network of their own (`start_as_node`).
    bridge: Option<String>,
    /// The machine's `net.ipv4.ip_forward` before the pod network's gateway turned it on.
    ip_forward_before: Option<String>,
    /// The network namespaces the runtime made for this test's sandboxes: detached and
    /// removed at teardown even when the runtime can no longer remove them itself.
    netns: Vec<PathBuf>,
    /// A size-limited filesystem of the test's own holding `root` and a kubelet root
    /// directory (`start_on_nodefs`): nodefs and imagefs in one, the kubelet's usual layout.
    pub nodefs: Option<PathBuf>,
    /// A second one holding `root` alone (`start_with_imagefs`): a dedicated imagefs.
    pub imagefs: Option<PathBuf>,
}

/// A pod as the test wants it.
pub struct PodSpec<'a> {
    pub name: &'a str,
    /// `guaranteed`, `burstable` or `besteffort`: where its cgroup goes.
    pub qos: &'a str,
    pub memory_limit: Option<u64>,
    pub oom_score_adj: i64,
    pub annotations: BTreeMap<String, String>,
    pub ignore_sigterm: bool,
    pub termination_grace_seconds: i64,
    /// Arguments for /hog instead of the control-file mode (e.g. the benchmark's rate mode).
    pub hog_args: Option<Vec<String>>,
    /// A kubelet root directory: the pod gets an emptyDir `scratch` where the kubelet makes
    /// one (`<root>/pods/<uid>/volumes/kubernetes.io~empty-dir/scratch`), at `/scratch`.
    pub empty_dir_under: Option<PathBuf>,
    /// That emptyDir with `medium: Memory`: a tmpfs mounted on the host as the kubelet mounts
    /// one, so its pages are charged to the pod and outlive its processes (and its sandbox)
    /// until the pod is torn down. Put `empty_dir_under` in the runtime's `tmp`: its teardown
    /// detaches what is mounted there.
    pub empty_dir_in_memory: bool,
}

impl<'a> PodSpec<'a> {
    /// A BestEffort pod (oom_score_adj 1000) whose hog follows its control file.
    pub fn besteffort(name: &'a str) -> Self {
        PodSpec {
            name,
            qos: "besteffort",
            memory_limit: None,
            oom_score_adj: 1000,
            annotations: BTreeMap::new(),
            ignore_sigterm: false,
            termination_grace_seconds: 30,
            hog_args: None,
            empty_dir_under: None,
            empty_dir_in_memory: false,
        }
    }
}

/// A running pod: ids, and the control file whose MiB number its hog allocates up to.
pub struct TestPod {
    pub uid: String,
    pub name: String,
    pub sandbox_id: String,
    pub container_id: String,
    pub control: PathBuf,
    /// The host directory mounted at /ctl in the container.
    pub ctl_dir: PathBuf,
    /// Its pod cgroup in the memory hierarchy.
    pub cgroup: PathBuf,
    memory_version: CgroupVersion,
    /// The pod's log directory (the CRI's `log_directory`; the hog logs to `hog/<attempt>.log`).
    pub log_dir: PathBuf,
    sandbox_config: cri::PodSandboxConfig,
    container_config: cri::ContainerConfig,
}

impl TestPod {
    /// Grows the workload to `mib` MiB (it never shrinks).
    pub fn set_mib(&self, mib: u64) {
        std::fs::write(&self.control, mib.to_string()).expect("writing the hog's control file");
    }

    /// The pod's memory usage, from its cgroup (0 once gone).
    pub fn usage(&self) -> u64 {
        usage_of(&self.cgroup, self.memory_version)
    }

    /// Waits until the pod's cgroup charges at least `bytes`.
    pub fn wait_usage_at_least(&self, bytes: u64, within: Duration) {
        let deadline = Instant::now() + crate::patience::patience(within);
        while self.usage() < bytes {
            assert!(
                Instant::now() < deadline,
                "pod {} did not reach {bytes} bytes (at {})",
                self.name,
                self.usage()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Containerd {
    /// Starts containerd with a node cgroup of `node_limit` bytes under the memory root.
    pub fn start(node_limit: u64) -> Self {
        Self::start_in(CgroupDriver::Cgroupfs, node_limit, None, None, false)
    }

    /// As `start`, with the systemd cgroup driver: `kubepods.slice`, limited to `node_limit`
    /// bytes, plays the node. Panics (naming what is missing) without systemd as PID 1 on
    /// cgroup v2, or when a `kubepods.slice` exists already: this machine runs pods of its
    /// own, and the test would take them for its node's.
    pub fn start_systemd(node_limit: u64) -> Self {
        Self::start_in(CgroupDriver::Systemd, node_limit, None, None, false)
    }

    /// The node's own pod cgroups, as the kubelet makes them: `kubepods` (cgroupfs) or
    /// `kubepods.slice` (systemd) at the root of the hierarchy, limited to `pods_limit` bytes
    /// (the node's allocatable memory, `enforceNodeAllocatable: [pods]`); and a pod network
    /// (the `bridge` and `host-local` CNI plugins) for pods without the host's. For a pod
    /// that watches the whole machine from the host's paths, as a DaemonSet does. Panics when
    /// the machine has pod cgroups already (it runs pods of its own).
    pub fn start_as_node(driver: CgroupDriver, pods_limit: u64) -> Self {
        Self::start_in(driver, pods_limit, None, None, true)
    }

    /// As `start`, with containerd's root on a tmpfs of `nodefs_bytes` mounted for this test
    /// (unmounted at teardown): a small disk that a test fills on purpose.
    pub fn start_on_nodefs(node_limit: u64, nodefs_bytes: u64) -> Self {
        Self::start_in(CgroupDriver::Cgroupfs, node_limit, Some(nodefs_bytes), None, false)
    }

    /// As `start_on_nodefs`, with containerd's root on a second tmpfs of `imagefs_bytes`:
    /// the kubelet's dedicated imagefs layout.
    pub fn start_with_imagefs(node_limit: u64, nodefs_bytes: u64, imagefs_bytes: u64) -> Self {
        Self::start_in(CgroupDriver::Cgroupfs, node_limit, Some(nodefs_bytes), Some(imagefs_bytes), false)
    }

    fn start_in(
        driver: CgroupDriver,
        node_limit: u64,
        nodefs_bytes: Option<u64>,
        imagefs_bytes: Option<u64>,
        at_root: bool,
    ) -> Self {
        let layout = evictd::node::cgroups::CgroupMounts::detect().expect("cgroup layout");
        // Before anything is made: nothing to clean up when it cannot run.
        if driver == CgroupDriver::Systemd {
            check_systemd_driver_can_run(&layout.memory_root, layout.memory_version);
        } else if at_root {
            check_no_pods_of_the_machine(&layout.memory_root.join("kubepods"));
        }
        remove_what_killed_runs_left();
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("{RUN_PREFIX}{}-{n}", std::process::id());
        let tmp = std::env::temp_dir().join(&name);
        let run = PathBuf::from("/run").join(&name);
        for d in [tmp.join("net.d"), tmp.join("logs"), tmp.join("ctl"), run.clone()] {
            std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
        }
        let nodefs = nodefs_bytes.map(|_| tmp.join("nodefs"));
        let imagefs = imagefs_bytes.map(|_| tmp.join("imagefs"));
        let root = match (&imagefs, &nodefs) {
            (Some(d), _) => d.join("containerd"),
            (None, Some(d)) => d.join("containerd"),
            (None, None) => tmp.join("root"),
        };
        let mut c = Containerd {
            driver,
            slices: Vec::new(),
            root,
            nodefs,
            imagefs,
            socket: run.join("containerd.sock"),
            name: name.clone(),
            tmp,
            run,
            child: None,
            node_cgroup: match driver {
                CgroupDriver::Cgroupfs if at_root => String::new(),
                CgroupDriver::Cgroupfs => format!("/{name}"),
                CgroupDriver::Systemd => format!("/{KUBEPODS_SLICE}"),
            },
            memory_root: layout.memory_root,
            memory_version: layout.memory_version,
            sandboxes: Vec::new(),
            at_root,
            bridge: None,
            ip_forward_before: None,
            netns: Vec::new(),
        };
        // Mounted once `c` exists: its teardown unmounts them, also when a step below fails.
        for (dir, size) in [(&c.nodefs, nodefs_bytes), (&c.imagefs, imagefs_bytes)] {
            if let (Some(dir), Some(size)) = (dir, size) {
                mount_tmpfs(dir, size);
            }
        }
        if let Some(dir) = &c.nodefs {
            std::fs::create_dir_all(dir.join("kubelet")).expect("kubelet root");
        }
        match driver {
            CgroupDriver::Cgroupfs => c.make_cgroupfs_node(node_limit),
            CgroupDriver::Systemd => c.make_systemd_node(node_limit),
        }
        if at_root {
            c.shared_root();
            c.pod_network(n);
        }
        c.write_config();
        c.spawn();
        c.import_image();
        c
    }

    /// containerd's root as a shared mount of its own: a container may mount it with
    /// `HostToContainer` propagation (rslave), which needs a shared or slave source, as a
    /// node's root filesystem is under systemd.
    fn shared_root(&self) {
        std::fs::create_dir_all(&self.root).expect("containerd root");
        make_shared(&self.root);
    }

    /// A bridge and an address range of this test's for pods off the host's network: a name
    /// and a range the machine does not use, so that the teardown deletes only what the test
    /// made. The bridge plugin's gateway turns IP forwarding on; the teardown restores it.
    fn pod_network(&mut self, n: usize) {
        // Free: no such link, and no route into the range.
        let routed = routed_ipv4_destinations();
        let (bridge, net) = (0..250)
            .map(|k| (std::process::id() as usize * 7 + n + k) % 10_000)
            .map(|id| (format!("evd{id}"), [10, 213, (id % 250 + 1) as u8]))
            .find(|(b, net)| {
                !Path::new("/sys/class/net").join(b).exists() && !routed.iter().any(|d| d[..3] == net[..])
            })
            .expect("no free bridge name and 10.213.x.0/24 range for the pod network");
        let subnet = format!("{}.{}.{}.0/24", net[0], net[1], net[2]);
        let conf = serde_json::json!({
            "cniVersion": "0.4.0",
            "name": self.name,
            "plugins": [{
                "type": "bridge",
                "bridge": bridge,
                "isGateway": true,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet}]],
                    "dataDir": self.tmp.join("cni").display().to_string(),
                },
            }],
        });
        std::fs::write(self.tmp.join("net.d/10-evictd-e2e.conflist"), conf.to_string()).expect("CNI config");
        self.ip_forward_before = std::fs::read_to_string(IP_FORWARD).ok();
        self.bridge = Some(bridge);
    }

    /// The node cgroup with its QoS cgroups, as the kubelet makes them with cgroupfs.
    fn make_cgroupfs_node(&self, node_limit: u64) {
        let node = self.node_dir();
        for qos in ["burstable", "besteffort"] {
            std::fs::create_dir_all(node.join("kubepods").join(qos)).expect("node cgroup");
        }
        if self.memory_version == CgroupVersion::V2 {
            // Pod cgroups get memory.max from the harness before runc makes theirs (the
            // machine's root has its controllers enabled by its init).
            for dir in [
                node.clone(),
                node.join("kubepods"),
                node.join("kubepods/burstable"),
                node.join("kubepods/besteffort"),
            ] {
                if dir == self.memory_root {
                    continue;
                }
                std::fs::write(dir.join("cgroup.subtree_control"), "+memory +pids")
                    .unwrap_or_else(|e| panic!("enabling memory and pids under {}: {e}", dir.display()));
            }
        }
        // At the root, the kubelet limits the pods' cgroup to allocatable: never the machine.
        let limited = if self.at_root { node.join("kubepods") } else { node };
        std::fs::write(limited.join(limit_file(self.memory_version)), node_limit.to_string())
            .expect("node limit");
    }

    /// `kubepods.slice` and its QoS slices, started through systemd as the kubelet's
    /// systemd cgroup manager does; the node's limit is the top slice's `MemoryMax`.
    fn make_systemd_node(&mut self, node_limit: u64) {
        self.limit_slice(KUBEPODS_SLICE, node_limit);
        for slice in [KUBEPODS_SLICE, "kubepods-burstable.slice", "kubepods-besteffort.slice"] {
            systemctl(&["start", slice]);
        }
        let limit = read_u64(&self.node_dir().join("memory.max"));
        assert_eq!(limit, node_limit, "systemd set {KUBEPODS_SLICE}'s memory.max");
    }

    /// `MemoryMax` on a slice, for this boot only (`--runtime`; reverted at teardown).
    fn limit_slice(&mut self, slice: &str, bytes: u64) {
        systemctl(&["set-property", "--runtime", slice, &format!("MemoryMax={bytes}")]);
        self.slices.push(slice.to_owned());
    }

    /// Bytes available on the test's nodefs (`start_on_nodefs`), as statvfs says.
    pub fn nodefs_available(&self) -> u64 {
        fs_available(self.nodefs.as_ref().expect("a containerd started on a nodefs of its own"))
    }

    /// Bytes available on the test's dedicated imagefs (`start_with_imagefs`).
    pub fn imagefs_available(&self) -> u64 {
        fs_available(self.imagefs.as_ref().expect("a containerd started with an imagefs of its own"))
    }

    /// Sets the node cgroup's memory limit (the node's capacity as evictd reads it at start).
    pub fn set_node_limit(&self, bytes: u64) {
        let file = self.node_dir().join(limit_file(self.memory_version));
        std::fs::write(&file, bytes.to_string())
            .unwrap_or_else(|e| panic!("writing {}: {e}", file.display()));
    }

    /// The node cgroup's memory usage.
    pub fn node_usage(&self) -> u64 {
        usage_of(&self.node_dir(), self.memory_version)
    }

    /// The node cgroup's directory in the memory hierarchy.
    pub fn node_dir(&self) -> PathBuf {
        self.memory_root.join(self.node_cgroup.trim_start_matches('/'))
    }

    /// The cgroup holding every pod: the node cgroup of the test's own, or the machine's
    /// `kubepods` (`start_as_node`), whose tree alone is the test's.
    fn pods_dir(&self) -> PathBuf {
        match (self.driver, self.at_root) {
            (CgroupDriver::Cgroupfs, true) => self.node_dir().join("kubepods"),
            _ => self.node_dir(),
        }
    }

    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    pub fn client(&self) -> CriClient {
        CriClient::new(&self.endpoint(), Duration::from_secs(10)).expect("CRI client")
    }

    fn write_config(&self) {
        let (t, r, root) = (self.tmp.display(), self.run.display(), self.root.display());
        let (snapshotter, no_pivot) = (snapshotter(), root_is_initramfs());
        let systemd_cgroup = self.driver == CgroupDriver::Systemd;
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{r}/state"
[grpc]
  address = "{r}/containerd.sock"
[ttrpc]
  address = "{r}/containerd.sock.ttrpc"
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{t}/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "{IMAGE}"
    restrict_oom_score_adj = true
    disable_apparmor = true
    stats_collect_period = 1
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "{t}/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "{snapshotter}"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = {systemd_cgroup}
          BinaryName = "/usr/sbin/runc"
          Root = "{r}/runc"
          NoPivotRoot = {no_pivot}
"#
        );
        std::fs::write(self.tmp.join("config.toml"), config).expect("containerd config");
    }

    /// Starts (or restarts) containerd and waits until it answers.
    pub fn spawn(&mut self) {
        let log = std::fs::File::create(self.tmp.join("containerd.log")).expect("containerd log");
        let child = crate::dies_with_harness(&mut Command::new("containerd"))
            .arg("--config")
            .arg(self.tmp.join("config.toml"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting containerd");
        self.child = Some(child);
        // Seconds here; the VM matrix's TCG is 10–50× slower.
        let deadline = Instant::now() + crate::patience::patience(Duration::from_secs(60));
        while !self.ctr(&["version"]).status.success() {
            assert!(
                Instant::now() < deadline,
                "containerd did not come up; see {}/containerd.log",
                self.tmp.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops containerd (pods keep running, as on a real node), by its PID.
    pub fn stop_daemon(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::SIGTERM);
            let deadline = Instant::now() + crate::patience::patience(Duration::from_secs(10));
            while c.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = c.kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.wait();
        }
    }

    pub fn ctr(&self, args: &[&str]) -> std::process::Output {
        Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["-n", "k8s.io"])
            .args(args)
            .output()
            .expect("running ctr")
    }

    /// Builds the static binaries (or takes them prebuilt from `$EVICTD_TEST_IMAGE_BIN`) and
    /// a docker-save tarball, and imports it.
    fn import_image(&self) {
        let bin = match std::env::var_os(IMAGE_BIN_ENV) {
            Some(dir) => PathBuf::from(dir),
            None => self.build_image_binaries(),
        };
        let files: Vec<(&str, Vec<u8>)> = ["pause", "hog"]
            .iter()
            .map(|n| {
                (*n, std::fs::read(bin.join(n)).unwrap_or_else(|e| panic!("{}: {e}", bin.join(n).display())))
            })
            .collect();
        self.import(IMAGE, &files);
    }

    /// `pause` and `hog`, static, from `tests/images/*.c`; returns their directory.
    fn build_image_binaries(&self) -> PathBuf {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("images");
        let bin = self.tmp.join("image-bin");
        std::fs::create_dir_all(&bin).expect("image dir");
        for name in ["pause", "hog"] {
            let out = Command::new("gcc")
                .args(["-static", "-O2", "-o"])
                .arg(bin.join(name))
                .arg(src.join(format!("{name}.c")))
                .output()
                .expect("running gcc");
            assert!(out.status.success(), "gcc {name}.c: {}", String::from_utf8_lossy(&out.stderr));
        }
        bin
    }

    /// Imports an image named `tag` holding `files` (each executable).
    pub fn import(&self, tag: &str, files: &[(&str, Vec<u8>)]) {
        let tarball = self.tmp.join(format!("image-{}.tar", tag.replace(['/', ':'], "_")));
        write_image_tarball(tag, files, &tarball);
        let out = self.ctr(&["images", "import", &tarball.display().to_string()]);
        assert!(out.status.success(), "ctr images import {tag}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Creates and starts a pod as the kubelet would, with a hog container in it.
    pub async fn run_pod(&mut self, spec: PodSpec<'_>) -> TestPod {
        let uid = format!("{}-{}", spec.name, SEQ.fetch_add(1, Ordering::Relaxed));
        let qos_dir = match spec.qos {
            "guaranteed" => String::new(),
            q => format!("/{q}"),
        };
        // The kubelet creates the pod cgroup (with the pod's limit) before the sandbox.
        let (cgroup_parent, pod_cgroup) = match self.driver {
            CgroupDriver::Cgroupfs => {
                let parent = format!("{}/kubepods{qos_dir}/pod{uid}", self.node_cgroup);
                let dir = self.memory_root.join(parent.trim_start_matches('/'));
                std::fs::create_dir_all(&dir).expect("pod cgroup");
                if let Some(l) = spec.memory_limit {
                    std::fs::write(dir.join(limit_file(self.memory_version)), l.to_string())
                        .expect("pod limit");
                }
                (parent, dir)
            }
            CgroupDriver::Systemd => self.make_pod_slice(spec.qos, &uid, spec.memory_limit),
        };
        let labels: std::collections::HashMap<String, String> = [
            ("io.kubernetes.pod.name", spec.name.to_owned()),
            ("io.kubernetes.pod.namespace", "e2e".to_owned()),
            ("io.kubernetes.pod.uid", uid.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let log_dir = self.tmp.join("logs").join(&uid);
        std::fs::create_dir_all(&log_dir).expect("log dir");
        let sandbox_config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: spec.name.into(),
                uid: uid.clone(),
                namespace: "e2e".into(),
                attempt: 0,
            }),
            log_directory: log_dir.display().to_string(),
            labels: labels.clone(),
            annotations: spec.annotations.clone().into_iter().collect(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: cgroup_parent.clone(),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: cri::NamespaceMode::Node as i32,
                        pid: cri::NamespaceMode::Container as i32,
                        ipc: cri::NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let sandbox_id = self.run_sandbox(&sandbox_config).await;
        let empty_dir = spec.empty_dir_under.as_ref().map(|root| {
            let d = root.join("pods").join(&uid).join("volumes/kubernetes.io~empty-dir/scratch");
            std::fs::create_dir_all(&d).expect("emptyDir");
            if spec.empty_dir_in_memory {
                nix::mount::mount(
                    Some("tmpfs"),
                    &d,
                    Some("tmpfs"),
                    nix::mount::MsFlags::empty(),
                    None::<&str>,
                )
                .unwrap_or_else(|e| panic!("mounting a tmpfs on {}: {e}", d.display()));
            }
            d
        });
        let ctl_dir = self.tmp.join("ctl").join(&uid);
        std::fs::create_dir_all(&ctl_dir).expect("control dir");
        let control = ctl_dir.join("mib");
        std::fs::write(&control, "0").expect("control file");
        let mut args = vec!["/ctl/mib".to_owned()];
        if spec.ignore_sigterm {
            args.push("ignore-term".into());
        }
        if let Some(a) = &spec.hog_args {
            args = a.clone();
        }
        let mut container_labels = labels.clone();
        container_labels.insert("io.kubernetes.container.name".into(), "hog".into());
        let container = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata { name: "hog".into(), attempt: 0 }),
            image: Some(cri::ImageSpec { image: IMAGE.into(), ..Default::default() }),
            command: vec!["/hog".into()],
            args,
            labels: container_labels,
            annotations: [(
                "io.kubernetes.pod.terminationGracePeriod".to_owned(),
                spec.termination_grace_seconds.to_string(),
            )]
            .into_iter()
            .collect(),
            mounts: std::iter::once(("/ctl".to_owned(), ctl_dir.clone()))
                .chain(empty_dir.iter().map(|d| ("/scratch".to_owned(), d.clone())))
                .map(|(container_path, host)| cri::Mount {
                    container_path,
                    host_path: host.display().to_string(),
                    ..Default::default()
                })
                .collect(),
            // The kubelet's layout: `<pod log dir>/<container>/<attempt>.log`, the directory
            // made by the kubelet before CreateContainer.
            log_path: "hog/0.log".into(),
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(cri::LinuxContainerResources {
                    memory_limit_in_bytes: spec.memory_limit.unwrap_or(0) as i64,
                    oom_score_adj: spec.oom_score_adj,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        std::fs::create_dir_all(log_dir.join("hog")).expect("container log dir");
        let container_id = self.create_and_start(&sandbox_id, &container, &sandbox_config).await;
        TestPod {
            uid,
            name: spec.name.into(),
            sandbox_id,
            container_id,
            control,
            ctl_dir,
            cgroup: pod_cgroup,
            memory_version: self.memory_version,
            log_dir,
            sandbox_config,
            container_config: container,
        }
    }

    /// Runs a pod the kubelet's way (`crate::kubelet_pod`): its pod cgroup made with its
    /// limit, the sandbox, the container's log directory, then its container, whose image
    /// must be on the node already. Returns the sandbox's and the container's ids.
    pub async fn run_kubelet_pod(&mut self, pod: &mut crate::kubelet_pod::KubeletPod) -> (String, String) {
        let cgroup_parent = match self.driver {
            CgroupDriver::Cgroupfs => {
                let qos_dir = if pod.qos == "guaranteed" { String::new() } else { format!("/{}", pod.qos) };
                let parent = format!("{}/kubepods{qos_dir}/pod{}", self.node_cgroup, pod.uid);
                let dir = self.memory_root.join(parent.trim_start_matches('/'));
                std::fs::create_dir_all(&dir).expect("pod cgroup");
                if let Some(l) = pod.memory_limit {
                    std::fs::write(dir.join(limit_file(self.memory_version)), l.to_string())
                        .expect("pod limit");
                }
                parent
            }
            CgroupDriver::Systemd => self.make_pod_slice(pod.qos, &pod.uid, pod.memory_limit).0,
        };
        if let Some(linux) = pod.sandbox.linux.as_mut() {
            linux.cgroup_parent = cgroup_parent;
        }
        let image = pod.container.image.clone().unwrap_or_default().image;
        let present = self
            .client()
            .images()
            .image_status(cri::ImageStatusRequest {
                image: Some(cri::ImageSpec { image: image.clone(), ..Default::default() }),
                verbose: false,
            })
            .await
            .expect("ImageStatus")
            .into_inner()
            .image
            .is_some();
        assert!(present, "image {image} is not on the node (imagePullPolicy IfNotPresent, and no registry)");
        let sandbox_id = self.run_sandbox(&pod.sandbox).await;
        std::fs::create_dir_all(&pod.container_log_dir).expect("container log dir");
        let container_id = self.create_and_start(&sandbox_id, &pod.container, &pod.sandbox).await;
        (sandbox_id, container_id)
    }

    /// RunPodSandbox, the sandbox remembered for the teardown (with its network namespace).
    async fn run_sandbox(&mut self, config: &cri::PodSandboxConfig) -> String {
        let sandbox_id = self
            .client()
            .runtime()
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            })
            .await
            .expect("RunPodSandbox")
            .into_inner()
            .pod_sandbox_id;
        self.sandboxes.push(sandbox_id.clone());
        self.remember_netns(&sandbox_id).await;
        sandbox_id
    }

    /// The sandbox's network namespace, if the runtime made one (a pod off the host's
    /// network): its path is in the sandbox's runtime spec (the verbose status).
    async fn remember_netns(&mut self, sandbox_id: &str) {
        let Some(status) = self.sandbox_status(sandbox_id, true).await else { return };
        let info = status.info;
        let Some(info) = info.get("info").and_then(|i| serde_json::from_str::<serde_json::Value>(i).ok())
        else {
            return;
        };
        let namespaces = info.pointer("/runtimeSpec/linux/namespaces").and_then(|n| n.as_array());
        let network = namespaces
            .into_iter()
            .flatten()
            .filter(|ns| ns["type"] == "network")
            .find_map(|ns| ns["path"].as_str().map(PathBuf::from));
        self.netns.extend(network);
    }

    /// PodSandboxStatus, or `None` when the runtime does not answer it.
    async fn sandbox_status(&self, sandbox_id: &str, verbose: bool) -> Option<cri::PodSandboxStatusResponse> {
        let request = cri::PodSandboxStatusRequest { pod_sandbox_id: sandbox_id.into(), verbose };
        self.client().runtime().pod_sandbox_status(request).await.ok().map(|r| r.into_inner())
    }

    /// The pod IP the runtime gives a sandbox on the pod network.
    pub async fn pod_ip(&self, sandbox_id: &str) -> String {
        let status = self.sandbox_status(sandbox_id, false).await.expect("PodSandboxStatus");
        status.status.and_then(|s| s.network).map(|n| n.ip).filter(|ip| !ip.is_empty()).expect("a pod IP")
    }

    /// The pod's slice as the kubelet names and starts it with the systemd driver: the
    /// runtime is given the slice's name (`cgroup_parent`), systemd puts it at the path its
    /// dashes spell. Returns that name and the directory, spelled out here.
    fn make_pod_slice(&mut self, qos: &str, uid: &str, limit: Option<u64>) -> (String, PathBuf) {
        // A dash in the uid would be one more slice level: the kubelet escapes them.
        let uid = uid.replace('-', "_");
        let (slice, rel) = match qos {
            "guaranteed" => {
                let s = format!("kubepods-pod{uid}.slice");
                (s.clone(), format!("{KUBEPODS_SLICE}/{s}"))
            }
            q => {
                let s = format!("kubepods-{q}-pod{uid}.slice");
                (s.clone(), format!("{KUBEPODS_SLICE}/kubepods-{q}.slice/{s}"))
            }
        };
        if let Some(l) = limit {
            self.limit_slice(&slice, l);
        }
        systemctl(&["start", &slice]);
        let dir = self.memory_root.join(rel);
        assert!(dir.is_dir(), "systemd started {slice} but {} is not there", dir.display());
        (slice, dir)
    }

    async fn create_and_start(
        &self,
        sandbox_id: &str,
        config: &cri::ContainerConfig,
        sandbox_config: &cri::PodSandboxConfig,
    ) -> String {
        let mut rt = self.client().runtime();
        let container_id = rt
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox_id.into(),
                config: Some(config.clone()),
                sandbox_config: Some(sandbox_config.clone()),
            })
            .await
            .expect("CreateContainer")
            .into_inner()
            .container_id;
        rt.start_container(cri::StartContainerRequest { container_id: container_id.clone() })
            .await
            .expect("StartContainer");
        container_id
    }

    /// Restarts the pod's container as the kubelet does after it exited: a new instance in
    /// the same sandbox with the next attempt number, logging to `hog/<attempt>.log`. The
    /// running instance, if any, is stopped first.
    pub async fn restart_container(&self, pod: &mut TestPod) {
        self.client().stop_container(&pod.container_id, 0).await.expect("StopContainer");
        let meta = pod.container_config.metadata.get_or_insert_with(Default::default);
        meta.attempt += 1;
        pod.container_config.log_path = format!("hog/{}.log", meta.attempt);
        pod.container_id =
            self.create_and_start(&pod.sandbox_id, &pod.container_config, &pod.sandbox_config).await;
    }

    /// Waits until the runtime reports `pod`'s writable layer at `bytes` or more. containerd
    /// measures snapshots on its own schedule (`stats_collect_period`, 1 s here), so what a
    /// container has just written shows in `ListContainerStats` — where the kubelet and evictd
    /// read it for ranking — only some time later.
    pub async fn wait_writable_layer_at_least(&self, pod: &TestPod, bytes: u64) {
        let deadline = Instant::now() + crate::patience::patience(Duration::from_secs(20));
        loop {
            let stats = self.client().list_container_stats().await.expect("ListContainerStats");
            let used = stats
                .iter()
                .filter(|s| s.attributes.as_ref().is_some_and(|a| a.id == pod.container_id))
                .filter_map(|s| s.writable_layer.as_ref()?.used_bytes.as_ref().map(|u| u.value))
                .max()
                .unwrap_or(0);
            if used >= bytes {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the runtime still reports {used} bytes in pod {}'s writable layer, want ≥ {bytes}",
                pod.name
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the CRI answers: after a restart containerd serves its own API at once,
    /// but the CRI only once it has recovered every pod (longer, the more pods there are).
    pub async fn wait_cri_ready(&self) {
        let deadline = Instant::now() + crate::patience::patience(Duration::from_secs(60));
        while let Err(e) = self.client().list_pod_sandboxes().await {
            assert!(
                Instant::now() < deadline,
                "the CRI did not come up: {e}; see {}/containerd.log",
                self.tmp.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether the runtime still has a ready sandbox with this id.
    pub async fn sandbox_ready(&self, id: &str) -> bool {
        self.client()
            .list_pod_sandboxes()
            .await
            .expect("ListPodSandbox")
            .iter()
            .any(|s| s.id == id && s.state == cri::PodSandboxState::SandboxReady as i32)
    }

    fn teardown(&mut self) {
        // CRI clean-up needs a runtime of its own: Drop may run inside a test's runtime.
        if self.child.is_some() && !self.sandboxes.is_empty() {
            let client = self.client();
            let ids = std::mem::take(&mut self.sandboxes);
            let _ = std::thread::spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                    return;
                };
                rt.block_on(async {
                    for id in &ids {
                        let _ = client.stop_pod_sandbox(id).await;
                        let _ = client.remove_pod_sandbox(id).await;
                    }
                });
            })
            .join();
        }
        self.stop_daemon();
        // Anything still alive in our cgroups, or a shim serving our socket, is ours.
        let sock = self.socket.display().to_string();
        for pid in pids_in_tree(&self.pods_dir()).into_iter().chain(pids_with_cmdline(&sock)) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(100));
        detach_mounts_under(&[&self.tmp, &self.run]);
        if self.driver == CgroupDriver::Systemd {
            // Stopping the top slice stops (and removes) every slice and scope under it.
            let _ = Command::new("systemctl").args(["stop", KUBEPODS_SLICE]).status();
            let slices = std::mem::take(&mut self.slices);
            let _ = Command::new("systemctl").arg("revert").args(&slices).status();
        }
        for netns in std::mem::take(&mut self.netns).iter().filter(|p| p.exists()) {
            let _ = nix::mount::umount2(netns, nix::mount::MntFlags::MNT_DETACH);
            let _ = std::fs::remove_file(netns);
        }
        if let Some(bridge) = &self.bridge {
            let _ = Command::new("ip").args(["link", "del", bridge]).output();
        }
        if let Some(before) = &self.ip_forward_before
            && std::fs::read_to_string(IP_FORWARD).is_ok_and(|now| now != *before)
        {
            let _ = std::fs::write(IP_FORWARD, before);
        }
        match (self.driver, self.at_root) {
            (CgroupDriver::Cgroupfs, true) => remove_cgroup_trees("kubepods"),
            _ => remove_cgroup_trees(&self.name),
        }
        let _ = std::fs::remove_dir_all(&self.run);
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // A failing test's runtime side is in containerd's log, which the teardown deletes
        // (and which is lost with a VM): show its end first.
        if std::thread::panicking() {
            let log = self.tmp.join("containerd.log");
            crate::print_log_tail(
                "containerd",
                Some(&log),
                &std::fs::read_to_string(&log).unwrap_or_default(),
                60,
            );
        }
        self.teardown();
    }
}

/// The systemd driver needs systemd as PID 1 (`sd_booted`: /run/systemd/system) managing a
/// cgroup v2 hierarchy, and a node without pods of its own in `kubepods.slice`.
fn check_systemd_driver_can_run(memory_root: &Path, version: CgroupVersion) {
    assert!(
        Path::new("/run/systemd/system").is_dir(),
        "the systemd cgroup driver needs systemd as PID 1 (no /run/systemd/system here); \
         cargo xtask vm runs these tests in its trixie-systemd VM"
    );
    assert_eq!(version, CgroupVersion::V2, "the systemd cgroup driver tests need cgroup v2");
    let kubepods = memory_root.join(KUBEPODS_SLICE);
    assert!(
        !kubepods.exists(),
        "{} exists: this machine runs pods of its own, which the test would take for its node's",
        kubepods.display()
    );
}

/// The machine's own `kubepods` cgroup must not exist: its pods would be taken for the test's.
fn check_no_pods_of_the_machine(kubepods: &Path) {
    assert!(
        !kubepods.exists(),
        "{} exists: this machine runs pods of its own, which the test would take for its node's \
         (if it is what a killed test run left, empty: remove it with \
         `find {} -depth -type d -exec rmdir {{}} +`)",
        kubepods.display(),
        kubepods.display()
    );
}

const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// The destinations of the machine's IPv4 routes other than the default one
/// (`/proc/net/route`: each address a hex word in the host's byte order).
fn routed_ipv4_destinations() -> Vec<[u8; 4]> {
    let table = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|hex| u32::from_str_radix(hex, 16).ok())
        .filter(|&d| d != 0)
        .map(u32::to_ne_bytes)
        .collect()
}

/// `dir` bound onto itself and made a shared mount (the kubelet does this to its root
/// directory), so that containers can mount it with `HostToContainer` propagation. The
/// teardown detaches it with the rest of the test's directories.
pub fn make_shared(dir: &Path) {
    use nix::mount::{MsFlags, mount};
    mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
        .unwrap_or_else(|e| panic!("binding {} onto itself: {e}", dir.display()));
    mount(None::<&str>, dir, None::<&str>, MsFlags::MS_SHARED | MsFlags::MS_REC, None::<&str>)
        .unwrap_or_else(|e| panic!("making {} a shared mount: {e}", dir.display()));
}

/// `systemctl ARGS`, which must succeed.
fn systemctl(args: &[&str]) {
    let out =
        Command::new("systemctl").args(args).output().unwrap_or_else(|e| panic!("running systemctl: {e}"));
    assert!(
        out.status.success(),
        "systemctl {}: {} {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// overlayfs where the kernel has it, as on a node; else containerd's `native` snapshotter
/// (copies): Debian's kernels build overlay as a module, which the VM matrix's initramfs
/// does not load.
fn snapshotter() -> &'static str {
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if fs.lines().any(|l| l.split_whitespace().last() == Some("overlay")) { "overlayfs" } else { "native" }
}

/// Whether `/` is the initramfs (`rootfs`, the VM matrix), which runc cannot pivot_root
/// away from.
fn root_is_initramfs() -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let root_fstype = info.lines().rev().find(|l| l.split_whitespace().nth(4) == Some("/")).and_then(|l| {
        let (_, after) = l.split_once(" - ")?;
        after.split_whitespace().next()
    });
    root_fstype.is_none_or(|t| t == "rootfs")
}

/// A memory cgroup's limit file: v1's, or v2's.
fn limit_file(version: CgroupVersion) -> &'static str {
    match version {
        CgroupVersion::V1 => "memory.limit_in_bytes",
        CgroupVersion::V2 => "memory.max",
    }
}

/// A (non-root) memory cgroup's usage, read as evictd reads it; 0 once the cgroup is gone.
fn usage_of(dir: &Path, version: CgroupVersion) -> u64 {
    evictd::node::memory::MemoryCgroup::new(dir, version, false).usage().unwrap_or(0)
}

/// A number file's value; 0 when it cannot be read (a cgroup gone).
fn read_u64(path: &Path) -> u64 {
    std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

/// A docker-save tarball named `tag` with one layer holding `files` at the root.
fn write_image_tarball(tag: &str, files: &[(&str, Vec<u8>)], out: &Path) {
    use sha2::Digest as _;
    let mut layer = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o755);
        h.set_cksum();
        layer.append_data(&mut h, name, data.as_slice()).expect("layer entry");
    }
    let layer = layer.into_inner().expect("layer tar");
    let diff_id = format!("sha256:{:x}", sha2::Sha256::digest(&layer));
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let config = serde_json::json!({
        "architecture": arch, "os": "linux",
        "config": {"Entrypoint": ["/pause"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]}
    })
    .to_string();
    let manifest =
        serde_json::json!([{"Config": "config.json", "RepoTags": [tag], "Layers": ["layer/layer.tar"]}])
            .to_string();
    let mut outer = tar::Builder::new(std::fs::File::create(out).expect("image tarball"));
    for (path, data) in [
        ("manifest.json", manifest.as_bytes()),
        ("config.json", config.as_bytes()),
        ("layer/layer.tar", &layer),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        outer.append_data(&mut h, path, data).expect("image entry");
    }
    outer.into_inner().expect("image tarball").flush().expect("flush");
}
