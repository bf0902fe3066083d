//! `cargo xtask vm`: the privileged tests inside Debian's own kernels, booted with cgroup v2
//! in QEMU.
//!
//! Production nodes run cgroup v2 on kernels this machine does not have. For each kernel of
//! the matrix this fetches Debian's kernel package (apt, through a private sources list and
//! state directory: the machine's own apt sources are never touched; apt checks the
//! archive's signatures and the package's hash), builds one initramfs with evictd, the
//! privileged test binaries, their shared libraries, the image `cargo xtask image` wrote and
//! `evictd-vm-init` as `/init` (to which each kernel's copy adds the modules of a pod
//! network, where its package has them), and boots it under QEMU's TCG (`/dev/kvm` here cannot run a stock kernel). Inside, the init
//! checks that `evictd probe` picks the wake tier the matrix expects and runs the tests;
//! its `evictd-vm:` lines on the serial console are the results. One VM boots systemd as
//! PID 1 (this machine's own systemd, which starts the init as a service) for the systemd
//! cgroup driver's end-to-end tests. TCG is 10–50× slower than the host: the VMs test
//! behaviour, the benchmarks stay on the host.

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Result, anyhow, bail, ensure};
use clap::Args;

use crate::{BuildEnv, setup, step, workspace_root};

mod boot;
mod initramfs;
mod kernels;

use self::{
    boot::{VmOutcome, boot, failure_excerpt},
    initramfs::{build_initramfs, with_modules},
    kernels::{KernelImage, fetch_kernel, network_modules},
};

/// One kernel of the matrix: a Debian suite's cloud kernel, how it boots, and what evictd
/// must make of it.
struct Kernel {
    /// The VM's name (`--suites`, its log): the suite, or the suite and its init.
    name: &'static str,
    suite: &'static str,
    /// What runs as PID 1.
    init: Init,
    /// The tests it runs.
    plan: &'static Plan,
    /// The charge wake tier `evictd probe` must choose there.
    tier: &'static str,
    /// Tests that need what this kernel does not offer, and why (`--skip`, printed).
    skip: &'static [(&'static str, &'static str)],
}

const NO_MEMCG_TRACEPOINTS: &str = "needs the memcg stat tracepoints, which this kernel lacks";
const V1_ONLY: &str = "cgroup v1 only; these VMs run cgroup v2";
const NO_DISK: &str = "needs page cache on a disk; a VM's only filesystem is its initramfs, in memory";

/// PID 1 of a VM.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Init {
    /// `evictd-vm-init` itself: quickest, and all the kernel-facing tests need.
    TestInit,
    /// systemd, which starts `evictd-vm-init` as a service: for the systemd cgroup driver,
    /// whose cgroups runc makes by asking systemd (D-Bus, on systemd's private socket).
    Systemd,
}

const E2E_ELSEWHERE: &str = "the containerd end-to-end tests are split between 6.12 (the stop through the runtime) and 7.3 (the fast kill): under TCG each takes minutes";

/// Debian's 6.1: the batched hook, no memcg stat tracepoints, cgroup v2.
const BOOKWORM: &[(&str, &str)] = &[
    ("anonymous_memory_displacing_page_cache_wakes_at_the_working_set_crossing", NO_DISK),
    ("the_poll_alone_sees_anonymous_memory_displacing_page_cache", NO_DISK),
    ("reclaim_lost_to_a_full_ring_reaches_the_reader_as_a_lost_wake", NO_DISK),
    ("this_kernel_has_the_memcg_tracepoints_and_the_id_path", NO_MEMCG_TRACEPOINTS),
    ("charge_probes_are_attached_only_near_a_threshold", NO_MEMCG_TRACEPOINTS),
    ("an_eventfd_threshold_follows_a_cgroup_made_again_at_the_same_path", V1_ONLY),
    ("an_eventfd_threshold_armed_below_the_usage_wakes_at_once", V1_ONLY),
    ("a_pass_does_not_wait_for_the_eventfd_registration", V1_ONLY),
    ("the_v1_freezer_holds_the_pod_while_it_is_killed", V1_ONLY),
    ("a_stuck_walk_gives_way_after_a_period_to_a_recent_complete_one", V1_ONLY),
    ("a_process_outside_the_cgroup2_tree_dies_with_the_pod", V1_ONLY),
    ("an_exiting_process_of_a_hybrid_pod_is_still_pinned", V1_ONLY),
    (E2E_TESTS[0], E2E_ELSEWHERE),
    (E2E_TESTS[1], E2E_ELSEWHERE),
];

/// Debian's 6.12: as 6.1, and the end-to-end eviction through the runtime.
const TRIXIE: &[(&str, &str)] = &[
    ("anonymous_memory_displacing_page_cache_wakes_at_the_working_set_crossing", NO_DISK),
    ("the_poll_alone_sees_anonymous_memory_displacing_page_cache", NO_DISK),
    ("reclaim_lost_to_a_full_ring_reaches_the_reader_as_a_lost_wake", NO_DISK),
    ("this_kernel_has_the_memcg_tracepoints_and_the_id_path", NO_MEMCG_TRACEPOINTS),
    ("charge_probes_are_attached_only_near_a_threshold", NO_MEMCG_TRACEPOINTS),
    ("an_eventfd_threshold_follows_a_cgroup_made_again_at_the_same_path", V1_ONLY),
    ("an_eventfd_threshold_armed_below_the_usage_wakes_at_once", V1_ONLY),
    ("a_pass_does_not_wait_for_the_eventfd_registration", V1_ONLY),
    ("the_v1_freezer_holds_the_pod_while_it_is_killed", V1_ONLY),
    ("a_stuck_walk_gives_way_after_a_period_to_a_recent_complete_one", V1_ONLY),
    ("a_process_outside_the_cgroup2_tree_dies_with_the_pod", V1_ONLY),
    ("an_exiting_process_of_a_hybrid_pod_is_still_pinned", V1_ONLY),
    (E2E_TESTS[1], E2E_ELSEWHERE),
];

/// Debian's 7.3: the batched hook, cgroup v2; the memcg stat tracepoints too, tested with
/// `--charge-tier memcg-tracepoints`; and the end-to-end fast kill.
const TRIXIE_BACKPORTS: &[(&str, &str)] = &[
    ("anonymous_memory_displacing_page_cache_wakes_at_the_working_set_crossing", NO_DISK),
    ("the_poll_alone_sees_anonymous_memory_displacing_page_cache", NO_DISK),
    ("reclaim_lost_to_a_full_ring_reaches_the_reader_as_a_lost_wake", NO_DISK),
    ("an_eventfd_threshold_follows_a_cgroup_made_again_at_the_same_path", V1_ONLY),
    ("an_eventfd_threshold_armed_below_the_usage_wakes_at_once", V1_ONLY),
    ("a_pass_does_not_wait_for_the_eventfd_registration", V1_ONLY),
    ("the_v1_freezer_holds_the_pod_while_it_is_killed", V1_ONLY),
    ("a_stuck_walk_gives_way_after_a_period_to_a_recent_complete_one", V1_ONLY),
    ("a_process_outside_the_cgroup2_tree_dies_with_the_pod", V1_ONLY),
    ("an_exiting_process_of_a_hybrid_pod_is_still_pinned", V1_ONLY),
    (E2E_TESTS[0], E2E_ELSEWHERE),
];

/// Debian's kernels have BPF trampolines, so the batched hook on all three; the memcg stat
/// tracepoints (7.x only) are then not used. This host's own kernel (no trampolines, the
/// tracepoints, cgroup v1) is `cargo xtask test`'s.
///
/// trixie-systemd boots the 6.12 kernel again with systemd as PID 1 for the systemd driver's
/// end-to-end tests alone (`SYSTEMD_PLAN`): the rest ran in trixie.
///
/// Longest first (those with an end-to-end test), since they run two at a time.
const MATRIX: &[Kernel] = &[
    Kernel {
        name: "trixie",
        suite: "trixie",
        init: Init::TestInit,
        plan: &MAIN_PLAN,
        tier: "batched-charge-hook",
        skip: TRIXIE,
    },
    Kernel {
        name: "trixie-backports",
        suite: "trixie-backports",
        init: Init::TestInit,
        plan: &MAIN_PLAN,
        tier: "batched-charge-hook",
        skip: TRIXIE_BACKPORTS,
    },
    Kernel {
        name: "bookworm",
        suite: "bookworm",
        init: Init::TestInit,
        plan: &MAIN_PLAN,
        tier: "batched-charge-hook",
        skip: BOOKWORM,
    },
    Kernel {
        name: "trixie-systemd",
        suite: "trixie",
        init: Init::Systemd,
        plan: &SYSTEMD_PLAN,
        tier: "batched-charge-hook",
        skip: &[],
    },
];

/// What one VM runs: a list of test binaries (cargo's selections), each with the flags it
/// is given and which of its tests run (all when none is named).
struct Plan {
    /// Where the init finds it (`evictd_vm.plan=`).
    file: &'static str,
    lines: &'static [PlanLine],
}

impl Plan {
    /// Whether one of its lines selects the integration test binary `name`.
    fn runs_test(&self, name: &str) -> bool {
        self.lines.iter().any(|l| l.selection.windows(2).any(|w| w == ["--test", name]))
    }
}

struct PlanLine {
    selection: &'static [&'static str],
    flags: &'static [&'static str],
    only: &'static [&'static str],
}

/// The kernel-facing library tests, the privileged integration tests that need no container
/// runtime, and of the end-to-end tests on a real containerd those in `E2E_TESTS`.
const MAIN_PLAN: Plan = Plan {
    file: "/vm/plan",
    lines: &[
        PlanLine { selection: &["-p", "evictd", "--lib"], flags: &[], only: &[] },
        PlanLine {
            selection: &["-p", "evictd-tests", "--test", "kernel_wake", "--test", "trace_cli"],
            flags: &[],
            only: &[],
        },
        PlanLine { selection: &["-p", "evictd-tests", "--test", "e2e_evict"], flags: &[], only: &E2E_TESTS },
    ],
};

/// Under systemd: the end-to-end tests of the systemd cgroup driver, `#[ignore]`d where
/// systemd is not PID 1 (every host run), so run here with `--ignored`; among them the
/// DaemonSet's pod through the CRI.
const SYSTEMD_PLAN: Plan = Plan {
    file: "/vm/plan-systemd",
    lines: &[
        PlanLine {
            selection: &["-p", "evictd-tests", "--test", "e2e_evict"],
            flags: &["--ignored"],
            only: &[
                "evicts_exactly_the_top_ranked_pod_of_the_systemd_slice_layout",
                "a_zero_hard_grace_period_kills_a_pod_of_the_systemd_slice_layout",
            ],
        },
        PlanLine {
            selection: &["-p", "evictd-tests", "--test", "daemonset"],
            flags: &["--ignored"],
            only: &["the_daemonset_runs_through_the_cri_with_the_systemd_driver"],
        },
    ],
};

/// The end-to-end tests run in the VM: an eviction through the CRI (decided on cgroup v2,
/// the pod stopped by containerd and runc, its memory freed), and the fast kill
/// (`cgroup.kill`) of a real pod's cgroup.
const E2E_TESTS: [&str; 2] = [
    "evicts_exactly_the_top_ranked_pod_and_frees_its_memory",
    "a_zero_hard_grace_period_kills_at_once_without_the_runtime",
];

const DEFAULT_JOBS: usize = 2;
const DEFAULT_TIMEOUT_MINUTES: u64 = 25;

#[derive(Args)]
pub(crate) struct VmArgs {
    /// The matrix's VMs to boot, by name (default: all of them: bookworm, trixie,
    /// trixie-systemd, trixie-backports).
    #[arg(long, value_delimiter = ',')]
    suites: Vec<String>,
    /// VMs at a time (each takes one host CPU under TCG).
    #[arg(long, default_value_t = DEFAULT_JOBS)]
    jobs: usize,
    /// Give up on a VM after this many minutes.
    #[arg(long, default_value_t = DEFAULT_TIMEOUT_MINUTES)]
    timeout_minutes: u64,
}

/// The whole matrix, as `cargo xtask test` runs it.
impl Default for VmArgs {
    fn default() -> Self {
        VmArgs { suites: Vec::new(), jobs: DEFAULT_JOBS, timeout_minutes: DEFAULT_TIMEOUT_MINUTES }
    }
}

pub(crate) fn vm(env: &BuildEnv, args: &VmArgs) -> Result<()> {
    let started = Instant::now();
    ensure!(crate::is_root(), "cargo xtask vm needs root (apt-get, and the kernels' packages)");
    let kernels: Vec<&Kernel> = if args.suites.is_empty() {
        MATRIX.iter().collect()
    } else {
        args.suites
            .iter()
            .map(|s| {
                MATRIX.iter().find(|k| k.name == s).ok_or_else(|| {
                    let known: Vec<&str> = MATRIX.iter().map(|k| k.name).collect();
                    anyhow!("--suites: {s} is not in the matrix ({})", known.join(", "))
                })
            })
            .collect::<Result<_>>()?
    };
    setup::ensure_debian_packages(&["qemu-system-x86", "systemd"])?;
    let dir = workspace_root().join("target/vm");
    // The image, for the DaemonSet's test (built already by `cargo xtask test`): the dev
    // profile's, as the test suite's.
    let image = crate::image::image(env, &crate::image::ImageArgs { for_tests: true, ..Default::default() })?;
    let initramfs = build_initramfs(env, &dir, &image)?;
    let mut images = Vec::new();
    for k in &kernels {
        let kernel = fetch_kernel(&dir, k.suite)?;
        // Only the DaemonSet's pod network needs the kernel's bridge and veth modules.
        let modules =
            if k.plan.runs_test("daemonset") { network_modules(&dir, k.suite, &kernel)? } else { Vec::new() };
        let own = if modules.is_empty() {
            initramfs.clone()
        } else {
            with_modules(&initramfs, &modules, &dir.join(format!("initramfs-{}.cpio", k.name)))?
        };
        images.push((*k, kernel, own));
    }
    let logs = dir.join("logs");
    fs::create_dir_all(&logs)?;
    let timeout = Duration::from_secs(args.timeout_minutes * 60);
    let outcomes = run_all(&images, &logs, args.jobs.max(1), timeout);
    let mut failed = Vec::new();
    for (k, r) in kernels.iter().zip(&outcomes) {
        match r {
            Ok(o) => step(&format!("vm {}: {} ({:.0}s)", k.name, o.summary, o.seconds)),
            Err(e) => {
                step(&format!("vm {}: FAILED: {e:#}", k.name));
                failed.push(k.name);
            }
        }
    }
    // CI keeps only the end of what it printed, and a clean clone's logs are gone with it:
    // what failed, in the failing tests' own words, goes last.
    for name in &failed {
        for line in failure_excerpt(&logs.join(format!("{name}.log"))) {
            step(&format!("vm {name}: | {line}"));
        }
    }
    step(&format!("VM matrix: {} kernels in {:.0}s", kernels.len(), started.elapsed().as_secs_f64()));
    if !failed.is_empty() {
        bail!("the VM tests failed on {} (logs in {})", failed.join(", "), logs.display());
    }
    Ok(())
}

/// Every VM, `jobs` at a time; results in the order of `images`.
fn run_all(
    images: &[(&Kernel, KernelImage, PathBuf)],
    logs: &Path,
    jobs: usize,
    timeout: Duration,
) -> Vec<Result<VmOutcome>> {
    crate::in_parallel(images, jobs, |(k, image, initramfs)| {
        boot(k, image, initramfs, &logs.join(format!("{}.log", k.name)), timeout)
    })
    .into_iter()
    .map(|r| r.unwrap_or_else(|| Err(anyhow!("the VM's thread panicked"))))
    .collect()
}
