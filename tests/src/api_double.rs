//! A stand-in for the Kubernetes API server. No API server can run on these machines, so
//! the tests of what evictd reads from and writes to Kubernetes use this: a local HTTP server
//! that speaks the API's JSON for the calls evictd makes (the list and watch of a node's
//! pods, pod and node status patches, events, the get and merge patch of a Node, the get of
//! a pod and its status patch applied to the pods it holds), records
//! every request, and can be told to fail, to hold its answers, or to be down. It checks
//! nothing itself but what the API server would (a merge patch's resource version); the
//! tests read what it recorded. It speaks plain HTTP, or (`start_tls`) HTTPS with a
//! certificate from a CA of its own that its kubeconfig names, and a bearer token, as a
//! real cluster's kubeconfig and service account do.

use std::{
    collections::BTreeMap,
    convert::Infallible,
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use http_body_util::{BodyExt as _, Full, channel::Channel, combinators::BoxBody};
use hyper::{Request, Response, body::Bytes, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// One request as the double received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    /// Path and query.
    pub path: String,
    pub content_type: String,
    /// The `Authorization` header ("" without one).
    pub authorization: String,
    pub body: Value,
    pub at: Instant,
}

#[derive(Default)]
struct Behaviour {
    /// The next this many requests whose path contains the string get this status code.
    fail: Option<(usize, u16, String)>,
    /// Put in place of its Node right after the next get of that Node is answered: another
    /// writer between evictd's read and its write.
    after_node_get: Option<Value>,
}

/// The pods the double serves, with the history a watch replays from a resource version.
#[derive(Default)]
struct PodStore {
    /// The last resource version handed out.
    rv: u64,
    /// By uid.
    pods: BTreeMap<String, Value>,
    /// (resource version, watch event type, object), oldest first.
    events: Vec<(u64, &'static str, Value)>,
}

struct Shared {
    requests: Mutex<Vec<Recorded>>,
    behaviour: Mutex<Behaviour>,
    answered: Mutex<usize>,
    /// TLS handshakes that failed (with `start_tls`): a client that refused the certificate.
    handshakes_failed: Mutex<usize>,
    pods: Mutex<PodStore>,
    /// The store's resource version, for the watches waiting on it.
    pods_rv: watch::Sender<u64>,
    /// Nodes by name, for get and merge patch.
    nodes: Mutex<BTreeMap<String, Value>>,
}

/// The double, serving on 127.0.0.1 from a thread of its own until dropped.
pub struct ApiDouble {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// While false, requests are recorded but not answered.
    open: watch::Sender<bool>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    tls: Option<Tls>,
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
        Self::serve(port, None)
    }

    /// Over TLS: a certificate for 127.0.0.1 signed by a CA made for this double; its
    /// kubeconfig names that CA and the bearer token `API_TOKEN`.
    pub fn start_tls() -> Self {
        Self::serve(0, Some(Tls::new()))
    }

    fn serve(port: u16, tls: Option<Tls>) -> Self {
        let shared = Arc::new(Shared {
            requests: Mutex::new(Vec::new()),
            behaviour: Mutex::new(Behaviour::default()),
            answered: Mutex::new(0),
            handshakes_failed: Mutex::new(0),
            pods: Mutex::new(PodStore::default()),
            pods_rv: watch::channel(0).0,
            nodes: Mutex::new(BTreeMap::new()),
        });
        let (open, _) = watch::channel(true);
        let acceptor = tls.as_ref().map(|t| t.acceptor.clone());
        let (addr, stop, thread) = serve_on(("127.0.0.1", port), &shared, &open, acceptor);
        let dir = tempfile::tempdir().expect("a directory for the kubeconfig");
        let kubeconfig = match &tls {
            Some(t) => kubeconfig_tls(&format!("https://{addr}"), &t.ca_pem, API_TOKEN, dir.path()),
            None => kubeconfig_for(&format!("http://{addr}"), dir.path()),
        };
        let kubeconfig = kubeconfig.display().to_string();
        ApiDouble { addr, shared, open, stop: Some(stop), thread: Some(thread), tls, dir, kubeconfig }
    }

    /// The PEM of the CA that signed the double's certificate (with `start_tls`).
    pub fn ca_pem(&self) -> Option<&str> {
        self.tls.as_ref().map(|t| t.ca_pem.as_str())
    }

    /// Stops serving, as an API server that goes down: its open connections (watches
    /// included) are closed and new ones refused, until `come_back`. What it holds is kept,
    /// as etcd keeps it.
    pub fn go_down(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Serves again on the same address, with what it held.
    pub fn come_back(&mut self) {
        if self.thread.is_some() {
            return;
        }
        let acceptor = self.tls.as_ref().map(|t| t.acceptor.clone());
        let (_, stop, thread) = serve_on(self.addr, &self.shared, &self.open, acceptor);
        (self.stop, self.thread) = (Some(stop), Some(thread));
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// A kubeconfig naming this double (plain HTTP and no credentials, or its CA and token).
    pub fn kubeconfig(&self) -> &str {
        debug_assert!(self.dir.path().exists());
        &self.kubeconfig
    }

    /// The next `n` requests whose path (or "METHOD path") contains `path` get `code` (with a
    /// Status body); the others, and the ones after, are answered normally.
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

    /// Adds or replaces a pod (by `metadata.uid`) in what the double serves; open watches see
    /// it at once. The pod needs `metadata.uid` and, to be seen by a node, `spec.nodeName`.
    pub fn put_pod(&self, mut pod: Value) {
        let mut store = self.shared.pods.lock().expect("pods");
        store.rv += 1;
        let rv = store.rv;
        pod["metadata"]["resourceVersion"] = json!(rv.to_string());
        let uid = pod["metadata"]["uid"].as_str().expect("a pod with metadata.uid").to_owned();
        let kind = if store.pods.insert(uid, pod.clone()).is_some() { "MODIFIED" } else { "ADDED" };
        store.events.push((rv, kind, pod));
        drop(store);
        self.shared.pods_rv.send_replace(rv);
    }

    /// Removes the pod with `uid`; open watches see it deleted.
    pub fn delete_pod(&self, uid: &str) {
        let mut store = self.shared.pods.lock().expect("pods");
        let Some(mut pod) = store.pods.remove(uid) else { return };
        store.rv += 1;
        let rv = store.rv;
        pod["metadata"]["resourceVersion"] = json!(rv.to_string());
        store.events.push((rv, "DELETED", pod));
        drop(store);
        self.shared.pods_rv.send_replace(rv);
    }

    /// Adds or replaces the Node named by `metadata.name`, with a new resource version.
    pub fn put_node(&self, mut node: Value) {
        let mut nodes = self.shared.nodes.lock().expect("nodes");
        let name = node["metadata"]["name"].as_str().expect("a node with metadata.name").to_owned();
        let rv = nodes.get(&name).map_or(0, resource_version) + 1;
        node["metadata"]["resourceVersion"] = json!(rv.to_string());
        nodes.insert(name, node);
    }

    /// Right after the next get of the Node `node` names is answered, `node` replaces it
    /// (with a new resource version): a write by somebody else between evictd's read and
    /// its write.
    pub fn after_next_node_get(&self, node: Value) {
        self.shared.behaviour.lock().expect("behaviour").after_node_get = Some(node);
    }

    /// The Node `name` as the double holds it now.
    pub fn node(&self, name: &str) -> Option<Value> {
        self.shared.nodes.lock().expect("nodes").get(name).cloned()
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().expect("requests").clone()
    }

    /// TLS handshakes a client ended (with `start_tls`): it did not trust the certificate.
    pub fn handshakes_failed(&self) -> usize {
        *self.shared.handshakes_failed.lock().expect("handshakes")
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
        let within = crate::patience::patience(within);
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
        self.open.send_replace(true);
        self.go_down();
    }
}

/// The TLS double's server side, and the CA its kubeconfig names.
struct Tls {
    acceptor: TlsAcceptor,
    ca_pem: String,
}

impl Tls {
    /// A CA made for this double, and a certificate it signed for 127.0.0.1, served with
    /// rustls on ring (kube-rs's client side uses the same).
    fn new() -> Self {
        use tokio_rustls::rustls::{ServerConfig, crypto::ring, pki_types::PrivatePkcs8KeyDer};
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name.push(rcgen::DnType::CommonName, "evictd test CA");
        let ca_key = rcgen::KeyPair::generate().expect("the CA's key");
        let ca = rcgen::CertifiedIssuer::self_signed(ca, ca_key).expect("the CA's certificate");
        let key = rcgen::KeyPair::generate().expect("the server's key");
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .and_then(|p| p.signed_by(&key, &*ca))
            .expect("the server's certificate");
        let config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], PrivatePkcs8KeyDer::from(key.serialize_der()).into())
            .expect("the server's TLS configuration");
        Tls { acceptor: TlsAcceptor::from(Arc::new(config)), ca_pem: ca.pem() }
    }
}

/// Serves `shared` on `addr` from a thread of its own, until the returned sender fires (or
/// is dropped); the thread's runtime ends with it, closing every connection it served.
fn serve_on(
    addr: impl std::net::ToSocketAddrs,
    shared: &Arc<Shared>,
    open: &watch::Sender<bool>,
    tls: Option<TlsAcceptor>,
) -> (SocketAddr, tokio::sync::oneshot::Sender<()>, std::thread::JoinHandle<()>) {
    // Coming back on its old port, which a client's outgoing socket may hold for a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    let listener = loop {
        match TcpListener::bind(&addr) {
            Ok(l) => break l,
            Err(e) if Instant::now() < deadline && e.kind() == std::io::ErrorKind::AddrInUse => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("binding the API double: {e}"),
        }
    };
    listener.set_nonblocking(true).expect("non-blocking listener");
    let addr = listener.local_addr().expect("the double's address");
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let (s, opened) = (shared.clone(), open.subscribe());
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(serve(listener, s, opened, stopped, tls));
    });
    (addr, stop, thread)
}

/// evictd's API options for the server `kubeconfig` names, as node `node-a`, with a 2 s
/// request deadline.
pub fn api_options(kubeconfig: &str) -> evictd::cluster::connect::ApiOptions {
    evictd::cluster::connect::ApiOptions {
        source: evictd::cluster::connect::ApiSource::kubeconfig(Path::new(kubeconfig))
            .expect("the double's kubeconfig"),
        node_name: "node-a".into(),
        timeout: Duration::from_secs(2),
        taint_effect: Default::default(),
    }
}

/// The bearer token the TLS double's kubeconfig carries.
pub const API_TOKEN: &str = "evictd-test-token";

/// A kubeconfig for an HTTPS API server at `url` whose certificate `ca_pem` signed, with a
/// bearer token, written into `dir`.
pub fn kubeconfig_tls(url: &str, ca_pem: &str, token: &str, dir: &Path) -> PathBuf {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: double\n  cluster:\n    server: {url}\n\
         \x20   certificate-authority-data: {ca}\n\
         users:\n- name: evictd\n  user:\n    token: {token}\ncontexts:\n- name: double\n  context:\n    cluster: double\n    user: evictd\n\
         current-context: double\n"
    );
    std::fs::write(&path, text).expect("writing the kubeconfig");
    path
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
    tls: Option<TlsAcceptor>,
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
        let (shared, opened, tls) = (shared.clone(), opened.clone(), tls.clone());
        tokio::spawn(async move {
            let failed = shared.clone();
            let service = service_fn(move |req| answer(req, shared.clone(), opened.clone()));
            match tls {
                // A client that does not trust the certificate ends the handshake: no request.
                Some(tls) => match tls.accept(stream).await {
                    Ok(stream) => {
                        let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                    }
                    Err(_) => *failed.handshakes_failed.lock().expect("handshakes") += 1,
                },
                None => {
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                }
            }
        });
    }
}

async fn answer(
    req: Request<hyper::body::Incoming>,
    shared: Arc<Shared>,
    mut opened: watch::Receiver<bool>,
) -> Result<Response<BoxBody<Bytes, Infallible>>, hyper::Error> {
    let method = req.method().to_string();
    let path = req.uri().path_and_query().map_or_else(|| req.uri().path().to_string(), |p| p.to_string());
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let (content_type, authorization) = (header("content-type"), header("authorization"));
    let bytes = req.into_body().collect().await?.to_bytes();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    shared.requests.lock().expect("requests").push(Recorded {
        method: method.clone(),
        path: path.clone(),
        content_type: content_type.clone(),
        authorization,
        body: body.clone(),
        at: Instant::now(),
    });
    let _ = opened.wait_for(|o| *o).await;
    let fail = {
        let mut b = shared.behaviour.lock().expect("behaviour");
        match b.fail.take() {
            Some((n, code, p)) if n > 0 && format!("{method} {path}").contains(&p) => {
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
        Some(code) => status(code, "InternalError", "injected by the test's API double"),
        None if path.starts_with("/api/v1/pods?") && query(&path, "watch").is_some() => {
            return Ok(json_response(200, watch_pods(&shared, &path)));
        }
        None if path.starts_with("/api/v1/pods?") => (200, list_pods(&shared, &path)),
        None if node_path(&path).is_some() => node_call(&shared, &method, &content_type, &path, body),
        None if stored_pod_call(&shared, &path).is_some() => pod_call(&shared, &method, &path, body),
        None => (200, object_for(&path, body)),
    };
    Ok(json_response(code, Full::new(Bytes::from(out.to_string())).boxed()))
}

fn json_response(code: u16, body: BoxBody<Bytes, Infallible>) -> Response<BoxBody<Bytes, Infallible>> {
    let mut r = Response::new(body);
    r.headers_mut().insert("content-type", hyper::header::HeaderValue::from_static("application/json"));
    *r.status_mut() = hyper::StatusCode::from_u16(code).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    r
}

/// A query parameter's value, percent-decoded as far as the API's selectors need.
fn query(path: &str, key: &str) -> Option<String> {
    let q = path.split_once('?')?.1;
    q.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == key).then(|| v.replace("%3D", "=").replace("%2C", ","))
    })
}

/// The pods a `fieldSelector=spec.nodeName=<node>` selects (all, without a selector).
fn selected(path: &str, pod: &Value) -> bool {
    match query(path, "fieldSelector").as_deref().and_then(|f| f.strip_prefix("spec.nodeName=")) {
        Some(node) => pod["spec"]["nodeName"] == node,
        None => true,
    }
}

fn list_pods(shared: &Shared, path: &str) -> Value {
    let store = shared.pods.lock().expect("pods");
    let items: Vec<&Value> = store.pods.values().filter(|p| selected(path, p)).collect();
    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": store.rv.to_string()},
           "items": items})
}

/// A watch: the events after the requested resource version, then each new one as it comes,
/// one JSON object per line, for as long as the client stays.
fn watch_pods(shared: &Arc<Shared>, path: &str) -> BoxBody<Bytes, Infallible> {
    let mut from: u64 = query(path, "resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
    let (mut tx, body) = Channel::<Bytes, Infallible>::new(16);
    let (shared, path) = (shared.clone(), path.to_owned());
    tokio::spawn(async move {
        let mut changed = shared.pods_rv.subscribe();
        loop {
            let lines: Vec<(u64, String)> = {
                let store = shared.pods.lock().expect("pods");
                store
                    .events
                    .iter()
                    .filter(|(rv, _, p)| *rv > from && selected(&path, p))
                    .map(|(rv, kind, p)| (*rv, format!("{}\n", json!({"type": kind, "object": p}))))
                    .collect()
            };
            for (rv, line) in lines {
                if tx.send_data(Bytes::from(line)).await.is_err() {
                    return;
                }
                from = rv;
            }
            if changed.changed().await.is_err() {
                return;
            }
        }
    });
    body.boxed()
}

/// The node a `GET` or `PATCH /api/v1/nodes/<name>` names (not its status).
fn node_path(path: &str) -> Option<&str> {
    let path = path.split('?').next().unwrap_or(path);
    let name = path.strip_prefix("/api/v1/nodes/")?;
    (!name.is_empty() && !name.contains('/')).then_some(name)
}

fn resource_version(object: &Value) -> u64 {
    object["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn status(code: u16, reason: &str, message: &str) -> (u16, Value) {
    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                      "message": message, "reason": reason, "code": code});
    (code, body)
}

/// A Node's get, or its patch as the API server applies one: a JSON merge patch (RFC 7386)
/// whose `metadata.resourceVersion` is not the Node's is a 409 Conflict; a JSON patch
/// (RFC 6902) whose `test` fails is a 422.
fn node_call(shared: &Shared, method: &str, content_type: &str, path: &str, patch: Value) -> (u16, Value) {
    let name = node_path(path).unwrap_or_default();
    let mut nodes = shared.nodes.lock().expect("nodes");
    let Some(node) = nodes.get_mut(name) else {
        return status(404, "NotFound", &format!("nodes \"{name}\" not found"));
    };
    if method == "GET" {
        let answer = node.clone();
        let swap = shared.behaviour.lock().expect("behaviour").after_node_get.take();
        if let Some(mut next) = swap {
            next["metadata"]["resourceVersion"] = json!((resource_version(node) + 1).to_string());
            *node = next;
        }
        return (200, answer);
    }
    let rv = resource_version(node);
    if content_type == "application/json-patch+json" {
        let mut next = node.clone();
        for op in patch.as_array().cloned().unwrap_or_default() {
            let (path, value) = (op["path"].as_str().unwrap_or_default(), op["value"].clone());
            match op["op"].as_str() {
                Some("test") if next.pointer(path) != Some(&value) => {
                    return status(422, "Invalid", &format!("testing value {path} failed"));
                }
                Some("test") => {}
                Some("replace" | "add") => match next.pointer_mut(path) {
                    Some(v) => *v = value,
                    None => {
                        return status(
                            422,
                            "Invalid",
                            &format!("{path}: no such member (the double adds none)"),
                        );
                    }
                },
                other => return status(422, "Invalid", &format!("op {other:?}: not one the double knows")),
            }
        }
        *node = next;
        node["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
        return (200, node.clone());
    }
    if patch["metadata"]["resourceVersion"].as_str().is_some_and(|v| v != rv.to_string()) {
        let message = "Operation cannot be fulfilled on nodes: the object has been modified";
        return status(409, "Conflict", message);
    }
    merge(node, &patch);
    node["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
    (200, node.clone())
}

/// The namespace and name a `/api/v1/namespaces/<ns>/pods/<name>[/status]` names, when the
/// double holds such a pod (calls on pods it does not hold get the plain answer below).
fn stored_pod_call(shared: &Shared, path: &str) -> Option<(String, String)> {
    let path = path.split('?').next().unwrap_or(path);
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (ns, name) = match parts.as_slice() {
        ["api", "v1", "namespaces", ns, "pods", name]
        | ["api", "v1", "namespaces", ns, "pods", name, "status"] => (*ns, *name),
        _ => return None,
    };
    let store = shared.pods.lock().expect("pods");
    let held = store.pods.values().any(|p| p["metadata"]["namespace"] == ns && p["metadata"]["name"] == name);
    held.then(|| (ns.to_owned(), name.to_owned()))
}

/// A held pod's get, or its status patch applied as the API server applies a strategic
/// merge of `status`: conditions merged by `type`, the rest replaced field by field; a
/// `metadata.uid` in the patch that is not the pod's is a 409. Watches see the change.
fn pod_call(shared: &Arc<Shared>, method: &str, path: &str, patch: Value) -> (u16, Value) {
    let Some((ns, name)) = stored_pod_call(shared, path) else {
        return status(404, "NotFound", "no such pod");
    };
    let mut store = shared.pods.lock().expect("pods");
    let Some(pod) = store
        .pods
        .values_mut()
        .find(|p| p["metadata"]["namespace"] == ns.as_str() && p["metadata"]["name"] == name.as_str())
    else {
        return status(404, "NotFound", "no such pod");
    };
    if method == "GET" {
        return (200, pod.clone());
    }
    if patch["metadata"]["uid"].as_str().is_some_and(|u| pod["metadata"]["uid"] != u) {
        return status(409, "Conflict", "Precondition failed: UID in precondition does not match the pod's");
    }
    let mut status_patch = patch["status"].clone();
    if let Some(conditions) = status_patch.as_object_mut().and_then(|s| s.remove("conditions")) {
        let list = pod["status"]["conditions"].as_array().cloned().unwrap_or_default();
        let mut merged: Vec<Value> = list;
        for c in conditions.as_array().cloned().unwrap_or_default() {
            match merged.iter_mut().find(|m| m["type"] == c["type"]) {
                Some(m) => merge(m, &c),
                None => merged.push(c),
            }
        }
        pod["status"]["conditions"] = Value::Array(merged);
    }
    merge(&mut pod["status"], &status_patch);
    let pod = pod.clone();
    store.rv += 1;
    let rv = store.rv;
    let mut pod = pod;
    pod["metadata"]["resourceVersion"] = json!(rv.to_string());
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
    store.pods.insert(uid, pod.clone());
    store.events.push((rv, "MODIFIED", pod.clone()));
    drop(store);
    shared.pods_rv.send_replace(rv);
    (200, pod)
}

impl ApiDouble {
    /// A pod the double holds, by uid (as the API server holds it now).
    pub fn pod(&self, uid: &str) -> Option<Value> {
        self.shared.pods.lock().expect("pods").pods.get(uid).cloned()
    }
}

/// RFC 7386: objects merge key by key, `null` removes, anything else replaces.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    for (k, v) in p {
        match (v, target.as_object_mut()) {
            (Value::Null, Some(t)) => drop(t.remove(k)),
            (_, Some(t)) => merge(t.entry(k.clone()).or_insert(Value::Null), v),
            (_, None) => {}
        }
    }
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

/// An eviction of `shop/web-1` for memory, as the act step hands it to the reporter.
pub fn eviction_record() -> evictd::vocab::EvictionRecord {
    use std::collections::BTreeMap;

    use evictd_policy::policy::Signal;

    evictd::vocab::EvictionRecord {
        namespace: "shop".into(),
        name: "web-1".into(),
        uid: "6f1d7c1e-0000-4000-8000-000000000001".into(),
        signal: evictd::vocab::EvictionCause::Signal(Signal::MemoryAvailable),
        available: 50 << 20,
        threshold: 100 << 20,
        grace_period_seconds: 1,
        message: "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. ".into(),
        annotations: BTreeMap::from([
            ("offending_containers".into(), "app".into()),
            ("offending_containers_usage".into(), "600Mi".into()),
            ("starved_resource".into(), "memory".into()),
        ]),
        dry_run: false,
        error: None,
        decide_us: 10,
        pods_read: None,
        phases: None,
        wake_cause: None,
        wake_kernel_ts_ns: None,
        wake_received_ns: None,
        observed_ns: 0,
        decided_ns: 0,
        released_ns: None,
    }
}
