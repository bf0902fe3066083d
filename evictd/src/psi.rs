//! PSI triggers: write "some <stall_us> <window_us>" to a pressure file and poll it for
//! POLLPRI. Without CAP_SYS_RESOURCE only cgroup2 files accept triggers, and only with a
//! window that is a multiple of 2 s; the caller falls back and says so.

use std::{fs::File, io::Write as _, path::Path, time::Duration};

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
