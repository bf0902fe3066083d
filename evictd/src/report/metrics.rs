//! Prometheus metrics: wakes by source, evictions by signal (the kubelet's
//! `kubelet_evictions`), and latency histograms for every decision (wake → decision by wake
//! source, kernel → userspace delivery, and each eviction phase). Served as text on
//! `--metrics-addr` at /metrics.

use std::{net::SocketAddr, sync::Arc};

use http_body_util::Full;
use hyper::{Request, Response, body::Bytes, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

use crate::{report::record::EvictionRecord, wake::Wake};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabel {
    cause: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SignalLabel {
    eviction_signal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    phase: String,
}

/// 10 µs .. ~80 s, doubling: wide enough for eBPF wakes and 10 s polling alike.
fn latency_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(1e-5, 2.0, 24)
}

pub struct Metrics {
    registry: Registry,
    wakes: Family<CauseLabel, Counter>,
    evictions: Family<SignalLabel, Counter>,
    failed_evictions: Counter,
    detection: Family<CauseLabel, Histogram>,
    delivery: Histogram,
    phases: Family<PhaseLabel, Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("evictd");
        let wakes = Family::<CauseLabel, Counter>::default();
        registry.register("wakes", "Wake events, by source", wakes.clone());
        let evictions = Family::<SignalLabel, Counter>::default();
        registry.register("evictions", "Pods evicted, by the signal that drove it", evictions.clone());
        let failed_evictions = Counter::default();
        registry.register("failed_evictions", "Evictions whose stop failed", failed_evictions.clone());
        let detection =
            Family::<CauseLabel, Histogram>::new_with_constructor(|| Histogram::new(latency_buckets()));
        registry.register(
            "detection_seconds",
            "From the wake's origin (kernel event time, or receipt) to the eviction decision, by wake source",
            detection.clone(),
        );
        let delivery = Histogram::new(latency_buckets());
        registry.register(
            "wake_delivery_seconds",
            "From a kernel event to its receipt by evictd",
            delivery.clone(),
        );
        let phases =
            Family::<PhaseLabel, Histogram>::new_with_constructor(|| Histogram::new(latency_buckets()));
        registry.register(
            "eviction_phase_seconds",
            "Time spent in each phase of an eviction",
            phases.clone(),
        );
        Metrics { registry, wakes, evictions, failed_evictions, detection, delivery, phases }
    }
}

impl Metrics {
    pub fn wake(&self, w: &Wake) {
        self.wakes.get_or_create(&CauseLabel { cause: w.cause.as_str().into() }).inc();
        if let Some(ns) = w.delivery_ns() {
            self.delivery.observe(ns as f64 / 1e9);
        }
    }

    pub fn eviction(&self, e: &EvictionRecord) {
        if e.error.is_some() {
            self.failed_evictions.inc();
        } else if !e.dry_run {
            self.evictions.get_or_create(&SignalLabel { eviction_signal: e.signal.as_str().into() }).inc();
        }
        if let (Some(cause), Some(received)) = (e.wake_cause, e.wake_received_ns) {
            let origin = e.wake_kernel_ts_ns.unwrap_or(received);
            self.detection
                .get_or_create(&CauseLabel { cause: cause.as_str().into() })
                .observe(e.decided_ns.saturating_sub(origin) as f64 / 1e9);
        }
        let phase = |name: &str, ms: f64| {
            self.phases.get_or_create(&PhaseLabel { phase: name.into() }).observe(ms / 1e3);
        };
        phase("decide", e.decide_us as f64 / 1e3);
        if let Some(p) = &e.phases {
            phase("stop_containers", p.stop_containers_ms);
            phase("stop_sandbox", p.stop_sandbox_ms);
            if let Some(ms) = p.memory_released_ms {
                phase("memory_released", ms);
            }
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Serves /metrics on `addr` until the process ends. Binding errors are returned; errors
/// on one connection are logged and do not stop the server.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let metrics = metrics.clone();
                    async move {
                        if req.uri().path() == "/metrics" {
                            Response::builder()
                                .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
                                .body(Full::new(Bytes::from(metrics.encode())))
                        } else {
                            Response::builder()
                                .status(404)
                                .body(Full::new(Bytes::from_static(b"not found\n")))
                        }
                    }
                });
                if let Err(e) = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await {
                    tracing::debug!("metrics connection: {e}");
                }
            });
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wake::WakeCause;

    #[test]
    fn wakes_and_evictions_are_counted_and_timed() {
        let m = Metrics::default();
        m.wake(&Wake::now(WakeCause::Timer));
        let rec = EvictionRecord {
            namespace: "ns".into(),
            name: "p".into(),
            uid: "u".into(),
            signal: evictd_policy::policy::Signal::MemoryAvailable,
            available: 1,
            threshold: 2,
            grace_period_seconds: 1,
            message: String::new(),
            dry_run: false,
            error: None,
            decide_us: 500,
            phases: Some(crate::runtime::evict::Phases {
                stop_containers_ms: 120.0,
                stop_sandbox_ms: 30.0,
                memory_released_ms: Some(0.1),
            }),
            wake_cause: Some(WakeCause::Charge),
            wake_kernel_ts_ns: Some(1_000_000),
            wake_received_ns: Some(1_100_000),
            observed_ns: 1_200_000,
            decided_ns: 1_700_000,
            released_ns: Some(200_000_000),
        };
        m.eviction(&rec);
        let text = m.encode();
        assert!(text.contains("evictd_wakes_total{cause=\"timer\"} 1"), "{text}");
        assert!(text.contains("evictd_evictions_total{eviction_signal=\"memory.available\"} 1"), "{text}");
        // 0.7 ms from the kernel event to the decision.
        assert!(text.contains("evictd_detection_seconds_sum{cause=\"charge\"} 0.0007"), "{text}");
        assert!(text.contains("evictd_eviction_phase_seconds_count{phase=\"stop_containers\"} 1"), "{text}");
        // A dry run is not an eviction.
        m.eviction(&EvictionRecord { dry_run: true, ..rec });
        assert!(m.encode().contains("evictd_evictions_total{eviction_signal=\"memory.available\"} 1"));
    }
}
