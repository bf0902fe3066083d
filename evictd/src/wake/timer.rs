//! The last-resort wake source: the housekeeping timer (`--housekeeping-interval`), every
//! interval whatever the kernel says. The kubelet's only one.

use std::time::Duration;

use tokio::sync::mpsc;

use super::{SourceKind, SourceTask, TaskSource, Wake, WakeCause, WakeSource};

pub fn start(interval: Duration, tx: mpsc::Sender<Wake>) -> Box<dyn WakeSource> {
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // A full channel means a look is already pending: nothing lost.
            if let Err(mpsc::error::TrySendError::Closed(_)) = tx.try_send(Wake::now(WakeCause::Timer)) {
                return;
            }
        }
    });
    Box::new(TaskSource { kind: SourceKind::Timer, task: SourceTask::new("the housekeeping timer", task) })
}
