//! Node-level reclaim before evicting for disk pressure, as the kubelet does: remove dead
//! containers (its container GC), then images no container or sandbox uses. Errors are
//! logged and the rest goes on; afterwards the caller re-observes and evicts only if a
//! threshold is still met.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex},
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
/// just pulled is about to be used by a pod starting. The runtime gives no pull time, so
/// images are listed every `IMAGE_DETECTION` (`detect_images`), and, as for the kubelet,
/// those of the first listing that works count as old; later ones from when a listing first
/// showed them. Images the runtime no longer lists are forgotten.
#[derive(Debug, Default)]
pub struct ImageAges {
    /// `None`: there at the first listing, old whatever the minimum age.
    first_detected: HashMap<String, Option<Instant>>,
    listed_once: bool,
}

/// Shared between the detection task and the pressure pass.
pub type SharedImageAges = Arc<Mutex<ImageAges>>;

/// How often the node's images are listed: the kubelet's image GC period.
pub const IMAGE_DETECTION: Duration = Duration::from_secs(5 * 60);

impl ImageAges {
    /// The images listed now: new ones are first detected now (at the first listing: old),
    /// gone ones forgotten.
    pub fn detect<'a>(&mut self, ids: impl IntoIterator<Item = &'a str>, now: Instant) {
        let listed: BTreeSet<&str> = ids.into_iter().collect();
        self.first_detected.retain(|id, _| listed.contains(id.as_str()));
        let first = if self.listed_once { Some(now) } else { None };
        for id in listed {
            self.first_detected.entry(id.to_owned()).or_insert(first);
        }
        self.listed_once = true;
    }

    fn old_enough(&self, id: &str, min_age: Duration, now: Instant) -> bool {
        match self.first_detected.get(id) {
            Some(None) => true,
            Some(Some(t)) => now.duration_since(*t) >= min_age,
            None => false,
        }
    }
}

/// Lists the node's images now and every `IMAGE_DETECTION`, off the pressure path. A
/// listing that fails changes nothing; the next one tries again.
pub fn detect_images(client: CriClient, ages: SharedImageAges) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            match client.list_images().await {
                Ok(images) => ages
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .detect(images.iter().map(|i| i.id.as_str()), Instant::now()),
                Err(e) => tracing::debug!("listing the node's images for their ages: {e}"),
            }
            tokio::time::sleep(IMAGE_DETECTION).await;
        }
    })
}

/// What image removal keeps besides images in use.
pub struct ImagePolicy<'a> {
    /// The images running sandboxes use (the CRI does not list sandboxes as containers).
    pub sandbox_images: &'a BTreeSet<String>,
    pub ages: &'a SharedImageAges,
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
    // An image the detection has not seen yet is first detected now. The ages stay whole
    // whatever a panic elsewhere did: a poisoned lock is used as it is.
    let old: Vec<bool> = {
        let mut ages = ages.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        ages.detect(listed.iter().map(|i| i.id.as_str()), now);
        listed.iter().map(|i| ages.old_enough(&i.id, min_age, now)).collect()
    };
    for (img, old_enough) in listed.into_iter().zip(old) {
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
        if !old_enough {
            report.images_too_young += 1;
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

    /// The first listing's images are old whatever the minimum age (as the kubelet's first
    /// detection); an image first seen later is young until the minimum age has passed;
    /// one the runtime stopped listing is forgotten, and young again if it comes back.
    #[test]
    fn images_age_from_the_listing_that_first_showed_them() {
        let t0 = Instant::now();
        let min = Duration::from_secs(120);
        let mut ages = ImageAges::default();
        assert!(!ages.old_enough("a", min, t0), "never listed: not old");
        ages.detect(["a"], t0);
        assert!(ages.old_enough("a", min, t0), "there at the first listing");
        assert!(ages.old_enough("a", Duration::from_secs(86_400), t0), "whatever the minimum age");
        ages.detect(["a", "b"], t0);
        assert!(!ages.old_enough("b", min, t0 + Duration::from_secs(60)));
        assert!(ages.old_enough("b", min, t0 + Duration::from_secs(120)));
        ages.detect(["b"], t0);
        ages.detect(["a", "b"], t0 + Duration::from_secs(300));
        assert!(!ages.old_enough("a", min, t0 + Duration::from_secs(301)), "gone and back: young");
    }
}
