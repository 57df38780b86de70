//! A small HTTP/1.1 server on hyper for kpx's endpoints: each request is
//! answered by a plain function of its path.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use tokio::sync::{Semaphore, watch};

/// What one server allows its clients, so that no client, idle, slow or
/// many-connectioned, keeps others (a kubelet's probe, a load balancer's
/// health check) from an answer. Every connection is accepted at once
/// (none waits in the kernel's backlog for a slot); one over a limit is
/// closed as soon as it is accepted.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections held at once, all clients together.
    pub connections: usize,
    /// Connections one client address (an IPv6 one by its /64) holds at
    /// once, so that one client cannot take every slot. Clients from
    /// 127.0.0.1 and ::1 count against neither limit.
    pub per_client: usize,
    /// A request head must arrive within this from the connection's start
    /// or the end of its last answer (an idle or trickling client is cut
    /// off; probes send their request at once).
    pub header: Duration,
    /// A write that makes no progress for this long ends the connection
    /// (a client that sends requests and never reads the answers).
    pub write: Duration,
}

/// kpx's servers' limits.
pub const LIMITS: Limits =
    Limits { connections: 1024, per_client: 16, header: Duration::from_secs(3), write: Duration::from_secs(10) };

/// Binds as Go's `net.Listen("tcp", …)` does: an unspecified address
/// (`0.0.0.0` or `::`) gets one dual-stack socket, so IPv4 and IPv6
/// clients both reach it; IPv4 alone where the node has no IPv6.
pub fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    if addr.ip().is_unspecified() {
        let dual = (|| -> std::io::Result<std::net::TcpListener> {
            let s = Socket::new(Domain::IPV6, Type::STREAM, None)?;
            s.set_only_v6(false)?;
            s.set_reuse_address(true)?;
            s.bind(&SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), addr.port()).into())?;
            s.listen(1024)?;
            Ok(s.into())
        })();
        match dual {
            Ok(l) => return finish(l),
            Err(e) if addr.is_ipv6() => return Err(e),
            Err(_) => {}
        }
    }
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    finish(s.into())
}

fn finish(l: std::net::TcpListener) -> std::io::Result<std::net::TcpListener> {
    l.set_nonblocking(true)?;
    Ok(l)
}

/// One answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub content_type: &'static str,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

impl Answer {
    pub fn json(status: u16, body: String) -> Answer {
        Answer {
            status,
            content_type: "application/json",
            headers: vec![("X-Content-Type-Options", "nosniff".into())],
            body,
        }
    }

    pub fn text(status: u16, body: String) -> Answer {
        Answer { status, content_type: "text/plain; charset=utf-8", headers: Vec::new(), body }
    }

    pub fn not_found() -> Answer {
        Answer::text(404, "404 page not found\n".into())
    }
}

/// What a request asks for: its path, and the media types it accepts.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    pub path: &'a str,
    pub accept: Option<&'a str>,
}

pub type Handler = Arc<dyn Fn(&Asked) -> Answer + Send + Sync>;

fn respond(a: Answer) -> Response<Full<Bytes>> {
    let mut b = Response::builder().status(a.status).header("Content-Type", a.content_type);
    for (k, v) in a.headers {
        b = b.header(k, v);
    }
    b.body(Full::new(Bytes::from(a.body))).expect("a valid response")
}

/// Serves `listener` until `stop` turns true (or its sender is gone),
/// within [`LIMITS`]; a failing accept (out of file descriptors) backs off.
pub async fn serve(listener: tokio::net::TcpListener, handler: Handler, stop: watch::Receiver<bool>) {
    serve_within(listener, handler, stop, LIMITS).await
}

/// Who a connection counts against: its address, an IPv6 one by its /64
/// (one host's, as a provider hands them out: a client cannot take a
/// share per address of its prefix).
fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

/// The connections each client address holds; a [`Held`] gives its one back.
type PerClient = Arc<Mutex<HashMap<IpAddr, usize>>>;

struct Held(PerClient, IpAddr);

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.0.lock().expect("per-client lock");
        if let Some(n) = held.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.1);
            }
        }
    }
}

/// [`serve`] within `limits`.
pub async fn serve_within(
    listener: tokio::net::TcpListener,
    handler: Handler,
    mut stop: watch::Receiver<bool>,
    limits: Limits,
) {
    let slots = Arc::new(Semaphore::new(limits.connections));
    let per_client: PerClient = Arc::default();
    let mut backoff = Duration::from_millis(5);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => {
                backoff = Duration::from_millis(5);
                accepted
            }
            Err(e) => {
                tracing::warn!("accepting a connection failed, retrying in {backoff:?}: {e}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        // (An IPv4 client of a dual-stack socket is ::ffff:a.b.c.d.)
        let client = client_key(peer.ip());
        // The node's own probes (from 127.0.0.1 or ::1: a local check, a
        // kubelet's exec) are never closed for others' connections.
        let local = peer.ip().to_canonical();
        let (slot, held) = if local == IpAddr::from([127, 0, 0, 1]) || local == IpAddr::V6(Ipv6Addr::LOCALHOST) {
            (None, None)
        } else {
            // Over the limit of all clients: closed at once (dropped).
            let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
            let mut held = per_client.lock().expect("per-client lock");
            let n = held.entry(client).or_insert(0);
            if *n >= limits.per_client {
                // Closed at once; the slot goes back with `slot`.
                continue;
            }
            *n += 1;
            (Some(slot), Some(Held(per_client.clone(), client)))
        };
        let mut io = tokio_io_timeout::TimeoutStream::new(stream);
        io.set_write_timeout(Some(limits.write));
        let handler = handler.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let (_slot, _held) = (slot, held);
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let accept = req.headers().get(hyper::header::ACCEPT).and_then(|v| v.to_str().ok());
                let answer = handler(&Asked { path: req.uri().path(), accept });
                async move { Ok::<_, Infallible>(respond(answer)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header)
                .serve_connection(hyper_util::rt::TokioIo::new(Box::pin(io)), service);
            tokio::select! {
                _ = conn => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Instant;

    const BIG: usize = 1 << 20;

    /// A client socket from `from` (any 127.0.0.0/8 address) to `to`.
    fn connect(from: &str, to: SocketAddr) -> TcpStream {
        use socket2::{Domain, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        s.bind(&SocketAddr::new(from.parse().unwrap(), 0).into()).unwrap();
        s.connect(&to.into()).unwrap();
        s.into()
    }

    fn get(to: SocketAddr) -> Option<Duration> {
        let t0 = Instant::now();
        let mut s = connect("127.0.0.1", to);
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        text.starts_with("HTTP/1.1 200").then(|| t0.elapsed())
    }

    /// A server on 127.0.0.1 within `limits`, in a runtime of its own:
    /// `/big` answers 1 MiB, anything else "ok".
    fn server(limits: Limits) -> (tokio::runtime::Runtime, SocketAddr, watch::Sender<bool>) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (addr, stop) = rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let handler: Handler = Arc::new(|a: &Asked| match a.path {
                "/big" => Answer::text(200, "x".repeat(BIG)),
                _ => Answer::text(200, "ok".into()),
            });
            let (tx, rx) = watch::channel(false);
            tokio::spawn(serve_within(listener, handler, rx, limits));
            (addr, tx)
        });
        (rt, addr, stop)
    }

    /// Idle clients, a client over its share of connections and a client
    /// that never reads its answers: a probe from elsewhere is answered at
    /// once all along, and the stalled writer is cut off.
    #[test]
    fn idle_greedy_and_unread_clients_do_not_starve_a_probe() {
        let limits =
            Limits { connections: 8, per_client: 4, header: Duration::from_secs(5), write: Duration::from_secs(1) };
        let (_rt, addr, _stop) = server(limits);
        // Ten idle connections from one address: it keeps four slots, the
        // rest are closed as accepted.
        let idle: Vec<TcpStream> = (0..10).map(|_| connect("127.0.0.2", addr)).collect();
        let mut closed = 0;
        for mut s in idle.iter().skip(4) {
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            if matches!(s.read(&mut [0u8; 1]), Ok(0)) {
                closed += 1;
            }
        }
        assert_eq!(closed, 6, "a client's connections over its share are closed");
        let took = get(addr).expect("a probe beside idle clients is answered");
        assert!(took < Duration::from_millis(500), "{took:?}");
        // A client that asks for 64 MiB and reads nothing.
        let mut unread = connect("127.0.0.3", addr);
        for _ in 0..64 {
            unread.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        }
        std::thread::sleep(Duration::from_secs(3));
        let took = get(addr).expect("a probe beside a stalled reader is answered");
        assert!(took < Duration::from_millis(500), "{took:?}");
        unread.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = 0;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match unread.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    panic!("the stalled connection was neither served nor closed ({got} bytes)")
                }
                // Reset: closed with answers unread.
                Err(_) => break,
            }
        }
        assert!(got < 8 * BIG, "the stalled connection was cut off, not served on: {got} bytes");
        drop(idle);
    }

    #[test]
    fn ipv6_clients_count_by_their_64_and_ipv4_by_address() {
        let a = client_key("2001:db8:1:2:aaaa::1".parse().unwrap());
        assert_eq!(a, client_key("2001:db8:1:2:ffff::9".parse().unwrap()));
        assert_ne!(a, client_key("2001:db8:1:3::1".parse().unwrap()));
        assert_eq!(client_key("::ffff:10.0.0.1".parse().unwrap()), "10.0.0.1".parse::<IpAddr>().unwrap());
    }

    /// Over the limit of all clients, a connection is closed as accepted
    /// (never left waiting in the backlog), and a head that trickles in is
    /// cut off at the header deadline, whatever it has sent.
    #[test]
    fn over_the_limit_is_closed_at_once_and_trickling_heads_are_cut_off() {
        let limits =
            Limits { connections: 4, per_client: 2, header: Duration::from_secs(1), write: Duration::from_secs(1) };
        let (_rt, addr, _stop) = server(limits);
        let held: Vec<TcpStream> =
            ["127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"].iter().map(|a| connect(a, addr)).collect();
        std::thread::sleep(Duration::from_millis(100));
        let t0 = Instant::now();
        let mut over = connect("127.0.0.4", addr);
        over.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(matches!(over.read(&mut [0u8; 1]), Ok(0) | Err(_)), "closed");
        assert!(t0.elapsed() < Duration::from_millis(500), "closed at once, not held: {:?}", t0.elapsed());
        // Loopback (127.0.0.1, the probes' own address here) is still served.
        let took = get(addr).expect("a loopback probe beside a full server is answered");
        assert!(took < Duration::from_millis(500), "{took:?}");
        // The four held ones trickle a byte every 200 ms: all cut off at
        // the 1 s deadline, and the slots are free again.
        let t0 = Instant::now();
        let mut open = held;
        for s in &open {
            s.set_nonblocking(true).unwrap();
        }
        // (Open: peek would block; closed: it reads the end, or an error.)
        let still_open =
            |s: &TcpStream| matches!(s.peek(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        while !open.is_empty() && t0.elapsed() < Duration::from_secs(5) {
            open.retain_mut(|s| s.write_all(b"G").is_ok() && still_open(s));
            std::thread::sleep(Duration::from_millis(200));
        }
        let took = t0.elapsed();
        assert!(open.is_empty() && took < Duration::from_millis(2500), "trickling heads cut off: {took:?}");
        assert!(get(addr).expect("slots free again") < Duration::from_millis(500));
    }
}
