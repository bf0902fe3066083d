//! Node-level reclaim before evicting for disk pressure, as the kubelet does: remove dead
//! containers (its container GC), then images no container or sandbox uses. Errors are
//! logged and the rest goes on; afterwards the caller re-observes and evicts only if a
//! threshold is still met.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::{Duration, Instant},
};

use evictd_policy::rank::NodeReclaim;

use crate::runtime::cri::{CriClient, CriError, api as cri};

#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReclaimReport {
    pub containers_removed: usize,
    pub images_removed: usize,
    /// Unused images kept: younger than `imageMinimumGCAge`.
    pub images_too_young: usize,
    pub errors: Vec<String>,
}

/// When each image was first seen on the node, as the kubelet's image manager keeps it
/// (`firstDetected`): no image is removed before it is `imageMinimumGCAge` old, since one
/// just pulled is about to be used by a pod starting. The runtime gives no pull time, so the
/// age counts from evictd's first listing; images already there at evictd's start count as
/// old (`present_at_start`). Images the runtime no longer lists are forgotten.
#[derive(Debug, Default)]
pub struct ImageAges {
    first_detected: HashMap<String, Instant>,
}

impl ImageAges {
    /// The images on the node when evictd started: old enough whatever the minimum age.
    pub fn present_at_start<'a>(&mut self, ids: impl IntoIterator<Item = &'a str>, min_age: Duration) {
        let now = Instant::now();
        let old = now.checked_sub(min_age).unwrap_or(now);
        self.first_detected.extend(ids.into_iter().map(|id| (id.to_owned(), old)));
    }

    /// The images listed now: new ones are first detected now, gone ones forgotten.
    fn detect<'a>(&mut self, ids: impl IntoIterator<Item = &'a str>, now: Instant) {
        let listed: BTreeSet<&str> = ids.into_iter().collect();
        self.first_detected.retain(|id, _| listed.contains(id.as_str()));
        for id in listed {
            self.first_detected.entry(id.to_owned()).or_insert(now);
        }
    }

    fn old_enough(&self, id: &str, min_age: Duration, now: Instant) -> bool {
        self.first_detected.get(id).is_some_and(|t| now.duration_since(*t) >= min_age)
    }
}

/// What image removal keeps besides images in use.
pub struct ImagePolicy<'a> {
    /// The images running sandboxes use (the CRI does not list sandboxes as containers).
    pub sandbox_images: &'a BTreeSet<String>,
    pub ages: &'a mut ImageAges,
    /// `imageMinimumGCAge`.
    pub min_age: Duration,
}

/// Runs `what`: dead containers first, then unused images old enough to go.
pub async fn reclaim(client: &CriClient, what: &[NodeReclaim], images: ImagePolicy<'_>) -> ReclaimReport {
    let mut report = ReclaimReport::default();
    let listed = tokio::try_join!(client.list_containers(), client.list_pod_sandboxes());
    let (containers, sandboxes) = match listed {
        Ok(c) => c,
        Err(e) => {
            report.errors.push(e.to_string());
            return report;
        }
    };
    if what.contains(&NodeReclaim::UnusedContainers) {
        let ready: BTreeSet<&str> = sandboxes
            .iter()
            .filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
            .map(|s| s.id.as_str())
            .collect();
        for c in dead_containers_to_remove(&containers, &ready) {
            match client.remove_container(&c.id).await {
                Ok(()) => report.containers_removed += 1,
                Err(e) => report.errors.push(e.to_string()),
            }
        }
    }
    if what.contains(&NodeReclaim::UnusedImages)
        && let Err(e) = remove_unused_images(client, &containers, images, &mut report).await
    {
        report.errors.push(e.to_string());
    }
    report
}

/// The kubelet's container GC as eviction runs it (`DeleteAllUnusedContainers`, with the
/// default `--maximum-dead-containers-per-container=1` and no minimum age): in a pod whose
/// sandbox is ready, the newest exited instance of each container stays (it carries the
/// restart count and `kubectl logs --previous`) and older ones go; a pod whose sandbox is
/// not ready (terminated, or gone) loses every exited container.
pub fn dead_containers_to_remove<'a>(
    containers: &'a [cri::Container],
    ready_sandboxes: &BTreeSet<&str>,
) -> Vec<&'a cri::Container> {
    let mut units: BTreeMap<(&str, &str), Vec<&cri::Container>> = BTreeMap::new();
    for c in containers.iter().filter(|c| c.state == cri::ContainerState::ContainerExited as i32) {
        let name = c.metadata.as_ref().map_or("", |m| m.name.as_str());
        units.entry((c.pod_sandbox_id.as_str(), name)).or_default().push(c);
    }
    let mut remove = Vec::new();
    for ((sandbox, _), mut unit) in units {
        let keep = usize::from(ready_sandboxes.contains(sandbox));
        // Newest first, by creation time; the attempt breaks ties of the clock.
        unit.sort_by_key(|c| std::cmp::Reverse((c.created_at, c.metadata.as_ref().map_or(0, |m| m.attempt))));
        remove.extend(unit.into_iter().skip(keep));
    }
    remove
}

async fn remove_unused_images(
    client: &CriClient,
    containers: &[cri::Container],
    images: ImagePolicy<'_>,
    report: &mut ReclaimReport,
) -> Result<(), CriError> {
    let ImagePolicy { sandbox_images, ages, min_age } = images;
    // Containers that remain (running, or exited and kept) pin their images.
    let remaining: Vec<cri::Container> = client.list_containers().await?;
    let mut used: BTreeSet<&str> = BTreeSet::new();
    for c in remaining
        .iter()
        .chain(containers.iter().filter(|c| c.state != cri::ContainerState::ContainerExited as i32))
    {
        used.insert(c.image_ref.as_str());
        if let Some(i) = &c.image {
            used.insert(i.image.as_str());
        }
    }
    let listed = client.list_images().await?;
    let now = Instant::now();
    ages.detect(listed.iter().map(|i| i.id.as_str()), now);
    for img in listed {
        if !ages.old_enough(&img.id, min_age, now) {
            report.images_too_young += 1;
            continue;
        }
        let in_use = used.contains(img.id.as_str())
            || img
                .repo_tags
                .iter()
                .chain(&img.repo_digests)
                .any(|t| used.contains(t.as_str()) || sandbox_images.contains(t))
            || sandbox_images.contains(&img.id);
        if in_use || img.pinned {
            continue;
        }
        match client.remove_image(&img.id).await {
            Ok(()) => report.images_removed += 1,
            Err(e) => report.errors.push(e.to_string()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exited(id: &str, sandbox: &str, name: &str, attempt: u32, created_at: i64) -> cri::Container {
        cri::Container {
            id: id.into(),
            pod_sandbox_id: sandbox.into(),
            metadata: Some(cri::ContainerMetadata { name: name.into(), attempt }),
            created_at,
            state: cri::ContainerState::ContainerExited as i32,
            ..Default::default()
        }
    }

    /// The newest exited instance of each container of a running pod
    /// stays; older instances, and every dead container of a pod that is gone, are removed;
    /// running containers are never touched.
    #[test]
    fn container_gc_keeps_the_newest_dead_instance_of_running_pods() {
        let running = cri::Container {
            state: cri::ContainerState::ContainerRunning as i32,
            ..exited("app-3", "a", "app", 3, 40)
        };
        let containers = vec![
            exited("app-0", "a", "app", 0, 10),
            exited("app-2", "a", "app", 2, 30),
            exited("app-1", "a", "app", 1, 20),
            running,
            exited("init-0", "a", "init", 0, 5),
            exited("web-0", "gone", "web", 0, 10),
            exited("web-1", "gone", "web", 1, 20),
        ];
        let ready = BTreeSet::from(["a"]);
        let mut removed: Vec<&str> =
            dead_containers_to_remove(&containers, &ready).iter().map(|c| c.id.as_str()).collect();
        removed.sort();
        assert_eq!(removed, ["app-0", "app-1", "web-0", "web-1"]);
    }
}
