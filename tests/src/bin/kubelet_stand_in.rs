//! A stand-in for the kubelet's process, for tests of `--kubelet-config auto`. No kubelet runs
//! here (it needs an API server to register with, and would evict pods of its own), and what
//! evictd reads of the kubelet is its process alone: its name, its command line, its root
//! and working directory. Copied to a file named `kubelet` and started with a kubelet's
//! command line, it ignores the arguments and sleeps until ended — at most ten minutes, so
//! that a test that fails before ending it does not leave it behind for long.

fn main() {
    std::thread::sleep(std::time::Duration::from_secs(600));
}
