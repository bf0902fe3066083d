//! The directory walk behind the pods' log and volume stats: the kubelet's `fs.DiskUsage`
//! (its MetricsDu), bounded in what it holds, because a tenant chooses the tree.
//!
//! Each directory is read in batches of one small `getdents` buffer, shared by the whole walk.
//! A directory's subdirectories of the batch last read wait in the directory's own short list
//! while the walk is below it; its descriptor stays open, so its next batch starts where the
//! kernel left off, on every filesystem (tmpfs before 6.6 and overlayfs number positions by
//! count, so a seek there can land on another entry once the directory changes). Past
//! `MAX_OPEN_DIRS` levels a directory is read only up to its next subdirectory and closed while
//! that subtree is walked, then opened again through the subtree's `..` (known by its inode)
//! and found again where it stopped (`Place`): depth costs a few words a level, not a
//! descriptor.

use std::{
    collections::HashSet,
    ffi::{CStr, CString},
    mem::MaybeUninit,
    path::Path,
};

use rustix::{
    fd::{AsFd, OwnedFd},
    fs::{AtFlags, CWD, FileType, Mode, OFlags, RawDir, SeekFrom, Statx, StatxFlags},
};

/// Bytes and inodes of `dir` and everything under it, as the kubelet's `fs.DiskUsage` counts
/// them: allocated blocks × 512 of every inode once (hard links deduplicated, directories
/// included), symlinks not followed, nothing on another filesystem. Entries that vanish
/// meanwhile are skipped; a path that does not exist is (0, 0), a file is itself.
pub fn du(dir: &Path) -> (u64, u64) {
    let walked = du_remembering(dir);
    if walked.incomplete {
        tracing::warn!(
            dir = %dir.display(),
            "a directory changed or could not be read while it was walked: its usage counts what the walk saw"
        );
    }
    (walked.bytes, walked.inodes)
}

/// What a walk found, and the most it held at once.
#[derive(Debug, Default)]
struct Walked {
    bytes: u64,
    inodes: u64,
    /// Inodes remembered plus directories open, at most.
    most_held: usize,
    /// Entries read, counted or not: past `READ_BUDGET` the walk stops.
    read: u64,
    /// Something was not seen (a read or seek refused, a deep directory moved or its place
    /// lost while the walk was below it, the read budget spent, no descriptor left): the
    /// totals lack it.
    incomplete: bool,
}

/// `du`, and the most it held at once. Only files with more than one link are remembered (as
/// `du` and the kubelet's walk do: another link may come later); a directory of a million
/// files, or of a million subdirectories, costs one batch of names.
fn du_remembering(dir: &Path) -> Walked {
    du_remembering_at_most(dir, MAX_LINKED)
}

fn du_remembering_at_most(dir: &Path, max_linked: usize) -> Walked {
    let Some(mut walk) = DirWalk::of(dir) else { return Walked::default() };
    walk.linked.max = max_linked;
    let mut buf = vec![MaybeUninit::<u8>::uninit(); DENTS_BUF];
    while walk.step(&mut buf) {}
    walk.linked.add_shares(&mut walk.done);
    walk.done
}

/// Multiply-linked inodes a walk remembers (a HashSet of them: ~0.5 MiB at most).
const MAX_LINKED: usize = 1 << 15;

/// Inodes with more than one link: remembered, to be counted once, up to `max`. Past it each
/// link met of an inode not remembered counts its share, 1/nlink of the inode: the sum is the
/// inode once when the walk meets all its links (as within one pod's volume), and never more.
/// So a tenant's million hard links cost the walk no more memory than `max` of them, and
/// count no less than the files they are.
struct Links {
    seen: HashSet<u64>,
    max: usize,
    /// The shares past `max`, in 2^-32 of a byte and of an inode.
    share_bytes: u128,
    share_inodes: u128,
    /// Links met and not counted whole (a share, or an inode met before): each counts toward
    /// the read budget as a counted entry does, so that links cannot spend it.
    links_met: u64,
}

impl Links {
    fn new() -> Links {
        Links { seen: HashSet::new(), max: MAX_LINKED, share_bytes: 0, share_inodes: 0, links_met: 0 }
    }

    /// Whether the link met of inode `ino` (of `nlink` links, `bytes` allocated) is counted
    /// whole: false when the inode was met before, or the link is counted as a share.
    fn first_sight(&mut self, ino: u64, nlink: u32, bytes: u64) -> bool {
        if self.seen.len() < self.max && self.seen.insert(ino) {
            return true;
        }
        self.links_met += 1;
        if !self.seen.contains(&ino) {
            self.share_bytes += (u128::from(bytes) << 32) / u128::from(nlink);
            self.share_inodes += (1u128 << 32) / u128::from(nlink);
        }
        false
    }

    /// The shares, rounded up, into the walk's totals.
    fn add_shares(&self, done: &mut Walked) {
        done.bytes += self.share_bytes.div_ceil(1 << 32) as u64;
        done.inodes += self.share_inodes.div_ceil(1 << 32) as u64;
    }
}

/// The `getdents` buffer of a walk: a few dozen entries a read. A kept-open level's list of
/// subdirectories is at most one such batch.
const DENTS_BUF: usize = 1 << 10;

/// Levels kept open, read a batch at a time. Descriptors are what the kill path needs; the
/// walk holds at most these plus two (the deepest level, and one for the moment a level is
/// opened).
const MAX_OPEN_DIRS: usize = 32;

/// Entries a walk may read: a million, and eight for each it counts (every link of a
/// hard-linked file too, `Links`). A walk reads each entry once, but for the searches of
/// directories past `MAX_OPEN_DIRS` on filesystems whose positions move (a tenant renaming
/// entries ahead of the walk can have it read them again and again); past the budget it
/// stops, incomplete, and the walker thread goes on to the next pod.
const READ_BUDGET: (u64, u64) = (1 << 20, 8);

/// What the walk reads of each entry.
const WALK_STATX: StatxFlags =
    StatxFlags::TYPE.union(StatxFlags::NLINK).union(StatxFlags::INO).union(StatxFlags::BLOCKS);

/// One directory of the path the walk is in.
struct Level {
    /// `None` while a subtree below it is walked (levels past `MAX_OPEN_DIRS` only).
    fd: Option<OwnedFd>,
    /// To know it again when it is opened through its child's `..`.
    ino: u64,
    /// Names of the subdirectories read and not yet walked, each ended by a NUL, from `next`.
    pending: Vec<u8>,
    next: usize,
    /// Read to its end (or as far as it could be read).
    ended: bool,
    /// Levels past `MAX_OPEN_DIRS`: where to read on after the subdirectory the last read
    /// stopped at (it was closed meanwhile, or its descriptor read past that batch).
    resume: Option<Resume>,
}

/// A deep level's place: the subdirectory its last read stopped at.
#[derive(Clone, Copy)]
struct Resume {
    /// The seek positions before and after it: after it trusted only where positions stay
    /// put; before it tried elsewhere, and kept when the entry found there is it.
    before: u64,
    after: u64,
    mark: Mark,
}

/// An entry known again: its inode as the directory lists it and a hash of its name (some
/// filesystems list one inode number for every entry; a rename in place keeps the inode).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Mark {
    ino: u64,
    name: u64,
}

impl Mark {
    fn of(ino: u64, name: &CStr) -> Mark {
        use std::hash::{BuildHasher as _, BuildHasherDefault, DefaultHasher};
        Mark { ino, name: BuildHasherDefault::<DefaultHasher>::default().hash_one(name.to_bytes()) }
    }
}

/// Whether the filesystem's seek positions stay put while a directory changes (ext4, xfs and
/// btrfs hash or index their entries). Elsewhere a position may be a count (tmpfs before
/// Linux 6.6, ramfs, overlayfs' merged directories, hugetlbfs) or anything (FUSE), and a
/// deep level is found again by the entry it stopped at (`Place::find`).
fn stable_positions(fd: &OwnedFd) -> bool {
    const EXT4: u64 = 0xef53;
    const XFS: u64 = 0x5846_5342;
    const BTRFS: u64 = 0x9123_683e;
    rustix::fs::fstatfs(fd).is_ok_and(|st| matches!(st.f_type as u64, EXT4 | XFS | BTRFS))
}

// What a level of depth costs, as docs/operating.md states it: a tenant chooses the depth.
const _: () = assert!(size_of::<Level>() <= 88);

impl Level {
    fn new(fd: OwnedFd, ino: u64) -> Level {
        Level { fd: Some(fd), ino, pending: Vec::new(), next: 0, ended: false, resume: None }
    }

    /// The next subdirectory read and not yet walked.
    fn next_pending(&mut self) -> Option<CString> {
        let name = CStr::from_bytes_until_nul(self.pending.get(self.next..)?).ok()?.to_owned();
        self.next += name.as_bytes_with_nul().len();
        if self.next >= self.pending.len() {
            // Not kept: a level held closed far down a deep tree holds no spare room.
            self.pending = Vec::new();
            self.next = 0;
        }
        Some(name)
    }
}

/// A walk in progress.
struct DirWalk {
    /// The filesystem walked: nothing on another is counted or entered.
    dev: (u32, u32),
    /// Whether its seek positions stay put (`stable_positions`).
    stable: bool,
    /// The subdirectory a level past `MAX_OPEN_DIRS` stopped at, opened as it was read.
    entering: Option<OwnedFd>,
    levels: Vec<Level>,
    /// Inodes with more than one link, counted once.
    linked: Links,
    done: Walked,
}

impl DirWalk {
    /// The walk of `dir`, its top counted and, when it is a directory that opens, open as the
    /// first level (one that cannot be opened for want of descriptors leaves the walk
    /// incomplete); `None` when there is nothing at `dir`.
    fn of(dir: &Path) -> Option<DirWalk> {
        let flags = AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT;
        let top = rustix::fs::statx(CWD, dir, flags, WALK_STATX).ok()?;
        let mut walk = DirWalk::new(&top);
        if is_dir(&top)
            && let Some(fd) = open_to_walk(CWD, dir, &mut walk.done.incomplete)
        {
            walk.stable = stable_positions(&fd);
            walk.levels.push(Level::new(fd, top.stx_ino));
        }
        Some(walk)
    }

    fn new(top: &Statx) -> DirWalk {
        let done = Walked { bytes: top.stx_blocks * 512, inodes: 1, ..Walked::default() };
        let dev = (top.stx_dev_major, top.stx_dev_minor);
        DirWalk { dev, stable: false, entering: None, levels: Vec::new(), linked: Links::new(), done }
    }

    /// One step: into the deepest level's next subdirectory, or its next batch, or out of it
    /// once it is read. `false` when the walk is done.
    fn step(&mut self, buf: &mut [MaybeUninit<u8>]) -> bool {
        let held = self.linked.seen.len() + self.open();
        self.done.most_held = self.done.most_held.max(held);
        let counted = self.done.inodes + self.linked.links_met;
        if self.done.read > READ_BUDGET.0 + READ_BUDGET.1 * counted {
            self.done.incomplete = true;
            self.levels.clear();
        }
        let Some(level) = self.levels.last_mut() else { return false };
        if let Some(name) = level.next_pending() {
            self.descend(&name);
        } else if level.ended {
            self.ascend();
        } else {
            self.read_batch(buf);
        }
        true
    }

    /// Directories open now: the kept-open levels and the deepest.
    fn open(&self) -> usize {
        self.levels.len().min(MAX_OPEN_DIRS) + usize::from(self.levels.len() > MAX_OPEN_DIRS)
    }

    /// Whether the deepest level is past the kept-open ones.
    fn deep(&self) -> bool {
        self.levels.len() > MAX_OPEN_DIRS
    }

    /// Reads the deepest level's next batch, counting what it finds and listing its
    /// subdirectories; a level past `MAX_OPEN_DIRS` only up to its next subdirectory, from
    /// the one it stopped at. A directory that cannot be read on (a read error; the entry it
    /// stopped at gone, where positions are not kept) ends there, the walk said incomplete.
    fn read_batch(&mut self, buf: &mut [MaybeUninit<u8>]) {
        let deep = self.deep();
        let DirWalk { dev, levels, linked, done, stable, entering } = self;
        let Some(Level { fd, pending, ended, resume, .. }) = levels.last_mut() else { return };
        // The deepest level is open; were it not, it ends here rather than be read forever.
        let Some(fd) = fd.as_ref() else {
            (done.incomplete, *ended) = (true, true);
            return;
        };
        let Some(mut place) = Place::find(fd, resume.take(), *stable, buf) else {
            (done.incomplete, *ended) = (true, true);
            return;
        };
        // Only a deep level keeps the positions around the entry it stops at.
        let mut before = if deep { rustix::fs::seek(fd, SeekFrom::Current(0)).unwrap_or(0) } else { 0 };
        let mut entries = RawDir::new(fd, buf);
        let mut read = false;
        // One `getdents` a batch, past those a search for the place skips whole.
        while place.searching() || !read || !entries.is_buffer_empty() {
            let e = match entries.next() {
                Some(Ok(e)) => e,
                // Removed while it was read: its end.
                Some(Err(rustix::io::Errno::NOENT)) | None => {
                    (done.incomplete, *ended) = (done.incomplete || place.searching(), true);
                    return;
                }
                Some(Err(_)) => {
                    (done.incomplete, *ended) = (true, true);
                    return;
                }
            };
            (read, done.read) = (true, done.read + 1);
            let (at, name) = (before, e.file_name());
            before = e.next_entry_cookie();
            // A name is hashed only where a mark is compared: not on the kept-open levels.
            let passes = place.passes_all() || place.passes(Mark::of(e.ino(), name));
            if matches!(name.to_bytes(), b"." | b"..") || !passes {
                continue;
            }
            if count_entry(fd, name, *dev, linked, done) != Some(true) {
                continue;
            }
            if !deep {
                pending.extend_from_slice(name.to_bytes_with_nul());
                continue;
            }
            // Opened now, while its name is where it was read: one gone by the time its
            // parent is found again would take the rest of the parent with it.
            if let Some(child) = open_to_walk(fd, name, &mut done.incomplete) {
                pending.extend_from_slice(name.to_bytes_with_nul());
                *entering = Some(child);
                *resume = Some(Resume { before: at, after: before, mark: Mark::of(e.ino(), name) });
                return;
            }
        }
    }

    /// Opens the deepest level's subdirectory `name` (a level past `MAX_OPEN_DIRS` opened it
    /// as it read it) as the new deepest level; a parent past `MAX_OPEN_DIRS` is closed
    /// meanwhile.
    fn descend(&mut self, name: &CStr) {
        let deep = self.deep();
        let Some(Level { fd: Some(parent), .. }) = self.levels.last_mut() else { return };
        let opened = match self.entering.take() {
            Some(fd) => Some(fd),
            None => open_to_walk(parent, name, &mut self.done.incomplete),
        };
        let Some(fd) = opened else { return };
        let Some(ino) = inode_of(&fd) else {
            self.done.incomplete = true;
            return;
        };
        if deep && let Some(parent) = self.levels.last_mut() {
            parent.fd = None;
        }
        self.levels.push(Level::new(fd, ino));
    }

    /// Leaves the deepest level, done. A parent closed meanwhile is opened again through the
    /// level's `..` and known by its inode; when that is another directory (a tenant moved
    /// one), the closed levels above are given up and the walk goes on at the deepest open one.
    fn ascend(&mut self) {
        let Some(child) = self.levels.pop() else { return };
        let Some(parent) = self.levels.last_mut() else { return };
        if parent.fd.is_some() {
            return;
        }
        let again = child.fd.and_then(|fd| open_dir(&fd, c"..").ok());
        match again.filter(|fd| inode_of(fd) == Some(parent.ino)) {
            Some(fd) => parent.fd = Some(fd),
            None => {
                while self.levels.last().is_some_and(|l| l.fd.is_none()) {
                    self.levels.pop();
                }
                self.done.incomplete = true;
            }
        }
    }
}

/// Where a read of a deep level starts: on from its descriptor, or the entry it stopped at
/// found again.
enum Place {
    /// Read on; `never`: the subdirectory sought past, not met twice.
    On { never: Option<Mark> },
    /// Read from the start, skipping up to and past this entry.
    Past(Mark),
}

impl Place {
    /// Seeks `fd` where its read starts; `None` when a seek is refused. Where positions stay
    /// put, to the position after the entry it stopped at; elsewhere to the position before
    /// it, kept when the entry there is still it (then nothing moved before it, and what
    /// follows it is what is left to read), else to the start, to search for it.
    fn find(
        fd: &OwnedFd,
        stopped_at: Option<Resume>,
        stable: bool,
        buf: &mut [MaybeUninit<u8>],
    ) -> Option<Place> {
        let seek = |to: u64| (rustix::fs::seek(fd, SeekFrom::Start(to)).ok() == Some(to)).then_some(());
        let Some(at) = stopped_at else { return Some(Place::On { never: None }) };
        if stable {
            seek(at.after)?;
            return Some(Place::On { never: Some(at.mark) });
        }
        seek(at.before)?;
        let there = match RawDir::new(fd, buf).next() {
            Some(Ok(e)) => Some((Mark::of(e.ino(), e.file_name()), e.next_entry_cookie())),
            _ => None,
        };
        match there {
            Some((mark, after)) if mark == at.mark => seek(after).map(|()| Place::On { never: None }),
            _ => seek(0).map(|()| Place::Past(at.mark)),
        }
    }

    fn searching(&self) -> bool {
        matches!(self, Place::Past(_))
    }

    /// Whether every entry is one to count, whatever it is.
    fn passes_all(&self) -> bool {
        matches!(self, Place::On { never: None })
    }

    /// Whether the entry `mark` is one to count (the search ends past its own).
    fn passes(&mut self, mark: Mark) -> bool {
        match *self {
            Place::On { never } => never != Some(mark),
            Place::Past(sought) => {
                if mark == sought {
                    *self = Place::On { never: None };
                }
                false
            }
        }
    }
}

/// Counts the entry `name` of the directory `at` as the kubelet's walk does: `Some(whether it
/// is a directory)` when counted; `None` for one on another filesystem, a hard link met before
/// (or counted as its share, `Links`), or one gone meanwhile.
fn count_entry(
    at: &OwnedFd,
    name: &CStr,
    dev: (u32, u32),
    linked: &mut Links,
    done: &mut Walked,
) -> Option<bool> {
    let flags = AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT;
    let st = rustix::fs::statx(at, name, flags, WALK_STATX).ok()?;
    let dir = is_dir(&st);
    let bytes = st.stx_blocks * 512;
    if (st.stx_dev_major, st.stx_dev_minor) != dev
        || (!dir && st.stx_nlink > 1 && !linked.first_sight(st.stx_ino, st.stx_nlink, bytes))
    {
        return None;
    }
    done.bytes += bytes;
    done.inodes += 1;
    Some(dir)
}

fn is_dir(st: &Statx) -> bool {
    FileType::from_raw_mode(st.stx_mode.into()).is_dir()
}

/// `path` under `at` (the walk's top, or a subdirectory), opened to be walked. One gone,
/// replaced, or not ours to read is counted and not entered (`None`); one that cannot be
/// opened for want of descriptors or memory makes the walk `incomplete`.
fn open_to_walk<P: rustix::path::Arg>(at: impl AsFd, path: P, incomplete: &mut bool) -> Option<OwnedFd> {
    use rustix::io::Errno;
    match open_dir(at, path) {
        Ok(fd) => Some(fd),
        Err(Errno::NOENT | Errno::ACCESS | Errno::NOTDIR | Errno::LOOP) => None,
        Err(_) => {
            *incomplete = true;
            None
        }
    }
}

fn inode_of(fd: &OwnedFd) -> Option<u64> {
    rustix::fs::statx(fd, c"", AtFlags::EMPTY_PATH, StatxFlags::INO).ok().map(|st| st.stx_ino)
}

/// A directory opened for the walk, never through a symlink.
fn open_dir<P: rustix::path::Arg>(at: impl AsFd, path: P) -> rustix::io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat(at, path, flags, Mode::empty())
}

#[cfg(test)]
mod tests {
    use std::{fs, os::unix::fs::MetadataExt as _};

    use rusty_fork::rusty_fork_test;

    use super::*;

    /// A walk of `dir` ready to step.
    fn walk_of(dir: &Path) -> DirWalk {
        let walk = DirWalk::of(dir).expect("the walk's top");
        assert_eq!(walk.levels.len(), 1, "{} opened", dir.display());
        walk
    }

    /// Steps `walk` to its end, within a bound far past what the tests' trees take: a walk
    /// that finds its place wrongly can go round for ever.
    fn finish(walk: &mut DirWalk, buf: &mut [MaybeUninit<u8>]) {
        for _ in 0..1_000_000 {
            if !walk.step(buf) {
                return;
            }
        }
        panic!("the walk did not end within a million steps");
    }

    /// `n` subdirectories of `dir`, each with `files` files.
    fn subdirectories(dir: &Path, prefix: &str, n: usize, files: usize) {
        for i in 0..n {
            let sub = dir.join(format!("{prefix}{i}"));
            fs::create_dir(&sub).unwrap();
            for f in 0..files {
                fs::write(sub.join(format!("f{f}")), b"").unwrap();
            }
        }
    }

    rusty_fork_test! {
        /// A directory the walk cannot open for want of descriptors (for real: the open-file
        /// limit lowered, in a process of its own) is said incomplete, its top and its
        /// subdirectory alike: its contents were not seen.
        #[test]
        fn a_directory_that_cannot_be_opened_makes_the_walk_incomplete() {
            use nix::sys::resource::{Resource, getrlimit, setrlimit};
            let dir = tempfile::tempdir().unwrap();
            subdirectories(dir.path(), "s", 1, 1);
            let lowest_free = fs::File::open("/dev/null").map(|f| std::os::fd::AsRawFd::as_raw_fd(&f)).unwrap();
            let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
            let walked_with = |limit: i32| {
                setrlimit(Resource::RLIMIT_NOFILE, limit as u64, hard).unwrap();
                let walked = du_remembering(dir.path());
                setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
                walked
            };
            let top_only = walked_with(lowest_free);
            assert!(top_only.incomplete && top_only.inodes == 1, "{top_only:?}");
            let without_sub = walked_with(lowest_free + 1);
            assert!(without_sub.incomplete && without_sub.inodes == 2, "{without_sub:?}");
            let whole = du_remembering(dir.path());
            assert!(!whole.incomplete && whole.inodes == 3, "{whole:?}");
        }
    }

    /// A volume of many small files: the walk counts every one but remembers only what it
    /// can meet twice (the one file with two links), so its memory does not grow with the
    /// file count.
    #[test]
    fn the_walk_remembers_only_what_it_can_meet_twice() {
        let dir = tempfile::tempdir().unwrap();
        subdirectories(dir.path(), "a", 1, 2000);
        // 2000 sibling directories: a batch of names at a time, not 2000.
        subdirectories(dir.path(), "d", 2000, 0);
        fs::hard_link(dir.path().join("a0/f0"), dir.path().join("link")).unwrap();
        let walked = du_remembering(dir.path());
        assert_eq!(
            walked.inodes,
            1 + 1 + 2000 + 2000,
            "the top, a0/, every file once (the link is f0), every dir"
        );
        assert!(
            walked.most_held <= 3,
            "held {} entries for 2000 files and 2000 directories",
            walked.most_held
        );
        assert!(!walked.incomplete);
    }

    /// A tenant's hard links past what the walk remembers: each counts its share of the
    /// file, so the total is what the kubelet's walk counts (every file once) while the walk
    /// holds no more than its bound.
    #[test]
    fn hard_links_past_the_bound_count_their_share() {
        let dir = tempfile::tempdir().unwrap();
        for f in 0..6 {
            let file = dir.path().join(format!("f{f}"));
            fs::write(&file, vec![1u8; 8192 * (f + 1)]).unwrap();
            for l in 0..f + 1 {
                fs::hard_link(&file, dir.path().join(format!("f{f}-link{l}"))).unwrap();
            }
        }
        let remembered = du_remembering(dir.path());
        let bounded = du_remembering_at_most(dir.path(), 2);
        assert_eq!((bounded.bytes, bounded.inodes), (remembered.bytes, remembered.inodes));
        assert_eq!(remembered.inodes, 1 + 6, "the top and each file once");
        assert!(bounded.most_held <= 2 + 1, "held {} with a bound of 2", bounded.most_held);
        assert!(!bounded.incomplete);
    }

    /// What the kubelet's walk counts of what is not a plain directory: a file is itself, a
    /// path that does not exist nothing, a symlink (to a large directory) one inode, a FIFO
    /// one inode; names need not be UTF-8.
    #[test]
    fn files_symlinks_and_odd_names_count_as_the_kubelet_counts_them() {
        use std::os::unix::ffi::OsStrExt as _;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        fs::write(&file, vec![1u8; 8192]).unwrap();
        assert_eq!(du(&file), (fs::metadata(&file).unwrap().blocks() * 512, 1));
        assert_eq!(du(&dir.path().join("missing")), (0, 0));

        let vol = dir.path().join("vol");
        fs::create_dir(&vol).unwrap();
        std::os::unix::fs::symlink(dir.path(), vol.join("link")).unwrap();
        nix::unistd::mkfifo(&vol.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        fs::write(vol.join(std::ffi::OsStr::from_bytes(b"\xff\xfe")), b"x").unwrap();
        let (_, inodes) = du(&vol);
        assert_eq!(inodes, 1 + 3, "the top, the symlink (not followed), the FIFO, the odd name");
    }

    /// A chain of 200 directories (a tenant chooses the depth) with files at every level and,
    /// far past `MAX_OPEN_DIRS`, a level of many files and subdirectories: every inode is
    /// counted once, each deep level read on from where it stopped after each subtree (opened
    /// again through `..`), with at most `MAX_OPEN_DIRS` + 1 directories open between steps
    /// (counted on the levels themselves): descriptors are what the kill path needs.
    #[test]
    fn a_deep_chain_is_walked_whole_with_a_bounded_number_of_directories_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut level = dir.path().to_path_buf();
        let mut expected = 1;
        for depth in 0..200 {
            level.push("d");
            fs::create_dir(&level).unwrap();
            for f in ["a", "m", "z"] {
                fs::write(level.join(f), b"x").unwrap();
            }
            expected += 4;
            if depth == 100 {
                subdirectories(&level, "sub", 300, 1);
                for i in 0..3000 {
                    fs::write(level.join(format!("f{i}")), b"x").unwrap();
                }
                expected += 300 * 2 + 3000;
            }
        }
        let mut walk = walk_of(dir.path());
        let mut buf = vec![MaybeUninit::<u8>::uninit(); DENTS_BUF];
        let (mut most_open, mut deepest) = (0, 0);
        while walk.step(&mut buf) {
            most_open = most_open.max(walk.levels.iter().filter(|l| l.fd.is_some()).count());
            deepest = deepest.max(walk.levels.len());
        }
        assert_eq!(walk.done.inodes, expected, "every level, its files, the wide level's entries, once each");
        assert_eq!(deepest, 201, "the top and the 200 levels");
        assert!(most_open <= MAX_OPEN_DIRS + 1, "{most_open} directories open at once");
        assert!(!walk.done.incomplete);
    }

    /// A directory that gains entries while the walk is below it is read on where the walk
    /// left it, on every filesystem: each subdirectory is walked once (one walked twice would
    /// add its 301 inodes), new entries are counted or not, none twice. Past `MAX_OPEN_DIRS`
    /// the same holds whether the level is found again by its seek position (where positions
    /// stay put: ext4, xfs, btrfs) or by reading from its start to the entry it stopped at
    /// (elsewhere; tried here on every filesystem).
    #[test]
    fn a_directory_that_changes_under_the_walk_has_each_subdirectory_walked_once() {
        for (depth, search) in [(0, false), (MAX_OPEN_DIRS + 3, false), (MAX_OPEN_DIRS + 3, true)] {
            let dir = tempfile::tempdir().unwrap();
            let mut changing = dir.path().to_path_buf();
            for _ in 0..depth {
                changing.push("d");
            }
            fs::create_dir_all(&changing).unwrap();
            for i in 0..100 {
                fs::write(changing.join(format!("early{i}")), b"").unwrap();
            }
            subdirectories(&changing, "s", 10, 300);
            let expected = 1 + depth as u64 + 100 + 10 * 301;
            let mut walk = walk_of(dir.path());
            walk.stable &= !search;
            let mut buf = vec![MaybeUninit::<u8>::uninit(); DENTS_BUF];
            // Into the changing directory's first subdirectory.
            while walk.levels.len() < depth + 2 {
                assert!(walk.step(&mut buf), "the walk ended before it reached the changing directory");
            }
            let added = 100;
            for i in 0..added {
                fs::write(changing.join(format!("late{i}")), b"").unwrap();
            }
            finish(&mut walk, &mut buf);
            let (counted, most) = (walk.done.inodes, expected + added);
            let how =
                format!("depth {depth}, found again by {}", if walk.stable { "seek" } else { "search" });
            assert!((expected..=most).contains(&counted), "{how}: {counted} inodes, {expected}..={most}");
            assert!(!walk.done.incomplete, "{how}");
        }
    }

    /// A wide directory past `MAX_OPEN_DIRS`, unchanged, on the path that does not trust seek
    /// positions: each time the walk comes back to it, the entry it stopped at is still
    /// where it was read, so it reads on from there; no search from the start (which would
    /// read about half the directory again for each of its subdirectories).
    #[test]
    fn a_wide_deep_directory_is_read_about_once_when_it_does_not_change() {
        let dir = tempfile::tempdir().unwrap();
        let mut wide = dir.path().to_path_buf();
        for _ in 0..MAX_OPEN_DIRS + 3 {
            wide.push("d");
        }
        fs::create_dir_all(&wide).unwrap();
        subdirectories(&wide, "s", 500, 0);
        for i in 0..2000 {
            fs::write(wide.join(format!("f{i}")), b"").unwrap();
        }
        let mut walk = walk_of(dir.path());
        walk.stable = false;
        let mut buf = vec![MaybeUninit::<u8>::uninit(); DENTS_BUF];
        finish(&mut walk, &mut buf);
        let entries = 1 + MAX_OPEN_DIRS as u64 + 3 + 500 + 2000;
        assert_eq!(walk.done.inodes, entries);
        assert!(walk.done.read < 2 * entries, "{} entries read for {entries}", walk.done.read);
        assert!(!walk.done.incomplete);
    }

    /// An entry is known again by its inode and its name together: a filesystem may list one
    /// inode number for every entry (FUSE without inode numbers).
    #[test]
    fn the_entry_a_search_looks_for_is_known_by_inode_and_name() {
        let mut place = Place::Past(Mark::of(7, c"b"));
        assert!(!place.passes(Mark::of(7, c"a")) && place.searching(), "another name, the same inode");
        assert!(
            !place.passes(Mark::of(7, c"b")) && !place.searching(),
            "the entry itself: found, not counted"
        );
        assert!(place.passes(Mark::of(7, c"c")), "what follows it is counted");
    }

    /// A walk that reads far more entries than it counts (searches a tenant keeps sending
    /// back to the start) stops, incomplete.
    #[test]
    fn a_walk_past_its_read_budget_stops_incomplete() {
        let dir = tempfile::tempdir().unwrap();
        subdirectories(dir.path(), "s", 3, 3);
        let mut walk = walk_of(dir.path());
        let mut buf = vec![MaybeUninit::<u8>::uninit(); DENTS_BUF];
        assert!(walk.step(&mut buf));
        walk.done.read = READ_BUDGET.0 + READ_BUDGET.1 * walk.done.inodes + 1;
        assert!(!walk.step(&mut buf), "the walk goes on past its budget");
        assert!(walk.done.incomplete && walk.levels.is_empty());
    }

    /// A closed level is known again by its inode when it is opened through its child's `..`;
    /// one moved away meanwhile (`..` is now another directory) is given up, with the closed
    /// levels above it, and the walk goes on at the deepest open level, said incomplete.
    #[test]
    fn a_moved_directory_past_the_open_ones_is_given_up_not_mistaken() {
        let dir = tempfile::tempdir().unwrap();
        let child = dir.path().join("p/c");
        let elsewhere = dir.path().join("elsewhere");
        fs::create_dir_all(&child).unwrap();
        fs::create_dir(&elsewhere).unwrap();
        let level = |p: &Path, open: bool| {
            let mut l = Level::new(open_dir(CWD, p).unwrap(), fs::metadata(p).unwrap().ino());
            l.fd = l.fd.filter(|_| open);
            l
        };
        let mut walk = walk_of(dir.path());
        walk.levels.extend([level(&dir.path().join("p"), false), level(&child, true)]);
        walk.ascend();
        assert_eq!(walk.levels.len(), 2);
        assert!(
            walk.levels[1].fd.is_some() && !walk.done.incomplete,
            "its parent, opened again through `..`"
        );

        // The child's parent remembered as `elsewhere`: `p/c/..` is now another directory.
        let mut walk = walk_of(dir.path());
        walk.levels.extend([level(&elsewhere, false), level(&elsewhere, false), level(&child, true)]);
        walk.ascend();
        assert_eq!(walk.levels.len(), 1, "both closed levels given up, the walk at the top");
        assert!(walk.done.incomplete);
    }
}
