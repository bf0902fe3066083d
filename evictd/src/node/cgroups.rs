//! Where the cgroup hierarchies are mounted, and which one carries the memory controller.
//! Read from mountinfo so that hybrid (v1 memory + v2 unified, as on this project's CI),
//! pure v1 and pure v2 nodes are all handled without guessing from paths.

use std::path::{Path, PathBuf};

use procfs::FromBufRead as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum CgroupVersion {
    #[serde(rename = "v1")]
    V1,
    #[serde(rename = "v2")]
    V2,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupMounts {
    /// Mount point of the hierarchy that has the memory controller.
    pub memory_root: PathBuf,
    pub memory_version: CgroupVersion,
    /// Mount point of the cgroup2 hierarchy, if any (with or without controllers).
    pub unified_root: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupMountError {
    #[error("reading {path}: {source}")]
    Read { path: String, source: procfs::ProcError },
    #[error(
        "no memory cgroup controller is mounted (looked for a cgroup v1 mount with the memory option, and a cgroup2 mount whose cgroup.controllers lists memory)"
    )]
    NoMemoryController,
    #[error(
        "the cgroup2 hierarchy at {path} is not the node's: its root has memory.current, which only non-root cgroups have. evictd is in a private cgroup namespace (a container's default on cgroup v2) and would take its own container for the node. Run it in the host's cgroup namespace (e.g. `nsenter -t 1 -C`, or hostPID with the host's /sys/fs/cgroup), or name the cgroup that plays the node with --node-cgroup"
    )]
    NotTheRoot { path: PathBuf },
}

impl CgroupMounts {
    /// The layout of the running system, from /proc/self/mountinfo.
    pub fn detect() -> Result<Self, CgroupMountError> {
        let path = "/proc/self/mountinfo";
        let file = std::fs::File::open(path)
            .map_err(|e| CgroupMountError::Read { path: path.into(), source: e.into() })?;
        let infos = procfs::process::MountInfos::from_buf_read(std::io::BufReader::new(file))
            .map_err(|e| CgroupMountError::Read { path: path.into(), source: e })?;
        Self::from_mounts(
            infos.0.iter().map(|m| Mount {
                fs_type: &m.fs_type,
                mount_point: &m.mount_point,
                super_options: m.super_options.keys().map(String::as_str).collect(),
            }),
            |p| std::fs::read_to_string(p.join("cgroup.controllers")).unwrap_or_default(),
        )
    }

    /// The layout from a list of mounts; `controllers` reads a cgroup2 mount's
    /// cgroup.controllers (injected so fixtures can describe any node).
    pub fn from_mounts<'a>(
        mounts: impl Iterator<Item = Mount<'a>>,
        controllers: impl Fn(&Path) -> String,
    ) -> Result<Self, CgroupMountError> {
        let mut v1_memory = None;
        let mut unified = None;
        for m in mounts {
            match m.fs_type {
                "cgroup" if m.super_options.contains(&"memory") && v1_memory.is_none() => {
                    v1_memory = Some(m.mount_point.to_path_buf());
                }
                "cgroup2" if unified.is_none() => unified = Some(m.mount_point.to_path_buf()),
                _ => {}
            }
        }
        if let Some(memory_root) = v1_memory {
            return Ok(CgroupMounts {
                memory_root,
                memory_version: CgroupVersion::V1,
                unified_root: unified,
            });
        }
        match unified {
            Some(root) if controllers(&root).split_whitespace().any(|c| c == "memory") => Ok(CgroupMounts {
                memory_root: root.clone(),
                memory_version: CgroupVersion::V2,
                unified_root: Some(root),
            }),
            _ => Err(CgroupMountError::NoMemoryController),
        }
    }

    /// On cgroup v2, that the mount evictd sees is the hierarchy's real root, the node. Inside
    /// a private cgroup namespace (a container's default on v2) the mount's root is the
    /// container's own cgroup, and evictd would take it for the node: its memory, its limit,
    /// its pods (none). The kernel gives every cgroup but the root a `memory.current`, so
    /// its presence at the mount's root tells. (On v1 the layout says nothing of it; nodes
    /// that run pods on v1 give containers the host's cgroup namespace.)
    pub fn check_sees_the_node(&self) -> Result<(), CgroupMountError> {
        let current = self.memory_root.join("memory.current");
        if self.memory_version == CgroupVersion::V2 && current.exists() {
            return Err(CgroupMountError::NotTheRoot { path: self.memory_root.clone() });
        }
        Ok(())
    }

    /// Whether cgroup ids from `bpf_get_current_cgroup_id` (the default hierarchy) are ids in
    /// the memory hierarchy too.
    pub fn memory_is_unified(&self) -> bool {
        self.memory_version == CgroupVersion::V2
    }
}

/// One mount, as far as layout detection cares.
pub struct Mount<'a> {
    pub fs_type: &'a str,
    pub mount_point: &'a Path,
    pub super_options: Vec<&'a str>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount<'a>(fs_type: &'a str, at: &'a str, opts: &[&'a str]) -> Mount<'a> {
        Mount { fs_type, mount_point: Path::new(at), super_options: opts.to_vec() }
    }

    #[test]
    fn hybrid_layout_uses_v1_memory() {
        let l = CgroupMounts::from_mounts(
            [
                mount("cgroup", "/sys/fs/cgroup/cpu", &["rw", "cpu"]),
                mount("cgroup", "/sys/fs/cgroup/memory", &["rw", "memory"]),
                mount("cgroup2", "/sys/fs/cgroup/unified", &["rw"]),
            ]
            .into_iter(),
            |_| String::new(),
        )
        .unwrap();
        assert_eq!(l.memory_version, CgroupVersion::V1);
        assert_eq!(l.memory_root, Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(l.unified_root.as_deref(), Some(Path::new("/sys/fs/cgroup/unified")));
        assert!(!l.memory_is_unified());
    }

    #[test]
    fn pure_v2_needs_memory_in_controllers() {
        let mounts = || [mount("cgroup2", "/sys/fs/cgroup", &["rw", "nsdelegate"])].into_iter();
        let l = CgroupMounts::from_mounts(mounts(), |_| "cpuset cpu io memory pids".into()).unwrap();
        assert_eq!(l.memory_version, CgroupVersion::V2);
        assert!(l.memory_is_unified());
        assert!(matches!(
            CgroupMounts::from_mounts(mounts(), |_| "cpu io".into()),
            Err(CgroupMountError::NoMemoryController)
        ));
    }

    /// Inside a private cgroup namespace the v2 mount's root is a non-root cgroup
    /// (it has memory.current); evictd refuses to take it for the node, naming the path.
    #[test]
    fn a_private_cgroup_namespace_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let layout = |version| CgroupMounts {
            memory_root: d.path().to_owned(),
            memory_version: version,
            unified_root: Some(d.path().to_owned()),
        };
        std::fs::write(d.path().join("memory.stat"), "anon 1\n").unwrap();
        layout(CgroupVersion::V2).check_sees_the_node().unwrap();
        std::fs::write(d.path().join("memory.current"), "4096\n").unwrap();
        let err = layout(CgroupVersion::V2).check_sees_the_node().unwrap_err().to_string();
        assert!(err.contains(&d.path().display().to_string()) && err.contains("cgroup namespace"), "{err}");
        layout(CgroupVersion::V1).check_sees_the_node().unwrap();
    }

    #[test]
    fn this_machine_has_a_memory_controller() {
        let l = CgroupMounts::detect().expect("layout of this machine");
        assert!(l.memory_root.join("cgroup.procs").exists(), "{l:?}");
    }
}
