//! The daemon's thread at real-time priority, where the node permits it: the wake-up, the
//! decision and the kill all run on it, and at an ordinary priority a node full of busy
//! allocators decides how soon it runs. SCHED_FIFO at a low priority is enough to run
//! before every ordinary task; the kernel's RT throttling (95 % by default) still bounds it.
//! Threads it creates later (the blocking pool, metrics) start as ordinary threads again
//! (`SCHED_RESET_ON_FORK`), but for the decision's reader (`Reader`) and the charge
//! programs' mover (`kernel::ebpf::mover`), which take the same priority. The blocking
//! pool's threads are made at start and kept (`daemon_runtime`).

use std::{
    io,
    panic::AssertUnwindSafe,
    sync::{
        Arc, Condvar, Mutex,
        atomic::{AtomicUsize, Ordering},
        mpsc,
    },
    time::Duration,
};

use crate::kernel::sched::set_fifo;

/// Blocking-pool threads made at start. A pass and the act step hand work to tokio's
/// blocking pool (a fast kill's reaps, the scope's walk, a policy read), and tokio panics,
/// ending the daemon, when it has no thread for such work and the kernel refuses a new one
/// — a tenant's fork bomb exhausting the node's PIDs, the very pressure evictd is there to
/// relieve. Kept threads take the work; when all are busy and a new one is refused, the work
/// waits for the first to be free.
const BLOCKING_SPARES: usize = 4;
/// Every blocking thread is kept for the daemon's life: tokio's default ends an idle one
/// after 10 s, and with the last one gone the next hand-off needs a new thread.
const BLOCKING_KEEP_ALIVE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
/// Blocking threads at most (tokio's default is 512): one fast kill's reaps and the rest,
/// with room for reads stuck in the kernel; past it, work queues.
const BLOCKING_MAX: usize = 64;
/// How long the start waits for the spare threads to come up.
const SPARES_START: Duration = Duration::from_secs(2);

/// The daemon's runtime: one thread (the caller's) for the loop, and a blocking pool that
/// keeps `BLOCKING_SPARES` threads from the start, and every thread it makes later.
pub fn daemon_runtime() -> io::Result<tokio::runtime::Runtime> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("evictd-blocking")
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
        .max_blocking_threads(BLOCKING_MAX)
        .build()?;
    let started = start_spares(&rt);
    if started < BLOCKING_SPARES {
        tracing::warn!(
            started,
            wanted = BLOCKING_SPARES,
            "fewer blocking threads than wanted came up within {SPARES_START:?} (the kernel refuses new \
             threads while the node's PIDs are exhausted): a hand-off that finds none may end evictd"
        );
    }
    Ok(rt)
}

/// The spares' meeting point: how many have come, and whether the start stopped waiting.
struct Gate {
    arrived: usize,
    released: bool,
}

/// Makes the pool's spare threads; returns how many came up. Tokio makes a thread only for
/// a task that finds none idle: the tasks wait for each other, so each takes a thread.
fn start_spares(rt: &tokio::runtime::Runtime) -> usize {
    let gate = Arc::new((Mutex::new(Gate { arrived: 0, released: false }), Condvar::new()));
    // Tokio's refusal of the pool's first thread is a panic; the warning says it instead.
    // The hook is the process's: this runs before the daemon starts any thread of its own
    // (the log writer, already running, does not panic).
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let spawned = std::panic::catch_unwind(AssertUnwindSafe(|| {
        for _ in 0..BLOCKING_SPARES {
            let gate = gate.clone();
            drop(rt.spawn_blocking(move || hold(&gate)));
        }
    }));
    std::panic::set_hook(hook);
    let (gate, arrivals) = &*gate;
    let mut g = lock_gate(gate);
    if spawned.is_ok() {
        g = arrivals
            .wait_timeout_while(g, SPARES_START, |g| g.arrived < BLOCKING_SPARES)
            .map_or_else(|p| p.into_inner().0, |(g, _)| g);
    }
    // A spare that comes later (refused now, run by the first thread made later) leaves at once.
    g.released = true;
    arrivals.notify_all();
    g.arrived
}

/// A spare at the gate until the start stops waiting.
fn hold(gate: &(Mutex<Gate>, Condvar)) {
    let (gate, arrivals) = gate;
    let mut g = lock_gate(gate);
    g.arrived += 1;
    arrivals.notify_all();
    let _released = arrivals.wait_while(g, |g| !g.released);
}

fn lock_gate(gate: &Mutex<Gate>) -> std::sync::MutexGuard<'_, Gate> {
    gate.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

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

type Job = Box<dyn FnOnce() + Send>;

/// Reader threads alive at most, those stuck in a read included, before decisions read on
/// the blocking pool instead: each stuck one ends when its read returns.
const MAX_READERS: usize = 4;

/// The reader thread's stack (std's default).
const READER_STACK: usize = 2 << 20;

/// Whether a new reader thread faults its arena and stack in before its first read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Prefault {
    Yes,
    No,
}

/// A thread of its own for the decision's reads (the pods' cgroup files), at the daemon
/// thread's priority. On tokio's blocking pool, ordinary threads, these reads waited behind
/// the node's busy tasks and the disk walk: tens to hundreds of milliseconds on a node of
/// 110–250 pods (`cargo xtask bench scale`). On the daemon's own thread, one read stuck
/// behind a kernel lock would stop every wake. Jobs run one at a time, in order; a job that
/// panics answers nothing and the thread goes on. A reader stuck in a read is replaced
/// (`replacement`) by whoever stopped waiting for it.
pub struct Reader {
    jobs: mpsc::Sender<Job>,
    priority: u8,
    /// Reader threads alive, this one's stuck predecessors included.
    alive: Arc<AtomicUsize>,
}

/// Queues jobs on a reader's thread (`Reader::submitter`); a job queued after the thread
/// ended is dropped.
#[derive(Clone)]
pub struct Submitter(mpsc::Sender<Job>);

impl Submitter {
    pub fn submit(&self, job: impl FnOnce() + Send + 'static) {
        let _ = self.0.send(Box::new(job));
    }
}

impl Reader {
    /// Starts the reader at `priority` (0: an ordinary thread). `None` (said why) when the
    /// thread cannot be started: the reads then go to the blocking pool.
    pub fn spawn(priority: u8) -> Option<Reader> {
        Self::spawn_counted(priority, Arc::default(), Prefault::Yes)
    }

    /// A fresh reader in place of this one, stuck in a read (this one's thread ends when
    /// that read returns). `None` with `MAX_READERS` alive already, or no thread to be had.
    pub fn replacement(&self) -> Option<Reader> {
        if self.alive.load(Ordering::Relaxed) >= MAX_READERS {
            tracing::error!(
                "{MAX_READERS} reader threads are stuck in cgroup reads: the decisions' reads go to the \
                 blocking pool, at an ordinary priority"
            );
            return None;
        }
        // Not faulted in: a replacement starts while the node may be starved, and its first
        // read must not wait for ~150 pages of reclaim before it even begins.
        Self::spawn_counted(self.priority, self.alive.clone(), Prefault::No)
    }

    fn spawn_counted(priority: u8, alive: Arc<AtomicUsize>, prefault: Prefault) -> Option<Reader> {
        let (jobs, queue) = mpsc::channel::<Job>();
        alive.fetch_add(1, Ordering::Relaxed);
        let count = alive.clone();
        // Answered once the thread has faulted its reserves in, so that no read waits behind it.
        let (ready, started) = mpsc::sync_channel::<()>(1);
        let spawned = std::thread::Builder::new()
            .name("evictd-reads".into())
            // Fixed, so the stack the thread faults in is within it whatever RUST_MIN_STACK says.
            .stack_size(READER_STACK)
            .spawn(move || {
                if priority > 0
                    && let Err(e) = set_fifo(priority)
                {
                    tracing::warn!(priority, "the decision's reads run at an ordinary priority: {e}");
                }
                if prefault == Prefault::Yes {
                    super::protect::prefault_reader_thread();
                }
                let _ = ready.send(());
                while let Ok(job) = queue.recv() {
                    // A panicking job drops its answer's sender: its caller sees no answer.
                    let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
                }
                count.fetch_sub(1, Ordering::Relaxed);
            });
        match spawned {
            Ok(_) => {
                // Only at start (below a millisecond on a real machine). A replacement is not
                // waited for: the decision waiting on a thread not yet real-time would be
                // waiting on the node's load.
                if prefault == Prefault::Yes {
                    let _ = started.recv();
                }
                Some(Reader { jobs, priority, alive })
            }
            Err(e) => {
                alive.fetch_sub(1, Ordering::Relaxed);
                tracing::error!(
                    "cannot start the decision's reader thread ({e}): the pods' usage is read on the \
                     blocking pool, at an ordinary priority"
                );
                None
            }
        }
    }

    /// Runs `job` on the reader's thread, after what is queued, without waiting for it.
    pub fn submit(&self, job: impl FnOnce() + Send + 'static) {
        let _ = self.jobs.send(Box::new(job));
    }

    /// A handle that queues jobs on this reader's thread, for a job to queue its own
    /// continuation behind what was queued meanwhile.
    pub fn submitter(&self) -> Submitter {
        Submitter(self.jobs.clone())
    }

    /// `read`'s result, run on the reader's thread; `None` if it panicked or the thread is
    /// gone. The caller bounds the wait.
    pub async fn read<T: Send + 'static>(&self, read: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.jobs
            .send(Box::new(move || {
                let _ = tx.send(read());
            }))
            .ok()?;
        rx.await.ok()
    }
}

#[cfg(test)]
mod tests {
    use rusty_fork::rusty_fork_test;

    use super::*;

    /// Jobs queued together run one after the other, in order, off the caller's thread; a
    /// job that panics answers nothing and the next still runs.
    #[tokio::test(flavor = "current_thread")]
    async fn the_reader_runs_jobs_in_order_on_its_own_thread() {
        let reader = Reader::spawn(0).expect("a thread");
        let order = Arc::new(Mutex::new(Vec::new()));
        let (a, b) = (order.clone(), order.clone());
        let here = std::thread::current().id();
        #[allow(clippy::disallowed_methods, reason = "sleeps on the reader's thread, not tokio's")]
        let slow = reader.read(move || {
            std::thread::sleep(Duration::from_millis(50));
            a.lock().map(|mut o| o.push(1)).ok();
            std::thread::current().id()
        });
        let quick = reader.read(move || b.lock().map(|mut o| o.push(2)).is_ok());
        let (there, _) = tokio::join!(slow, quick);
        assert_ne!(there, Some(here), "the job ran on the caller's thread");
        assert_eq!(*order.lock().expect("order"), [1, 2]);
        #[allow(clippy::panic, reason = "the panic is the test's input")]
        let panicked = reader.read(|| -> u8 { panic!("a read that panics") }).await;
        assert_eq!(panicked, None);
        let name = reader.read(|| std::thread::current().name().map(String::from)).await;
        assert_eq!(name.flatten().as_deref(), Some("evictd-reads"), "the thread goes on after a panic");
    }

    rusty_fork_test! {
        /// A started reader's first reads allocate within the arena it faulted in: far fewer
        /// faults than pages (the same allocations on a thread that faulted nothing in take
        /// one a page: `protect`'s own test shows it). In a process of its own: no other
        /// test's thread shares the reader's arena.
        #[test]
        fn a_started_readers_first_allocations_do_not_fault() {
            use crate::daemon::protect::tests::{allocate, faults};
            // The daemon's malloc tunables, as set once the start is done: the freed reserve
            // stays in the arena.
            crate::daemon::protect::reserve_heap(crate::daemon::protect::HEAP_RESERVE);
            let reader = Reader::spawn(0).expect("a thread");
            let bytes = crate::daemon::protect::READER_HEAP_RESERVE / 2;
            let rt = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
            let in_reserve = rt
                .block_on(reader.read(move || {
                    let before = faults();
                    let held = allocate(bytes);
                    let n = faults() - before;
                    drop(held);
                    n
                }))
                .expect("an answer");
            let pages = (bytes / 4096) as i64;
            assert!(in_reserve < pages / 8, "{in_reserve} faults for {pages} pages within the reader's reserve");
        }
    }

    /// This process in a pids cgroup of its own (the host's v1 pids hierarchy, or cgroup v2
    /// with the pids controller), limited to the tasks it has: the kernel refuses every new
    /// thread. Put back where it was, the cgroup removed and the controller handed back as
    /// it was, on drop.
    struct NoNewThreads {
        dir: std::path::PathBuf,
        home: std::path::PathBuf,
        /// cgroup v2's root, where this enabled the pids controller for its children.
        enabled_in: Option<std::path::PathBuf>,
    }

    impl NoNewThreads {
        /// The cage, or why there can be none here.
        fn here() -> Result<Self, String> {
            let v1 = std::path::Path::new("/sys/fs/cgroup/pids");
            let v2 = std::path::Path::new("/sys/fs/cgroup");
            let read =
                |p: &std::path::Path| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
            let own = read(std::path::Path::new("/proc/self/cgroup"))?;
            let mut enabled_in = None;
            let (root, at) = if v1.join("cgroup.procs").exists() {
                let path = own
                    .lines()
                    .find(|l| l.split(':').nth(1).is_some_and(|c| c.split(',').any(|c| c == "pids")))
                    .and_then(|l| l.split(':').nth(2))
                    .ok_or("no pids line in /proc/self/cgroup")?;
                (v1, path.to_string())
            } else if read(&v2.join("cgroup.controllers"))?.split_whitespace().any(|c| c == "pids") {
                let control = v2.join("cgroup.subtree_control");
                if !read(&control)?.split_whitespace().any(|c| c == "pids") {
                    std::fs::write(&control, "+pids")
                        .map_err(|e| format!("enabling pids in {}: {e}", control.display()))?;
                    enabled_in = Some(v2.to_path_buf());
                }
                (
                    v2,
                    own.lines()
                        .find_map(|l| l.strip_prefix("0::"))
                        .ok_or("no v2 line in /proc/self/cgroup")?
                        .to_string(),
                )
            } else {
                return Err("no pids controller, in a v1 hierarchy or in cgroup v2".into());
            };
            let dir = root.join(format!("evictd-test-no-threads-{}", std::process::id()));
            if let Err(e) = std::fs::create_dir(&dir) {
                if let Some(root) = &enabled_in {
                    let _ = std::fs::write(root.join("cgroup.subtree_control"), "-pids");
                }
                return Err(format!("{}: {e}", dir.display()));
            }
            let cage = NoNewThreads { dir, home: root.join(at.trim_start_matches('/')), enabled_in };
            std::fs::write(cage.dir.join("cgroup.procs"), std::process::id().to_string())
                .expect("joining the pids cgroup");
            let tasks = std::fs::read_to_string(cage.dir.join("pids.current")).expect("pids.current");
            std::fs::write(cage.dir.join("pids.max"), tasks.trim()).expect("setting pids.max");
            Ok(cage)
        }
    }

    impl Drop for NoNewThreads {
        fn drop(&mut self) {
            let _ = std::fs::write(self.home.join("cgroup.procs"), std::process::id().to_string());
            let _ = std::fs::remove_dir(&self.dir);
            if let Some(root) = &self.enabled_in {
                let _ = std::fs::write(root.join("cgroup.subtree_control"), "-pids");
            }
        }
    }

    /// This process's threads named `name`.
    fn threads_named(name: &str) -> usize {
        let tasks = std::fs::read_dir("/proc/self/task").expect("/proc/self/task");
        tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim() == name)
            .count()
    }

    rusty_fork_test! {
        /// Work handed to the blocking pool runs when the kernel refuses every new thread (a
        /// fork bomb has the node's PIDs): the daemon's runtime made its threads at start and
        /// keeps them past tokio's default keep-alive, so a refusal only queues the work; more
        /// work than threads waits for the first to be free. The control: tokio's default
        /// runtime, which has no thread yet, panics on the same hand-off (that panic would end
        /// the daemon). In a process of its own: it limits its own threads. Takes 11 s: the
        /// kept threads must outlive tokio's default keep-alive (10 s).
        #[test]
        fn work_for_the_blocking_pool_runs_when_no_thread_can_be_made() {
            let test = "work_for_the_blocking_pool_runs_when_no_thread_can_be_made";
            // More than the threads kept: some wait for a free one.
            const HAND_OFFS: usize = 10;
            let daemon = daemon_runtime().expect("the daemon's runtime");
            let plain = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            daemon.block_on(async { tokio::time::sleep(Duration::from_secs(11)).await });
            assert_eq!(threads_named("evictd-blocking"), BLOCKING_SPARES, "the spare threads, kept");
            let _cage = match NoNewThreads::here() {
                Ok(cage) => cage,
                Err(why) => return crate::skip(test, &format!("cannot limit this process's threads: {why}")),
            };
            let refused = std::panic::catch_unwind(AssertUnwindSafe(|| {
                plain.block_on(async { tokio::task::spawn_blocking(|| ()).await.is_ok() })
            }));
            assert!(refused.is_err(), "tokio's default runtime made a thread: the limit does not hold");
            let done = daemon.block_on(async {
                let mut work = tokio::task::JoinSet::new();
                for i in 0..HAND_OFFS {
                    work.spawn_blocking(move || i);
                }
                tokio::time::timeout(Duration::from_secs(10), work.join_all()).await.map(|d| d.len())
            });
            assert_eq!(done, Ok(HAND_OFFS), "work queued behind the kept threads must run");
        }
    }

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
