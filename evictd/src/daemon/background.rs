//! The daemon's work off the pressure path — the runtime's inventory, the Kubernetes API's
//! watch and writes, the images' ages — on a runtime of its own: one thread, `evictd-io`.
//! On the daemon's real-time thread, decoding a relist of hundreds of pods (CRI protobuf,
//! JSON), TLS and the HTTP/2 framing under them would run between a wake and its decision.
//! Their clients are made here too: a tonic or kube client's connection runs on the runtime
//! it was made on.
//!
//! The thread is not real-time (it would then compete with the decision it serves), but it
//! runs at nice `NICE` where permitted: the list read after an eviction, which the next
//! decision waits for, and the record of the eviction, which races the kubelet's restart of
//! the pod, should not queue behind evictd's own disk walk (nice 10). A nice value weighs
//! only against the tasks of evictd's own CPU cgroup: across the node, the thread gets the
//! share of the pod's CPU request (the DaemonSet's `cpu` request), and the decision itself
//! never waits for it longer than the post-eviction hold (`INVENTORY_HOLD`).

use std::sync::mpsc;

use tokio::{
    runtime::{Builder, Handle},
    sync::oneshot,
};

/// The thread's nice value: ahead of evictd's other ordinary threads (the disk walker's 10).
const NICE: i32 = -10;

pub struct Background {
    handle: Handle,
    /// Ends the thread's runtime when dropped (`None`: no thread, the caller's runtime).
    _stop: Option<oneshot::Sender<()>>,
}

impl Background {
    /// The `evictd-io` thread; without one (no thread or runtime to be had), the work stays
    /// on the caller's runtime, said once: slower decisions beat no daemon. Started from the
    /// daemon's thread, it does not inherit its real-time policy (`SCHED_RESET_ON_FORK`).
    pub fn start() -> Self {
        match Self::spawn() {
            Ok((handle, stop)) => Background { handle, _stop: Some(stop) },
            Err(e) => {
                tracing::error!(
                    "cannot start the evictd-io thread ({e}): the inventory and the API run on the \
                     daemon's thread, between wakes and decisions"
                );
                Background { handle: Handle::current(), _stop: None }
            }
        }
    }

    /// The runtime is built on the thread itself: one that failed to start then leaves no
    /// runtime to drop here, which tokio refuses inside the daemon's own.
    fn spawn() -> std::io::Result<(Handle, oneshot::Sender<()>)> {
        let (handle_tx, handle_rx) = mpsc::sync_channel(1);
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new().name("evictd-io".into()).spawn(move || {
            let runtime = Builder::new_current_thread().thread_name("evictd-io").enable_all().build();
            let runtime = match runtime {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = handle_tx.send(Err(e));
                    return;
                }
            };
            lower_nice();
            let _ = handle_tx.send(Ok(runtime.handle().clone()));
            // Ends when the daemon drops its `Background` (or ends itself).
            let _ = runtime.block_on(stopped);
            // Without waiting: a request under way (a slow API server) must not hold the exit.
            runtime.shutdown_background();
        })?;
        let handle = handle_rx.recv().map_err(|_| std::io::Error::other("the thread ended at once"))??;
        Ok((handle, stop))
    }

    pub fn handle(&self) -> &Handle {
        &self.handle
    }
}

/// `NICE` for the calling thread.
fn lower_nice() {
    if let Err(e) = crate::kernel::sched::set_nice(NICE) {
        tracing::info!("evictd-io runs at the default nice value: {e}");
    }
}
