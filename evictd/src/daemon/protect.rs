//! The daemon keeps itself alive when the node is starved, which is when it is needed: the
//! kernel's OOM killer should pick anything but evictd (`oom_score_adj` −999, as the kubelet
//! sets for itself), none of its pages may be reclaimed from under it (a page fault on the
//! decision path in a node short of memory waits for reclaim: `mlockall`), and the memory the
//! pressure path allocates is already there: the daemon thread's stack is faulted in (and
//! locked) at start, a heap reserve once the start has given back what it freed, and the
//! decision reader thread's arena and stack when it starts; all are kept. Each is said once
//! when the node does not permit it, and evictd runs on.

use std::io;

use crate::kernel::sched::{fault_in_heap, prefault_stack};

/// `--oom-score-adj`, `--lock-memory`.
#[derive(Clone, Copy, Debug)]
pub struct SelfProtection {
    /// `None`: left as inherited.
    pub oom_score_adj: Option<i16>,
    pub lock_memory: bool,
}

/// Heap kept faulted in for the pressure path: a pass's allocations on the daemon's thread
/// (the ranking, the records, the CRI's messages, the trace lines). `bench scale` at 250
/// pods measured at most 2 page faults a run on the real-time threads with this reserve,
/// and 0–1 with half of it (one invocation, 3 runs a cell); made again off the pressure path
/// (`refresh_heap_reserve`) once what the daemon thread keeps has grown into it.
pub const HEAP_RESERVE: usize = 1 << 20;
/// The daemon thread's stack faulted in at start.
const STACK_RESERVE: usize = 256 << 10;
/// The decision's reader thread: its own malloc arena (glibc gives a new thread one of its
/// own while there are fewer than eight per CPU) and its stack, faulted in before its first
/// read. Without them, `bench scale`'s first eviction at 250 pods took 38–65 page faults on
/// the real-time threads and later ones up to 19 (the reader's buffers for 250 usage files
/// and the contenders' memory.stat growing its arena); with them, 0–1.
pub(crate) const READER_HEAP_RESERVE: usize = 512 << 10;
const READER_STACK_RESERVE: usize = 64 << 10;
/// Free memory at the top of the heap past this is given back (down to `M_TOP_PAD`, which is
/// set to the reserve so that no trim takes it): far above what a pass on the daemon's thread
/// holds at once.
const TRIM_THRESHOLD: usize = 8 << 20;

pub fn protect(p: SelfProtection) {
    raise_open_files();
    if let Some(adj) = p.oom_score_adj {
        match std::fs::write("/proc/self/oom_score_adj", adj.to_string()) {
            Ok(()) => tracing::info!(oom_score_adj = adj, "the kernel's OOM killer spares evictd"),
            Err(e) => tracing::warn!(
                "cannot set evictd's oom_score_adj to {adj} ({e}; lowering it needs CAP_SYS_RESOURCE): \
                 the kernel's OOM killer may pick evictd"
            ),
        }
    }
    if p.lock_memory {
        match lock_memory() {
            Ok(()) => tracing::info!("evictd's memory is locked (mlockall, on fault)"),
            Err(e) => tracing::warn!(
                "cannot lock evictd's memory ({e}; it needs CAP_IPC_LOCK or RLIMIT_MEMLOCK): its pages \
                 can be reclaimed when the node is short of memory"
            ),
        }
    }
    // After the lock: the pages faulted in here are locked as they are touched. The heap
    // reserve waits for the end of the start (`settle_heap`).
    // The pass's deepest calls on this thread: the CRI client, the JSON encoder.
    prefault_stack::<STACK_RESERVE>();
}

/// Once the start is done (BTF and the eBPF object parsed, the clients made): the free top of
/// the daemon thread's heap is given back to the kernel, and only then the reserve is faulted
/// in. Made before the start, the reserve was split by the start's long-lived allocations and
/// the heap grew past both (5.9 MiB idle, against 2.4 MiB this way with a 1 MiB reserve);
/// kept, that memory would stay locked for good. (Free pages inside the heap stay: under the
/// lock, malloc_trim's `MADV_DONTNEED` on them fails.) Before the reader and the disk walker
/// start, whose arenas this would trim too.
pub fn settle_heap() {
    // SAFETY: malloc_trim takes a size and touches no memory of ours.
    unsafe { libc::malloc_trim(0) };
    reserve_heap(HEAP_RESERVE);
}

/// Faults in `bytes` of this thread's malloc heap and keeps them there, so that the pressure
/// path's allocations reuse resident (and locked) pages instead of faulting on a node that has
/// none to give. glibc would return the freed reserve to the kernel (free memory at the top of
/// the heap past `M_TRIM_THRESHOLD`) and serve large requests with fresh mappings (past
/// `M_MMAP_THRESHOLD`, which also adapts upwards); both are fixed here, which also stops the
/// adaptation. A trim keeps `M_TOP_PAD` at the top: the reserve.
pub fn reserve_heap(bytes: usize) {
    // SAFETY: mallopt sets malloc's tunables; it touches no memory of ours. Values fit i32.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, (1 << 20) as libc::c_int);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD.max(2 * bytes) as libc::c_int);
        libc::mallopt(libc::M_TOP_PAD, bytes as libc::c_int);
    }
    fault_in_heap(bytes);
}

/// Makes the daemon thread's heap reserve again, off the pressure path: what the thread keeps
/// (the inventory's growth on a node that gains pods) takes from the free heap the reserve
/// left, and the next pass past that would fault. Allocating the reserve again finds it
/// resident (a few microseconds) or faults in what is missing now, while no threshold is met.
pub fn refresh_heap_reserve() {
    fault_in_heap(HEAP_RESERVE);
}

/// The reader thread's arena and stack, faulted in (and locked, when the lock was granted) on
/// that thread, with the tunables `reserve_heap` fixed at start: its reads then take no heap
/// or stack fault within these reserves (its code pages are faulted in on first use).
pub fn prefault_reader_thread() {
    fault_in_heap(READER_HEAP_RESERVE);
    prefault_stack::<READER_STACK_RESERVE>();
}

/// Locks every page evictd has and will have, as each is first touched (`MCL_ONFAULT`):
/// stacks and heap reserved but never used are not made resident.
fn lock_memory() -> io::Result<()> {
    // SAFETY: mlockall takes flags only and touches no memory of ours.
    let r = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT) };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Resident and locked memory of this process, in bytes (`VmRSS`, `VmLck`), for the log.
pub fn resident_and_locked() -> Option<(u64, u64)> {
    let status = procfs::process::Process::myself().ok()?.status().ok()?;
    Some((status.vmrss? * 1024, status.vmlck? * 1024))
}

/// The soft limit of open files raised to the hard one (runtimes often start containers at
/// a soft 1024): pidfds, cgroup files and the disk walk's directories share it, and running
/// out of descriptors would fail the kill path itself.
fn raise_open_files() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!("cannot raise evictd's open-file limit from {soft} to {hard}: {e}");
            }
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot read evictd's open-file limit: {e}"),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use rusty_fork::rusty_fork_test;

    use super::*;

    /// Minor page faults of this thread so far.
    pub(crate) fn faults() -> i64 {
        let mut u = std::mem::MaybeUninit::<libc::rusage>::uninit();
        // SAFETY: getrusage fills the struct it is given.
        let r = unsafe { libc::getrusage(libc::RUSAGE_THREAD, u.as_mut_ptr()) };
        assert_eq!(r, 0);
        // SAFETY: filled by the successful call above.
        unsafe { u.assume_init() }.ru_minflt
    }

    const CHUNK: usize = 64 << 10;

    pub(crate) fn allocate(bytes: usize) -> Vec<Vec<u8>> {
        (0..bytes / CHUNK).map(|_| std::hint::black_box(vec![1u8; CHUNK])).collect()
    }

    rusty_fork_test! {
        /// Allocations within the reserve reuse its pages: no faults. Past it, the same
        /// allocations fault page by page (which shows the count would see them). In a process
        /// of its own: no other test's thread shares the arena.
        #[test]
        fn allocations_within_the_reserve_do_not_fault() {
            reserve_heap(HEAP_RESERVE);
            let before = faults();
            let within = allocate(HEAP_RESERVE / 2);
            let in_reserve = faults() - before;
            let before = faults();
            let beyond = allocate(8 * HEAP_RESERVE);
            let past_reserve = faults() - before;
            drop((within, beyond));
            let pages = (HEAP_RESERVE / 2 / 4096) as i64;
            assert!(in_reserve < pages / 8, "{in_reserve} faults for {pages} pages within the reserve");
            assert!(past_reserve > pages, "{past_reserve} faults for {} pages past it", 16 * pages);
        }
    }
}
