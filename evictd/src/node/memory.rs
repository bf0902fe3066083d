//! The memory signal of one memory cgroup, computed as the kubelet does:
//! available = capacity − max(0, usage − inactive_file).
//!
//! For the node root, capacity is MemTotal, and all of it is read from /proc/meminfo
//! (`MemoryCgroup::read_root`). For a cgroup that plays the node (tests, benchmarks,
//! `--node-cgroup`), capacity is its limit, capped at MemTotal.

use std::{
    collections::{HashMap, HashSet},
    fs,
    path::{Path, PathBuf},
};

use crate::node::cgroups::CgroupVersion;

/// What evictd read; it never decides on anything it could not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemorySample {
    pub capacity: u64,
    pub usage: u64,
    pub inactive_file: u64,
    /// False when a non-root cgroup has no limit and capacity fell back to MemTotal (the
    /// kubelet then has no availableBytes for it).
    pub limited: bool,
}

impl MemorySample {
    pub fn working_set(&self) -> u64 {
        self.usage.saturating_sub(self.inactive_file)
    }

    /// May be negative: a working set above capacity is real pressure, not an underflow.
    /// The readers refuse a count above `i64::MAX` as garbage; a sample made otherwise
    /// (a fixture, a sum) is clamped, never wrapped.
    pub fn available(&self) -> i64 {
        let available = i128::from(self.capacity) - i128::from(self.working_set());
        i64::try_from(available).unwrap_or(if available < 0 { i64::MIN } else { i64::MAX })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: no {key} in it")]
    MissingKey { path: PathBuf, key: &'static str },
    #[error("{path}: cannot parse {what:?} as a number")]
    Parse { path: PathBuf, what: String },
    #[error("{path}: {what} is above i64::MAX: not a count of bytes or pages")]
    TooLarge { path: PathBuf, what: String },
    #[error(
        "{path} is not procfs's (filesystem magic {magic}; LXCFS, a FUSE filesystem, is \
         0x65735546): it shows a container's memory, not the node's, and evictd would decide on \
         it. Run evictd in a container without LXCFS's /proc files; on a node that is itself \
         a container, whose kubelet reads the same file, give --accept-lxcfs-meminfo"
    )]
    NotProcfs { path: PathBuf, magic: String },
}

/// A memory cgroup to observe.
#[derive(Clone, Debug)]
pub struct MemoryCgroup {
    pub dir: PathBuf,
    pub version: CgroupVersion,
    /// The hierarchy's root: on v2 it has no memory.current and is emulated.
    pub is_root: bool,
    /// /proc/meminfo, or a fixture.
    pub meminfo: PathBuf,
    /// Whether its files are opened for each read or kept open (`kept_open`).
    pub(crate) files: Files,
}

/// How a cgroup's files are read. Opened for each read by default: a node has hundreds of
/// pods, whose usage files `usage::PodUsageFiles` keeps within a bound. The node's own (and
/// its pods' cgroup's) are read on every wake and by the poll up to every millisecond, and
/// are kept open after their first read (`kept_open`): opening, reading and closing a cgroup
/// file costs ~15 µs here, reading one kept open ~1.5 µs, and a wake reads four to eight.
#[derive(Debug, Default)]
pub(crate) enum Files {
    #[default]
    Reopened,
    Kept(Box<KeptFiles>),
}

/// A clone reads through files of its own: the poll's thread and the daemon's never share a
/// file, nor its lock.
impl Clone for Files {
    fn clone(&self) -> Self {
        match self {
            Files::Reopened => Files::Reopened,
            Files::Kept(_) => Files::Kept(Box::default()),
        }
    }
}

/// The files kept open, with the path each was opened at (a handful: a linear search).
#[derive(Debug, Default)]
pub(crate) struct KeptFiles(std::sync::Mutex<Vec<(PathBuf, fs::File)>>);

impl KeptFiles {
    /// The text of the file at `path`, through the file kept open for that path where it still
    /// answers, else through the file opened anew (and kept). Keyed by the path itself, so a
    /// cgroup whose `dir` or `meminfo` changed reads the new file. A kept file of a removed
    /// cgroup fails (ENODEV) rather than answer for a cgroup made again at its path; it is
    /// closed before its replacement is opened.
    fn read(&self, path: PathBuf) -> Result<String, MemoryError> {
        let mut open = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(i) = open.iter().position(|(p, _)| *p == path) {
            if let Ok(text) = read_whole(&open[i].1) {
                return Ok(text);
            }
            open.swap_remove(i);
        }
        let read = fs::File::open(&path).and_then(|file| Ok((read_whole(&file)?, file)));
        let (text, file) = match read {
            Ok(r) => r,
            Err(source) => return Err(MemoryError::Read { path, source }),
        };
        open.push((path, file));
        Ok(text)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().map_or(0, |open| open.len())
    }
}

/// An open file's text, read anew from its start, for the files a node's memory is read from:
/// cgroup files and /proc/meminfo, each a seq file of one record that the kernel makes
/// whole for a read from offset 0 (where a seq file of many records may end a read at any
/// record's end). One `pread` is then enough when the text fits the buffer, and a second
/// read only to see the end would make it all again (memory.stat sums a whole subtree on
/// cgroup v1); a read from further on continues the text made for the first. Text that does
/// not end in a newline is read on; a full buffer is read again, twice the size.
fn read_whole(file: &fs::File) -> std::io::Result<String> {
    use std::os::unix::fs::FileExt as _;
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        let n = file.read_at(&mut buf[len..], len as u64)?;
        len += n;
        let ended = n == 0 || buf[len - 1] == b'\n';
        if len < buf.len() && ended {
            buf.truncate(len);
            return String::from_utf8(buf)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e));
        }
        if len == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
    }
}

/// Limits at or above this are "unlimited" on v1 (PAGE_COUNTER_MAX rounded to pages).
const V1_UNLIMITED: u64 = 1 << 62;

impl MemoryCgroup {
    pub fn new(dir: impl Into<PathBuf>, version: CgroupVersion, is_root: bool) -> Self {
        MemoryCgroup { dir: dir.into(), version, is_root, meminfo: MEMINFO.into(), files: Files::default() }
    }

    /// The same cgroup, its files kept open after their first read (`Files`): for the
    /// node's cgroups, read on every wake.
    pub fn kept_open(self) -> Self {
        MemoryCgroup { files: Files::Kept(Box::default()), ..self }
    }

    /// The whole text of the file at `path` (one of the cgroup's, or its meminfo).
    fn text(&self, path: PathBuf) -> Result<String, MemoryError> {
        match &self.files {
            Files::Kept(kept) => kept.read(path),
            Files::Reopened => fs::read_to_string(&path).map_err(|source| MemoryError::Read { path, source }),
        }
    }

    /// How many files it keeps open.
    #[cfg(test)]
    fn kept(&self) -> usize {
        match &self.files {
            Files::Kept(kept) => kept.len(),
            Files::Reopened => 0,
        }
    }

    /// A file of the cgroup holding one number.
    fn number(&self, name: &'static str) -> Result<u64, MemoryError> {
        let text = self.text(self.dir.join(name))?;
        parse_u64(&self.dir.join(name), text.trim())
    }

    /// A `key value` line of the cgroup's memory.stat.
    fn stat_key(&self, key: &'static str) -> Result<u64, MemoryError> {
        let text = self.text(self.dir.join("memory.stat"))?;
        parse::stat_value(&text, key).map_err(|e| e.at(&self.dir.join("memory.stat"), key))
    }

    /// A `Key:   N kB` line of /proc/meminfo, in bytes.
    fn meminfo_bytes(&self, key: &'static str) -> Result<u64, MemoryError> {
        let text = self.text(self.meminfo.clone())?;
        parse::meminfo_bytes(&text, key).map_err(|e| e.at(&self.meminfo, key))
    }

    pub fn read(&self) -> Result<MemorySample, MemoryError> {
        if self.is_root {
            return self.read_root();
        }
        let mem_total = self.meminfo_bytes("MemTotal")?;
        let (usage, inactive_file) = self.usage_and_inactive_file()?;
        let (capacity, limited) = match self.version {
            CgroupVersion::V1 => {
                let limit = self.number("memory.limit_in_bytes")?;
                if limit >= V1_UNLIMITED { (mem_total, false) } else { (limit.min(mem_total), true) }
            }
            CgroupVersion::V2 => {
                let max = self.text(self.dir.join("memory.max"))?;
                match max.trim() {
                    "max" => (mem_total, false),
                    max => (parse_u64(&self.dir.join("memory.max"), max)?.min(mem_total), true),
                }
            }
        };
        Ok(MemorySample { capacity, usage, inactive_file, limited })
    }

    /// The working set alone, as ranking a pod needs it: two files, where `read` also
    /// takes `/proc/meminfo` and the limit for a capacity — on a node of 250 pods, half of
    /// what a decision spent reading.
    pub fn working_set(&self) -> Result<u64, MemoryError> {
        let (usage, inactive_file) = self.usage_and_inactive_file()?;
        Ok(usage.saturating_sub(inactive_file))
    }

    /// (usage, inactive file pages): what the working set is made of.
    fn usage_and_inactive_file(&self) -> Result<(u64, u64), MemoryError> {
        if self.is_root {
            let sample = self.read_root()?;
            return Ok((sample.usage, sample.inactive_file));
        }
        match self.version {
            CgroupVersion::V1 => {
                Ok((self.number("memory.usage_in_bytes")?, self.stat_key("total_inactive_file")?))
            }
            CgroupVersion::V2 => Ok((self.number("memory.current")?, self.stat_key("inactive_file")?)),
        }
    }

    /// The hierarchy's root, whole from one read of /proc/meminfo: capacity MemTotal; usage
    /// what the kubelet's root usage counts — v1's usage_in_bytes, which the kernel sums from
    /// the same global counters, and on v2 (no memory.current) runc's emulation for
    /// cAdvisor, anon + file of the root's memory.stat — as AnonPages + the file pages
    /// (Cached, Buffers and SwapCached make NR_FILE_PAGES); inactive file pages Inactive(file).
    /// Not the root's memory.stat: reading it makes the kernel flush every cgroup's
    /// statistics when enough changed since the last flush (on a busy node, mostly), one
    /// hold of its statistics lock per CPU with interrupts off, on the pass's thread. The
    /// global counters are the same pages plus those charged to no cgroup, and about as fresh:
    /// each CPU holds back up to ~125 pages a counter, where the cgroup statistics hold back
    /// what awaits a flush (`this_machines_root_reads_as_its_memory_stat`).
    fn read_root(&self) -> Result<MemorySample, MemoryError> {
        let text = self.text(self.meminfo.clone())?;
        let field = |key| parse::meminfo_bytes(&text, key).map_err(|e| e.at(&self.meminfo, key));
        let file = [field("Cached")?, field("Buffers")?, field("SwapCached")?];
        let usage = file
            .iter()
            .try_fold(field("AnonPages")?, |sum, v| sum.checked_add(*v).filter(|&u| i64::try_from(u).is_ok()))
            .ok_or_else(|| MemoryError::TooLarge {
                path: self.meminfo.clone(),
                what: "AnonPages + Cached + Buffers + SwapCached".into(),
            })?;
        Ok(MemorySample {
            capacity: field("MemTotal")?,
            usage,
            inactive_file: field("Inactive(file)")?,
            limited: true,
        })
    }
}

impl MemoryCgroup {
    /// The cgroup's usage alone, one small file (the adaptive poll's cheap read): what grows
    /// first when memory fills. The v1 root's is the file its eventfd notifier compares
    /// with, summed by the kernel from the counters `read_root` reads; the v2 root has none,
    /// and its usage comes from /proc/meminfo (`usage_is_meminfo`).
    pub fn usage(&self) -> Result<u64, MemoryError> {
        if self.usage_is_meminfo() {
            return Ok(self.read_root()?.usage);
        }
        match self.version {
            CgroupVersion::V1 => self.number("memory.usage_in_bytes"),
            CgroupVersion::V2 => self.number("memory.current"),
        }
    }
}

impl MemoryCgroup {
    /// Whether `usage` reads /proc/meminfo, which gives the working set in the same read:
    /// the v2 root, which has no memory.current.
    pub fn usage_is_meminfo(&self) -> bool {
        self.is_root && self.version == CgroupVersion::V2
    }

    /// Whether the working set costs a read of memory.stat, which may flush the kernel's
    /// statistics (the root's comes from /proc/meminfo, which never does).
    pub fn working_set_reads_stat(&self) -> bool {
        !self.is_root
    }

    /// The working set as the adaptive poll estimates it: usage less the inactive file pages,
    /// what `read` gives, and never above `usage`. On a node full of page cache, anonymous
    /// memory displaces cache with usage flat at the limit: only this moves.
    pub fn working_set_estimate(&self) -> Result<u64, MemoryError> {
        self.working_set_after_usage(self.usage()?)
    }

    /// `working_set_estimate` given the `usage` just read. Costs a memory.stat read, which
    /// the poll makes only once usage alone says it might be past its level; on the root, a
    /// read of /proc/meminfo (`read_root`: the root's memory.stat would flush every cgroup's
    /// statistics).
    pub fn working_set_after_usage(&self, usage: u64) -> Result<u64, MemoryError> {
        if self.is_root {
            return Ok(self.read_root()?.working_set().min(usage));
        }
        match self.version {
            CgroupVersion::V1 => Ok(usage.saturating_sub(self.stat_key("total_inactive_file")?)),
            CgroupVersion::V2 => Ok(usage.saturating_sub(self.stat_key("inactive_file")?)),
        }
    }
}

/// Cgroups' usage files kept open by path (`read_kept`), for a set named by path that changes
/// between reads (the trace's growth view): reading an open cgroup file again costs ~1.4 µs
/// here, where opening, reading and closing it costs ~15 µs. `open_only` closes the files of
/// cgroups no longer asked for; past `limit` files a read opens and closes its file (the
/// descriptors are shared with the kill path's pidfds). A decision's pods keep theirs by
/// position instead (`usage::PodUsageFiles`).
#[derive(Debug)]
pub struct UsageFiles {
    open: HashMap<PathBuf, fs::File>,
    limit: usize,
}

impl UsageFiles {
    /// Keeping at most `limit` files open.
    pub fn at_most(limit: usize) -> Self {
        UsageFiles { open: HashMap::new(), limit }
    }

    /// `cg`'s usage now (`MemoryCgroup::usage`); `None` when the cgroup is gone.
    pub fn usage(&mut self, cg: &MemoryCgroup) -> Result<Option<u64>, MemoryError> {
        // Taken out with its key, so that putting it back makes no path.
        let (dir, mut kept) = match self.open.remove_entry(&cg.dir) {
            Some((dir, file)) => (Some(dir), Some(file)),
            None => (None, None),
        };
        let keep = dir.is_some() || self.open.len() < self.limit;
        let read = read_kept(&mut kept, cg, keep);
        if let Some(file) = kept {
            self.open.insert(dir.unwrap_or_else(|| cg.dir.clone()), file);
        }
        read
    }

    /// Opens the usage files of the cgroups in `cgs` not open yet (a read of each), and
    /// closes those of cgroups not in it: a node's first decision after pods come then
    /// opens nothing.
    pub fn open_only<'a>(&mut self, cgs: impl IntoIterator<Item = &'a MemoryCgroup>) {
        let mut keep = HashSet::new();
        for cg in cgs {
            if !self.open.contains_key(&cg.dir) {
                let _ = self.usage(cg);
            }
            keep.insert(cg.dir.as_path());
        }
        self.keep_only(&keep);
    }

    /// Closes the files of every cgroup `keep` does not name.
    fn keep_only(&mut self, keep: &HashSet<&Path>) {
        self.open.retain(|dir, _| keep.contains(dir.as_path()));
    }

    /// How many files are open.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

/// `cg`'s usage (`None`: the cgroup is gone), read from `kept`, its usage file opened before,
/// where that still answers; else from its file opened anew, left in `kept` if `keep`. A kept
/// file of a removed cgroup fails (ENODEV) rather than answer for a cgroup made again at its
/// path, and is closed before its replacement is opened: the descriptors kept never exceed
/// the slots for them.
pub fn read_kept(
    kept: &mut Option<fs::File>,
    cg: &MemoryCgroup,
    keep: bool,
) -> Result<Option<u64>, MemoryError> {
    let name = match (cg.version, cg.is_root) {
        (_, true) => return cg.usage().map(Some),
        (CgroupVersion::V1, false) => "memory.usage_in_bytes",
        (CgroupVersion::V2, false) => "memory.current",
    };
    // The path is made only when the file is opened: a decision reads every pod's.
    if let Some(v) = kept.as_ref().and_then(|file| read_u64_at(file, || cg.dir.join(name)).ok()) {
        return Ok(Some(v));
    }
    *kept = None;
    let path = cg.dir.join(name);
    let file = match fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !cg.dir.exists() => return Ok(None),
        Err(source) => return Err(MemoryError::Read { path, source }),
    };
    let v = read_u64_at(&file, || path)?;
    if keep {
        *kept = Some(file);
    }
    Ok(Some(v))
}

/// A number read from the start of an open file, read anew; `path` names it in an error.
fn read_u64_at(file: &fs::File, path: impl FnOnce() -> PathBuf) -> Result<u64, MemoryError> {
    use std::os::unix::fs::FileExt as _;
    let mut buf = [0u8; 32];
    let n = match file.read_at(&mut buf, 0) {
        Ok(n) => n,
        Err(source) => return Err(MemoryError::Read { path: path(), source }),
    };
    let text = String::from_utf8_lossy(&buf[..n]);
    parse::number(text.trim()).map_err(|e| e.in_file(&path()))
}

/// Where the node's memory is read from: `MemoryCgroup::meminfo`'s default.
pub const MEMINFO: &str = "/proc/meminfo";

/// Refuses a `meminfo` that is not the kernel's: a file on another filesystem than procfs.
/// LXCFS (FUSE) is mounted over /proc/meminfo in the containers set up for it (LXD's, or a
/// pod given it by a webhook or a hostPath), showing the container's own limit and usage as
/// the machine's: the node's memory signal read from it would be the container's, and every
/// threshold wrong. The file itself is asked, not the mount table: a bind of the host's
/// procfs passes, and so does a kernel that is not the node's (gVisor, a Kata VM), which no
/// file can tell.
pub fn check_meminfo_is_the_kernels(meminfo: &Path) -> Result<(), MemoryError> {
    use nix::sys::statfs::{PROC_SUPER_MAGIC, statfs};
    let fs = statfs(meminfo)
        .map_err(|e| MemoryError::Read { path: meminfo.to_owned(), source: std::io::Error::from(e) })?;
    match fs.filesystem_type() {
        PROC_SUPER_MAGIC => Ok(()),
        other => Err(MemoryError::NotProcfs { path: meminfo.to_owned(), magic: format!("{:#x}", other.0) }),
    }
}

fn parse_u64(path: &Path, s: &str) -> Result<u64, MemoryError> {
    parse::number(s).map_err(|e| e.in_file(path))
}

pub mod parse;

impl parse::FieldError {
    /// The error of a file that holds one number.
    fn in_file(self, path: &Path) -> MemoryError {
        match self {
            Self::Missing => MemoryError::Parse { path: path.to_owned(), what: String::new() },
            Self::NotANumber(what) => MemoryError::Parse { path: path.to_owned(), what },
            Self::TooLarge(what) => MemoryError::TooLarge { path: path.to_owned(), what },
        }
    }

    /// The error of `key`'s line in a file of many.
    fn at(self, path: &Path, key: &'static str) -> MemoryError {
        match self {
            Self::Missing => MemoryError::MissingKey { path: path.to_owned(), key },
            Self::NotANumber(what) => {
                MemoryError::Parse { path: path.to_owned(), what: format!("{key} {what}") }
            }
            Self::TooLarge(what) => {
                MemoryError::TooLarge { path: path.to_owned(), what: format!("{key} {what}") }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A root of 16384000 kB using 2000000 kB (AnonPages + Cached + Buffers + SwapCached),
    /// 1024000 kB of it inactive file pages; MemTotal − MemFree would say 8192000 kB.
    const MEMINFO: &str = "MemTotal:       16384000 kB\nMemFree:         8192000 kB\n\
                           Buffers:           50000 kB\nCached:          1200000 kB\n\
                           SwapCached:        10000 kB\nInactive(file):   1024000 kB\n\
                           AnonPages:        740000 kB\nShmem:             99999 kB\nSlab:  4000000 kB\n";

    /// A kept-open usage file reads what the cgroup uses now, is found gone when its cgroup
    /// is removed (a kept file of a removed cgroup answers nothing: it is not taken for a
    /// reading), reads the new cgroup made at the same path, and is closed when not kept.
    /// On this machine's real memory hierarchy: a file's kernel semantics are the point.
    #[test]
    fn kept_usage_files_follow_their_cgroups() {
        let Some((layout, dir)) = test_cgroup("kept_usage_files_follow_their_cgroups", "usage-files") else {
            return;
        };
        let _cleanup = Removed(&dir);
        fs::create_dir(&dir).unwrap();
        let cg = MemoryCgroup::new(&dir, layout.memory_version, false);
        let mut files = UsageFiles::at_most(2048);
        // An empty cgroup: the kept file and a fresh read agree.
        assert_eq!(files.usage(&cg).unwrap(), Some(cg.usage().unwrap()));
        assert_eq!(files.len(), 1);
        fs::remove_dir(&dir).unwrap();
        assert_eq!(files.usage(&cg).unwrap(), None, "a removed cgroup is gone, not read from its old file");
        assert!(files.is_empty());
        fs::create_dir(&dir).unwrap();
        assert_eq!(files.usage(&cg).unwrap(), Some(cg.usage().unwrap()));
        files.keep_only(&HashSet::new());
        assert!(files.is_empty());
        files.open_only([&cg]);
        assert_eq!(files.len(), 1);
        files.open_only([]);
        assert!(files.is_empty());
    }

    /// This machine's memory hierarchy and a path for a test's own cgroup under its root
    /// (not made yet); `None`, skipped loudly, without root or cgroups.
    fn test_cgroup(test: &str, name: &str) -> Option<(crate::node::cgroups::CgroupMounts, PathBuf)> {
        if !nix::unistd::geteuid().is_root() {
            crate::skip(test, "needs root to make a memory cgroup");
            return None;
        }
        let layout = match crate::node::cgroups::CgroupMounts::detect() {
            Ok(l) => l,
            Err(e) => {
                crate::skip(test, &format!("no cgroups: {e}"));
                return None;
            }
        };
        let dir = layout.memory_root.join(format!("evictd-test-{name}-{}", std::process::id()));
        Some((layout, dir))
    }

    /// A test's cgroup directory, removed when dropped (also when the test fails).
    struct Removed<'a>(&'a Path);

    impl Drop for Removed<'_> {
        fn drop(&mut self) {
            let _ = fs::remove_dir(self.0);
        }
    }

    fn fixture(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("meminfo"), MEMINFO).unwrap();
        for (name, body) in files {
            fs::write(dir.path().join(name), body).unwrap();
        }
        dir
    }

    fn cg(dir: &tempfile::TempDir, version: CgroupVersion, is_root: bool) -> MemoryCgroup {
        MemoryCgroup {
            meminfo: dir.path().join("meminfo"),
            ..MemoryCgroup::new(dir.path(), version, is_root)
        }
    }

    /// The root, either version, is read whole from /proc/meminfo: its memory.stat (which
    /// would make the kernel flush every cgroup's statistics) and usage file are not read.
    #[test]
    fn the_root_is_read_from_meminfo_alone() {
        let d = fixture(&[]);
        for version in [CgroupVersion::V1, CgroupVersion::V2] {
            let s = cg(&d, version, true).read().unwrap();
            assert_eq!(
                (s.capacity, s.usage, s.inactive_file),
                (16_384_000 * 1024, 2_000_000 * 1024, 1_024_000 * 1024)
            );
            assert_eq!(s.available(), (16_384_000 - 976_000) * 1024);
        }
        // A field missing is an error naming it and the file, never a guess.
        fs::write(d.path().join("meminfo"), MEMINFO.replace("SwapCached", "Swap")).unwrap();
        let err = cg(&d, CgroupVersion::V2, true).read().unwrap_err();
        assert!(err.to_string().contains("meminfo: no SwapCached"), "{err}");
        fs::remove_file(d.path().join("meminfo")).unwrap();
        let err = cg(&d, CgroupVersion::V1, true).read().unwrap_err();
        assert!(err.to_string().contains("meminfo"), "{err}");
    }

    #[test]
    fn v1_child_capacity_is_its_limit_and_unlimited_is_mem_total() {
        let d = fixture(&[
            ("memory.usage_in_bytes", "100\n"),
            ("memory.stat", "total_inactive_file 200\n"),
            ("memory.limit_in_bytes", "1073741824\n"),
        ]);
        let s = cg(&d, CgroupVersion::V1, false).read().unwrap();
        assert_eq!(s.capacity, 1 << 30);
        assert!(s.limited);
        // inactive_file above usage clamps the working set at zero.
        assert_eq!(s.working_set(), 0);
        fs::write(d.path().join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        let unlimited = cg(&d, CgroupVersion::V1, false).read().unwrap();
        assert_eq!(unlimited.capacity, 16_384_000 * 1024);
        assert!(!unlimited.limited);
    }

    #[test]
    fn v2_child_reads_current_and_max() {
        let d = fixture(&[
            ("memory.current", "5000\n"),
            ("memory.stat", "file 9\ninactive_file 1000\n"),
            ("memory.max", "max\n"),
        ]);
        let s = cg(&d, CgroupVersion::V2, false).read().unwrap();
        assert_eq!((s.usage, s.inactive_file, s.capacity), (5000, 1000, 16_384_000 * 1024));
        fs::write(d.path().join("memory.max"), "8192\n").unwrap();
        assert_eq!(cg(&d, CgroupVersion::V2, false).read().unwrap().available(), 8192 - 4000);
    }

    /// Ranking's read takes the working set from two files: no limit, no /proc/meminfo (a
    /// pod without them still ranks), the same number as `read` where both can be read.
    #[test]
    fn the_working_set_alone_needs_no_limit_and_no_meminfo() {
        let v1 =
            fixture(&[("memory.usage_in_bytes", "3000\n"), ("memory.stat", "total_inactive_file 1000\n")]);
        let v2 = fixture(&[("memory.current", "5000\n"), ("memory.stat", "inactive_file 1500\n")]);
        for (d, version, expected) in [(&v1, CgroupVersion::V1, 2000), (&v2, CgroupVersion::V2, 3500)] {
            fs::remove_file(d.path().join("meminfo")).unwrap();
            let c = cg(d, version, false);
            assert!(c.read().is_err(), "read needs MemTotal and the limit");
            assert_eq!(c.working_set().unwrap(), expected, "{version:?}");
        }
        let root = fixture(&[]);
        let c = cg(&root, CgroupVersion::V2, true);
        assert_eq!(c.working_set().unwrap(), c.read().unwrap().working_set());
    }

    /// The poll's estimate: usage less the inactive file pages, as `read` has it, on the root
    /// too.
    #[test]
    fn the_working_set_estimate_is_usage_less_inactive_file() {
        let v1 = fixture(&[
            ("memory.usage_in_bytes", "3000\n"),
            ("memory.limit_in_bytes", "9000\n"),
            ("memory.stat", "total_inactive_file 1000\n"),
        ]);
        let c = cg(&v1, CgroupVersion::V1, false);
        assert_eq!(c.working_set_estimate().unwrap(), 2000);
        assert_eq!(c.working_set_estimate().unwrap(), c.read().unwrap().working_set());
        let v2 = fixture(&[
            ("memory.current", "5000\n"),
            ("memory.max", "max\n"),
            ("memory.stat", "inactive_file 1\n"),
        ]);
        let c = cg(&v2, CgroupVersion::V2, false);
        assert_eq!(c.working_set_estimate().unwrap(), c.read().unwrap().working_set());
        // The v2 root: both from meminfo. The v1 root: its usage file (the same counters on a
        // real root; here larger), less meminfo's inactive file pages.
        let v2_root = fixture(&[]);
        let c = cg(&v2_root, CgroupVersion::V2, true);
        assert_eq!(c.working_set_estimate().unwrap(), 976_000 * 1024);
        assert_eq!(c.working_set_estimate().unwrap(), c.read().unwrap().working_set());
        let v1_root = fixture(&[("memory.usage_in_bytes", "99999999999\n")]);
        let c = cg(&v1_root, CgroupVersion::V1, true);
        assert_eq!(c.working_set_estimate().unwrap(), c.read().unwrap().working_set());
        fs::remove_file(v1.path().join("memory.stat")).unwrap();
        let err = cg(&v1, CgroupVersion::V1, false).working_set_estimate().unwrap_err();
        assert!(err.to_string().contains("memory.stat"), "{err}");
    }

    /// The poll's cheap read is the same usage `read` takes, from one file.
    #[test]
    fn usage_alone_matches_the_full_read() {
        let v1 = fixture(&[("memory.usage_in_bytes", "3000\n"), ("memory.stat", "total_inactive_file 1\n")]);
        assert_eq!(cg(&v1, CgroupVersion::V1, false).usage().unwrap(), 3000);
        let v2 = fixture(&[("memory.current", "5000\n"), ("memory.stat", "inactive_file 1\n")]);
        assert_eq!(cg(&v2, CgroupVersion::V2, false).usage().unwrap(), 5000);
        // The v2 root has no usage file: its usage is the one `read` takes from meminfo. The
        // v1 root's is the file its eventfd notifier compares with.
        let root = cg(&v2, CgroupVersion::V2, true);
        assert!(root.usage_is_meminfo());
        assert_eq!(root.usage().unwrap(), root.read().unwrap().usage);
        assert_eq!(cg(&v1, CgroupVersion::V1, true).usage().unwrap(), 3000);
        fs::remove_file(v1.path().join("memory.usage_in_bytes")).unwrap();
        let err = cg(&v1, CgroupVersion::V1, false).usage().unwrap_err();
        assert!(err.to_string().contains("memory.usage_in_bytes"), "{err}");
    }

    #[test]
    fn vanished_or_garbled_files_are_errors_naming_the_file() {
        let d = fixture(&[("memory.stat", "total_inactive_file 1\n"), ("memory.limit_in_bytes", "8000\n")]);
        let err = cg(&d, CgroupVersion::V1, false).read().unwrap_err();
        assert!(err.to_string().contains("memory.usage_in_bytes"), "{err}");
        fs::write(d.path().join("memory.usage_in_bytes"), "lots\n").unwrap();
        let err = cg(&d, CgroupVersion::V1, false).read().unwrap_err();
        assert!(err.to_string().contains("\"lots\""), "{err}");
        fs::write(d.path().join("memory.usage_in_bytes"), "1\n").unwrap();
        fs::write(d.path().join("memory.stat"), "cache 1\n").unwrap();
        let err = cg(&d, CgroupVersion::V1, false).read().unwrap_err();
        assert!(err.to_string().contains("total_inactive_file"), "{err}");
    }

    /// The node's files kept open read what the files say now, like files opened anew: a
    /// rewritten file (as the kernel makes its text anew), a longer one than the buffer, one
    /// removed (an error naming it) and made again.
    #[test]
    fn kept_open_files_read_what_the_files_say_now() {
        let d = fixture(&[
            ("memory.usage_in_bytes", "3000\n"),
            ("memory.limit_in_bytes", "8000\n"),
            ("memory.stat", "total_inactive_file 1000\n"),
        ]);
        let kept = cg(&d, CgroupVersion::V1, false).kept_open();
        assert_eq!(kept.read().unwrap().available(), 8000 - 2000);
        assert_eq!(kept.kept(), 4, "usage, memory.stat, the limit and meminfo");
        fs::write(d.path().join("memory.usage_in_bytes"), "5000\n").unwrap();
        let long = format!("{}total_inactive_file 500\n", "cache 1\n".repeat(2000));
        fs::write(d.path().join("memory.stat"), long).unwrap();
        assert_eq!(kept.read().unwrap().available(), 8000 - 4500);
        assert_eq!(kept.kept(), 4);
        fs::remove_file(d.path().join("memory.usage_in_bytes")).unwrap();
        // The file kept open still reads what it held (a file system's file, unlike a
        // cgroup's, outlives its name): only a kept file can; opened anew, the same cgroup
        // fails naming it.
        assert_eq!(kept.read().unwrap().available(), 8000 - 4500, "read through the kept file");
        let err = cg(&d, CgroupVersion::V1, false).kept_open().read().unwrap_err();
        assert!(err.to_string().contains("memory.usage_in_bytes"), "{err}");
        fs::write(d.path().join("memory.usage_in_bytes"), "6000\n").unwrap();
        let clone = kept.clone();
        assert_eq!(clone.kept(), 0, "a clone keeps no file of the original");
        assert_eq!(clone.read().unwrap().available(), 8000 - 5500, "a clone opens files of its own");
    }

    /// Against a real cgroup: a kept file of a cgroup removed and made again at its path
    /// answers for the new one, not the old.
    #[test]
    fn kept_open_files_follow_a_cgroup_made_again() {
        let Some((layout, dir)) = test_cgroup("kept_open_files_follow_a_cgroup_made_again", "kept-open")
        else {
            return;
        };
        let limit = match layout.memory_version {
            CgroupVersion::V1 => "memory.limit_in_bytes",
            CgroupVersion::V2 => "memory.max",
        };
        let _cleanup = Removed(&dir);
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join(limit), "100000000").unwrap();
        let page = procfs::page_size();
        let kept = MemoryCgroup::new(&dir, layout.memory_version, false).kept_open();
        assert_eq!(kept.read().unwrap().capacity, 100_000_000 / page * page, "rounded down to pages");
        fs::remove_dir(&dir).unwrap();
        assert!(kept.read().is_err(), "a removed cgroup read");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join(limit), "200000000").unwrap();
        assert_eq!(kept.read().unwrap().capacity, 200_000_000 / page * page);
        assert_eq!(kept.kept(), 4, "the files of the removed cgroup closed, the new one's kept");
    }

    /// The root read from /proc/meminfo is what the kubelet reads from the root cgroup (v1:
    /// usage_in_bytes and memory.stat's total_inactive_file; v2: runc's anon + file and
    /// inactive_file of memory.stat), on this machine's own hierarchy: the host's v1, the VMs'
    /// v2. The two are read moments apart on a live machine, and the global counters also
    /// hold pages charged to no cgroup: within 16 MiB, and 1 % of the usage.
    #[test]
    fn this_machines_root_reads_as_its_memory_stat() {
        let layout = crate::node::cgroups::CgroupMounts::detect().unwrap();
        // In a private cgroup namespace the mount's root is a container's cgroup, whose
        // memory.stat is not the machine's meminfo.
        if let Err(e) = layout.check_sees_the_node() {
            return crate::skip("this_machines_root_reads_as_its_memory_stat", &e.to_string());
        }
        let root = MemoryCgroup::new(&layout.memory_root, layout.memory_version, true);
        let stat = |key| root.stat_key(key).unwrap();
        let by_stat = || match layout.memory_version {
            CgroupVersion::V1 => (root.number("memory.usage_in_bytes").unwrap(), stat("total_inactive_file")),
            CgroupVersion::V2 => (stat("anon") + stat("file"), stat("inactive_file")),
        };
        let (before, read, after) = (by_stat(), root.read().unwrap(), by_stat());
        // What the global counters may hold back (~125 pages a CPU for each of three), and
        // what the machine's other work (the other tests among it) may allocate and free
        // between the three reads, which the reads before and after do not bound.
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        let near = |what: &str, a: u64, b: u64, c: u64| {
            let slack = (16u64 << 20).max(b / 100).max(3 * 125 * 4096 * cpus);
            let (lo, hi) = (a.min(c).saturating_sub(slack), a.max(c) + slack);
            assert!((lo..=hi).contains(&b), "{what}: meminfo {b}, memory.stat {a} then {c} ({layout:?})");
        };
        near("usage", before.0, read.usage, after.0);
        near("inactive file", before.1, read.inactive_file, after.1);
    }

    #[test]
    fn this_machine_root_memory_cgroup() {
        let layout = crate::node::cgroups::CgroupMounts::detect().unwrap();
        let s = MemoryCgroup::new(&layout.memory_root, layout.memory_version, true).read().unwrap();
        assert!(s.capacity > 0 && s.usage > 0, "{s:?}");
        assert!(s.available() <= s.capacity as i64);
    }

    /// A meminfo on another filesystem than procfs (LXCFS's, FUSE, in a container) is
    /// refused, named with its filesystem; the kernel's own is taken.
    #[test]
    fn a_meminfo_that_is_not_procfs_is_refused() {
        const TEST: &str = "a_meminfo_that_is_not_procfs_is_refused";
        if let Err(e) = check_meminfo_is_the_kernels(Path::new(super::MEMINFO)) {
            return crate::skip(TEST, &format!("this machine's own is not the kernel's: {e}"));
        }
        let d = tempfile::tempdir().unwrap();
        let copy = d.path().join("meminfo");
        fs::write(&copy, fs::read(super::MEMINFO).unwrap()).unwrap();
        let err = check_meminfo_is_the_kernels(&copy).unwrap_err().to_string();
        assert!(err.contains(&copy.display().to_string()) && err.contains("not procfs's"), "{err}");
        let err = check_meminfo_is_the_kernels(&d.path().join("gone")).unwrap_err().to_string();
        assert!(err.contains("gone"), "{err}");
    }

    /// A meminfo value too large to be bytes is an error, not an overflow.
    #[test]
    fn meminfo_values_that_do_not_fit_are_errors() {
        let huge = format!("MemTotal: {} kB\n", u64::MAX / 512);
        assert!(matches!(parse::meminfo_bytes(&huge, "MemTotal"), Err(parse::FieldError::TooLarge(_))));
        assert_eq!(parse::meminfo_bytes("MemTotal: 2 kB\n", "MemTotal"), Ok(2048));
        // Above i64::MAX bytes, a value would read as plenty available once signed.
        let over = format!("MemTotal: {} kB\n", (i64::MAX as u64) / 1024 + 1);
        assert!(matches!(parse::meminfo_bytes(&over, "MemTotal"), Err(parse::FieldError::TooLarge(_))));
        let garbage = format!("inactive_file {}\n", u64::MAX);
        assert!(matches!(parse::stat_value(&garbage, "inactive_file"), Err(parse::FieldError::TooLarge(_))));
        let err = parse_u64(Path::new("memory.current"), &u64::MAX.to_string()).unwrap_err().to_string();
        assert!(err.contains("memory.current") && err.contains("above i64::MAX"), "{err}");
        // Each term fits, their sum would not: no sample, the file named.
        let d = tempfile::tempdir().unwrap();
        let kb = i64::MAX as u64 / 1024 / 2;
        fs::write(
            d.path().join("meminfo"),
            format!(
                "MemTotal: 1000 kB\nAnonPages: {kb} kB\nCached: {kb} kB\nBuffers: {kb} kB\nSwapCached: 0 kB\n\
                 Inactive(file): 0 kB\n"
            ),
        )
        .unwrap();
        let err = cg(&d, CgroupVersion::V2, true).read().unwrap_err().to_string();
        assert!(err.contains("meminfo") && err.contains("above i64::MAX"), "{err}");
        // A sample made otherwise is clamped, never wrapped.
        let sample = |capacity, usage| MemorySample { capacity, usage, inactive_file: 0, limited: true };
        assert_eq!(sample(0, u64::MAX).available(), i64::MIN);
        assert_eq!(sample(u64::MAX, 0).available(), i64::MAX);
        assert_eq!(parse_u64(Path::new("memory.current"), &i64::MAX.to_string()).ok(), Some(i64::MAX as u64));
        assert_eq!(parse::stat_value("total_inactive_file 7\n", "total_inactive_file"), Ok(7));
        assert_eq!(
            parse::stat_value("inactive_file x\n", "inactive_file"),
            Err(parse::FieldError::NotANumber("x".into()))
        );
    }
}
