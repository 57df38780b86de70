//! Echo servers that answer every TCP connection and UDP datagram with
//! `<name> <peer address>`, and the clients that ask them.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};

use socket2::{Domain, Protocol as SockProtocol, Socket, Type};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::{Ns, Result};

/// What a request got back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The server that answered and the source address it saw.
    Answer { server: String, seen_from: String },
    /// Connection refused (a REJECT).
    Refused,
    /// No answer in time.
    Timeout,
    /// Anything else.
    Error(String),
}

impl Reply {
    pub fn server(&self) -> Option<&str> {
        match self {
            Reply::Answer { server, .. } => Some(server),
            _ => None,
        }
    }

    fn parse(text: &str) -> Reply {
        let mut parts = text.split_whitespace();
        match (parts.next(), parts.next()) {
            (Some(server), Some(seen)) => {
                let seen_from = seen.parse::<SocketAddr>().map(|a| a.ip().to_string()).unwrap_or(seen.to_string());
                Reply::Answer { server: server.to_string(), seen_from }
            }
            _ => Reply::Error(format!("bad reply {text:?}")),
        }
    }
}

/// A TCP and UDP echo server running in a namespace until dropped.
pub struct EchoServer {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl EchoServer {
    /// Serves TCP and UDP on `addr` (e.g. "0.0.0.0:8080") inside `ns`.
    pub fn start(ns: &Ns, name: &str, addr: &str) -> Result<EchoServer> {
        let addr: SocketAddr = addr.parse().map_err(|e| crate::Error::Unavailable(format!("{addr}: {e}")))?;
        // An address just added may not be bindable yet (an IPv6 address
        // is tentative until the kernel has set it up: EADDRNOTAVAIL, seen
        // once in a full test run under load); up to 2 s for it.
        let bind = move || -> std::io::Result<(TcpListener, UdpSocket, Option<TcpListener>)> {
            Ok((TcpListener::bind(addr)?, UdpSocket::bind(addr)?, sctp_listener(addr).ok()))
        };
        let mut tries = 0;
        let (tcp, udp, sctp) = loop {
            match ns.enter(bind)? {
                Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable && tries < 40 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(50));
                }
                other => break other?,
            }
        };
        udp.set_read_timeout(Some(Duration::from_millis(50)))?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for listener in std::iter::once(tcp).chain(sctp) {
            // A blocking accept that wakes every 50 ms to look at `stop`
            // (SO_RCVTIMEO bounds accept on Linux): no polling delay.
            let listener = TcpListener::from({
                let socket = Socket::from(listener);
                socket.set_read_timeout(Some(Duration::from_millis(50)))?;
                socket
            });
            let (name, stop) = (name.to_string(), stop.clone());
            threads.push(std::thread::spawn(move || serve_stream(&listener, &name, &stop)));
        }
        let (name_udp, stop_udp) = (name.to_string(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while !stop_udp.load(Ordering::Relaxed) {
                if let Ok((_, peer)) = udp.recv_from(&mut buf) {
                    let _ = udp.send_to(format!("{name_udp} {peer}\n").as_bytes(), peer);
                }
            }
        }));
        Ok(EchoServer { stop, threads })
    }
}

/// Answers each connection on a (TCP or SCTP) stream listener.
fn serve_stream(listener: &TcpListener, name: &str, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        if let Ok((mut conn, peer)) = listener.accept() {
            let _ = conn.write_all(format!("{name} {peer}\n").as_bytes());
        }
    }
}

const IPPROTO_SCTP: i32 = 132;

/// An SCTP one-to-one (stream) listener, where the kernel has SCTP.
fn sctp_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let domain = if addr.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
    let socket = Socket::new(domain, Type::STREAM, Some(SockProtocol::from(IPPROTO_SCTP)))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(64)?;
    Ok(TcpListener::from(socket))
}

/// Whether this kernel (in the current namespace) offers SCTP sockets;
/// the error says why not.
pub fn sctp_supported() -> Result<(), String> {
    Socket::new(Domain::IPV4, Type::STREAM, Some(SockProtocol::from(IPPROTO_SCTP)))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A request from inside a namespace, optionally from a given source address.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    pub to: SocketAddr,
    pub from: Option<IpAddr>,
    pub timeout: Duration,
}

impl Request {
    pub fn tcp(&self, ns: &Ns) -> Reply {
        let req = *self;
        ns.enter(move || req.stream_here(SockProtocol::TCP)).unwrap_or_else(|e| Reply::Error(e.to_string()))
    }

    pub fn sctp(&self, ns: &Ns) -> Reply {
        let req = *self;
        ns.enter(move || req.stream_here(SockProtocol::from(IPPROTO_SCTP)))
            .unwrap_or_else(|e| Reply::Error(e.to_string()))
    }

    /// How long a TCP connect takes (the first packet's trip through the
    /// rules to the server and back), without the exchange after it.
    pub fn connect_time(&self, ns: &Ns) -> Result<Duration, Reply> {
        let req = *self;
        ns.enter(move || {
            let domain = if req.to.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
            let socket =
                Socket::new(domain, Type::STREAM, Some(SockProtocol::TCP)).map_err(|e| Reply::Error(e.to_string()))?;
            let t = std::time::Instant::now();
            socket.connect_timeout(&req.to.into(), req.timeout).map_err(|e| Reply::Error(e.to_string()))?;
            Ok(t.elapsed())
        })
        .unwrap_or_else(|e| Err(Reply::Error(e.to_string())))
    }

    pub fn udp(&self, ns: &Ns) -> Reply {
        let req = *self;
        ns.enter(move || req.udp_here()).unwrap_or_else(|e| Reply::Error(e.to_string()))
    }

    fn stream_here(&self, protocol: SockProtocol) -> Reply {
        let domain = if self.to.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
        let connected = Socket::new(domain, Type::STREAM, Some(protocol)).and_then(|socket| {
            if let Some(src) = self.from {
                socket.bind(&SocketAddr::new(src, 0).into())?;
            }
            socket.connect_timeout(&self.to.into(), self.timeout)?;
            Ok(TcpStream::from(socket))
        });
        let mut conn = match connected {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Reply::Refused,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock) => {
                return Reply::Timeout;
            }
            Err(e) => return Reply::Error(e.to_string()),
        };
        let _ = conn.set_read_timeout(Some(self.timeout));
        let mut text = String::new();
        match conn.read_to_string(&mut text) {
            Ok(_) => Reply::parse(&text),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                Reply::Timeout
            }
            Err(e) => Reply::Error(e.to_string()),
        }
    }

    fn udp_here(&self) -> Reply {
        let any: IpAddr = if self.to.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
        let socket = match UdpSocket::bind(SocketAddr::new(self.from.unwrap_or(any), 0)) {
            Ok(s) => s,
            Err(e) => return Reply::Error(e.to_string()),
        };
        let _ = socket.set_read_timeout(Some(self.timeout));
        // Connected, so that an ICMP port-unreachable (a REJECT) is reported.
        if let Err(e) = socket.connect(self.to).and_then(|_| socket.send(b"hello\n")) {
            return Reply::Error(e.to_string());
        }
        let mut buf = [0u8; 1500];
        match socket.recv(&mut buf) {
            Ok(n) => Reply::parse(&String::from_utf8_lossy(&buf[..n])),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Reply::Refused,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                Reply::Timeout
            }
            Err(e) => Reply::Error(e.to_string()),
        }
    }
}

fn request(to: &str, timeout: Duration) -> Result<Request, Reply> {
    let to = to.parse::<SocketAddr>().map_err(|_| Reply::Error(format!("bad address {to}")))?;
    Ok(Request { to, from: None, timeout })
}

/// One TCP request from inside `ns`.
pub fn tcp_request(ns: &Ns, to: &str, timeout: Duration) -> Reply {
    request(to, timeout).map(|r| r.tcp(ns)).unwrap_or_else(|e| e)
}

/// One UDP request (a datagram and its answer) from inside `ns`.
pub fn udp_request(ns: &Ns, to: &str, timeout: Duration) -> Reply {
    request(to, timeout).map(|r| r.udp(ns)).unwrap_or_else(|e| e)
}
