//! PodLists (`--pods-file`, `--pods`), any text, and what ranking and messages ask of a pod.
#![no_main]

use evictd_policy::podspec::PodList;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|s: &str| {
    let Ok(list) = serde_json::from_str::<PodList>(s) else { return };
    for pod in &list.items {
        let _ = (pod.is_critical(), pod.is_active(), pod.priority());
        for r in ["memory", "ephemeral-storage", "cpu"] {
            let _ = pod.request_nanos(r);
        }
        for c in &pod.spec.containers {
            let _ = pod.container_request(&c.name, "memory");
        }
        let _ = pod.local_volume_names().count();
    }
});
