//! cgroup v1 memory thresholds: the kernel signals an eventfd when memory.usage_in_bytes
//! crosses a value, in either direction (the kubelet's `kernelMemcgNotification`).

use std::{
    fs::File,
    io::Write as _,
    os::fd::{AsRawFd as _, OwnedFd},
    path::Path,
};

use nix::sys::eventfd::{EfdFlags, EventFd};

#[derive(Debug, thiserror::Error)]
pub enum ThresholdError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("creating an eventfd: {0}")]
    EventFd(nix::Error),
}

/// A registered threshold: readable once usage crosses `bytes`. Dropping it unregisters.
pub struct UsageThreshold {
    pub eventfd: OwnedFd,
    pub bytes: u64,
    // The watched file must stay open for the registration to live.
    _usage: File,
}

/// Registers a threshold of `bytes` on `<dir>/memory.usage_in_bytes`.
pub fn register(dir: &Path, bytes: u64) -> Result<UsageThreshold, ThresholdError> {
    let io = |p: &Path| {
        let path = p.display().to_string();
        move |source| ThresholdError::Io { path, source }
    };
    let usage_path = dir.join("memory.usage_in_bytes");
    let usage = File::open(&usage_path).map_err(io(&usage_path))?;
    let efd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
        .map_err(ThresholdError::EventFd)?;
    let control_path = dir.join("cgroup.event_control");
    let mut control =
        std::fs::OpenOptions::new().write(true).open(&control_path).map_err(io(&control_path))?;
    // One write(2): the kernel parses each write on its own, and write! may split it.
    let line = format!("{} {} {}", efd.as_raw_fd(), usage.as_raw_fd(), bytes);
    control.write_all(line.as_bytes()).map_err(io(&control_path))?;
    Ok(UsageThreshold { eventfd: efd.into(), bytes, _usage: usage })
}
