//! The cgroup v1 memory-threshold wake source (the kubelet's memcg notifier): the kernel
//! signals an eventfd when memory.usage_in_bytes crosses the usage at which a memory
//! threshold would be met. The level moves with inactive_file, so it is re-registered after
//! observations when it has drifted.

use std::{os::fd::AsRawFd as _, path::PathBuf};

use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::mpsc,
    task::JoinHandle,
};

use super::{Wake, WakeCause};
use crate::memcg_threshold::{self, UsageThreshold};

/// Re-register only when the level moved by more than this (or by 1/16 of the distance).
const MIN_DRIFT: u64 = 4 << 20;

pub struct EventfdWake {
    /// (cgroup dir, usage level, the task waiting on its eventfd)
    armed: Vec<(PathBuf, u64, JoinHandle<()>)>,
    tx: mpsc::Sender<Wake>,
}

impl EventfdWake {
    pub fn new(tx: mpsc::Sender<Wake>) -> Self {
        EventfdWake { armed: Vec::new(), tx }
    }

    /// Arms one threshold per `(cgroup dir, usage level in bytes, distance)`; leaves
    /// registrations whose level has barely moved alone.
    pub fn update(&mut self, levels: &[(PathBuf, u64, u64)]) -> Result<(), memcg_threshold::ThresholdError> {
        let unchanged = levels.len() == self.armed.len()
            && levels
                .iter()
                .zip(&self.armed)
                .all(|((d, l, dist), (ad, al, _))| d == ad && l.abs_diff(*al) <= MIN_DRIFT.max(dist / 16));
        if unchanged {
            return Ok(());
        }
        for (_, _, task) in self.armed.drain(..) {
            task.abort();
        }
        for (dir, level, _) in levels {
            tracing::debug!(cgroup = %dir.display(), level, "arming memory.usage_in_bytes threshold");
            let t = memcg_threshold::register(dir, *level)?;
            let task = spawn_waiter(t, self.tx.clone()).map_err(|source| {
                memcg_threshold::ThresholdError::Io { path: dir.display().to_string(), source }
            })?;
            self.armed.push((dir.clone(), *level, task));
        }
        Ok(())
    }
}

impl Drop for EventfdWake {
    fn drop(&mut self) {
        for (_, _, task) in self.armed.drain(..) {
            task.abort();
        }
    }
}

fn spawn_waiter(t: UsageThreshold, tx: mpsc::Sender<Wake>) -> std::io::Result<JoinHandle<()>> {
    // SAFETY: UsageThreshold owns its eventfd for its whole life, and the AsyncFd owns it.
    let fd =
        unsafe { AsyncFd::register_with_interest(t, Interest::READABLE) }.map_err(std::io::Error::from)?;
    Ok(tokio::spawn(async move {
        loop {
            let Ok(mut guard) = fd.readable().await else { return };
            let mut buf = [0u8; 8];
            // SAFETY: reading 8 bytes into an 8-byte buffer from an eventfd we own.
            let n = unsafe { libc::read(guard.get_inner().eventfd.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
            if n < 0 {
                guard.clear_ready();
                continue;
            }
            if let Err(mpsc::error::TrySendError::Closed(_)) = tx.try_send(Wake::now(WakeCause::Eventfd)) {
                return;
            }
        }
    }))
}

impl std::os::fd::AsRawFd for UsageThreshold {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.eventfd.as_raw_fd()
    }
}
