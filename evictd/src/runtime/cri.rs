//! The container runtime, spoken to over the CRI (`runtime.v1`, gRPC on a unix socket), the
//! way the kubelet does. Every call has a deadline; the channel reconnects by itself when the
//! runtime restarts; every error names the endpoint and the call.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use hyper_util::rt::TokioIo;
pub use k8s_cri::v1 as api;
use k8s_cri::v1::{
    self as cri, image_service_client::ImageServiceClient, runtime_service_client::RuntimeServiceClient,
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};
use tonic::transport::{Channel, Endpoint, Uri};

/// containerd's CRI socket, the kubelet's default too.
pub const DEFAULT_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("CRI endpoint {0:?}: only unix:///path sockets are supported")]
    Endpoint(String),
    #[error("CRI {call} on {endpoint}: {status}")]
    Call { endpoint: String, call: &'static str, status: Box<tonic::Status> },
    #[error("CRI {call} on {endpoint}: no answer within {timeout:?}")]
    Timeout { endpoint: String, call: &'static str, timeout: Duration },
    #[error("CRI {call} on {endpoint}: {what}")]
    Malformed { endpoint: String, call: &'static str, what: &'static str },
}

impl CriError {
    /// The runtime does not know the object (already gone): for stop and remove calls that is
    /// success, as the CRI makes them idempotent.
    pub fn is_not_found(&self) -> bool {
        matches!(self, CriError::Call { status, .. } if status.code() == tonic::Code::NotFound)
    }

    /// The runtime could not be reached (socket missing, refused), went away in the middle
    /// of the call (tonic reports a broken connection as `Unknown: transport error`), is
    /// back but still starting (containerd answers `Unknown: server is not initialized yet`
    /// until its CRI plugin has loaded its state), or did not answer in time: a failure of
    /// the runtime, not of the object the call was about. A stop that failed this way may
    /// still be under way in the runtime.
    pub fn is_unavailable(&self) -> bool {
        match self {
            CriError::Call { status, .. } => match status.code() {
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => true,
                tonic::Code::Unknown => {
                    matches!(status.message(), "transport error" | "server is not initialized yet")
                }
                _ => false,
            },
            CriError::Timeout { .. } => true,
            CriError::Endpoint(_) | CriError::Malformed { .. } => false,
        }
    }
}

/// Stop and remove calls are idempotent in the CRI: an object that is already gone is done.
fn gone_is_done<T>(r: Result<T, CriError>) -> Result<(), CriError> {
    match r {
        Err(e) if e.is_not_found() => Ok(()),
        r => r.map(|_| ()),
    }
}

/// What a confirmed stop stops.
enum Stoppable<'a> {
    Container { id: &'a str, grace_seconds: i64 },
    Sandbox { id: &'a str },
}

impl std::fmt::Display for Stoppable<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stoppable::Container { id, .. } => write!(f, "container {id}"),
            Stoppable::Sandbox { id } => write!(f, "sandbox {id}"),
        }
    }
}

#[derive(Clone)]
pub struct CriClient {
    endpoint: String,
    /// The runtime's socket, shared by the clients below and the inventory's lists (`lists`).
    channel: Channel,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    timeout: Duration,
    /// A stop's deadline (a container's adds its grace period): the kubelet's
    /// `runtimeRequestTimeout`. A runtime under memory pressure is slow, and a stop it is
    /// still carrying out must not be cancelled into a failed eviction.
    stop_timeout: Duration,
    /// Failed calls are counted here (`evictd_cri_errors_total`), when set.
    metrics: Option<CriMetrics>,
}

/// `unix:///run/x.sock` or a bare `/run/x.sock`.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, CriError> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if !path.starts_with('/') {
        return Err(CriError::Endpoint(endpoint.to_owned()));
    }
    Ok(PathBuf::from(path))
}

/// The kubelet's default `runtimeRequestTimeout`: how long it gives the runtime for a call.
pub const RUNTIME_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// The largest CRI response accepted: the kubelet's (16 MiB), not tonic's default 4 MiB, which
/// a node whose sandboxes carry large annotations (any tenant can add them) exceeds, failing
/// every inventory refresh.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// Every call evictd makes, by its CRI name (the metrics' label values).
pub const CALLS: [&str; 14] = [
    "Version",
    "ListPodSandbox",
    "PodSandboxStatus",
    "ListContainers",
    "ContainerStatus",
    "ListPodSandboxStats",
    "ListContainerStats",
    "StopContainer",
    "StopPodSandbox",
    "RemovePodSandbox",
    "RemoveContainer",
    "ImageFsInfo",
    "ListImages",
    "RemoveImage",
];

/// The CRI client's own metric family: failed calls by call, every call present at 0 from
/// the start so that a dashboard sees a series before the first failure.
#[derive(Clone, Default)]
pub struct CriMetrics {
    errors: Family<CallLabel, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabel {
    call: &'static str,
}

impl CriMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = CriMetrics::default();
        registry.register(
            "cri_errors",
            "Failed CRI calls (an error, or past evictd's deadline), by call",
            m.errors.clone(),
        );
        for call in CALLS {
            m.errors.get_or_create(&CallLabel { call }).inc_by(0);
        }
        m
    }

    fn failed(&self, call: &'static str) {
        self.errors.get_or_create(&CallLabel { call }).inc();
    }
}

/// How long a stop the runtime failed is watched for the exit it may still have caused
/// (bounded by the CRI timeout too). containerd records an exit when its shim's event
/// arrives: up to 3 s after the SIGKILL under the VM matrix's TCG.
const EXIT_WATCH: Duration = Duration::from_secs(5);

/// `msg` as a request whose deadline the runtime sees.
fn deadline<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(timeout);
    r
}

impl CriClient {
    /// A client for `endpoint`. Connecting is lazy: this succeeds while the runtime is down,
    /// and every call (re)connects as needed.
    pub fn new(endpoint: &str, timeout: Duration) -> Result<Self, CriError> {
        let path = socket_path(endpoint)?;
        // The URI is a placeholder: the connector below always dials the socket.
        let channel =
            Endpoint::from_static("http://cri.invalid").connect_with_connector_lazy(tower::service_fn(
                move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
                    }
                },
            ));
        Ok(CriClient {
            endpoint: endpoint.to_owned(),
            channel: channel.clone(),
            runtime: RuntimeServiceClient::new(channel.clone()).max_decoding_message_size(MAX_MESSAGE_BYTES),
            images: ImageServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES),
            timeout,
            stop_timeout: RUNTIME_REQUEST_TIMEOUT,
            metrics: None,
        })
    }

    /// The deadline of StopContainer (plus the grace period) and StopPodSandbox.
    pub fn with_stop_timeout(mut self, stop_timeout: Duration) -> Self {
        self.stop_timeout = stop_timeout;
        self
    }

    pub fn with_metrics(mut self, metrics: CriMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The deadline of reads and clean-up calls (`--cri-timeout`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Runs one call under `timeout`, mapping failures to errors that name the call. The
    /// request carries the same deadline (`grpc-timeout`), so the runtime gives up when
    /// evictd does instead of finishing work nobody waits for.
    async fn call<T, F>(&self, call: &'static str, timeout: Duration, fut: F) -> Result<T, CriError>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let result = match tokio::time::timeout(timeout, fut).await {
            Ok(Ok(r)) => return Ok(r.into_inner()),
            Ok(Err(status)) => {
                CriError::Call { endpoint: self.endpoint.clone(), call, status: Box::new(status) }
            }
            Err(_) => CriError::Timeout { endpoint: self.endpoint.clone(), call, timeout },
        };
        if let Some(m) = &self.metrics {
            m.failed(call);
        }
        Err(result)
    }

    pub async fn version(&self) -> Result<cri::VersionResponse, CriError> {
        let mut c = self.runtime.clone();
        self.call(
            "Version",
            self.timeout,
            c.version(deadline(cri::VersionRequest { version: "v1".into() }, self.timeout)),
        )
        .await
    }

    pub async fn list_pod_sandboxes(&self) -> Result<Vec<cri::PodSandbox>, CriError> {
        let mut c = self.runtime.clone();
        let r = self.call(
            "ListPodSandbox",
            self.timeout,
            c.list_pod_sandbox(deadline(cri::ListPodSandboxRequest::default(), self.timeout)),
        );
        Ok(r.await?.items)
    }

    /// An answer of `call` that lacks what the CRI says it holds.
    pub fn malformed(&self, call: &'static str, what: &'static str) -> CriError {
        CriError::Malformed { endpoint: self.endpoint.clone(), call, what }
    }

    pub async fn pod_sandbox_status(&self, id: &str) -> Result<cri::PodSandboxStatusResponse, CriError> {
        let mut c = self.runtime.clone();
        let req = cri::PodSandboxStatusRequest { pod_sandbox_id: id.into(), verbose: true };
        self.call("PodSandboxStatus", self.timeout, c.pod_sandbox_status(deadline(req, self.timeout))).await
    }

    pub async fn list_containers(&self) -> Result<Vec<cri::Container>, CriError> {
        let mut c = self.runtime.clone();
        let r = self.call(
            "ListContainers",
            self.timeout,
            c.list_containers(deadline(cri::ListContainersRequest::default(), self.timeout)),
        );
        Ok(r.await?.containers)
    }

    pub async fn container_status(&self, id: &str) -> Result<cri::ContainerStatusResponse, CriError> {
        let mut c = self.runtime.clone();
        let req = cri::ContainerStatusRequest { container_id: id.into(), verbose: true };
        self.call("ContainerStatus", self.timeout, c.container_status(deadline(req, self.timeout))).await
    }

    pub async fn list_pod_sandbox_stats(&self) -> Result<Vec<cri::PodSandboxStats>, CriError> {
        let mut c = self.runtime.clone();
        let req = cri::ListPodSandboxStatsRequest::default();
        Ok(self
            .call("ListPodSandboxStats", self.timeout, c.list_pod_sandbox_stats(deadline(req, self.timeout)))
            .await?
            .stats)
    }

    pub async fn list_container_stats(&self) -> Result<Vec<cri::ContainerStats>, CriError> {
        let mut c = self.runtime.clone();
        let req = cri::ListContainerStatsRequest::default();
        Ok(self
            .call("ListContainerStats", self.timeout, c.list_container_stats(deadline(req, self.timeout)))
            .await?
            .stats)
    }

    /// SIGTERM, then SIGKILL after `grace_seconds`. The call lasts as long as the grace period,
    /// so its deadline is the grace period plus the usual timeout.
    pub async fn stop_container(&self, id: &str, grace_seconds: i64) -> Result<(), CriError> {
        let mut c = self.runtime.clone();
        let req = cri::StopContainerRequest { container_id: id.into(), timeout: grace_seconds };
        let limit = self.stop_timeout + Duration::from_secs(grace_seconds.max(0) as u64);
        gone_is_done(self.call("StopContainer", limit, c.stop_container(deadline(req, limit))).await)
    }

    /// `stop_container`, made to stick: see `stop_confirmed`.
    pub async fn stop_container_confirmed(&self, id: &str, grace_seconds: i64) -> Result<(), CriError> {
        self.stop_confirmed(Stoppable::Container { id, grace_seconds }).await
    }

    pub async fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let mut c = self.runtime.clone();
        let req = cri::StopPodSandboxRequest { pod_sandbox_id: id.into() };
        gone_is_done(
            self.call(
                "StopPodSandbox",
                self.stop_timeout,
                c.stop_pod_sandbox(deadline(req, self.stop_timeout)),
            )
            .await,
        )
    }

    /// `stop_pod_sandbox`, made to stick: see `stop_confirmed`.
    pub async fn stop_pod_sandbox_confirmed(&self, id: &str) -> Result<(), CriError> {
        self.stop_confirmed(Stoppable::Sandbox { id }).await
    }

    /// A stop the runtime answered with an error is judged by the object's own state, as
    /// the kubelet's next sync would: one that has stopped is stopped, whatever the answer
    /// said. containerd 1.6 learns of an exit from its shim's event, after the stop may have
    /// failed: in the VM matrix it answered "ttrpc: closed" to the SIGKILL at the end of a
    /// grace period, when the container's exit and that SIGKILL met. So the state is watched
    /// for a while (`EXIT_WATCH`), and an object still running then is stopped once more.
    /// The runtime's error stands when that fails too and the object still runs, or when its
    /// state cannot be read: a stop is never assumed.
    async fn stop_confirmed(&self, target: Stoppable<'_>) -> Result<(), CriError> {
        let started = Instant::now();
        let Err(failed) = self.stop_once(&target, Duration::ZERO).await else { return Ok(()) };
        let watch_until = Instant::now() + EXIT_WATCH.min(self.timeout);
        loop {
            match self.has_stopped(&target).await {
                Ok(true) => {
                    tracing::warn!("the runtime failed to stop {target} ({failed}), but it has stopped");
                    return Ok(());
                }
                Ok(false) if Instant::now() < watch_until => {}
                Ok(false) => break,
                Err(_) => return Err(failed),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tracing::warn!("the runtime failed to stop {target} ({failed}) and it still runs: stopping it again");
        match self.stop_once(&target, started.elapsed()).await {
            Ok(()) => Ok(()),
            Err(again) if matches!(self.has_stopped(&target).await, Ok(true)) => {
                tracing::warn!("the second stop of {target} failed too ({again}), but it has stopped");
                Ok(())
            }
            Err(again) => Err(again),
        }
    }

    /// One stop call; a container's second one gets what is left of its grace period after
    /// `spent`.
    async fn stop_once(&self, target: &Stoppable<'_>, spent: Duration) -> Result<(), CriError> {
        match *target {
            Stoppable::Container { id, grace_seconds } => {
                let spent = i64::try_from(spent.as_secs()).unwrap_or(i64::MAX);
                self.stop_container(id, grace_seconds.saturating_sub(spent).max(0)).await
            }
            Stoppable::Sandbox { id } => self.stop_pod_sandbox(id).await,
        }
    }

    /// An exited container, a sandbox no longer ready, or one the runtime no longer knows.
    async fn has_stopped(&self, target: &Stoppable<'_>) -> Result<bool, CriError> {
        let state =
            match *target {
                Stoppable::Container { id, .. } => self.container_status(id).await.map(|r| {
                    r.status.is_some_and(|s| s.state == cri::ContainerState::ContainerExited as i32)
                }),
                Stoppable::Sandbox { id } => self.pod_sandbox_status(id).await.map(|r| {
                    r.status.is_some_and(|s| s.state == cri::PodSandboxState::SandboxNotready as i32)
                }),
            };
        match state {
            Err(e) if e.is_not_found() => Ok(true),
            state => state,
        }
    }

    pub async fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let mut c = self.runtime.clone();
        let req = cri::RemovePodSandboxRequest { pod_sandbox_id: id.into() };
        gone_is_done(
            self.call("RemovePodSandbox", self.timeout, c.remove_pod_sandbox(deadline(req, self.timeout)))
                .await,
        )
    }

    pub async fn remove_container(&self, id: &str) -> Result<(), CriError> {
        let mut c = self.runtime.clone();
        let req = cri::RemoveContainerRequest { container_id: id.into() };
        gone_is_done(
            self.call("RemoveContainer", self.timeout, c.remove_container(deadline(req, self.timeout))).await,
        )
    }

    pub async fn image_fs_info(&self) -> Result<cri::ImageFsInfoResponse, CriError> {
        let mut c = self.images.clone();
        self.call(
            "ImageFsInfo",
            self.timeout,
            c.image_fs_info(deadline(cri::ImageFsInfoRequest::default(), self.timeout)),
        )
        .await
    }

    /// The writable layers' filesystem, when the runtime keeps them apart from the images'
    /// (the kubelet's `IsContainerFsSeparateFromImageFs`, asked once): `None` when it is the
    /// same, when the runtime reports no container filesystem (containerd up to 1.7 does
    /// not), or when it cannot be asked (logged; the kubelet too takes that as no split).
    pub async fn separate_container_fs(&self) -> Option<PathBuf> {
        match self.image_fs_info().await {
            Ok(resp) => separate_container_fs(&resp),
            Err(e) => {
                tracing::warn!("{e}: taking the writable layers to be on imagefs (no split containerfs)");
                None
            }
        }
    }

    pub async fn list_images(&self) -> Result<Vec<cri::Image>, CriError> {
        let mut c = self.images.clone();
        Ok(self
            .call(
                "ListImages",
                self.timeout,
                c.list_images(deadline(cri::ListImagesRequest::default(), self.timeout)),
            )
            .await?
            .images)
    }

    pub async fn remove_image(&self, id: &str) -> Result<(), CriError> {
        let mut c = self.images.clone();
        let req = cri::RemoveImageRequest {
            image: Some(cri::ImageSpec { image: id.into(), ..Default::default() }),
        };
        gone_is_done(
            self.call("RemoveImage", self.timeout, c.remove_image(deadline(req, self.timeout))).await,
        )
    }

    /// The raw runtime client, for callers (the test harness) that create pods.
    pub fn runtime(&self) -> RuntimeServiceClient<Channel> {
        self.runtime.clone()
    }

    pub fn images(&self) -> ImageServiceClient<Channel> {
        self.images.clone()
    }
}

/// The container filesystem's mountpoint when the first container and image filesystems of
/// an `ImageFsInfo` answer differ (KEP-4191 supports one of each).
pub fn separate_container_fs(resp: &cri::ImageFsInfoResponse) -> Option<PathBuf> {
    let mountpoint = |fs: Option<&cri::FilesystemUsage>| fs?.fs_id.as_ref().map(|id| id.mountpoint.clone());
    let container = mountpoint(resp.container_filesystems.first())?;
    let image = mountpoint(resp.image_filesystems.first())?;
    (container != image).then(|| PathBuf::from(container))
}

#[cfg(test)]
pub(crate) mod scripted;

pub mod lists;

#[cfg(test)]
mod tests {
    use super::{
        scripted::{Script, scripted_runtime},
        *,
    };

    #[test]
    fn endpoints() {
        assert_eq!(socket_path("unix:///run/x.sock").unwrap(), PathBuf::from("/run/x.sock"));
        assert_eq!(socket_path("/run/x.sock").unwrap(), PathBuf::from("/run/x.sock"));
        assert!(socket_path("tcp://1.2.3.4:5").is_err());
        assert!(socket_path("unix://relative").is_err());
    }

    /// The kubelet's rule on what runtimes answer: CRI-O with an image store apart, CRI-O
    /// and containerd 2 without, containerd up to 1.7 (no container filesystems at all).
    #[test]
    fn a_split_containerfs_is_two_mountpoints() {
        let fs = |m: &str| cri::FilesystemUsage {
            fs_id: Some(cri::FilesystemIdentifier { mountpoint: m.into() }),
            ..Default::default()
        };
        let answer = |containers: Vec<cri::FilesystemUsage>, images: Vec<cri::FilesystemUsage>| {
            cri::ImageFsInfoResponse { container_filesystems: containers, image_filesystems: images }
        };
        let split = answer(vec![fs("/var/lib/containers/storage")], vec![fs("/mnt/imagestore")]);
        assert_eq!(separate_container_fs(&split), Some(PathBuf::from("/var/lib/containers/storage")));
        let same = answer(vec![fs("/var/lib/containerd")], vec![fs("/var/lib/containerd")]);
        assert_eq!(separate_container_fs(&same), None);
        assert_eq!(separate_container_fs(&answer(vec![], vec![fs("/var/lib/containerd")])), None);
        let no_id = answer(vec![cri::FilesystemUsage::default()], vec![fs("/images")]);
        assert_eq!(separate_container_fs(&no_id), None);
    }

    #[tokio::test]
    async fn a_missing_socket_is_an_error_naming_endpoint_and_call() {
        let c = CriClient::new("unix:///nonexistent/evictd-test.sock", Duration::from_secs(2)).unwrap();
        let e = c.version().await.unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("/nonexistent/evictd-test.sock") && msg.contains("Version"), "{msg}");
        assert!(e.is_unavailable(), "{e:?}");
    }

    fn call_error(code: tonic::Code, message: &str) -> CriError {
        let status = Box::new(tonic::Status::new(code, message));
        CriError::Call { endpoint: "unix:///run/x.sock".into(), call: "StopContainer", status }
    }

    /// What containerd answers while it restarts must not read as a failure of the pod: the
    /// daemon would then stop the next candidate too (seen in the runtime-restart fault test).
    #[test]
    fn a_restarting_runtime_is_unavailable_and_a_pod_error_is_not() {
        for (code, msg) in [
            (tonic::Code::Unknown, "server is not initialized yet"),
            (tonic::Code::Unknown, "transport error"),
            (tonic::Code::Unavailable, "connection refused"),
            (tonic::Code::DeadlineExceeded, "context deadline exceeded"),
        ] {
            assert!(call_error(code, msg).is_unavailable(), "{code:?} {msg}");
        }
        for (code, msg) in [
            (tonic::Code::Unknown, "failed to kill container: permission denied"),
            (tonic::Code::InvalidArgument, "container id is empty"),
            (tonic::Code::NotFound, "an error occurred when try to find container"),
        ] {
            assert!(!call_error(code, msg).is_unavailable(), "{code:?} {msg}");
        }
    }

    /// grpc-timeout's `<digits><unit>` as a duration (gRPC over HTTP/2, "Timeout").
    fn grpc_timeout(v: &str) -> Duration {
        let (n, unit) = v.split_at(v.len() - 1);
        let n: u64 = n.parse().unwrap_or_else(|e| panic!("grpc-timeout {v:?}: {e}"));
        match unit {
            "H" => Duration::from_secs(n * 3600),
            "M" => Duration::from_secs(n * 60),
            "S" => Duration::from_secs(n),
            "m" => Duration::from_millis(n),
            "u" => Duration::from_micros(n),
            "n" => Duration::from_nanos(n),
            _ => panic!("grpc-timeout {v:?}: unknown unit"),
        }
    }

    /// Each call carries its deadline to the runtime (`grpc-timeout`), so
    /// that a runtime still stopping a container when evictd gives up stops too, instead of
    /// finishing a kill evictd then counts as failed and repeats on the next pod. A stop's
    /// deadline includes its grace period. The listener is not a runtime (containerd runs in
    /// the e2e tests, but cannot show what headers it got): it records each call's path and
    /// header and answers "unimplemented".
    #[tokio::test(flavor = "current_thread")]
    async fn every_call_sends_its_deadline_to_the_runtime() {
        use hyper::{Response, body::Bytes, service::service_fn};
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("cri.sock");
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let seen_tx = seen_tx.clone();
                let record = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let timeout =
                        req.headers().get("grpc-timeout").map(|v| v.to_str().unwrap_or("").to_owned());
                    let _ = seen_tx.send((req.uri().path().to_owned(), timeout));
                    async {
                        Response::builder()
                            .header("content-type", "application/grpc")
                            .header("grpc-status", "12")
                            .body(http_body_util::Empty::<Bytes>::new())
                    }
                });
                let http2 = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
                tokio::spawn(http2.serve_connection(TokioIo::new(stream), record));
            }
        });
        let client = CriClient::new(sock.to_str().unwrap(), Duration::from_secs(3)).unwrap();
        let expect = [
            ("/runtime.v1.RuntimeService/Version", Duration::from_secs(3)),
            // A stop's deadline is the runtime request timeout, not the CRI timeout.
            ("/runtime.v1.RuntimeService/StopContainer", RUNTIME_REQUEST_TIMEOUT + Duration::from_secs(5)),
        ];
        assert!(client.version().await.is_err(), "the listener answers unimplemented");
        assert!(client.stop_container("c1", 5).await.is_err());
        for (path, want) in expect {
            let (got_path, timeout) = seen.recv().await.expect("the call reached the listener");
            assert_eq!(got_path, path);
            let got = grpc_timeout(&timeout.unwrap_or_else(|| panic!("{path} sent no grpc-timeout")));
            assert!(got <= want && got + Duration::from_millis(500) > want, "{path}: {got:?}, want {want:?}");
        }
    }

    /// A stop the runtime failed is judged by the object's state: one that has stopped
    /// (at once, or once the runtime learns of the exit) is stopped; one still running is
    /// stopped once more; the runtime's own error stands when that fails too.
    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_stop_is_judged_by_the_state_and_tried_once_more() {
        use std::sync::atomic::Ordering::SeqCst;
        let never = usize::MAX;
        // (script, stopped, stop calls, status reads)
        let cases = [
            (
                Script {
                    failing_stops: never,
                    running_polls: Some(0),
                    stop_delay: Duration::ZERO,
                    sandbox_stop_fails: false,
                },
                true,
                1,
                Some(1),
            ),
            (
                Script {
                    failing_stops: never,
                    running_polls: Some(3),
                    stop_delay: Duration::ZERO,
                    sandbox_stop_fails: false,
                },
                true,
                1,
                Some(4),
            ),
            (
                Script {
                    failing_stops: 1,
                    running_polls: None,
                    stop_delay: Duration::ZERO,
                    sandbox_stop_fails: false,
                },
                true,
                2,
                None,
            ),
            (
                Script {
                    failing_stops: never,
                    running_polls: None,
                    stop_delay: Duration::ZERO,
                    sandbox_stop_fails: false,
                },
                false,
                2,
                None,
            ),
        ];
        for sandbox in [false, true] {
            for (script, stopped, stops, polls) in cases {
                let dir = tempfile::tempdir().unwrap();
                let sock = dir.path().join("cri.sock");
                let asked = scripted_runtime(&sock, script);
                // The state is watched for the CRI timeout at most: a second here.
                let client = CriClient::new(sock.to_str().unwrap(), Duration::from_secs(1)).unwrap();
                let started = Instant::now();
                let r = if sandbox {
                    client.stop_pod_sandbox_confirmed("s1").await
                } else {
                    client.stop_container_confirmed("c1", 0).await
                };
                let case = format!(
                    "sandbox {sandbox}, {} failing stops, {:?} running polls",
                    script.failing_stops, script.running_polls
                );
                match r {
                    Ok(()) => assert!(stopped, "{case}: a running object was taken for stopped"),
                    Err(e) => {
                        assert!(!stopped, "{case}: {e}");
                        assert!(
                            e.to_string().contains("ttrpc: closed"),
                            "{case}: the runtime's error stands: {e}"
                        );
                    }
                }
                assert_eq!(asked.stops.load(SeqCst), stops, "{case}: stop calls");
                if let Some(polls) = polls {
                    assert_eq!(asked.polls.load(SeqCst), polls, "{case}: status reads");
                } else {
                    // Watched for the whole second, more than once (how many reads fit in it
                    // depends on the machine: the VM matrix's emulation is far slower).
                    let polls = asked.polls.load(SeqCst);
                    assert!(polls >= 2, "{case}: {polls} status reads");
                    assert!(
                        started.elapsed() >= Duration::from_millis(950),
                        "{case}: {:?}",
                        started.elapsed()
                    );
                }
            }
        }
    }

    /// A runtime slowed by memory pressure takes longer than evictd's CRI timeout to carry
    /// out a stop: the stop is waited for (the kubelet's `runtimeRequestTimeout`), not
    /// cancelled into a failed eviction. A stop past that deadline still fails, naming it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_slow_stop_is_waited_for_not_cancelled() {
        use std::sync::atomic::Ordering::SeqCst;
        let slow =
            Script { running_polls: Some(0), stop_delay: Duration::from_millis(2500), ..Script::default() };
        for sandbox in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let sock = dir.path().join("cri.sock");
            let asked = scripted_runtime(&sock, slow);
            let client = CriClient::new(sock.to_str().unwrap(), Duration::from_secs(1)).unwrap();
            let r = if sandbox {
                client.stop_pod_sandbox("s1").await
            } else {
                client.stop_container("c1", 0).await
            };
            assert!(r.is_ok(), "sandbox {sandbox}: a stop answered after 2.5 s failed: {r:?}");
            assert_eq!(asked.stops.load(SeqCst), 1, "sandbox {sandbox}: one stop, not repeated");
            let hurried = client.with_stop_timeout(Duration::from_millis(500));
            let r = if sandbox {
                hurried.stop_pod_sandbox("s1").await
            } else {
                hurried.stop_container("c1", 0).await
            };
            let e = r.expect_err("a stop past its own deadline fails");
            let call = if sandbox { "StopPodSandbox" } else { "StopContainer" };
            assert!(e.to_string().contains(call), "{e}");
        }
    }
}
