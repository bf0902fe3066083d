//! The tuning view: which cgroups under the node grew most in the last second, whether or
//! not a threshold is near (`--trace` shows it in each summary). One usage file read per
//! cgroup per second, and only with `--trace`.

use std::{collections::HashMap, path::PathBuf};

use super::{cgroup_names, cgroups::CgroupVersion};

/// How many cgroups a summary names.
const TOP: usize = 3;

/// One cgroup's growth over the last interval.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Growth {
    /// Relative to the node cgroup, with a leading '/'.
    pub cgroup: String,
    pub bytes: i64,
}

pub struct GrowthTracker {
    node: PathBuf,
    usage_file: &'static str,
    last: HashMap<String, u64>,
}

impl GrowthTracker {
    pub fn new(node: PathBuf, version: CgroupVersion) -> Self {
        let usage_file = match version {
            CgroupVersion::V1 => "memory.usage_in_bytes",
            CgroupVersion::V2 => "memory.current",
        };
        GrowthTracker { node, usage_file, last: HashMap::new() }
    }

    /// The cgroups below the node that grew most since the last call (none on the first).
    /// A cgroup that cannot be read is skipped: it is a hint for tuning, not a signal.
    pub fn sample(&mut self) -> Vec<Growth> {
        let mut now = HashMap::new();
        let mut grown = Vec::new();
        for rel in cgroup_names::subtree_paths(&self.node).into_iter().filter(|r| r != "/") {
            let file = self.node.join(rel.trim_start_matches('/')).join(self.usage_file);
            let Some(usage) = std::fs::read_to_string(file).ok().and_then(|s| s.trim().parse::<u64>().ok())
            else {
                continue;
            };
            if let Some(&before) = self.last.get(&rel)
                && usage > before
            {
                grown.push(Growth { cgroup: rel.clone(), bytes: (usage - before) as i64 });
            }
            now.insert(rel, usage);
        }
        self.last = now;
        grown.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.cgroup.cmp(&b.cgroup)));
        grown.truncate(TOP);
        grown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_cgroups_that_grew_most() {
        let d = tempfile::tempdir().unwrap();
        let set = |rel: &str, v: u64| {
            std::fs::create_dir_all(d.path().join(rel)).unwrap();
            std::fs::write(d.path().join(rel).join("memory.usage_in_bytes"), v.to_string()).unwrap();
        };
        for (rel, v) in [("a", 100), ("b", 100), ("b/c", 50), ("d", 100), ("e", 100)] {
            set(rel, v);
        }
        let mut t = GrowthTracker::new(d.path().into(), CgroupVersion::V1);
        assert!(t.sample().is_empty(), "nothing to compare with yet");
        for (rel, v) in [("a", 130), ("b", 400), ("b/c", 350), ("d", 90), ("e", 101)] {
            set(rel, v);
        }
        let top: Vec<(String, i64)> = t.sample().into_iter().map(|g| (g.cgroup, g.bytes)).collect();
        assert_eq!(top, [("/b".into(), 300), ("/b/c".into(), 300), ("/a".into(), 30)]);
    }
}
