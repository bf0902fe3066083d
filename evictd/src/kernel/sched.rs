//! The scheduling class of evictd's own threads: SCHED_FIFO for the daemon's thread and the
//! threads that stand in for it (the decision's reader, the charge programs' mover).

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
