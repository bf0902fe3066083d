//! How much the node has been charged since a moment userspace marked, from the charge
//! programs' count (`COUNTER_CHARGED_PAGES`: every page charged, frees not taken off).
//!
//! No pod's usage can grow by more than the node is charged, so a pod's usage read at mark
//! `a` is at most that plus `b − a` (and the kernel's slack, below) at mark `b`: ranking can
//! pass over a pod whose bound is below the first pod's real usage without reading it. The
//! bound holds only while every charge was counted, so a mark is refused, or two marks do
//! not compare, when that may not have been so:
//! - the charge programs were not all attached (the stat tracepoints come off while a
//!   killed pod exits, and far from every threshold), or were detached in between (a detach
//!   and an attach each begin a new epoch: marks of two epochs do not compare);
//! - the kernel skipped a program run (it does not re-enter a program on a CPU: a charge in
//!   an interrupt while the same program runs is lost), seen in the programs'
//!   `recursion_misses`, or a program failed to read what it counts (the `memcg-id-read`
//!   error count).
//!
//! What the count cannot see is the kernel's slack (`slack_pages_per_cpu`): memory charged
//! to a page counter whose stat event (the stat tracepoints' tier) or whose hook's exit (the
//! batched hook's) has not come yet. Per CPU that is one charge in flight, the per-CPU
//! stock's precharge and the LRU and mlock batches. Not bounded: a task preempted after a
//! charge and before it is counted holds that charge outside the count until it runs again —
//! on the stat tracepoints' tier up to a huge page (2 MiB) between its charge and its LRU
//! stat event (zeroing it takes ~100 µs); on the batched hook at most one charge batch,
//! within `page_counter_try_charge` itself.

use std::{
    io,
    os::fd::{AsFd, AsRawFd},
    sync::{
        Arc, Weak,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use aya::programs::ProgramFd;
use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_prog_info};
use evictd_common::{CHARGED_PAGES_SLOTS, COUNTER_CHARGED_PAGES, COUNTER_ERRORS_BASE, KernelError};

use super::{CounterMap, sum_counter};

/// Pages a CPU can have charged to a pod's page counters that the count does not show
/// yet: the charge in flight (a PMD-sized folio — a page table's worth of pages, 512 with
/// 4 KiB pages — between its charge and its stat event, or before the batched hook's exit
/// runs), the per-CPU stock's precharge (up to the 64-page charge batch for each of the 7
/// memory cgroups a CPU's stock holds since Linux 6.16, all of one pod's containers at
/// worst), and the order-0 pages waiting in the CPU's LRU-add and mlock batches (31 each)
/// before their LRU stat event.
fn slack_pages_per_cpu(page_size: u64) -> u64 {
    let pmd_folio = page_size / 8;
    pmd_folio + 7 * 64 + 31 + 31
}

/// The count's state, shared by the probes (which change it) and the clocks (which read it).
pub(super) struct ClockState {
    counters: CounterMap,
    /// The programs whose runs the kernel may skip (their `recursion_misses`); none when one
    /// of the tier did not attach or has no descriptor: then no mark is ever given.
    programs: Vec<ProgramFd>,
    /// A new epoch begins as any charge program is detached, and as they are attached again.
    epoch: AtomicU64,
    /// The programs were armed (the batched hook counts from its first config on).
    counting: AtomicBool,
    /// Every counting program is attached (the batched hook always is).
    attached: AtomicBool,
}

impl ClockState {
    pub(super) fn new(counters: CounterMap, programs: Option<Vec<ProgramFd>>) -> Self {
        ClockState {
            counters,
            programs: programs.unwrap_or_default(),
            epoch: AtomicU64::new(0),
            counting: AtomicBool::new(false),
            attached: AtomicBool::new(true),
        }
    }

    /// Programs are about to come off: no mark from here on (`attached` first, so that a
    /// mark read meanwhile fails its second look), and none taken before compares with a
    /// later one.
    pub(super) fn detaching(&self) {
        self.attached.store(false, Ordering::SeqCst);
        self.new_epoch();
    }

    /// The programs are back on (`all`: every one of them): marks again, in a new epoch.
    pub(super) fn attached(&self, all: bool) {
        self.new_epoch();
        self.attached.store(all, Ordering::SeqCst);
    }

    fn counts(&self) -> bool {
        self.counting.load(Ordering::Acquire) && self.attached.load(Ordering::SeqCst)
    }

    fn new_epoch(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// The programs were armed: the count holds every charge from here on, if every
    /// counting program of the tier attached (`programs`).
    pub(super) fn armed(&self) {
        self.counting.store(!self.programs.is_empty(), Ordering::Release);
    }

    /// Pages counted as charged, every counting program's slots summed over the CPUs.
    fn charged_pages(&self) -> Option<u64> {
        (0..CHARGED_PAGES_SLOTS)
            .map(|slot| sum_counter(&self.counters, COUNTER_CHARGED_PAGES + slot).ok())
            .sum()
    }

    /// Runs that may have left a charge uncounted: skipped by the kernel, or failed reading
    /// what they count. Only ever grows.
    fn missed_runs(&self) -> io::Result<u64> {
        let failed = sum_counter(&self.counters, COUNTER_ERRORS_BASE + KernelError::MemcgIdRead as u32)
            .map_err(io::Error::other)?;
        Ok(self.programs.iter().map(recursion_misses).sum::<io::Result<u64>>()? + failed)
    }
}

/// A program's `recursion_misses`: runs the kernel skipped because the program was already
/// running on that CPU.
fn recursion_misses(prog: &ProgramFd) -> io::Result<u64> {
    // SAFETY: plain-old-data kernel ABI structs; all zeroes is their valid empty value.
    let mut info: bpf_prog_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    attr.info.bpf_fd = prog.as_fd().as_raw_fd() as u32;
    attr.info.info_len = size_of::<bpf_prog_info>() as u32;
    attr.info.info = &raw mut info as u64;
    // SAFETY: `attr` names a buffer of `info_len` bytes that outlives the call; the kernel
    // writes at most that many.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as libc::c_long,
            &raw mut attr,
            size_of::<bpf_attr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info.recursion_misses)
}

/// The node's charge count at one moment, as far as it can bound growth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChargeMark {
    epoch: u64,
    misses: u64,
    pages: u64,
}

/// Reads the charge count for bounds (`now`, `grown_since`); clones share the probes' state
/// and read nothing once the probes are gone.
#[derive(Clone)]
pub struct ChargeClock {
    state: Weak<ClockState>,
    page_size: u64,
    slack_bytes: u64,
}

impl std::fmt::Debug for ChargeClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChargeClock").field("slack_bytes", &self.slack_bytes).finish_non_exhaustive()
    }
}

impl ChargeClock {
    pub(super) fn new(state: &Arc<ClockState>, page_size: u64, ncpus: u64) -> Self {
        ChargeClock {
            state: Arc::downgrade(state),
            page_size,
            slack_bytes: ncpus.max(1) * slack_pages_per_cpu(page_size) * page_size,
        }
    }

    /// The count now, or `None` when it may miss charges (see the module's list). Two
    /// syscalls per counting program and three map reads, twice: a few microseconds.
    pub fn now(&self) -> Option<ChargeMark> {
        let state = self.state.upgrade()?;
        if !state.counts() {
            return None;
        }
        let epoch = state.epoch.load(Ordering::SeqCst);
        let misses = state.missed_runs().ok()?;
        let pages = state.charged_pages()?;
        // A skip or a detach begun while the count was read: it may not hold them all.
        let still = state.missed_runs().ok()? == misses
            && state.epoch.load(Ordering::SeqCst) == epoch
            && state.counts();
        still.then_some(ChargeMark { epoch, misses, pages })
    }

    /// The count as it reads, unchecked (`bytes_since`); `None` while it does not count (the
    /// programs off far from every threshold: nothing to read, no syscall spent).
    pub fn rough_pages(&self) -> Option<u64> {
        let state = self.state.upgrade()?;
        if !state.counts() {
            return None;
        }
        state.charged_pages()
    }

    /// Bytes charged anywhere since `rough_pages` read `then`, unchecked: two map reads, no
    /// check that no charge was missed, so it may read low (the programs off, a run skipped)
    /// and reads high for the node (other cgroups' charges, frees not taken off). Only for
    /// what may make a wake come sooner (`Daemon::rearm`), never for a bound.
    pub fn bytes_since(&self, then: u64) -> Option<u64> {
        Some(self.rough_pages()?.saturating_sub(then).saturating_mul(self.page_size))
    }

    /// How much any one cgroup under the node can have grown between `then` and `now`
    /// (`then` taken before the usage it bounds was read), in bytes; `None` when the two
    /// do not compare.
    pub fn grown_since(&self, then: ChargeMark, now: ChargeMark) -> Option<u64> {
        Some(self.charged(then, now)?.saturating_add(self.slack_bytes))
    }

    /// The bytes counted as charged between `then` and `now`; `None` when the two do not
    /// compare.
    pub fn charged(&self, then: ChargeMark, now: ChargeMark) -> Option<u64> {
        if then.epoch != now.epoch || then.misses != now.misses || now.pages < then.pages {
            return None;
        }
        Some((now.pages - then.pages).saturating_mul(self.page_size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock() -> ChargeClock {
        ChargeClock { state: Weak::new(), page_size: 4096, slack_bytes: 1 << 20 }
    }

    /// Growth is the pages counted between the marks plus the slack, only within one epoch
    /// and with no run skipped; a count that went back (impossible) compares with nothing.
    #[test]
    fn growth_compares_only_marks_of_one_unbroken_count() {
        let c = clock();
        let then = ChargeMark { epoch: 3, misses: 7, pages: 100 };
        let now = ChargeMark { pages: 356, ..then };
        assert_eq!(c.grown_since(then, now), Some(256 * 4096 + (1 << 20)));
        assert_eq!(c.grown_since(then, then), Some(1 << 20));
        assert_eq!(c.grown_since(then, ChargeMark { epoch: 4, ..now }), None);
        assert_eq!(c.grown_since(then, ChargeMark { misses: 8, ..now }), None);
        assert_eq!(c.grown_since(now, then), None);
    }

    /// A clock whose probes are gone reads nothing.
    #[test]
    fn a_clock_without_probes_has_no_mark() {
        assert_eq!(clock().now(), None);
    }
}
