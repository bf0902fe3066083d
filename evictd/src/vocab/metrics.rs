//! What every component's metric families share, so that their histograms line up on one
//! dashboard: the latency buckets.

/// 10 µs .. ~80 s, doubling: wide enough for eBPF wakes and 10 s polling alike.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(1e-5, 2.0, 24)
}
