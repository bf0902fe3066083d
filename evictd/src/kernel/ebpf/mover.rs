//! The charge programs attached and detached on a thread of their own. An attach moments
//! after the programs came off waits for an RCU grace period (5–20 ms here, up to ~60 ms):
//! in the daemon's pass it held every wake behind it, and on tokio's blocking pool it waited
//! behind other work at an ordinary priority, in no order with the act step's detach. Here
//! every request (the band's, from a pass; the act step's, when a killed pod exits) goes to
//! one thread at the daemon's priority, which acts on the latest (a request not begun yet is
//! replaced by the next), so the programs end where the latest request asked.

use std::{
    io,
    sync::{
        Arc, Condvar, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use super::ChargeSwitch;
use crate::kernel::sched;

/// Why a request was made: what the log says once it is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// A memory threshold is near (the band).
    Near,
    /// Every memory threshold is far (the band).
    Far,
    /// A pod evictd's fast kill ended exits: its uncharges would each run the programs.
    Exit,
}

/// The latest request and the mover's progress on it.
struct Requests {
    attach: bool,
    why: Why,
    /// Counts requests; `served` is the last one the mover began.
    seq: u64,
    served: u64,
}

struct Shared {
    requests: Mutex<Requests>,
    asked: Condvar,
    /// No request is waiting and no move is under way.
    idle: AtomicBool,
    /// The thread runs (it ends once the probes are gone, or if a move panicked).
    alive: AtomicBool,
    /// The last move failed (warned once until one works again).
    failing: AtomicBool,
}

/// A handle on the mover's thread; clones share it. The thread ends once the probes are gone
/// (within `CHECK_GONE`).
#[derive(Clone)]
pub struct ChargeMover(Arc<Shared>);

/// How often an idle mover checks whether its probes are gone.
const CHECK_GONE: Duration = Duration::from_secs(1);

/// The mover's stack: it attaches programs and logs, nothing more.
const MOVER_STACK: usize = 256 << 10;

impl ChargeMover {
    /// Starts the mover's thread, at `priority` (SCHED_FIFO) when one is given. The programs
    /// are taken to be attached, as the load leaves them.
    pub fn start(switch: ChargeSwitch, priority: Option<u8>) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            requests: Mutex::new(Requests { attach: true, why: Why::Near, seq: 0, served: 0 }),
            asked: Condvar::new(),
            idle: AtomicBool::new(true),
            alive: AtomicBool::new(true),
            failing: AtomicBool::new(false),
        });
        let theirs = shared.clone();
        std::thread::Builder::new().name("evictd-charge".into()).stack_size(MOVER_STACK).spawn(
            move || {
                if let Some(p) = priority
                    && let Err(e) = sched::set_fifo(p)
                {
                    tracing::warn!(
                        priority = p,
                        "the charge programs' mover runs at an ordinary priority: {e}"
                    );
                }
                sched::prefault_helper_thread::<STACK_RESERVE>();
                // A panic in a move (aya, the log) ends the thread; the passes then move the
                // programs themselves (`alive`).
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&switch, &theirs)));
                theirs.alive.store(false, Ordering::Release);
            },
        )?;
        Ok(ChargeMover(shared))
    }

    /// Asks for the programs attached (`attach`) or detached; a later request replaces one
    /// not begun yet, and one under way is followed by the latest.
    pub fn request(&self, attach: bool, why: Why) {
        let mut r = lock(&self.0.requests);
        r.attach = attach;
        r.why = why;
        r.seq = r.seq.wrapping_add(1);
        self.0.idle.store(false, Ordering::Release);
        self.0.asked.notify_one();
    }

    /// What the latest request asked for.
    pub fn wanted(&self) -> bool {
        lock(&self.0.requests).attach
    }

    /// Whether every request has been acted on (a failed move included).
    pub fn idle(&self) -> bool {
        self.0.idle.load(Ordering::Acquire)
    }

    /// Whether the thread still runs.
    pub fn alive(&self) -> bool {
        self.0.alive.load(Ordering::Acquire)
    }
}

/// The stack a move takes at most, faulted in (and locked, under `mlockall`) at the
/// thread's start: an attach near a threshold, on a node short of memory, then takes no
/// stack fault.
const STACK_RESERVE: usize = 64 << 10;

fn run(switch: &ChargeSwitch, shared: &Shared) {
    loop {
        let (attach, why) = {
            let mut r = lock(&shared.requests);
            while r.seq == r.served {
                shared.idle.store(true, Ordering::Release);
                if switch.gone() {
                    return;
                }
                r = shared.asked.wait_timeout(r, CHECK_GONE).map_or_else(|p| p.into_inner().0, |(r, _)| r);
            }
            r.served = r.seq;
            (r.attach, r.why)
        };
        if !move_programs(switch, attach, why, &shared.failing) {
            return;
        }
    }
}

/// One move; `false` once the probes are gone.
fn move_programs(switch: &ChargeSwitch, attach: bool, why: Why, failing: &AtomicBool) -> bool {
    let t = Instant::now();
    let moved = if attach { switch.attach() } else { switch.detach().map(Ok) };
    let moved = match moved {
        None => return false,
        Some(Ok(n)) => n,
        Some(Err(e)) => {
            if !failing.swap(true, Ordering::Relaxed) {
                tracing::warn!("{e}; tried again at every pass");
            }
            return true;
        }
    };
    failing.store(false, Ordering::Relaxed);
    if moved > 0 {
        let took_us = t.elapsed().as_micros() as u64;
        match why {
            Why::Near => tracing::info!(took_us, "charge programs attached: a memory threshold is near"),
            Why::Far => tracing::info!(took_us, "charge programs detached: every memory threshold is far"),
            Why::Exit => tracing::info!(took_us, "charge programs detached while an evicted pod exits"),
        }
    }
    true
}

/// The requests stay consistent whatever a panicking holder did.
fn lock(m: &Mutex<Requests>) -> MutexGuard<'_, Requests> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
