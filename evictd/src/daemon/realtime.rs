//! The daemon's thread at real-time priority, where the node permits it: the wake-up, the
//! decision and the kill all run on it, and at an ordinary priority a node full of busy
//! allocators decides how soon it runs. SCHED_FIFO at a low priority is enough to run
//! before every ordinary task; the kernel's RT throttling (95 % by default) still bounds it.
//! Threads it creates later (the blocking pool, metrics) start as ordinary threads again
//! (`SCHED_RESET_ON_FORK`).

use std::io;

/// Puts the calling thread under SCHED_FIFO at `priority` (1–99); 0 leaves it alone.
/// Refused (no CAP_SYS_NICE, an RT budget of 0 in a cgroup): said once, and evictd runs on.
pub fn enter(priority: u8) {
    if priority == 0 {
        return;
    }
    match set_fifo(priority) {
        Ok(()) => tracing::info!(priority, "the daemon thread runs under SCHED_FIFO"),
        Err(e) => tracing::warn!(
            priority,
            "cannot run the daemon thread at real-time priority ({e}; it needs CAP_SYS_NICE and an RT \
             budget): detection latency then depends on the CPU share of the node's other tasks"
        ),
    }
}

fn set_fifo(priority: u8) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: i32::from(priority) };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param for the call's
    // duration.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param) };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a thread of its own, so that the test harness's threads stay as they are.
    #[test]
    fn fifo_is_set_and_not_inherited() {
        let outcome = std::thread::spawn(|| {
            set_fifo(1)?;
            // SAFETY: pid 0, the calling thread; no memory involved.
            let policy = unsafe { libc::sched_getscheduler(0) };
            let child = std::thread::spawn(|| {
                // SAFETY: as above.
                unsafe { libc::sched_getscheduler(0) }
            })
            .join()
            .map_err(|_| io::Error::other("child thread panicked"))?;
            Ok::<_, io::Error>((policy, child))
        })
        .join();
        match outcome {
            Ok(Ok((policy, child))) => {
                assert_eq!(policy & !libc::SCHED_RESET_ON_FORK, libc::SCHED_FIFO);
                assert_eq!(child, libc::SCHED_OTHER, "threads it creates must not inherit SCHED_FIFO");
            }
            Ok(Err(e)) if e.raw_os_error() == Some(libc::EPERM) => {
                crate::skip("fifo_is_set_and_not_inherited", "SCHED_FIFO refused (no CAP_SYS_NICE)");
            }
            other => panic!("{other:?}"),
        }
    }
}
