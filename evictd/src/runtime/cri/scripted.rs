//! Not a runtime: a hand-made CRI listener for the tests of what a runtime does wrong.
//! containerd cannot be made to fail or delay a stop on purpose, so the four calls a
//! confirmed stop makes (StopContainer, ContainerStatus, StopPodSandbox, PodSandboxStatus)
//! are answered as a `Script` says, and any call as a test says (`answering`).

use std::{sync::Arc, time::Duration};

use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;

/// How the hand-made runtime below answers: the first `failing_stops` stops fail as
/// containerd 1.6's once did in the VM matrix ("ttrpc: closed"), and the object's status
/// shows it running for the first `running_polls` reads (`None`: always), stopped after.
#[derive(Clone, Copy, Default)]
pub(crate) struct Script {
    pub(crate) failing_stops: usize,
    pub(crate) running_polls: Option<usize>,
    /// How long each stop takes to answer: a runtime slowed by memory pressure.
    pub(crate) stop_delay: Duration,
    /// StopPodSandbox always fails and the sandbox stays ready (a struggling runtime),
    /// whatever the containers do.
    pub(crate) sandbox_stop_fails: bool,
}

/// How often the hand-made runtime was asked to stop, and for a status.
#[derive(Default)]
pub(crate) struct Asked {
    pub(crate) stops: std::sync::atomic::AtomicUsize,
    pub(crate) polls: std::sync::atomic::AtomicUsize,
}

/// One answer of the hand-made runtime: an encoded message, or a gRPC error (code, message).
pub(crate) type Answer = Result<Vec<u8>, (tonic::Code, &'static str)>;

/// Not a runtime: containerd cannot be made to fail a stop on purpose, so the four calls
/// a confirmed stop makes (StopContainer, ContainerStatus, StopPodSandbox,
/// PodSandboxStatus) are answered by hand, as `script` says.
pub(crate) fn scripted_runtime(sock: &std::path::Path, script: Script) -> Arc<Asked> {
    use std::sync::atomic::Ordering::SeqCst;

    let asked = Arc::new(Asked::default());
    let a = asked.clone();
    answering(sock, move |path| {
        let delay = if path.ends_with("Status") { Duration::ZERO } else { script.stop_delay };
        let sandbox = path.ends_with("/StopPodSandbox") || path.ends_with("/PodSandboxStatus");
        let answer = if path.ends_with("Status") {
            let poll = a.polls.fetch_add(1, SeqCst);
            let running =
                (sandbox && script.sandbox_stop_fails) || script.running_polls.is_none_or(|n| poll < n);
            Ok(if path.ends_with("/ContainerStatus") {
                let state = if running {
                    cri::ContainerState::ContainerRunning
                } else {
                    cri::ContainerState::ContainerExited
                };
                let status = cri::ContainerStatus { state: state as i32, ..Default::default() };
                prost::Message::encode_to_vec(&cri::ContainerStatusResponse {
                    status: Some(status),
                    ..Default::default()
                })
            } else {
                let state = if running {
                    cri::PodSandboxState::SandboxReady
                } else {
                    cri::PodSandboxState::SandboxNotready
                };
                let status = cri::PodSandboxStatus { state: state as i32, ..Default::default() };
                prost::Message::encode_to_vec(&cri::PodSandboxStatusResponse {
                    status: Some(status),
                    ..Default::default()
                })
            })
        } else if a.stops.fetch_add(1, SeqCst) >= script.failing_stops
            && !(sandbox && script.sandbox_stop_fails)
        {
            // Stop responses are empty messages.
            Ok(Vec::new())
        } else {
            Err((tonic::Code::Unknown, "failed to kill container: ttrpc: closed"))
        };
        (answer, delay)
    });
    asked
}

/// A CRI listener on `sock` that answers each call (by its gRPC path) as `answer` says,
/// after the delay it gives; the request itself is not read.
pub(crate) fn answering(
    sock: &std::path::Path,
    answer: impl Fn(&str) -> (Answer, Duration) + Send + Sync + 'static,
) {
    use futures::stream;
    use http_body_util::StreamBody;
    use hyper::{
        Response,
        body::{Bytes, Frame},
        service::service_fn,
    };
    let answer = Arc::new(answer);
    let listener = tokio::net::UnixListener::bind(sock).unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let answer = answer.clone();
            let serve = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let (message, delay) = answer(req.uri().path());
                let reply = Response::builder().header("content-type", "application/grpc");
                let mut frames = Vec::new();
                let reply = match message {
                    Ok(msg) => {
                        // gRPC's length-prefixed message: no compression, u32 length.
                        let mut framed = vec![0u8];
                        framed.extend(u32::try_from(msg.len()).unwrap().to_be_bytes());
                        framed.extend(msg);
                        let mut trailers = hyper::HeaderMap::new();
                        trailers.insert("grpc-status", hyper::header::HeaderValue::from_static("0"));
                        frames.push(Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(framed))));
                        frames.push(Ok(Frame::trailers(trailers)));
                        reply
                    }
                    Err((code, text)) => {
                        reply.header("grpc-status", (code as i32).to_string()).header("grpc-message", text)
                    }
                };
                async move {
                    tokio::time::sleep(delay).await;
                    reply.body(StreamBody::new(stream::iter(frames)))
                }
            });
            let http2 = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
            tokio::spawn(http2.serve_connection(TokioIo::new(stream), serve));
        }
    });
}
