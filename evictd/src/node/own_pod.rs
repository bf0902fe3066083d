//! The daemon's own pod, which is never evicted, whatever the policy says.

/// evictd's own pod, never to be evicted: `POD_UID` from the downward API, or the pod
/// cgroup evictd runs in.
pub fn uid() -> Option<String> {
    if let Ok(uid) = std::env::var("POD_UID")
        && !uid.is_empty()
    {
        return Some(uid);
    }
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        l.split('/').find_map(|seg| {
            let seg = seg.trim_end_matches(".slice");
            let pod = seg.rsplit('-').next().unwrap_or(seg).strip_prefix("pod")?;
            // systemd slices spell the uid's dashes as underscores.
            (pod.len() >= 32).then(|| pod.replace('_', "-"))
        })
    })
}
