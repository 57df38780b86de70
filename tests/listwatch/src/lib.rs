//! A Kubernetes API server for kpx's tests: it serves list and watch of
//! Services, EndpointSlices, Nodes and ServiceCIDRs over plain HTTP as the
//! kube client uses them (resource versions, paginated lists, watch streams
//! with bookmarks, 410 Gone for an expired resource version, label and
//! field selectors), and breaks on demand (dropped connections, 410, 500,
//! slow responses, a restart). Objects are written through [`ListWatch`]'s
//! methods, not over HTTP. README.md says what it does not implement.

mod selector;
mod store;

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::{Body, Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

pub use selector::{BadSelector, Selector};
use store::Store;
pub use store::{ENDPOINT_SLICES, Invalid, NODES, RESOURCES, Resource, SERVICE_CIDRS, SERVICES, resource_version};

/// One request as the server read it (for the RBAC check: which verbs on
/// which resources a client used).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Logged {
    /// get, list or watch (or the HTTP method for anything else).
    pub verb: String,
    /// `group/plural` ("" group for the core one), or the path when unknown.
    pub resource: String,
    pub namespace: Option<String>,
    /// The query string, decoded (`labelSelector=…&watch=true…`).
    pub query: String,
    pub status: u16,
}

/// Faults armed by the test.
#[derive(Debug, Default)]
struct Faults {
    /// The next N requests get this status.
    fail: Option<(u32, StatusCode)>,
    /// Every response waits this long first.
    delay: Duration,
    /// Lists return at most this many items per page, whatever the
    /// client's limit (0: as the client asks).
    max_page: usize,
}

struct Shared {
    store: Mutex<Store>,
    faults: Mutex<Faults>,
    log: Mutex<Vec<Logged>>,
    /// Bumped on every change: watches wake.
    changed: watch::Sender<u64>,
    /// Bumped to cut every open watch.
    cut: watch::Sender<u64>,
    bookmark_every: Duration,
}

/// A running server and its objects. The objects survive [`stop`] and
/// [`resume`], as etcd's do across an API server restart.
///
/// [`stop`]: ListWatch::stop
/// [`resume`]: ListWatch::resume
pub struct ListWatch {
    shared: Arc<Shared>,
    runtime: tokio::runtime::Runtime,
    /// Ends the accept loop and every connection of the current run.
    running: Mutex<Option<watch::Sender<bool>>>,
    addr: Mutex<SocketAddr>,
}

impl ListWatch {
    /// Serves on `listener` (bound by the caller, in whatever network
    /// namespace the client lives in). Bookmarks every second.
    pub fn start(listener: std::net::TcpListener) -> io::Result<ListWatch> {
        ListWatch::with_bookmarks(listener, Duration::from_secs(1))
    }

    pub fn with_bookmarks(listener: std::net::TcpListener, bookmark_every: Duration) -> io::Result<ListWatch> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("listwatch")
            .enable_all()
            .build()?;
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::default()),
            faults: Mutex::new(Faults::default()),
            log: Mutex::new(Vec::new()),
            changed: watch::channel(0).0,
            cut: watch::channel(0).0,
            bookmark_every,
        });
        let addr = listener.local_addr()?;
        let server = ListWatch { shared, runtime, running: Mutex::new(None), addr: Mutex::new(addr) };
        server.resume(listener)?;
        Ok(server)
    }

    /// `http://ADDRESS:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr.lock().unwrap())
    }

    /// A kubeconfig that points a client at this server.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: listwatch\n  cluster:\n    server: {}\nusers:\n- name: test\n  user: {{}}\ncontexts:\n- name: listwatch\n  context:\n    cluster: listwatch\n    user: test\ncurrent-context: listwatch\n",
            self.url()
        )
    }

    /// Stops serving: the listener closes and every connection is cut.
    pub fn stop(&self) {
        if let Some(stop) = self.running.lock().unwrap().take() {
            let _ = stop.send(true);
        }
        // Let the accept loop drop its listener before a resume binds again.
        std::thread::sleep(Duration::from_millis(50));
    }

    /// Serves again (after [`stop`](ListWatch::stop)) on a new listener.
    pub fn resume(&self, listener: std::net::TcpListener) -> io::Result<()> {
        listener.set_nonblocking(true)?;
        *self.addr.lock().unwrap() = listener.local_addr()?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let shared = self.shared.clone();
        let _guard = self.runtime.enter();
        let listener = tokio::net::TcpListener::from_std(listener)?;
        self.runtime.spawn(accept_loop(listener, shared, stop_rx));
        if let Some(old) = self.running.lock().unwrap().replace(stop_tx) {
            let _ = old.send(true);
        }
        Ok(())
    }

    /// Creates or replaces an object (JSON as kubectl would send it);
    /// returns its resource version.
    pub fn apply(&self, resource: Resource, object: Value) -> Result<u64, Invalid> {
        let rv = self.shared.store.lock().unwrap().apply(resource, object)?;
        self.shared.changed.send_replace(rv);
        Ok(rv)
    }

    /// Deletes an object; false if it did not exist.
    pub fn delete(&self, resource: Resource, namespace: &str, name: &str) -> bool {
        let rv = self.shared.store.lock().unwrap().delete(resource, namespace, name);
        if let Some(rv) = rv {
            self.shared.changed.send_replace(rv);
        }
        rv.is_some()
    }

    pub fn get(&self, resource: Resource, namespace: &str, name: &str) -> Option<Value> {
        self.shared.store.lock().unwrap().get(resource, namespace, name).cloned()
    }

    /// The current resource version.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.lock().unwrap().rv
    }

    /// Forgets the change history: a watch resumed from any earlier
    /// resource version gets 410 Gone and the client must list again.
    pub fn compact(&self) {
        self.shared.store.lock().unwrap().compact();
    }

    /// Keeps only the last `n` changes for watches to replay.
    pub fn set_history_limit(&self, n: usize) {
        self.shared.store.lock().unwrap().history_limit = n.max(1);
    }

    /// Cuts every open watch stream mid-body, as a dropped connection does.
    pub fn drop_watches(&self) {
        self.shared.cut.send_modify(|n| *n += 1);
    }

    /// The next `n` requests are answered with `status` (e.g. 500).
    pub fn fail_next(&self, n: u32, status: u16) {
        let status = StatusCode::from_u16(status).expect("an HTTP status");
        self.shared.faults.lock().unwrap().fail = Some((n, status));
    }

    /// Lists return at most `n` items per page (with a continue token for
    /// the rest), whatever limit the client sends; 0 restores the client's.
    pub fn set_max_page(&self, n: usize) {
        self.shared.faults.lock().unwrap().max_page = n;
    }

    /// Every response first waits `delay`.
    pub fn set_delay(&self, delay: Duration) {
        self.shared.faults.lock().unwrap().delay = delay;
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Logged> {
        self.shared.log.lock().unwrap().clone()
    }

    /// How many requests so far had this verb on this resource (`group/plural`).
    pub fn count(&self, verb: &str, resource: &str) -> usize {
        self.shared.log.lock().unwrap().iter().filter(|l| l.verb == verb && l.resource == resource).count()
    }
}

impl Drop for ListWatch {
    fn drop(&mut self) {
        if let Some(stop) = self.running.lock().unwrap().take() {
            let _ = stop.send(true);
        }
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        let Ok((stream, _)) = accepted else { continue };
        let (shared, mut stop) = (shared.clone(), stop.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(shared.clone(), req));
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            // Dropping the connection future closes the socket mid-stream.
            tokio::select! {
                _ = conn => {}
                _ = stop.changed() => {}
            }
        });
    }
}

type ResponseBody = BoxBody<Bytes, io::Error>;

fn full(status: StatusCode, body: Value) -> Response<ResponseBody> {
    let bytes = Bytes::from(serde_json::to_vec(&body).expect("JSON"));
    let body = http_body_util::Full::new(bytes).map_err(|never| match never {}).boxed();
    Response::builder().status(status).header("content-type", "application/json").body(body).expect("a response")
}

/// A `Status` object, as the API server reports errors.
fn status(code: StatusCode, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code.as_u16()})
}

fn error(code: StatusCode, reason: &str, message: &str) -> Response<ResponseBody> {
    full(code, status(code, reason, message))
}

/// What a path names: a resource, maybe in a namespace, maybe one object.
struct Target {
    resource: Resource,
    namespace: Option<String>,
    name: Option<String>,
}

fn route(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        _ => (None, rest),
    };
    let (plural, name) = match rest {
        [plural] => (*plural, None),
        [plural, name] => (*plural, Some(name.to_string())),
        _ => return None,
    };
    let resource = *RESOURCES.iter().find(|r| r.group == group && r.version == version && r.plural == plural)?;
    if namespace.is_some() && !resource.namespaced {
        return None;
    }
    Some(Target { resource, namespace, name })
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"), 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(req: &Request<Incoming>) -> Vec<(String, String)> {
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<ResponseBody>, Infallible> {
    let (delay, max_page) = {
        let f = shared.faults.lock().unwrap();
        (f.delay, f.max_page)
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let target = route(req.uri().path());
    let params = query(&req);
    let param = |k: &str| params.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
    let is_watch = matches!(param("watch"), Some("true" | "1"));
    let verb = match (req.method(), &target) {
        (&Method::GET, Some(t)) if t.name.is_some() => "get",
        (&Method::GET, Some(_)) if is_watch => "watch",
        (&Method::GET, Some(_)) => "list",
        (m, _) => m.as_str(),
    }
    .to_string();
    let resource = match &target {
        Some(t) => format!("{}/{}", t.resource.group, t.resource.plural),
        None => req.uri().path().to_string(),
    };
    let namespace = target.as_ref().and_then(|t| t.namespace.clone());
    let raw_query = params.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&");
    let injected = {
        let mut faults = shared.faults.lock().unwrap();
        match &mut faults.fail {
            Some((n, code)) if *n > 0 => {
                *n -= 1;
                Some(*code)
            }
            _ => None,
        }
    };
    let response = match (injected, target) {
        (Some(code), _) => error(code, "InternalError", "a fault injected by the test"),
        (None, None) => error(StatusCode::NOT_FOUND, "NotFound", "the server could not find the requested resource"),
        (None, Some(_)) if req.method() != Method::GET => {
            error(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "this server serves GET only")
        }
        (None, Some(t)) => match (
            Selector::labels(param("labelSelector").unwrap_or("")),
            Selector::fields(param("fieldSelector").unwrap_or("")),
        ) {
            (Err(BadSelector(m)), _) | (_, Err(BadSelector(m))) => error(StatusCode::BAD_REQUEST, "BadRequest", &m),
            (Ok(labels), Ok(fields)) => {
                let filter = Filter { resource: t.resource, namespace: t.namespace.clone(), labels, fields };
                if let Some(name) = &t.name {
                    get(&shared, &filter, name)
                } else if is_watch {
                    let timeout = param("timeoutSeconds").and_then(|s| s.parse().ok()).map(Duration::from_secs);
                    let bookmarks = param("allowWatchBookmarks") == Some("true");
                    if param("sendInitialEvents") == Some("true") {
                        error(
                            StatusCode::BAD_REQUEST,
                            "BadRequest",
                            "sendInitialEvents (streaming lists) is not served",
                        )
                    } else {
                        start_watch(&shared, filter, param("resourceVersion").unwrap_or(""), timeout, bookmarks)
                    }
                } else {
                    let limit: Option<usize> = param("limit").and_then(|s| s.parse().ok());
                    let limit = match (limit, max_page) {
                        (l, 0) => l,
                        (Some(l), m) if l > 0 => Some(l.min(m)),
                        (_, m) => Some(m),
                    };
                    list(&shared, &filter, limit, param("continue"))
                }
            }
        },
    };
    shared.log.lock().unwrap().push(Logged {
        verb,
        resource,
        namespace,
        query: raw_query,
        status: response.status().as_u16(),
    });
    Ok(response)
}

/// What a request selects.
struct Filter {
    resource: Resource,
    namespace: Option<String>,
    labels: Selector,
    fields: Selector,
}

impl Filter {
    fn matches(&self, object: &Value) -> bool {
        let ns = object.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("");
        self.namespace.as_deref().is_none_or(|n| n == ns)
            && self.labels.matches_labels(object)
            && self.fields.matches_fields(object)
    }
}

fn get(shared: &Shared, filter: &Filter, name: &str) -> Response<ResponseBody> {
    let store = shared.store.lock().unwrap();
    let ns = filter.namespace.as_deref().unwrap_or("");
    match store.get(filter.resource, ns, name) {
        Some(o) => full(StatusCode::OK, o.clone()),
        None => error(StatusCode::NOT_FOUND, "NotFound", &format!("{} \"{name}\" not found", filter.resource.plural)),
    }
}

fn list(shared: &Shared, filter: &Filter, limit: Option<usize>, token: Option<&str>) -> Response<ResponseBody> {
    let mut store = shared.store.lock().unwrap();
    let (rv, mut items) = match token.filter(|t| !t.is_empty()) {
        Some(t) => match store.take_pages(t) {
            Some(pages) => pages,
            None => {
                return error(
                    StatusCode::GONE,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list result.",
                );
            }
        },
        None => (
            store.rv,
            store.list(filter.resource, filter.namespace.as_deref()).filter(|o| filter.matches(o)).cloned().collect(),
        ),
    };
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(limit) = limit.filter(|&l| l > 0 && l < items.len()) {
        let rest = items.split_off(limit);
        metadata["continue"] = json!(store.keep_pages(rest));
    }
    let kind = format!("{}List", filter.resource.kind);
    full(
        StatusCode::OK,
        json!({"kind": kind, "apiVersion": filter.resource.api_version(), "metadata": metadata, "items": items}),
    )
}

/// A watch stream's body, fed by its task; an error cuts the connection.
struct Stream(mpsc::Receiver<Result<Bytes, io::Error>>);

impl Body for Stream {
    type Data = Bytes;
    type Error = io::Error;
    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.0.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data)))
    }
}

fn event(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).expect("JSON");
    line.push(b'\n');
    Bytes::from(line)
}

fn start_watch(
    shared: &Arc<Shared>,
    filter: Filter,
    from: &str,
    timeout: Option<Duration>,
    bookmarks: bool,
) -> Response<ResponseBody> {
    let (tx, rx) = mpsc::channel(256);
    let store = shared.store.lock().unwrap();
    // "" and "0": the current objects as ADDED, then changes from now.
    let (initial, start): (Vec<Value>, u64) = match from {
        "" | "0" => (
            store.list(filter.resource, filter.namespace.as_deref()).filter(|o| filter.matches(o)).cloned().collect(),
            store.rv,
        ),
        v => match v.parse::<u64>() {
            Ok(rv) => (Vec::new(), rv.min(store.rv)),
            Err(_) => {
                return error(StatusCode::BAD_REQUEST, "BadRequest", &format!("invalid resourceVersion {v:?}"));
            }
        },
    };
    drop(store);
    let shared = shared.clone();
    tokio::spawn(async move {
        let _ = feed(shared, filter, initial, start, timeout, bookmarks, tx).await;
    });
    let body = Stream(rx).boxed();
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .header("transfer-encoding", "chunked")
        .body(body)
        .expect("a response")
}

/// Writes a watch's events until the client goes, the timeout ends it,
/// the test cuts it, or its resource version is compacted away.
async fn feed(
    shared: Arc<Shared>,
    filter: Filter,
    initial: Vec<Value>,
    mut seen: u64,
    timeout: Option<Duration>,
    bookmarks: bool,
    tx: mpsc::Sender<Result<Bytes, io::Error>>,
) -> Result<(), mpsc::error::SendError<Result<Bytes, io::Error>>> {
    for o in &initial {
        tx.send(Ok(event("ADDED", o))).await?;
    }
    let mut changed = shared.changed.subscribe();
    let mut cut = shared.cut.subscribe();
    cut.mark_unchanged();
    let ends = tokio::time::Instant::now() + timeout.unwrap_or(Duration::from_secs(3600));
    let mut bookmark = tokio::time::interval(shared.bookmark_every);
    bookmark.tick().await;
    loop {
        let lines: Result<Vec<Bytes>, ()> = {
            let store = shared.store.lock().unwrap();
            match store.changes_after(seen) {
                None => Err(()),
                Some(changes) => {
                    let mut out = Vec::new();
                    for c in changes {
                        if c.resource != filter.resource {
                            continue;
                        }
                        let was = c.old.as_ref().is_some_and(|o| filter.matches(o));
                        let is = c.new.as_ref().is_some_and(|o| filter.matches(o));
                        match (was, is, &c.new) {
                            (false, true, Some(n)) => out.push(event("ADDED", n)),
                            (true, true, Some(n)) => out.push(event("MODIFIED", n)),
                            (true, false, Some(n)) => out.push(event("DELETED", n)),
                            (true, false, None) => out.push(event("DELETED", c.old.as_ref().expect("old"))),
                            _ => {}
                        }
                    }
                    // Every change up to the store's version is now seen.
                    seen = store.rv;
                    Ok(out)
                }
            }
        };
        match lines {
            Err(()) => {
                let gone = status(StatusCode::GONE, "Expired", &format!("too old resource version: {seen}"));
                tx.send(Ok(event("ERROR", &gone))).await?;
                return Ok(());
            }
            Ok(lines) => {
                for l in lines {
                    tx.send(Ok(l)).await?;
                }
            }
        }
        tokio::select! {
            _ = changed.changed() => {}
            _ = cut.changed() => {
                let _ = tx.send(Err(io::Error::new(io::ErrorKind::ConnectionReset, "cut by the test"))).await;
                return Ok(());
            }
            _ = bookmark.tick(), if bookmarks => {
                let mark = json!({"kind": filter.resource.kind, "apiVersion": filter.resource.api_version(),
                                  "metadata": {"resourceVersion": seen.to_string()}});
                tx.send(Ok(event("BOOKMARK", &mark))).await?;
            }
            _ = tokio::time::sleep_until(ends) => return Ok(()),
            _ = tx.closed() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let t = route("/api/v1/services").unwrap();
        assert_eq!((t.resource, t.namespace, t.name), (SERVICES, None, None));
        let t = route("/api/v1/namespaces/ns/services/web").unwrap();
        assert_eq!((t.resource, t.namespace.as_deref(), t.name.as_deref()), (SERVICES, Some("ns"), Some("web")));
        let t = route("/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices").unwrap();
        assert_eq!(t.resource, ENDPOINT_SLICES);
        assert_eq!(route("/apis/networking.k8s.io/v1/servicecidrs/kubernetes").unwrap().resource, SERVICE_CIDRS);
        assert!(route("/api/v1/namespaces/ns/nodes").is_none(), "nodes are cluster-scoped");
        assert!(route("/api/v1/pods").is_none());
        assert!(route("/apis/discovery.k8s.io/v1beta1/endpointslices").is_none());
    }

    #[test]
    fn decodes_queries() {
        assert_eq!(percent_decode("%21a.b%2Fc%2C%21d"), "!a.b/c,!d");
        assert_eq!(percent_decode("a+in+%28x%29"), "a in (x)");
        assert_eq!(percent_decode("50%"), "50%");
    }
}
