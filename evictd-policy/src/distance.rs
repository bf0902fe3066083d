//! How far the node is from its memory thresholds. Not a step of the kubelet's loop: the
//! wake sources re-arm on it (the eBPF watermark, the eventfd notifier's level) and
//! `--trace` shows it.

use crate::{
    observations::Observations,
    policy::{Signal, Threshold},
};

/// available − threshold quantity for each threshold on `signal`, when `signal` is observed.
pub fn distances<'a>(
    thresholds: &'a [Threshold],
    obs: &'a Observations,
    signal: Signal,
) -> impl Iterator<Item = (&'a Threshold, i64)> + 'a {
    let o = obs.get(&signal);
    thresholds
        .iter()
        .filter(move |t| t.signal == signal)
        .filter_map(move |t| o.map(|o| (t, o.available - t.value.resolve(o.capacity))))
}

/// The memory threshold closest to being crossed, and available − its quantity.
/// Thresholds whose signal has no observation are not "near".
pub fn nearest_memory_threshold(thresholds: &[Threshold], obs: &Observations) -> Option<(Threshold, i64)> {
    [Signal::MemoryAvailable, Signal::AllocatableMemoryAvailable]
        .into_iter()
        .flat_map(|s| distances(thresholds, obs, s))
        .map(|(t, d)| (*t, d))
        .min_by_key(|(_, d)| *d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        observations::Observation,
        policy::{MapSetting, PolicyInput, build},
    };

    #[test]
    fn nearest_threshold_picks_the_smallest_distance() {
        let input = PolicyInput {
            hard: Some(
                MapSetting::from_flag("h", "memory.available<100Mi,nodefs.available<10%", '<').unwrap(),
            ),
            soft: MapSetting::from_flag("s", "memory.available<50%", '<').unwrap(),
            soft_grace: MapSetting::from_flag("g", "memory.available=1m", '=').unwrap(),
            ..Default::default()
        };
        let all = build(&input, &mut Vec::new()).unwrap().thresholds;
        let mut obs = Observations::new();
        obs.insert(
            Signal::MemoryAvailable,
            Observation { available: 824 << 20, capacity: 1 << 30, time_ns: None },
        );
        let (nearest, d) = nearest_memory_threshold(&all, &obs).unwrap();
        assert_eq!(nearest.to_string(), "memory.available<50%");
        assert_eq!(d, (824 << 20) - (512 << 20));
        // Thresholds without an observation (allocatable here) are not "near".
        assert!(all.iter().any(|t| t.signal == Signal::AllocatableMemoryAvailable));
        assert_eq!(distances(&all, &obs, Signal::AllocatableMemoryAvailable).count(), 0);
    }
}
