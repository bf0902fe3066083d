//! PSI triggers as a wake source: the kernel raises POLLPRI on a pressure file when tasks
//! stalled on memory for more than the trigger's share of its window.

use std::path::Path;

use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::mpsc,
    task::JoinHandle,
};

use super::{Wake, WakeCause};
use crate::psi;

struct Trigger(psi::PsiTrigger);

impl std::os::fd::AsRawFd for Trigger {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.file.as_raw_fd()
    }
}

/// Registers a trigger on `path` (the privileged 500 ms window, else the 2 s one, saying so)
/// and wakes evictd whenever it fires.
pub fn spawn(path: &Path, tx: mpsc::Sender<Wake>) -> std::io::Result<JoinHandle<()>> {
    let t = psi::open_best(path)?;
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
