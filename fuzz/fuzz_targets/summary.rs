//! Summary API documents, any text, through one replay step of the decision engine with the
//! kubelet's default policy and a pod list of three pods.
#![no_main]

use evictd_policy::{
    offline::Session,
    podspec::{Pod, PodList},
    policy::{PolicyInput, build},
    rank::FsLayout,
};
use libfuzzer_sys::fuzz_target;

fn pods() -> Vec<Pod> {
    let list: PodList = serde_json::from_str(
        r#"{"items": [
            {"metadata": {"name": "a", "namespace": "n", "uid": "uid-a"},
             "spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": "100Mi"}}}]}},
            {"metadata": {"name": "b", "namespace": "n", "uid": "uid-b",
                          "annotations": {"kubernetes.io/config.source": "file"}}, "spec": {}},
            {"metadata": {"name": "c", "namespace": "n", "uid": "uid-c"}, "spec": {"priority": 2000000000}}
        ]}"#,
    )
    .expect("a valid pod list");
    list.items
}

fuzz_target!(|s: &str| {
    let policy = build(&PolicyInput::default(), &mut Vec::new()).expect("the default policy");
    let pods = pods();
    for layout in [FsLayout::SingleFs, FsLayout::DedicatedImageFs] {
        let mut session = Session::new(&policy, layout, &pods);
        if let Ok(step) = session.step(s, "fuzz", false) {
            let _ = session.step_json(&step).to_string();
            let _ = session.write_table(&step, &mut Vec::new());
        }
    }
});
