//! The wake sources' flags: which sources run, the eBPF source's (tier, watermark, ring
//! buffer, charge items) and the polls' fill rates, each checked and named when wrong.

use anyhow::{Context as _, bail};
use evictd_policy::{
    policy::{Policy, Resource, Threshold},
    quantity::Quantity,
};

use super::RunArgs;
use crate::{
    kernel::{btf::KernelBtf, ebpf::LoadOptions, stat_items},
    vocab::ChargeTier,
    wake::{SourceKind, WakeOptions, Watermark, disk::FillRates},
};

impl RunArgs {
    /// `--wake-sources`, the eBPF source's flags and the polls' fill rates.
    pub(super) fn wake_options(&self) -> anyhow::Result<WakeOptions> {
        let sources = self.wake_sources()?;
        let load = self.load_options(&sources)?;
        let watermark = match self.bpf_watermark.as_str() {
            "auto" => Watermark::Auto,
            q => Watermark::Fixed(bytes_flag("--bpf-watermark", q)?),
        };
        let fill = bytes_flag("--poll-fill-rate", &self.poll_fill_rate)?;
        if fill < 1 << 20 {
            bail!("--poll-fill-rate: {} is below 1Mi per second", self.poll_fill_rate);
        }
        Ok(WakeOptions {
            sources,
            housekeeping: self.housekeeping_interval,
            poll_fill_rate: fill,
            disk_fill_rates: self.disk_fill_rates()?,
            charge_probes_near: self.charge_probes == "near",
            load,
            watermark,
        })
    }

    /// `--wake-sources`: known names, each once, at least one.
    fn wake_sources(&self) -> anyhow::Result<Vec<SourceKind>> {
        let mut sources = Vec::new();
        for s in self.wake_sources.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let Some(kind) = SourceKind::parse(s) else {
                bail!(
                    "--wake-sources: unknown wake source {s:?} (known: ebpf, eventfd, psi, poll, disk, timer)"
                )
            };
            if !sources.contains(&kind) {
                sources.push(kind);
            }
        }
        if sources.is_empty() {
            bail!("--wake-sources: at least one wake source is needed");
        }
        Ok(sources)
    }

    /// How the eBPF programs are loaded: the tier insisted on, the ring buffer, the charge
    /// items (checked against this kernel's BTF).
    fn load_options(&self, sources: &[SourceKind]) -> anyhow::Result<LoadOptions> {
        // clap has checked the name: anything but `auto` is one of the eBPF tiers.
        let charge_tier = ChargeTier::parse(&self.charge_tier);
        if charge_tier.is_some() && !sources.contains(&SourceKind::Ebpf) {
            bail!("--charge-tier {}: an eBPF tier, but --wake-sources has no ebpf", self.charge_tier);
        }
        let ring = Quantity::parse(&self.ring_buffer_size)
            .with_context(|| format!("--ring-buffer-size: {:?}", self.ring_buffer_size))?
            .value();
        if !(4096..=1 << 30).contains(&ring) || (ring as u64).count_ones() != 1 {
            bail!("--ring-buffer-size: {} is not a power of two between 4Ki and 1Gi", self.ring_buffer_size);
        }
        let defaults = LoadOptions::default();
        let charge_items = match &self.charge_items {
            Some(list) => {
                let items: Vec<String> =
                    list.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect();
                check_charge_items(&items, &defaults.btf_path)?;
                items
            }
            None => defaults.charge_items.clone(),
        };
        Ok(LoadOptions {
            charge_items,
            ring_buffer_bytes: ring as u32,
            min_interval: self.reclaim_min_interval,
            charge_tier,
            ..defaults
        })
    }

    /// The fastest fills the disk poll must see in time.
    fn disk_fill_rates(&self) -> anyhow::Result<FillRates> {
        let rates = FillRates {
            bytes: bytes_flag("--disk-fill-rate", &self.disk_fill_rate)?,
            inodes: bytes_flag("--inodes-fill-rate", &self.inodes_fill_rate)?,
        };
        if rates.bytes < 1 << 20 {
            bail!("--disk-fill-rate: {} is below 1Mi per second", self.disk_fill_rate);
        }
        if rates.inodes < 100 {
            bail!("--inodes-fill-rate: {} is below 100 per second", self.inodes_fill_rate);
        }
        Ok(rates)
    }
}

/// `--charge-tier`'s values: `auto`, then the eBPF tiers as `evictd probe` names them.
pub(super) fn charge_tier_flag_values() -> clap::builder::PossibleValuesParser {
    let tiers = ChargeTier::EBPF.map(|t| clap::builder::PossibleValue::new(t.as_str()));
    clap::builder::PossibleValuesParser::new(
        std::iter::once(clap::builder::PossibleValue::new("auto")).chain(tiers),
    )
}

/// A quantity flag in bytes (`64Mi`, `1G`), which must not be negative.
pub(super) fn bytes_flag(flag: &str, text: &str) -> anyhow::Result<u64> {
    let q = Quantity::parse(text).with_context(|| format!("{flag}: {text:?}"))?;
    if q.is_negative() {
        bail!("{flag}: must not be negative");
    }
    Ok(q.value() as u64)
}

/// Names in `--charge-items` that this kernel does not have are an error at start-up, not a
/// warning and a silent fall back to the timer. Without BTF there is nothing to check them
/// against; the eBPF source then reports that itself.
fn check_charge_items(items: &[String], btf: &std::path::Path) -> anyhow::Result<()> {
    let Ok(btf) = KernelBtf::open(btf) else { return Ok(()) };
    let known = stat_items::kernel_items(&btf).context("--charge-items")?;
    stat_items::select(&known, items).context("--charge-items")?;
    Ok(())
}

/// Only the timer (and a wake that happens to come) looks at PID signals, at disk signals
/// without the disk poll, and at soft memory thresholds whose grace period runs out while
/// memory stays put: without it they may never be evaluated.
pub(super) fn unwoken_thresholds(policy: &Policy, sources: &[SourceKind]) -> Option<String> {
    if sources.contains(&SourceKind::Timer) {
        return None;
    }
    let disk_woken = sources.contains(&SourceKind::Disk);
    let woken = |t: &Threshold| match t.signal.resource() {
        Resource::Memory => t.is_hard(),
        Resource::EphemeralStorage | Resource::Inodes => disk_woken,
        Resource::Pids => false,
    };
    let unwoken: Vec<String> =
        policy.thresholds.iter().filter(|t| !woken(t)).map(|t| t.to_string()).collect();
    (!unwoken.is_empty()).then(|| {
        format!(
            "--wake-sources has no timer: {} are evaluated only when another source happens to wake evictd",
            unwoken.join(", ")
        )
    })
}
