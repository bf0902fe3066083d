//! Where a pod's spec came from: it decides how far evictd trusts the pod's priority.

use std::fmt;

/// Where a pod's spec came from, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecSource {
    Api,
    PodsFile,
    /// From the node: priority unknown (0 unless node-critical), requests approximate.
    Inferred,
}

impl SpecSource {
    pub const ALL: [SpecSource; 3] = [SpecSource::Api, SpecSource::PodsFile, SpecSource::Inferred];

    pub fn as_str(self) -> &'static str {
        match self {
            SpecSource::Api => "api",
            SpecSource::PodsFile => "pods_file",
            SpecSource::Inferred => "inferred",
        }
    }
}

impl fmt::Display for SpecSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
