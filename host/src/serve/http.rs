//! A small HTTP/1.1 server on hyper for kpx's endpoints: each request is
//! answered by a plain function of its path.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use tokio::sync::{Semaphore, watch};

/// Connections one server holds at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 256;
/// A client must send its request head within this.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

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

/// Serves `listener` until `stop` turns true (or its sender is gone), at
/// most [`MAX_CONNECTIONS`] at once, each with [`HEADER_TIMEOUT`] to send
/// its request head; a failing accept (out of file descriptors) backs off.
pub async fn serve(listener: tokio::net::TcpListener, handler: Handler, mut stop: watch::Receiver<bool>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut backoff = Duration::from_millis(5);
    loop {
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => s.expect("the semaphore is never closed"),
            _ = stop.wait_for(|s| *s) => return,
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                backoff = Duration::from_millis(5);
                stream
            }
            Err(e) => {
                tracing::warn!("accepting a connection failed, retrying in {backoff:?}: {e}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let handler = handler.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let accept = req.headers().get(hyper::header::ACCEPT).and_then(|v| v.to_str().ok());
                let answer = handler(&Asked { path: req.uri().path(), accept });
                async move { Ok::<_, Infallible>(respond(answer)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        });
    }
}
