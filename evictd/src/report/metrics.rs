//! Prometheus metrics: wakes by source, evictions by signal (the kubelet's
//! `kubelet_evictions`), and latency histograms for every decision (wake → decision by wake
//! source, kernel → userspace delivery, and each eviction phase). Served as text on
//! `--metrics-addr` at /metrics.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use http_body_util::Full;
use hyper::{Request, Response, body::Bytes, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::{report::record::EvictionRecord, runtime::inventory::SpecSource, wake::Wake};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabel {
    cause: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SignalLabel {
    eviction_signal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiCallLabel {
    call: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SpecSourceLabel {
    spec_source: String,
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
    api_calls: Family<ApiCallLabel, Counter>,
    status_window: Histogram,
    pods: Family<SpecSourceLabel, Gauge>,
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
        let api_calls = Family::<ApiCallLabel, Counter>::default();
        registry.register(
            "kube_api_calls",
            "Kubernetes API calls (pod_status, event, node_status) by outcome: ok, retried, refused, given_up, dropped",
            api_calls.clone(),
        );
        let status_window = Histogram::new(latency_buckets());
        registry.register(
            "eviction_recorded_seconds",
            "From an evicted pod's kill to its Failed/Evicted status accepted by the API server",
            status_window.clone(),
        );
        let pods = Family::<SpecSourceLabel, Gauge>::default();
        registry.register(
            "pods",
            "Pods on the node, by where their spec comes from (api, pods_file, inferred: priority unknown)",
            pods.clone(),
        );
        // Every label value present from the start, so a dashboard sees 0 rather than nothing.
        for source in SpecSource::ALL {
            pods.get_or_create(&SpecSourceLabel { spec_source: source.as_str().into() }).set(0);
        }
        Metrics {
            registry,
            wakes,
            evictions,
            failed_evictions,
            detection,
            delivery,
            phases,
            api_calls,
            status_window,
            pods,
        }
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
            if let Some(k) = &p.fast_kill {
                phase("fast_kill_signalled", k.report.signalled_ms);
                phase("fast_kill_reaped", k.report.reaped_ms);
            }
        }
    }

    pub fn api_call(&self, call: &str, outcome: &str) {
        self.api_calls.get_or_create(&ApiCallLabel { call: call.into(), outcome: outcome.into() }).inc();
    }

    /// The inventory's pods, counted by spec source.
    pub fn pods_by_spec_source(&self, counts: &[(&str, i64)]) {
        for (source, n) in counts {
            self.pods.get_or_create(&SpecSourceLabel { spec_source: (*source).into() }).set(*n);
        }
    }

    pub fn status_recorded(&self, after_kill: Duration) {
        self.status_window.observe(after_kill.as_secs_f64());
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// How much the metrics endpoint gives any client.
#[derive(Clone, Copy, Debug)]
pub struct ServerLimits {
    /// Connections served at once; more are closed at once (a scraper retries).
    pub max_connections: usize,
    /// A client must send its request headers within this.
    pub header_timeout: Duration,
    /// No connection lives longer than this.
    pub connection_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 16,
            header_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(30),
        }
    }
}

/// Serves /metrics on `addr` until the process ends, on a thread and runtime of its own, so
/// that no client — slow, many, or broken — can delay the pressure path. Binding errors are
/// returned; errors on one connection are logged at debug level and end only that one.
pub fn serve(addr: SocketAddr, metrics: Arc<Metrics>, limits: ServerLimits) -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    std::thread::Builder::new().name("evictd-metrics".into()).spawn(move || {
        rt.block_on(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => accept_loop(listener, metrics, limits).await,
                Err(e) => tracing::warn!("metrics endpoint stopped: {e}"),
            }
        })
    })?;
    Ok(bound)
}

async fn accept_loop(listener: tokio::net::TcpListener, metrics: Arc<Metrics>, limits: ServerLimits) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, say: back off instead of spinning on accept.
                tracing::warn!("metrics endpoint: accept failed: {e}; retrying in 100 ms");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Over the cap the connection is dropped, i.e. closed, at once.
        let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
        tokio::spawn(serve_connection(stream, metrics.clone(), limits, slot));
    }
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    metrics: Arc<Metrics>,
    limits: ServerLimits,
    _slot: tokio::sync::OwnedSemaphorePermit,
) {
    let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
        let metrics = metrics.clone();
        async move {
            if req.uri().path() == "/metrics" {
                Response::builder()
                    .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
                    .body(Full::new(Bytes::from(metrics.encode())))
            } else {
                Response::builder().status(404).body(Full::new(Bytes::from_static(b"not found\n")))
            }
        }
    });
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    let conn = http.serve_connection(TokioIo::new(stream), svc);
    match tokio::time::timeout(limits.connection_timeout, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!("metrics connection: {e}"),
        Err(_) => tracing::debug!("metrics connection closed after {:?}", limits.connection_timeout),
    }
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
            annotations: Default::default(),
            dry_run: false,
            error: None,
            decide_us: 500,
            phases: Some(crate::runtime::evict::Phases {
                stop_containers_ms: 120.0,
                stop_sandbox_ms: 30.0,
                memory_released_ms: Some(0.1),
                fast_kill: None,
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

    fn get(addr: SocketAddr) -> std::io::Result<String> {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    }

    /// Issue 12, defect 7: the endpoint runs off the daemon's thread, so a pressure pass that
    /// holds that thread does not stop scrapes (and slow scrapes cannot hold a pass).
    #[tokio::test(flavor = "current_thread")]
    #[expect(clippy::disallowed_methods, reason = "blocks the runtime's thread on purpose")]
    async fn scrapes_are_served_while_the_daemon_thread_is_busy() {
        let m = Arc::new(Metrics::default());
        let addr = serve("127.0.0.1:0".parse().unwrap(), m, ServerLimits::default()).unwrap();
        let scrape = std::thread::spawn(move || get(addr));
        // Hold this (the daemon's) thread: a server task on it could not answer.
        std::thread::sleep(Duration::from_millis(500));
        let body = scrape.join().unwrap().expect("scrape answered");
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    }

    /// Slow clients are cut off after the header timeout, and past the cap new connections
    /// are closed at once instead of piling up.
    #[test]
    #[expect(clippy::disallowed_methods, reason = "a plain test thread, no runtime on it")]
    fn slow_and_surplus_clients_are_bounded() {
        use std::io::Read as _;
        let limits = ServerLimits {
            max_connections: 2,
            header_timeout: Duration::from_millis(300),
            connection_timeout: Duration::from_secs(5),
        };
        let addr = serve("127.0.0.1:0".parse().unwrap(), Arc::new(Metrics::default()), limits).unwrap();
        let idle: Vec<std::net::TcpStream> =
            (0..2).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(100));
        // Both slots are taken by clients that send nothing: a third is closed at once.
        let mut surplus = std::net::TcpStream::connect(addr).unwrap();
        surplus.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        assert_eq!(surplus.read(&mut [0u8; 16]).unwrap_or(0), 0, "closed without an answer");
        // The idle ones are cut off after the header timeout, which frees the slots.
        for mut c in idle {
            c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            let mut buf = Vec::new();
            c.read_to_end(&mut buf).expect("the server closes a client that sends no headers");
        }
        assert!(get(addr).expect("scrape after the slow clients are gone").starts_with("HTTP/1.1 200"));
    }
}
