//! A stand-in for the Kubernetes API server. No API server can run on these machines, so
//! the tests of what evictd writes to Kubernetes use this: a local HTTP server that speaks
//! the API's JSON for the calls evictd makes (pod and node status patches, events), records
//! every request, and can be told to fail, to hold its answers, or to be down. It checks
//! nothing itself; the tests read what it recorded.

use std::{
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use http_body_util::{BodyExt as _, Full};
use hyper::{Request, Response, body::Bytes, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::watch;

/// One request as the double received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    /// Path and query.
    pub path: String,
    pub content_type: String,
    pub body: Value,
    pub at: Instant,
}

#[derive(Default)]
struct Behaviour {
    /// The next this many requests whose path contains the string get this status code.
    fail: Option<(usize, u16, String)>,
}

struct Shared {
    requests: Mutex<Vec<Recorded>>,
    behaviour: Mutex<Behaviour>,
    answered: Mutex<usize>,
}

/// The double, serving on 127.0.0.1 from a thread of its own until dropped.
pub struct ApiDouble {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// While false, requests are recorded but not answered.
    open: watch::Sender<bool>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Holds the kubeconfig naming this double.
    dir: tempfile::TempDir,
    kubeconfig: String,
}

/// A port free a moment ago, for a double that starts later ("the API server is down").
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

impl ApiDouble {
    pub fn start() -> Self {
        Self::start_on(0)
    }

    /// On `port` (0: any).
    pub fn start_on(port: u16) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("binding the API double");
        listener.set_nonblocking(true).expect("non-blocking listener");
        let addr = listener.local_addr().expect("the double's address");
        let shared = Arc::new(Shared {
            requests: Mutex::new(Vec::new()),
            behaviour: Mutex::new(Behaviour::default()),
            answered: Mutex::new(0),
        });
        let (open, opened) = watch::channel(true);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let s = shared.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(serve(listener, s, opened, stopped));
        });
        let dir = tempfile::tempdir().expect("a directory for the kubeconfig");
        let kubeconfig = kubeconfig_for(&format!("http://{addr}"), dir.path()).display().to_string();
        ApiDouble { addr, shared, open, stop: Some(stop), thread: Some(thread), dir, kubeconfig }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig naming this double (plain HTTP, no credentials).
    pub fn kubeconfig(&self) -> &str {
        debug_assert!(self.dir.path().exists());
        &self.kubeconfig
    }

    /// The next `n` requests whose path contains `path` get `code` (with a Status body); the
    /// others, and the ones after, are answered normally.
    pub fn fail_next(&self, n: usize, code: u16, path: &str) {
        self.shared.behaviour.lock().expect("behaviour").fail = Some((n, code, path.into()));
    }

    /// Holds every answer (requests are still recorded) until `release`.
    pub fn hold(&self) {
        self.open.send_replace(false);
    }

    pub fn release(&self) {
        self.open.send_replace(true);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().expect("requests").clone()
    }

    /// Requests answered so far (held ones are not).
    pub fn answered(&self) -> usize {
        *self.shared.answered.lock().expect("answered")
    }

    /// Waits until the recorded requests satisfy `pred`; panics naming `what` and listing the
    /// requests when they do not within `within`.
    pub fn wait_for(
        &self,
        what: &str,
        within: Duration,
        pred: impl Fn(&[Recorded]) -> bool,
    ) -> Vec<Recorded> {
        let t = Instant::now();
        loop {
            let r = self.requests();
            if pred(&r) {
                return r;
            }
            if t.elapsed() > within {
                let seen: Vec<String> = r.iter().map(|r| format!("{} {}", r.method, r.path)).collect();
                panic!("the API double never saw {what} within {within:?}; it saw {seen:#?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for ApiDouble {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.open.send_replace(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A kubeconfig for a plain-HTTP API server at `url`, written into `dir`.
pub fn kubeconfig_for(url: &str, dir: &Path) -> PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: double\n  cluster:\n    server: {url}\n\
         users:\n- name: evictd\n  user: {{}}\ncontexts:\n- name: double\n  context:\n    cluster: double\n    user: evictd\n\
         current-context: double\n"
    );
    std::fs::write(&path, text).expect("writing the kubeconfig");
    path
}

async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    opened: watch::Receiver<bool>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    loop {
        let stream = tokio::select! {
            _ = &mut stopped => return,
            a = listener.accept() => match a {
                Ok((s, _)) => s,
                Err(_) => continue,
            },
        };
        let (shared, opened) = (shared.clone(), opened.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req| answer(req, shared.clone(), opened.clone()));
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

async fn answer(
    req: Request<hyper::body::Incoming>,
    shared: Arc<Shared>,
    mut opened: watch::Receiver<bool>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let method = req.method().to_string();
    let path = req.uri().path_and_query().map_or_else(|| req.uri().path().to_string(), |p| p.to_string());
    let content_type =
        req.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let bytes = req.into_body().collect().await?.to_bytes();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    shared.requests.lock().expect("requests").push(Recorded {
        method,
        path: path.clone(),
        content_type,
        body: body.clone(),
        at: Instant::now(),
    });
    let _ = opened.wait_for(|o| *o).await;
    let fail = {
        let mut b = shared.behaviour.lock().expect("behaviour");
        match b.fail.take() {
            Some((n, code, p)) if n > 0 && path.contains(&p) => {
                b.fail = (n > 1).then_some((n - 1, code, p));
                Some(code)
            }
            other => {
                b.fail = other;
                None
            }
        }
    };
    *shared.answered.lock().expect("answered") += 1;
    let (code, out) = match fail {
        Some(code) => (
            code,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                   "message": "injected by the test's API double", "reason": "InternalError", "code": code}),
        ),
        None => (200, object_for(&path, body)),
    };
    Ok(Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(out.to_string())))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()))))
}

/// What the API server would answer a successful call with: the object, as far as the
/// client reads it.
fn object_for(path: &str, body: Value) -> Value {
    let path = path.split('?').next().unwrap_or(path);
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        ["api", "v1", "namespaces", ns, "pods", name, ..] => {
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}})
        }
        ["api", "v1", "nodes", name, ..] => {
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        }
        ["api", "v1", "namespaces", _, "events"] => {
            let mut e = body;
            e["apiVersion"] = json!("v1");
            e["kind"] = json!("Event");
            e
        }
        _ => json!({}),
    }
}
