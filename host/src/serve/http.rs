//! A small HTTP/1.1 server on hyper for kpx's endpoints: each request is
//! answered by a plain function of its path.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use tokio::sync::watch;

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

pub type Handler = Arc<dyn Fn(&str) -> Answer + Send + Sync>;

fn respond(a: Answer) -> Response<Full<Bytes>> {
    let mut b = Response::builder().status(a.status).header("Content-Type", a.content_type);
    for (k, v) in a.headers {
        b = b.header(k, v);
    }
    b.body(Full::new(Bytes::from(a.body))).expect("a valid response")
}

/// Serves `listener` until `stop` turns true (or its sender is gone).
pub async fn serve(listener: tokio::net::TcpListener, handler: Handler, mut stop: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => return,
        };
        let Ok((stream, _)) = accepted else { continue };
        let handler = handler.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let answer = handler(req.uri().path());
                async move { Ok::<_, Infallible>(respond(answer)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        });
    }
}
