//! A process named `kubelet` with a kubelet's command line, for `--kubelet-config auto`:
//! `evictd-kubelet-stand-in` (which sleeps) copied to a file of that name. No kubelet can run
//! here (it needs an API server to register with, and would evict pods of its own), and what
//! evictd reads of the kubelet is its process alone: its name, command line, root and
//! working directory.

use std::{
    path::Path,
    process::{Child, Command},
};

/// The stand-in, ended (by its PID) when dropped.
pub struct StandInKubelet(Child);

impl StandInKubelet {
    /// Starts `<dir>/kubelet` with `args`, in `cwd`.
    pub fn start(dir: &Path, cwd: &Path, args: &[&str]) -> StandInKubelet {
        let exe = dir.join("kubelet");
        if !exe.exists() {
            std::fs::copy(crate::sibling_binary("evictd-kubelet-stand-in"), &exe)
                .expect("copying the stand-in");
        }
        let child = crate::dies_with_harness(&mut Command::new(&exe))
            .args(args)
            .current_dir(cwd)
            .spawn()
            .expect("starting the stand-in kubelet");
        StandInKubelet(child)
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for StandInKubelet {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
