//! PSI triggers as a wake source. Registration: write "some <stall_us> <window_us>" to a
//! pressure file and keep it open; the kernel raises POLLPRI on it when tasks stalled on
//! memory for more than the trigger's share of its window. Without CAP_SYS_RESOURCE only
//! cgroup2 files accept triggers, and only with a window that is a multiple of 2 s; the
//! registration falls back to that and the log says so.

use std::{fs::File, io::Write as _, path::Path, time::Duration};

use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::mpsc,
    task::JoinHandle,
};

use super::{SourceKind, SourceTask, TaskSource, Wake, WakeCause, WakeError, WakeSource};
use crate::node::{cgroups::CgroupVersion, signals::NodeSignalSources};

/// A registered trigger; the kernel keeps it while the file stays open.
pub struct PsiTrigger {
    pub file: File,
    pub window: Duration,
}

/// Registers a `some` trigger on `path` (e.g. /proc/pressure/memory or a cgroup's
/// memory.pressure).
pub fn open_trigger(path: &Path, stall: Duration, window: Duration) -> std::io::Result<PsiTrigger> {
    let mut file = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
    let spec = format!("some {} {}\0", stall.as_micros(), window.as_micros());
    file.write_all(spec.as_bytes())?;
    Ok(PsiTrigger { file, window })
}

/// Tries the privileged 500 ms window first, then the unprivileged 2 s form.
pub fn open_best(path: &Path) -> Result<PsiTrigger, std::io::Error> {
    match open_trigger(path, Duration::from_millis(100), Duration::from_millis(500)) {
        Ok(t) => Ok(t),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) || e.raw_os_error() == Some(libc::EPERM) => {
            open_trigger(path, Duration::from_millis(200), Duration::from_secs(2))
        }
        Err(e) => Err(e),
    }
}

struct Trigger(PsiTrigger);

impl std::os::fd::AsRawFd for Trigger {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.file.as_raw_fd()
    }
}

/// Starts the source on the node cgroup's pressure file: a v2 node cgroup has its own; on
/// v1 only the system-wide one exists.
pub fn start(signals: &NodeSignalSources, tx: mpsc::Sender<Wake>) -> Result<Box<dyn WakeSource>, WakeError> {
    let node = &signals.node;
    let path = match node.version {
        CgroupVersion::V2 => node.dir.join("memory.pressure"),
        CgroupVersion::V1 => std::path::PathBuf::from("/proc/pressure/memory"),
    };
    let task =
        spawn(&path, tx).map_err(|error| WakeError::Psi { path: path.display().to_string(), error })?;
    Ok(Box::new(TaskSource {
        kind: SourceKind::Psi,
        task: SourceTask::new("the PSI trigger's waiter", task),
    }))
}

/// Registers a trigger on `path` (the privileged 500 ms window, else the 2 s one, saying so)
/// and wakes evictd whenever it fires.
fn spawn(path: &Path, tx: mpsc::Sender<Wake>) -> std::io::Result<JoinHandle<()>> {
    let t = open_best(path)?;
    if t.window.as_millis() > 500 {
        tracing::warn!(
            path = %path.display(),
            "PSI trigger with a {:?} window: the 500 ms window needs CAP_SYS_RESOURCE", t.window
        );
    } else {
        tracing::info!(path = %path.display(), "PSI wake source armed, {:?} window", t.window);
    }
    // SAFETY: the trigger's file stays open, unchanged, for as long as the AsyncFd owns it.
    let fd = unsafe { AsyncFd::register_with_interest(Trigger(t), Interest::PRIORITY) }
        .map_err(std::io::Error::from)?;
    Ok(tokio::spawn(async move {
        loop {
            let Ok(mut guard) = fd.ready(Interest::PRIORITY).await else { return };
            guard.clear_ready();
            if let Err(mpsc::error::TrySendError::Closed(_)) = tx.try_send(Wake::now(WakeCause::Psi)) {
                return;
            }
        }
    }))
}
