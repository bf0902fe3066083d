//! The tuning view: which cgroups under the node grew most in the last second, whether or
//! not a threshold is near (`--trace` shows it in each summary). One usage file read per
//! cgroup per second, through files kept open, and only with `--trace`; the cgroups are
//! listed again every `RELIST_EVERY` (a node of 250 pods has ~750 of them, and listing
//! cgroup directories costs the kernel far more than reading a number), so a pod started
//! since is named up to that much later.

use std::{
    collections::HashMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use super::{
    cgroup_names,
    cgroups::CgroupVersion,
    memory::{MemoryCgroup, UsageFiles},
};

/// How many cgroups a summary names.
const TOP: usize = 3;

/// How often the node's cgroups are listed again: a cgroup newer than that is named from
/// its second sample after it is listed.
const RELIST_EVERY: Duration = Duration::from_secs(10);

/// One cgroup's growth over the last interval.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Growth {
    /// Relative to the node cgroup, with a leading '/'.
    pub cgroup: String,
    pub bytes: i64,
}

pub struct GrowthTracker {
    node: PathBuf,
    version: CgroupVersion,
    /// The cgroups below the node as last listed, and when.
    listed: Vec<(String, MemoryCgroup)>,
    listed_at: Option<Instant>,
    files: UsageFiles,
    last: HashMap<String, u64>,
}

impl GrowthTracker {
    pub fn new(node: PathBuf, version: CgroupVersion) -> Self {
        GrowthTracker {
            node,
            version,
            listed: Vec::new(),
            listed_at: None,
            // A tenant's own cgroups (systemd or Docker inside a pod) are cgroups too: the
            // files kept open stay bounded however many there are.
            files: UsageFiles::at_most(1024),
            last: HashMap::new(),
        }
    }

    /// The cgroups below the node that grew most since the last call (none on the first).
    /// A cgroup that cannot be read is skipped: it is a hint for tuning, not a signal.
    pub fn sample(&mut self) -> Vec<Growth> {
        self.relist_when_due();
        let mut now = HashMap::new();
        let mut grown = Vec::new();
        for (rel, cg) in &self.listed {
            let Ok(Some(usage)) = self.files.usage(cg) else { continue };
            if let Some(&before) = self.last.get(rel)
                && usage > before
            {
                grown.push(Growth { cgroup: rel.clone(), bytes: (usage - before) as i64 });
            }
            now.insert(rel.clone(), usage);
        }
        self.last = now;
        grown.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.cgroup.cmp(&b.cgroup)));
        grown.truncate(TOP);
        grown
    }

    fn relist_when_due(&mut self) {
        if self.listed_at.is_some_and(|t| t.elapsed() < RELIST_EVERY) {
            return;
        }
        self.listed_at = Some(Instant::now());
        self.listed = cgroup_names::subtree_paths(&self.node)
            .into_iter()
            .filter(|r| r != "/")
            .map(|rel| {
                let dir = self.node.join(rel.trim_start_matches('/'));
                (rel, MemoryCgroup::new(dir, self.version, false))
            })
            .collect();
        self.files.open_only(self.listed.iter().map(|(_, cg)| cg));
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
        // A cgroup made since the last listing waits for the next one; one removed is skipped.
        set("f", 100);
        std::fs::remove_dir_all(d.path().join("e")).unwrap();
        set("a", 140);
        let top: Vec<String> = t.sample().into_iter().map(|g| g.cgroup).collect();
        assert_eq!(top, ["/a"]);
        t.listed_at = None;
        set("f", 900);
        assert!(t.sample().is_empty(), "f is new to the listing, e is gone");
        set("f", 1000);
        let top: Vec<String> = t.sample().into_iter().map(|g| g.cgroup).collect();
        assert_eq!(top, ["/f"]);
    }
}
