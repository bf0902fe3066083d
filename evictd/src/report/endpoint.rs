//! The HTTP endpoints: Prometheus metrics at /metrics on `--metrics-addr`, and the probes a
//! DaemonSet points at — /healthz (the daemon's loop is alive) and /readyz (the first
//! observation of the node, the first pod inventory and the API's first list are done) — on
//! it and on `--probe-addr`. Each listener caps its connections, in all and per client
//! address, so that no client can starve the others.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use http_body_util::Full;
use hyper::{Request, Response, body::Bytes, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};

use super::metrics::Metrics;

/// What the probes answer from: the loop's heartbeat and whether the daemon is ready.
pub struct Health {
    start: Instant,
    /// ms since `start` of the loop's last beat (once a second), and of the background
    /// thread's (`daemon::background`: the inventory and the API; a stuck one leaves
    /// every pod list and record stale).
    last_beat_ms: AtomicU64,
    last_background_beat_ms: AtomicU64,
    ready: AtomicBool,
    /// False while an API is configured and its first list of the node's pods has not come:
    /// until then specs are guesses, and a pod is not ready on guesses.
    api_listed: AtomicBool,
    /// A loop silent this long is not alive; the background thread gets
    /// `BACKGROUND_STALLS` times as long.
    stall: Duration,
}

/// The loop beats every second; ten missed beats mean it is stuck (a liveness probe then
/// restarts the pod, which is the right thing for a daemon that can no longer act).
pub const DEFAULT_STALL: Duration = Duration::from_secs(10);

/// The background thread is not real-time: on a node whose tenants saturate the CPUs it
/// waits its CPU share, and a restart of evictd in the middle of pressure costs more than a
/// pod list some seconds late. Silent six times as long as the loop may be (a minute by
/// default), it is stuck (a task blocking its runtime), not slow.
const BACKGROUND_STALLS: u32 = 6;

impl Health {
    pub fn new(stall: Duration) -> Self {
        Health {
            start: Instant::now(),
            last_beat_ms: AtomicU64::new(0),
            last_background_beat_ms: AtomicU64::new(0),
            ready: AtomicBool::new(false),
            api_listed: AtomicBool::new(true),
            stall,
        }
    }

    /// The daemon's loop is alive.
    pub fn beat(&self) {
        self.last_beat_ms.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// The background thread is alive.
    pub fn background_beat(&self) {
        self.last_background_beat_ms.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// The node has been observed and the pods listed once.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// An API is configured: not ready before its first list of the node's pods.
    pub fn await_api_list(&self) {
        self.api_listed.store(false, Ordering::Relaxed);
    }

    /// The API's first list of the node's pods has come.
    pub fn api_listed(&self) {
        self.api_listed.store(true, Ordering::Relaxed);
    }

    pub fn alive(&self) -> Result<(), String> {
        let since = |beat: &AtomicU64| {
            self.start.elapsed().saturating_sub(Duration::from_millis(beat.load(Ordering::Relaxed)))
        };
        for (beat, stall, what) in [
            (&self.last_beat_ms, self.stall, "the daemon's loop"),
            (
                &self.last_background_beat_ms,
                self.stall * BACKGROUND_STALLS,
                "the inventory and API thread (evictd-io)",
            ),
        ] {
            let since = since(beat);
            if since > stall {
                return Err(format!("{what} has not run for {} ms", since.as_millis()));
            }
        }
        Ok(())
    }

    pub fn ready(&self) -> Result<(), String> {
        self.alive()?;
        if !self.ready.load(Ordering::Relaxed) {
            return Err(
                "starting: the first observation of the node or the first pod inventory is not done".into()
            );
        }
        if !self.api_listed.load(Ordering::Relaxed) {
            return Err("starting: the Kubernetes API has not listed this node's pods yet".into());
        }
        Ok(())
    }
}

/// How much the metrics endpoint gives any client.
#[derive(Clone, Copy, Debug)]
pub struct ServerLimits {
    /// Connections served at once; past it a new one displaces an old one (`Connections`).
    pub max_connections: usize,
    /// Connections served at once for one client address: a pod that holds as many as it
    /// can leaves the rest to others (the kubelet's probes come from the node's address);
    /// past it the address's new connection displaces its oldest.
    pub max_per_peer: usize,
    /// A client must send its request headers within this.
    pub header_timeout: Duration,
    /// No connection lives longer than this.
    pub connection_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 16,
            max_per_peer: 4,
            header_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(30),
        }
    }
}

/// Serves /metrics, /healthz and /readyz on `addr` until the process ends, on a thread and
/// runtime of its own, so that no client — slow, many, or broken — can delay the pressure
/// path. Binding errors are returned; errors on one connection are logged at debug level and
/// end only that one.
pub fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    limits: ServerLimits,
) -> std::io::Result<SocketAddr> {
    listen(addr, Some(metrics), health, limits, "evictd-metrics")
}

/// Serves only /healthz and /readyz on `addr` (`--probe-addr`), with connections of their
/// own: a client that holds every connection of the metrics port (any pod on the node can
/// reach it) cannot make the kubelet's probes fail and restart evictd.
pub fn serve_probes(
    addr: SocketAddr,
    health: Arc<Health>,
    limits: ServerLimits,
) -> std::io::Result<SocketAddr> {
    listen(addr, None, health, limits, "evictd-probes")
}

fn listen(
    addr: SocketAddr,
    metrics: Option<Arc<Metrics>>,
    health: Arc<Health>,
    limits: ServerLimits,
    thread: &str,
) -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    std::thread::Builder::new().name(thread.into()).spawn(move || {
        rt.block_on(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => accept_loop(listener, metrics, health, limits).await,
                Err(e) => tracing::warn!("the endpoint on {bound} stopped: {e}"),
            }
        })
    })?;
    Ok(bound)
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    metrics: Option<Arc<Metrics>>,
    health: Arc<Health>,
    limits: ServerLimits,
) {
    let conns: Arc<Mutex<Connections>> = Arc::default();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, say: back off instead of spinning on accept.
                tracing::warn!("metrics endpoint: accept failed: {e}; retrying in 100 ms");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (displaced, id) = lock(&conns).make_room(peer.ip(), &limits);
        if let Some(connection) = displaced {
            connection.abort();
        }
        let registered = Registered { conns: conns.clone(), id };
        let task =
            tokio::spawn(serve_connection(stream, metrics.clone(), health.clone(), limits, registered));
        // Listed by `make_room` before it could end: a task that ended already is off the list.
        if let Some((_, handle)) = lock(&conns).live.get_mut(&id) {
            *handle = Some(task.abort_handle());
        }
        // The new connection's task runs before the next accept: a probe that asked at once
        // is answered before a burst of connections could displace it.
        tokio::task::yield_now().await;
    }
}

fn lock(conns: &Mutex<Connections>) -> std::sync::MutexGuard<'_, Connections> {
    conns.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The connections served, in the order they were accepted. At a cap, a new connection
/// displaces an old one rather than being refused: the oldest of its own address at that
/// address's cap, else the oldest of the address holding the most. Clients that open
/// connections and ask nothing (up to the header timeout, again and again) thus cannot keep
/// out one that asks at once and goes — the kubelet's probes open a connection per probe —
/// unless they hold as many addresses as there are connections and open as many
/// connections within the moment a probe takes.
#[derive(Default)]
struct Connections {
    next_id: u64,
    /// By id: ids grow with acceptance, so the first is the oldest. The handle comes once the
    /// connection's task is spawned.
    live: std::collections::BTreeMap<u64, (IpAddr, Option<tokio::task::AbortHandle>)>,
    per_peer: HashMap<IpAddr, usize>,
}

impl Connections {
    /// Makes room for a connection from `peer`: the connection displaced for it, taken off
    /// the list (to be aborted), and the new connection's id, listed for `peer`.
    fn make_room(&mut self, peer: IpAddr, limits: &ServerLimits) -> (Option<tokio::task::AbortHandle>, u64) {
        let peer_full = self.per_peer.get(&peer).is_some_and(|&n| n >= limits.max_per_peer);
        let from = if peer_full {
            Some(peer)
        } else if self.live.len() >= limits.max_connections {
            let most = self.per_peer.values().copied().max().unwrap_or(0);
            self.live.values().map(|(p, _)| *p).find(|p| self.per_peer.get(p) == Some(&most))
        } else {
            None
        };
        let oldest = from.and_then(|from| self.live.iter().find(|(_, (p, _))| *p == from).map(|(id, _)| *id));
        let displaced = oldest.and_then(|id| self.forget(id));
        let id = self.next_id;
        self.next_id += 1;
        *self.per_peer.entry(peer).or_default() += 1;
        self.live.insert(id, (peer, None));
        (displaced, id)
    }

    /// Takes connection `id` off the list, if it is still on it.
    fn forget(&mut self, id: u64) -> Option<tokio::task::AbortHandle> {
        let (peer, handle) = self.live.remove(&id)?;
        if let Some(n) = self.per_peer.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&peer);
            }
        }
        handle
    }
}

/// A connection on the list, taken off when it ends (or is displaced and aborted).
struct Registered {
    conns: Arc<Mutex<Connections>>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        lock(&self.conns).forget(self.id);
    }
}

fn route(
    path: &str,
    metrics: Option<&Metrics>,
    health: &Health,
) -> Result<Response<Full<Bytes>>, hyper::http::Error> {
    let text = |code: u16, body: String| {
        Response::builder()
            .status(code)
            .header("content-type", "text/plain; charset=utf-8")
            .body(Full::new(Bytes::from(body)))
    };
    match path {
        "/metrics" => match metrics {
            Some(m) => Response::builder()
                .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
                .body(Full::new(Bytes::from(m.encode()))),
            None => text(404, "this port serves the probes only: metrics are on --metrics-addr\n".into()),
        },
        "/healthz" => match health.alive() {
            Ok(()) => text(200, "ok\n".into()),
            Err(why) => text(503, format!("{why}\n")),
        },
        "/readyz" => match health.ready() {
            Ok(()) => text(200, "ok\n".into()),
            Err(why) => text(503, format!("{why}\n")),
        },
        _ => text(404, "not found: try /metrics, /healthz or /readyz\n".into()),
    }
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    metrics: Option<Arc<Metrics>>,
    health: Arc<Health>,
    limits: ServerLimits,
    _registered: Registered,
) {
    let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
        let (metrics, health) = (metrics.clone(), health.clone());
        async move { route(req.uri().path(), metrics.as_deref(), &health) }
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

    fn serve_with(limits: ServerLimits) -> SocketAddr {
        let health = Arc::new(Health::new(DEFAULT_STALL));
        health.beat();
        serve("127.0.0.1:0".parse().unwrap(), Arc::new(Metrics::default()), health, limits).unwrap()
    }

    fn get(addr: SocketAddr) -> std::io::Result<String> {
        get_path(addr, "/metrics")
    }

    fn get_path(addr: SocketAddr, path: &str) -> std::io::Result<String> {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    }

    /// The endpoint runs off the daemon's thread, so a pressure pass that
    /// holds that thread does not stop scrapes (and slow scrapes cannot hold a pass).
    #[tokio::test(flavor = "current_thread")]
    #[expect(clippy::disallowed_methods, reason = "blocks the runtime's thread on purpose")]
    async fn scrapes_are_served_while_the_daemon_thread_is_busy() {
        let addr = serve_with(ServerLimits::default());
        let scrape = std::thread::spawn(move || get(addr));
        // Hold this (the daemon's) thread: a server task on it could not answer.
        std::thread::sleep(Duration::from_millis(500));
        let body = scrape.join().unwrap().expect("scrape answered");
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    }

    /// Slow clients are cut off after the header timeout, and past the cap a new connection
    /// displaces the oldest instead of piling up.
    #[test]
    #[expect(clippy::disallowed_methods, reason = "a plain test thread, no runtime on it")]
    fn slow_and_surplus_clients_are_bounded() {
        use std::io::Read as _;
        let limits = ServerLimits {
            max_connections: 2,
            max_per_peer: 2,
            header_timeout: Duration::from_millis(300),
            connection_timeout: Duration::from_secs(5),
        };
        let addr = serve_with(limits);
        let mut idle: Vec<std::net::TcpStream> =
            (0..2).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(100));
        // Both slots are taken by clients that send nothing: a third closes the oldest.
        let _third = std::net::TcpStream::connect(addr).unwrap();
        let mut oldest = idle.remove(0);
        oldest.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        assert_eq!(oldest.read(&mut [0u8; 16]).ok(), Some(0), "the oldest is closed at once");
        // The idle ones are cut off after the header timeout, which frees the slots.
        for mut c in idle {
            c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            let mut buf = Vec::new();
            c.read_to_end(&mut buf).expect("the server closes a client that sends no headers");
        }
        assert!(get(addr).expect("scrape after the slow clients are gone").starts_with("HTTP/1.1 200"));
    }

    /// /healthz follows the loop's heartbeat; /readyz also waits for the first inventory.
    #[test]
    #[expect(clippy::disallowed_methods, reason = "a plain test thread, no runtime on it")]
    fn the_probes_follow_the_heartbeat_and_readiness() {
        let health = Arc::new(Health::new(Duration::from_millis(300)));
        let addr = serve(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(Metrics::default()),
            health.clone(),
            ServerLimits::default(),
        )
        .unwrap();
        health.beat();
        health.background_beat();
        assert!(get_path(addr, "/healthz").unwrap().starts_with("HTTP/1.1 200"));
        let not_ready = get_path(addr, "/readyz").unwrap();
        assert!(
            not_ready.starts_with("HTTP/1.1 503") && not_ready.contains("first pod inventory"),
            "{not_ready}"
        );
        health.await_api_list();
        health.set_ready();
        let unlisted = get_path(addr, "/readyz").unwrap();
        assert!(unlisted.starts_with("HTTP/1.1 503") && unlisted.contains("not listed"), "{unlisted}");
        health.api_listed();
        assert!(get_path(addr, "/readyz").unwrap().starts_with("HTTP/1.1 200"));
        // The loop stops beating: neither alive nor ready.
        std::thread::sleep(Duration::from_millis(500));
        let dead = get_path(addr, "/healthz").unwrap();
        assert!(dead.starts_with("HTTP/1.1 503") && dead.contains("has not run for"), "{dead}");
        assert!(get_path(addr, "/readyz").unwrap().starts_with("HTTP/1.1 503"));
        health.beat();
        health.background_beat();
        assert!(get_path(addr, "/healthz").unwrap().starts_with("HTTP/1.1 200"));
        assert!(get_path(addr, "/nothing").unwrap().starts_with("HTTP/1.1 404"));
        // The loop beats, the background thread does not: slow for a while is alive (a
        // starved thread, not a stuck one); for six times the loop's limit, its pod lists
        // and records are stale, and that is not alive either.
        let beat_for = |d: Duration| {
            let end = Instant::now() + d;
            while Instant::now() < end {
                health.beat();
                std::thread::sleep(Duration::from_millis(100));
            }
            health.beat();
        };
        beat_for(Duration::from_millis(600));
        let slow = get_path(addr, "/healthz").unwrap();
        assert!(slow.starts_with("HTTP/1.1 200"), "{slow}");
        beat_for(Duration::from_millis(1400));
        let stuck = get_path(addr, "/healthz").unwrap();
        assert!(stuck.starts_with("HTTP/1.1 503") && stuck.contains("evictd-io"), "{stuck}");
    }

    /// The probes on their own port (`--probe-addr`) have connections of their own: a client
    /// holding every connection of the metrics port (any pod can reach it) takes none of
    /// them, and the probes displace none of its (a Prometheus scrape among them, say).
    #[test]
    #[expect(clippy::disallowed_methods, reason = "a plain test thread, no runtime on it")]
    fn the_probes_on_their_own_port_answer_while_the_metrics_port_is_flooded() {
        use std::io::Read as _;
        let health = Arc::new(Health::new(DEFAULT_STALL));
        health.beat();
        health.set_ready();
        let limits = ServerLimits { max_connections: 2, ..ServerLimits::default() };
        let metrics =
            serve("127.0.0.1:0".parse().unwrap(), Arc::new(Metrics::default()), health.clone(), limits)
                .unwrap();
        let probes = serve_probes("127.0.0.1:0".parse().unwrap(), health, limits).unwrap();
        let flood: Vec<std::net::TcpStream> =
            (0..2).map(|_| std::net::TcpStream::connect(metrics).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(100));
        for _ in 0..3 {
            for path in ["/healthz", "/readyz"] {
                let answer = get_path(probes, path).expect("the probe port answers");
                assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
            }
        }
        assert!(get_path(probes, "/metrics").unwrap().starts_with("HTTP/1.1 404"), "probes only");
        for mut c in flood {
            c.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
            let read = c.read(&mut [0u8; 16]);
            assert!(read.is_err(), "a metrics connection was closed by the probes: {read:?}");
        }
    }

    /// Clients that open connections and ask nothing, from as many addresses as they like,
    /// cannot keep out a probe that asks at once: it displaces the oldest connection of the
    /// address holding the most, or the oldest of all when each holds one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn clients_holding_every_connection_cannot_keep_a_probe_out() {
        let health = Arc::new(Health::new(DEFAULT_STALL));
        health.beat();
        health.set_ready();
        let limits = ServerLimits { max_connections: 4, max_per_peer: 2, ..ServerLimits::default() };
        let probes = serve_probes("127.0.0.1:0".parse().unwrap(), health, limits).unwrap();
        let connect_from = |ip: &'static str| async move {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(format!("{ip}:0").parse().unwrap()).unwrap();
            socket.connect(probes).await.unwrap()
        };
        for senders in [
            &["127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"],
            &["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"],
        ] {
            let mut flood = Vec::new();
            for ip in senders {
                flood.push(connect_from(ip).await);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            let answer = tokio::task::spawn_blocking(move || get_path(probes, "/healthz")).await.unwrap();
            let answer = answer.unwrap_or_else(|e| panic!("{senders:?} hold every connection: {e}"));
            assert!(answer.starts_with("HTTP/1.1 200"), "{senders:?}: {answer}");
            // The one displaced is the oldest (of the address holding the most).
            let mut first = [0u8; 1];
            let closed = tokio::time::timeout(
                Duration::from_secs(1),
                tokio::io::AsyncReadExt::read(&mut flood[0], &mut first),
            )
            .await;
            assert!(matches!(closed, Ok(Ok(0))), "{senders:?}: the oldest connection was closed");
        }
    }

    /// One client holding as many connections as it can gets `max_per_peer`: another address
    /// (the kubelet probing from the node's) is still served.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_client_address_cannot_take_every_connection() {
        let health = Arc::new(Health::new(DEFAULT_STALL));
        health.beat();
        health.set_ready();
        let limits = ServerLimits { max_connections: 4, max_per_peer: 2, ..ServerLimits::default() };
        let probes = serve_probes("127.0.0.1:0".parse().unwrap(), health, limits).unwrap();
        let mut flood = Vec::new();
        for _ in 0..4 {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
            flood.push(socket.connect(probes).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let answer = tokio::task::spawn_blocking(move || get_path(probes, "/healthz")).await.unwrap();
        assert!(answer.expect("another address is served").starts_with("HTTP/1.1 200"));
    }
}
