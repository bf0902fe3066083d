//! The daemon's own pod, which is never evicted, whatever the policy says. Its UID comes from
//! `POD_UID` (the DaemonSet sets it through the downward API), else from the pod cgroup
//! evictd runs in, in either cgroup driver's spelling:
//!
//! - cgroupfs: `/kubepods/burstable/pod6f1d7c1e-8c2b-4e0a-9d3e-0123456789ab/<container>`
//! - systemd: `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6f1d7c1e_8c2b_4e0a_9d3e_0123456789ab.slice/cri-containerd-<id>.scope`
//!
//! A static pod's UID is the kubelet's hash of its manifest, 32 hex digits without dashes.
//! Inside a private cgroup namespace `/proc/self/cgroup` is only `0::/`: then `POD_UID` is
//! the only way, and evictd refuses to start in a pod whose UID it cannot establish.

/// evictd runs in a pod but cannot tell which.
#[derive(Debug, thiserror::Error)]
#[error(
    "evictd runs in a pod ({evidence}) but cannot establish its UID, so it could evict itself: \
     set POD_UID from the downward API (fieldRef metadata.uid; deploy/daemonset.yaml does)"
)]
pub struct UnknownOwnPod {
    evidence: String,
}

/// The UID of the pod evictd runs in; `None` outside any pod.
pub fn identify() -> Result<Option<String>, UnknownOwnPod> {
    let env = std::env::var("POD_UID").ok();
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let service_host = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    resolve(env.as_deref(), &cgroup, service_host)
}

fn resolve(env: Option<&str>, cgroup: &str, service_host: bool) -> Result<Option<String>, UnknownOwnPod> {
    if let Some(uid) = env.map(str::trim).filter(|u| !u.is_empty()) {
        return Ok(Some(uid.to_owned()));
    }
    if let Some(uid) = uid_in_cgroup(cgroup) {
        return Ok(Some(uid));
    }
    let evidence = if cgroup.contains("kubepods") {
        Some("its cgroup is under kubepods")
    } else if service_host {
        Some("KUBERNETES_SERVICE_HOST is set")
    } else {
        None
    };
    match evidence {
        Some(e) => Err(UnknownOwnPod { evidence: e.into() }),
        None => Ok(None),
    }
}

/// The pod UID in the lines of `/proc/<pid>/cgroup`, in either driver's spelling.
pub fn uid_in_cgroup(text: &str) -> Option<String> {
    text.lines().find_map(|line| line.rsplit(':').next()?.split('/').find_map(pod_segment_uid))
}

/// `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid with _>.slice` (systemd).
fn pod_segment_uid(seg: &str) -> Option<String> {
    let seg = seg.strip_suffix(".slice").unwrap_or(seg);
    let raw = match seg.strip_prefix("pod") {
        Some(rest) => rest,
        None => seg.rsplit_once("-pod")?.1,
    };
    let uid = raw.replace('_', "-");
    is_pod_uid(&uid).then_some(uid)
}

/// A UUID (8-4-4-4-12 hex digits), or a static pod's 32 hex digits.
fn is_pod_uid(s: &str) -> bool {
    let hex = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_hexdigit());
    let groups: Vec<&str> = s.split('-').collect();
    match groups.as_slice() {
        [one] => one.len() == 32 && hex(one),
        [a, b, c, d, e] => {
            [a.len(), b.len(), c.len(), d.len(), e.len()] == [8, 4, 4, 4, 12] && groups.iter().all(|g| hex(g))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "6f1d7c1e-8c2b-4e0a-9d3e-0123456789ab";

    #[test]
    fn the_whole_uid_from_either_drivers_cgroup_path() {
        let cgroupfs = format!("0::/kubepods/burstable/pod{UID}/0123abcd\n");
        assert_eq!(uid_in_cgroup(&cgroupfs).as_deref(), Some(UID));
        let v1 = format!(
            "12:memory:/kubepods/besteffort/pod{UID}/0123abcd\n11:pids:/kubepods/besteffort/pod{UID}/x\n"
        );
        assert_eq!(uid_in_cgroup(&v1).as_deref(), Some(UID));
        let systemd = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-0123.scope\n",
            UID.replace('-', "_")
        );
        assert_eq!(uid_in_cgroup(&systemd).as_deref(), Some(UID));
        let guaranteed = format!("0::/kubepods.slice/kubepods-pod{}.slice/x.scope\n", UID.replace('-', "_"));
        assert_eq!(uid_in_cgroup(&guaranteed).as_deref(), Some(UID));
        let static_pod = "0::/kubepods/burstable/pod0123456789abcdef0123456789abcdef/c\n";
        assert_eq!(uid_in_cgroup(static_pod).as_deref(), Some("0123456789abcdef0123456789abcdef"));
    }

    #[test]
    fn segments_that_only_look_like_pods_are_not_uids() {
        for text in
            ["0::/podman/abc\n", "0::/system.slice/podcast.service\n", "0::/kubepods/pod123\n", "0::/\n"]
        {
            assert_eq!(uid_in_cgroup(text), None, "{text}");
        }
    }

    #[test]
    fn pod_uid_from_the_environment_comes_first() {
        let cgroupfs = format!("0::/kubepods/burstable/pod{UID}/c\n");
        assert_eq!(resolve(Some("env-uid"), &cgroupfs, true).unwrap().as_deref(), Some("env-uid"));
        assert_eq!(resolve(Some(" "), &cgroupfs, true).unwrap().as_deref(), Some(UID));
    }

    #[test]
    fn a_pod_whose_uid_cannot_be_established_is_refused() {
        // A private cgroup namespace: only `0::/`, but the service account's env is there.
        let err = resolve(None, "0::/\n", true).unwrap_err();
        assert!(err.to_string().contains("POD_UID"), "{err}");
        assert!(resolve(None, "0::/kubepods/burstable/podnot-a-uid/c\n", false).is_err());
        // Not in a pod at all: nothing to protect.
        assert_eq!(resolve(None, "0::/user.slice/user-0.slice/session-1.scope\n", false).unwrap(), None);
    }
}
