//! The one builder of test pods (`Pod`, as a PodList gives them): each test says only what
//! its case is about, and every pod reads through the same JSON as `--pods` and the API.

use serde_json::{Value, json};

use crate::podspec::Pod;

/// A pod named `name` (its uid too), in namespace `default`, with no containers yet.
pub(crate) fn test_pod(name: &str) -> TestPod {
    TestPod(json!({"metadata": {"name": name, "namespace": "default", "uid": name}, "spec": {}}))
}

pub(crate) struct TestPod(Value);

impl TestPod {
    pub(crate) fn namespace(mut self, namespace: &str) -> Self {
        self.0["metadata"]["namespace"] = namespace.into();
        self
    }

    pub(crate) fn uid(mut self, uid: &str) -> Self {
        self.0["metadata"]["uid"] = uid.into();
        self
    }

    pub(crate) fn annotations(mut self, annotations: Value) -> Self {
        self.0["metadata"]["annotations"] = annotations;
        self
    }

    pub(crate) fn priority(mut self, priority: Option<i32>) -> Self {
        self.0["spec"]["priority"] = priority.into();
        self
    }

    /// A container named `name` whose resource requests are `requests` (`{"memory": "1Gi"}`).
    pub(crate) fn container(mut self, name: &str, requests: Value) -> Self {
        let c = json!({"name": name, "resources": {"requests": requests}});
        match self.0["spec"]["containers"].as_array_mut() {
            Some(list) => list.push(c),
            None => self.0["spec"]["containers"] = json!([c]),
        }
        self
    }

    /// Fields of the spec, set as given (`{"terminationGracePeriodSeconds": 45}`).
    pub(crate) fn spec(mut self, fields: Value) -> Self {
        if let (Some(spec), Value::Object(fields)) = (self.0["spec"].as_object_mut(), fields) {
            spec.extend(fields);
        }
        self
    }

    pub(crate) fn build(self) -> Pod {
        serde_json::from_value(self.0).expect("a test pod reads as a pod")
    }
}
