//! Node-level reclaim before evicting for disk pressure, as the kubelet does: remove dead
//! containers, then images no container or sandbox uses. Errors are logged and the rest goes
//! on; afterwards the caller re-observes and evicts only if a threshold is still met.

use std::collections::BTreeSet;

use evictd_policy::rank::NodeReclaim;

use crate::runtime::cri::{CriClient, CriError, api as cri};

#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReclaimReport {
    pub containers_removed: usize,
    pub images_removed: usize,
    pub errors: Vec<String>,
}

/// Runs `what`. `sandbox_images` are the images running sandboxes use (the CRI does not list
/// sandboxes as containers), which must survive image removal.
pub async fn reclaim(
    client: &CriClient,
    what: &[NodeReclaim],
    sandbox_images: &BTreeSet<String>,
) -> ReclaimReport {
    let mut report = ReclaimReport::default();
    let containers = match client.list_containers().await {
        Ok(c) => c,
        Err(e) => {
            report.errors.push(e.to_string());
            return report;
        }
    };
    if what.contains(&NodeReclaim::UnusedContainers) {
        for c in containers.iter().filter(|c| c.state == cri::ContainerState::ContainerExited as i32) {
            match client.remove_container(&c.id).await {
                Ok(()) => report.containers_removed += 1,
                Err(e) => report.errors.push(e.to_string()),
            }
        }
    }
    if what.contains(&NodeReclaim::UnusedImages)
        && let Err(e) = remove_unused_images(client, &containers, sandbox_images, &mut report).await
    {
        report.errors.push(e.to_string());
    }
    report
}

async fn remove_unused_images(
    client: &CriClient,
    containers: &[cri::Container],
    sandbox_images: &BTreeSet<String>,
    report: &mut ReclaimReport,
) -> Result<(), CriError> {
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
    for img in client.list_images().await? {
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
