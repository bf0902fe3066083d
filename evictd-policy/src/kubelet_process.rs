//! `--kubelet-config auto`: the configuration of the kubelet running on this node, read as
//! it reads it — its command line's `--config`, `--config-dir` and eviction flags, and those
//! files through the kubelet's own root and working directory (`/proc/<pid>/root`,
//! `/proc/<pid>/cwd`), so that a kubelet in another mount namespace (evictd in a pod with
//! `hostPID`, a kind node) is read at its own paths. Where evictd may not look through
//! another process's root, the same absolute path in evictd's own view is read instead (a
//! read-only mount of the kubelet's configuration directory at the same path).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

/// Where the host's processes are: evictd runs with the host's PID namespace.
pub const PROC: &str = "/proc";

/// The kubelet's flags evictd reads, by kind: a map flag's occurrences add up (the first
/// clears what the file said), a list flag's append, a scalar's last wins.
const MAP_FLAGS: [&str; 4] =
    ["eviction-hard", "eviction-soft", "eviction-soft-grace-period", "eviction-minimum-reclaim"];
const LIST_FLAGS: [&str; 1] = ["enforce-node-allocatable"];
const SCALAR_FLAGS: [&str; 5] = [
    "config",
    "config-dir",
    "eviction-max-pod-grace-period",
    "eviction-pressure-transition-period",
    "image-minimum-gc-age",
];

#[derive(Debug, thiserror::Error)]
pub enum KubeletProcessError {
    #[error(
        "--kubelet-config auto: no kubelet process in {proc}{rejected} (evictd needs the host's PID \
         namespace, hostPID in a pod; k3s and MicroK8s run the kubelet inside another process: give \
         --config, --config-dir and the eviction flags instead)"
    )]
    NotFound { proc: String, rejected: String },
    #[error(
        "--kubelet-config auto: {count} kubelet processes in {proc} (PIDs {pids}): give --config and --config-dir instead"
    )]
    Several { proc: String, count: usize, pids: String },
    #[error("--kubelet-config auto: reading {proc}: {error}")]
    Proc { proc: String, error: String },
    #[error("--kubelet-config auto: the kubelet (PID {pid}) flag --{flag} has no value")]
    NoValue { pid: i32, flag: String },
    #[error("--kubelet-config auto: the kubelet (PID {pid}) flag --{flag}={value}: {reason}")]
    BadValue { pid: i32, flag: String, value: String, reason: String },
}

/// The running kubelet, and what its command line says about eviction.
#[derive(Debug, Clone, PartialEq)]
pub struct Kubelet {
    pub pid: i32,
    /// Flag name (with `-`, as the kubelet normalizes `_`) → the value in force, occurrences
    /// of a map or list flag joined by `,`.
    pub flags: BTreeMap<String, String>,
    /// Its `--config` and `--config-dir`, as evictd can open them.
    pub config: Option<PathBuf>,
    pub config_dir: Option<PathBuf>,
    /// What finding them is worth a warning for.
    pub notes: Vec<String>,
}

impl Kubelet {
    /// The kubelet among the processes under `proc`: the one process named `kubelet` that
    /// runs in the node's PID namespace (that of `proc`'s PID 1) and outside every pod's
    /// cgroup. A process in a pod cannot pose as the kubelet, even one with `hostPID` and
    /// the name `kubelet`: it would choose the node's policy, or keep evictd from starting.
    pub fn find(proc: &Path) -> Result<Kubelet, KubeletProcessError> {
        let proc_name = proc.display().to_string();
        let processes = procfs::process::all_processes_with_root(proc)
            .map_err(|e| KubeletProcessError::Proc { proc: proc_name.clone(), error: e.to_string() })?;
        let node_ns = NodeNamespaces::of(proc);
        let mut kubelets = Vec::new();
        let mut rejected = Vec::new();
        // `comm` first: reading it takes no lock of the process's memory, which a process
        // under memory pressure (or a tenant's on purpose) can hold for long. Processes that
        // end while listed are not the kubelet.
        for p in processes.filter_map(Result::ok) {
            if p.stat().is_ok_and(|s| s.comm == "kubelet") {
                match not_the_nodes(proc, p.pid(), &node_ns) {
                    Some(why) => rejected.push(format!("{} ({why})", p.pid())),
                    None => kubelets.push(p),
                }
            }
        }
        match kubelets.as_slice() {
            [] => Err(KubeletProcessError::NotFound { proc: proc_name, rejected: rejected_list(&rejected) }),
            [k] => {
                let argv = k.cmdline().map_err(|e| KubeletProcessError::Proc {
                    proc: format!("{proc_name}/{}/cmdline", k.pid()),
                    error: e.to_string(),
                })?;
                Self::from_command_line(proc, k.pid(), &argv)
            }
            several => Err(KubeletProcessError::Several {
                proc: proc_name,
                count: several.len(),
                pids: several.iter().map(|p| p.pid().to_string()).collect::<Vec<_>>().join(", "),
            }),
        }
    }

    fn from_command_line(proc: &Path, pid: i32, argv: &[String]) -> Result<Kubelet, KubeletProcessError> {
        let flags = kubelet_flags(pid, argv.get(1..).unwrap_or_default())?;
        // An empty `--config=` is no file, as the kubelet reads it.
        let mut notes = Vec::new();
        let mut file = |flag: &str| {
            let p = flags.get(flag).filter(|p| !p.is_empty())?;
            Some(as_the_kubelet_sees_it(proc, pid, Path::new(p), &mut notes))
        };
        let (config, config_dir) = (file("config"), file("config-dir"));
        Ok(Kubelet { pid, config, config_dir, flags, notes })
    }
}

/// The PID and cgroup namespaces of `proc`'s PID 1: the node's.
struct NodeNamespaces {
    pid: Option<PathBuf>,
    cgroup: Option<PathBuf>,
}

impl NodeNamespaces {
    fn of(proc: &Path) -> Self {
        let ns = |kind: &str| std::fs::read_link(proc.join("1/ns").join(kind)).ok();
        NodeNamespaces { pid: ns("pid"), cgroup: ns("cgroup") }
    }
}

/// Why a process named `kubelet` is not the node's: another PID or cgroup namespace than
/// the node's (a pod's container), or a pod's cgroup (`kubepods`, also with `hostPID`).
/// `None`: it is.
fn not_the_nodes(proc: &Path, pid: i32, node: &NodeNamespaces) -> Option<String> {
    let base = proc.join(pid.to_string());
    for (kind, theirs) in [("pid", &node.pid), ("cgroup", &node.cgroup)] {
        let Some(theirs) = theirs else { continue };
        match std::fs::read_link(base.join("ns").join(kind)) {
            Ok(ns) if ns == *theirs => {}
            Ok(_) => return Some(format!("in another {kind} namespace than PID 1's")),
            Err(e) => return Some(format!("its {kind} namespace cannot be read: {e}")),
        }
    }
    let cgroups = match std::fs::read_to_string(base.join("cgroup")) {
        Ok(c) => c,
        Err(e) => return Some(format!("its cgroups cannot be read: {e}")),
    };
    cgroups
        .lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .find(|path| path.contains("kubepods"))
        .map(|path| format!("in a pod's cgroup {path}"))
}

fn rejected_list(rejected: &[String]) -> String {
    if rejected.is_empty() {
        String::new()
    } else {
        format!("; not the node's kubelet: PID {}", rejected.join(", PID "))
    }
}

/// The flags of a kubelet command line that evictd reads, as pflag parses them: `--name=value`
/// or `--name value` (a running kubelet has no positional arguments, so a word after a flag
/// is its value), `_` in a name read as `-`.
fn kubelet_flags(pid: i32, args: &[String]) -> Result<BTreeMap<String, String>, KubeletProcessError> {
    let mut flags: BTreeMap<String, String> = BTreeMap::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else { continue };
        if flag.is_empty() {
            break; // `--`: the end of the flags.
        }
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n.replace('_', "-"), Some(v.to_owned())),
            None => (flag.replace('_', "-"), None),
        };
        let wanted = MAP_FLAGS.contains(&name.as_str())
            || LIST_FLAGS.contains(&name.as_str())
            || SCALAR_FLAGS.contains(&name.as_str());
        let value = match inline {
            Some(v) => v,
            // A flag evictd reads takes a value, dash or not (pflag takes the next word).
            None if wanted => {
                let v = args
                    .get(i)
                    .cloned()
                    .ok_or_else(|| KubeletProcessError::NoValue { pid, flag: name.clone() })?;
                i += 1;
                v
            }
            // Another flag's value, or a boolean flag's absence of one.
            None => {
                if args.get(i).is_some_and(|next| !next.starts_with('-')) {
                    i += 1;
                }
                continue;
            }
        };
        if !wanted {
            continue;
        }
        // pflag's map and list flags: the first occurrence replaces what the files said
        // (empty: nothing), each later one adds (empty: adds nothing).
        let accumulates = !SCALAR_FLAGS.contains(&name.as_str());
        match flags.get_mut(&name) {
            Some(v) if accumulates => {
                if !value.is_empty() {
                    v.push(',');
                    v.push_str(&value);
                }
            }
            _ => drop(flags.insert(name, value)),
        }
    }
    validate_numbers(pid, &flags)?;
    Ok(flags)
}

/// A kubelet that runs took its integer flags; one that does not parse means evictd read the
/// command line wrong, which must not become a policy.
fn validate_numbers(pid: i32, flags: &BTreeMap<String, String>) -> Result<(), KubeletProcessError> {
    if let Some(v) = flags.get("eviction-max-pod-grace-period") {
        v.parse::<i32>().map_err(|e| KubeletProcessError::BadValue {
            pid,
            flag: "eviction-max-pod-grace-period".into(),
            value: v.clone(),
            reason: e.to_string(),
        })?;
    }
    Ok(())
}

/// A path of the kubelet's command line as evictd can open it: through the kubelet's root
/// (absolute) or working directory (relative) in `proc`; where evictd may not look through
/// them, the absolute path in its own view.
fn as_the_kubelet_sees_it(proc: &Path, pid: i32, path: &Path, notes: &mut Vec<String>) -> PathBuf {
    let base = proc.join(pid.to_string());
    let through = match path.strip_prefix("/") {
        Ok(rel) => base.join("root").join(rel),
        Err(_) => base.join("cwd").join(path),
    };
    let denied = std::fs::metadata(&through).is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied);
    if denied && path.is_absolute() {
        notes.push(format!(
            "{} read in evictd's own view: it may not look through the kubelet's root ({}); \
             the file there must be the kubelet's (a read-only mount of the same host path)",
            path.display(),
            through.display()
        ));
        return path.to_owned();
    }
    through
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> BTreeMap<String, String> {
        kubelet_flags(1, &args.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    /// pflag's forms, the kubelet's normalization, accumulation of map and list flags, and
    /// flags evictd does not read skipped with their values.
    #[test]
    fn the_kubelets_command_line_is_read_as_pflag_reads_it() {
        let f = flags(&[
            "--config=/var/lib/kubelet/config.yaml",
            "--kubeconfig",
            "/etc/kubernetes/kubelet.conf",
            "--v=2",
            "-v",
            "4",
            "--eviction_hard",
            "memory.available<1Gi",
            "--fail-swap-on",
            "--eviction-hard=nodefs.available<5%",
            "--enforce-node-allocatable=pods",
            "--enforce-node-allocatable",
            "system-reserved",
            "--eviction-max-pod-grace-period",
            "-1",
            "--config-dir",
            "conf.d",
            "--eviction-pressure-transition-period=1m",
            "--eviction-pressure-transition-period=2m",
        ]);
        assert_eq!(f["config"], "/var/lib/kubelet/config.yaml");
        assert_eq!(f["config-dir"], "conf.d");
        assert_eq!(f["eviction-hard"], "memory.available<1Gi,nodefs.available<5%");
        assert_eq!(f["enforce-node-allocatable"], "pods,system-reserved");
        assert_eq!(f["eviction-max-pod-grace-period"], "-1");
        assert_eq!(f["eviction-pressure-transition-period"], "2m");
        assert!(!f.contains_key("kubeconfig") && !f.contains_key("v"));
        assert_eq!(f.len(), 6, "{f:?}");
    }

    /// pflag's `Set("")`: a map or list flag's first occurrence empties what the files said,
    /// a later empty one adds nothing; a scalar's last occurrence wins, empty or not.
    #[test]
    fn empty_and_repeated_flags_are_read_as_pflag_reads_them() {
        let f = flags(&[
            "--eviction-hard=memory.available<1Gi",
            "--eviction-hard=",
            "--config=/a",
            "--config=/b",
        ]);
        assert_eq!(f["eviction-hard"], "memory.available<1Gi");
        assert_eq!(f["config"], "/b");
        let f = flags(&["--eviction-hard=", "--enforce-node-allocatable=", "--config-dir="]);
        assert_eq!((f["eviction-hard"].as_str(), f["enforce-node-allocatable"].as_str()), ("", ""));
        let k =
            Kubelet::from_command_line(Path::new("/proc"), 1, &["kubelet".into(), "--config-dir=".into()])
                .unwrap();
        assert_eq!(k.config_dir, None, "an empty --config-dir is none, as the kubelet reads it");
    }

    #[test]
    fn a_flag_without_its_value_or_a_bad_number_is_an_error() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let e = kubelet_flags(7, &args(&["--config"])).unwrap_err().to_string();
        assert!(e.contains("PID 7") && e.contains("--config has no value"), "{e}");
        let e = kubelet_flags(7, &args(&["--eviction-max-pod-grace-period=soon"])).unwrap_err().to_string();
        assert!(e.contains("--eviction-max-pod-grace-period=soon"), "{e}");
    }

    /// Paths are opened through the kubelet's root and working directory.
    #[test]
    fn paths_are_the_kubelets() {
        let proc = Path::new("/proc");
        let me = std::process::id() as i32;
        assert_eq!(
            as_the_kubelet_sees_it(proc, me, Path::new("/etc/k.yaml"), &mut Vec::new()),
            PathBuf::from(format!("/proc/{me}/root/etc/k.yaml"))
        );
        assert_eq!(
            as_the_kubelet_sees_it(proc, me, Path::new("conf.d"), &mut Vec::new()),
            PathBuf::from(format!("/proc/{me}/cwd/conf.d"))
        );
    }
}
