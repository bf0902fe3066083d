//! How evictd's own threads run: SCHED_FIFO for the daemon's thread and the threads that
//! stand in for it (the decision's reader, the charge programs' mover, the eventfd
//! registrar), and the stack and heap they fault in before they are needed.

use std::io;

/// Puts the calling thread under SCHED_FIFO at `priority` (1–99). Threads it creates later
/// start as ordinary threads (`SCHED_RESET_ON_FORK`).
pub fn set_fifo(priority: u8) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: i32::from(priority) };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param for the call's
    // duration.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param) };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// The nice value of evictd's threads whose work is for people or for later (the disk walker,
/// the trace's writer): they yield to evictd-io and the pressure path's ordinary work.
pub const BACKGROUND_NICE: i32 = 10;

/// Sets the calling thread's nice value (Linux nice values are per thread: PRIO_PROCESS with
/// its TID). Lowering it below 0 needs CAP_SYS_NICE.
pub fn set_nice(nice: i32) -> io::Result<()> {
    // SAFETY: gettid has no preconditions; setpriority reads only its integer arguments.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// The calling thread's SCHED_FIFO priority; `None` under any other policy.
pub fn fifo_priority() -> Option<u8> {
    // SAFETY: pid 0, the calling thread; no memory involved.
    let policy = unsafe { libc::sched_getscheduler(0) };
    if policy < 0 || policy & !libc::SCHED_RESET_ON_FORK != libc::SCHED_FIFO {
        return None;
    }
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0, the calling thread; `param` is a valid sched_param to write into.
    let r = unsafe { libc::sched_getparam(0, &mut param) };
    (r == 0).then(|| u8::try_from(param.sched_priority).ok()).flatten().filter(|p| *p > 0)
}

/// Faults in the top `BYTES` of the calling thread's stack (locked as touched, under
/// `mlockall`): its calls within that depth then never grow it by a fault.
#[inline(never)]
pub fn prefault_stack<const BYTES: usize>() {
    let mut frame = [0u8; BYTES];
    std::hint::black_box(&mut frame);
}

/// The heap faulted in is made of chunks malloc serves from its heap (below
/// `M_MMAP_THRESHOLD`), all held at once.
const CHUNK: usize = 64 << 10;

/// Faults in `bytes` (rounded up to whole chunks) of the calling thread's malloc arena and
/// frees them into it: glibc gives a new thread an arena of its own (while there are fewer
/// than eight per CPU), and its first allocations would otherwise fault there.
pub fn fault_in_heap(bytes: usize) {
    let chunk = CHUNK.min(bytes);
    let chunks: Vec<Vec<u8>> = (0..bytes.div_ceil(chunk.max(1)))
        .map(|_| {
            // Written, not zeroed: calloc may skip zeroing fresh pages, and so never fault them.
            let mut c = Vec::with_capacity(chunk);
            c.resize(chunk, 1u8);
            std::hint::black_box(c)
        })
        .collect();
    drop(chunks);
}

/// A thread that stands in for the daemon's on the pressure path (it attaches, registers,
/// logs), ready before it is needed: its stack's top `STACK` bytes and 32 KiB of its own
/// arena faulted in (and locked as touched, under `mlockall`), so that the first request
/// after a kill, on a node short of memory, does not wait on a fault.
pub fn prefault_helper_thread<const STACK: usize>() {
    fault_in_heap(HELPER_HEAP);
    prefault_stack::<STACK>();
}

/// A helper thread's heap faulted in: an attach's or a registration's allocations and a log
/// line fit in it several times over.
const HELPER_HEAP: usize = 32 << 10;

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier};

    use rusty_fork::rusty_fork_test;

    use super::*;
    use crate::daemon::protect::tests::faults;

    /// Minor faults of a helper's first work on a new thread: 16 KiB allocated and held, a
    /// call 32 KiB deep. The thread not made ready goes first (`turn`), so that it, not the
    /// ready one, takes the faults of the code's pages.
    fn first_work_faults(ready: bool, both_up: &Barrier, turn: &Barrier) -> i64 {
        if ready {
            prefault_helper_thread::<{ 64 << 10 }>();
        }
        // Both threads hold an arena of their own from here (glibc gives a thread the arena
        // a thread that ended left, faulted in already).
        let _arena = std::hint::black_box(vec![0u8; 64]);
        both_up.wait();
        if ready {
            turn.wait();
        }
        let before = faults();
        let held: Vec<Vec<u8>> = (0..4).map(|_| std::hint::black_box(vec![1u8; 4 << 10])).collect();
        deep_call();
        drop(held);
        let taken = faults() - before;
        if !ready {
            turn.wait();
        }
        taken
    }

    /// A call whose frame takes 32 KiB of stack, faulted as the call begins.
    #[inline(never)]
    fn deep_call() {
        let mut frame = [0u8; 32 << 10];
        std::hint::black_box(&mut frame);
    }

    rusty_fork_test! {
        /// A helper thread made ready (`prefault_helper_thread`) takes no fault for its first
        /// allocations and deep calls (at most two the kernel may add); one beside it that was
        /// not takes them (which shows the count would see them). In a process of its own: no
        /// other test's thread left an arena to reuse.
        #[test]
        fn a_helper_thread_made_ready_does_not_fault_on_its_first_work() {
            // Small pages only: Debian's kernels run transparent huge pages `always`, where one
            // fault may map many of the pages a thread touches. In the bookworm VM the thread
            // not made ready once counted 7 faults (at least 8 in every other run), and the
            // control showed nothing.
            // SAFETY: prctl with integer arguments; it changes this forked process only.
            assert_eq!(unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) }, 0);
            // With the tunables the daemon fixes at start (no trim gives the heap back).
            crate::daemon::protect::reserve_heap(crate::daemon::protect::HEAP_RESERVE);
            let (both_up, turn) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
            let spawn = |ready| {
                let (b, t) = (both_up.clone(), turn.clone());
                std::thread::spawn(move || first_work_faults(ready, &b, &t))
            };
            let (ready, unready) = (spawn(true), spawn(false));
            let ready = ready.join().expect("the ready thread");
            let unready = unready.join().expect("the thread not made ready");
            // Not 0: the kernel may move or reclaim a page of the test's meanwhile.
            assert!(ready <= 2, "the ready thread took {ready} faults");
            assert!(unready >= 8, "the thread not made ready took {unready} faults: nothing shown");
        }
    }
}
