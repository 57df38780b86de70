//! TCP relaying, as upstream's userspace proxier does it
//! (pkg/proxy/userspace/proxysocket.go): a new connection dials an
//! endpoint the [`Chooser`] names, and if the dial fails, another, with
//! upstream's growing timeouts (250 ms, 500 ms, 1 s, 2 s); then bytes are
//! copied both ways through bounded buffers, and a side that ends its
//! writing (a half-close) has that passed on while the other direction
//! goes on.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

/// upstream's `EndpointDialTimeouts`: one dial per entry, each to the
/// endpoint chosen for that attempt.
pub const DIAL_TIMEOUTS: [Duration; 4] =
    [Duration::from_millis(250), Duration::from_millis(500), Duration::from_secs(1), Duration::from_secs(2)];

/// Each direction's copy buffer: a slow reader holds at most this much per
/// connection and direction in kpx.
pub const BUFFER: usize = 64 * 1024;

/// What a direction's pipe holds at most while fewer than [`LARGE_PIPES`]
/// relays are open (splice moves page references: the bytes stay in the
/// kernel); the kernel's 64 KiB past that.
pub const PIPE: usize = 1024 * 1024;
pub const LARGE_PIPES: usize = 256;
/// The socket buffers those relays ask for (the kernel doubles it).
pub const SOCKET_BUFFER: usize = 4 << 20;

/// Who picks the endpoint of a new connection.
pub trait Chooser: Send + Sync {
    /// The endpoint for attempt `attempt` (0-based) of `client`'s
    /// connection, the endpoints that already failed it in `failed`; None
    /// when there is none to try (no endpoints: the client is refused).
    fn choose(&self, client: SocketAddr, attempt: usize, failed: &[SocketAddr]) -> Option<SocketAddr>;

    /// A connection (or UDP session) `choose` placed on `endpoint` is over
    /// (its dial failed, or it ended): the live counts drop it.
    fn release(&self, _endpoint: SocketAddr) {}

    /// Whether `endpoint` runs on this node: the relay's hop to it never
    /// leaves the host (see [`local_hop_congestion`]).
    fn on_this_node(&self, _endpoint: SocketAddr) -> bool {
        false
    }
}

/// The congestion control of the relay's connections to endpoints on
/// this node, given the kernel's `tcp_available_congestion_control`:
/// cubic where listed, else reno (built into every kernel). Only listed
/// ones are asked for, so no connection makes the kernel look for a
/// module. A hop between namespaces of one host has no network queue to
/// probe or pace for; a pacing control (BBR, a common node default)
/// would pace it anyway, a kernel timer per burst on a path whose only
/// limit is the CPU (docs/BENCHMARKS.md, "userspace mode", has the
/// bench's figures with and without). Only bytes toward the endpoint are
/// sent on that connection: the replies' hop back to the client is the
/// accepted connection, which keeps the node's default (whether the
/// client is on this node is not known). Connections to other nodes'
/// endpoints keep the node's default.
pub fn local_hop_congestion(available: &str) -> &'static str {
    if available.split_whitespace().any(|c| c == "cubic") { "cubic" } else { "reno" }
}

/// What [`local_hop_congestion`] says for this kernel.
pub fn local_hop_congestion_here() -> &'static str {
    local_hop_congestion(
        &std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control").unwrap_or_default(),
    )
}

/// A socket to connect to `endpoint`; on this node, with `local_hop`'s
/// congestion control, else reno (a kpx without CAP_NET_ADMIN may only
/// pick those in `tcp_allowed_congestion_control`, where reno always is),
/// else the node's default.
fn socket_for(endpoint: SocketAddr, local_hop: Option<&str>) -> io::Result<tokio::net::TcpSocket> {
    let socket = if endpoint.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    if let Some(name) = local_hop {
        let sock = socket2::SockRef::from(&socket);
        if sock.set_tcp_congestion(name.as_bytes()).is_err() {
            let _ = sock.set_tcp_congestion(b"reno");
        }
    }
    Ok(socket)
}

/// Releases a placed connection's endpoint when dropped, however the
/// connection ends (an error, a reset, the end of both directions).
pub(super) struct Placed {
    pub chooser: Arc<dyn Chooser>,
    pub endpoint: SocketAddr,
}

impl Drop for Placed {
    fn drop(&mut self) {
        self.chooser.release(self.endpoint);
    }
}

/// Why a connection was not relayed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no endpoint to try for {client}")]
    NoEndpoint { client: SocketAddr },
    #[error("every dial for {client} failed: {}", failures.iter().map(|(a, e)| format!("{a}: {e}")).collect::<Vec<_>>().join("; "))]
    Unreachable { client: SocketAddr, failures: Vec<(SocketAddr, String)> },
}

/// Dials an endpoint for `client`: the chooser's pick for each attempt,
/// within that attempt's timeout; to an endpoint on this node, with the
/// `local_hop` congestion control ([`local_hop_congestion`]).
pub async fn dial(
    chooser: &dyn Chooser,
    client: SocketAddr,
    local_hop: &str,
) -> Result<(TcpStream, SocketAddr), Error> {
    let mut failures: Vec<(SocketAddr, String)> = Vec::new();
    for (attempt, timeout) in DIAL_TIMEOUTS.iter().enumerate() {
        let failed: Vec<SocketAddr> = failures.iter().map(|(a, _)| *a).collect();
        let Some(endpoint) = chooser.choose(client, attempt, &failed) else {
            if failures.is_empty() {
                return Err(Error::NoEndpoint { client });
            }
            break;
        };
        let connect = async {
            socket_for(endpoint, chooser.on_this_node(endpoint).then_some(local_hop))?.connect(endpoint).await
        };
        match tokio::time::timeout(*timeout, connect).await {
            Ok(Ok(stream)) => return Ok((stream, endpoint)),
            Ok(Err(e)) => failures.push((endpoint, e.to_string())),
            Err(_) => failures.push((endpoint, format!("no answer within {} ms", timeout.as_millis()))),
        }
        chooser.release(endpoint);
    }
    Err(Error::Unreachable { client, failures })
}

/// Moves bytes both ways until both sides are done; a side's end of
/// writing is passed on to the other (shutdown of its write half). The
/// bytes moved (client to endpoint, endpoint to client). The kernel moves
/// them (splice through a pipe per direction, never copied into kpx);
/// where no pipe can be had (out of file descriptors), kpx copies them
/// through its buffers.
pub async fn relay(
    mut client: TcpStream,
    mut endpoint: TcpStream,
    pipe: usize,
    activity: &Activity,
) -> io::Result<(u64, u64)> {
    let _ = client.set_nodelay(true);
    let _ = endpoint.set_nodelay(true);
    if pipe > 0 {
        // The first relays also get large socket buffers (fewer wakeups
        // per byte moved: a median of 89.5 % of a direct transfer over
        // eight runs, against 82.2 % over six with the kernel's
        // autotuning); the others keep the kernel's bounds.
        let _ = socket2::SockRef::from(&client).set_recv_buffer_size(SOCKET_BUFFER);
        let _ = socket2::SockRef::from(&endpoint).set_send_buffer_size(SOCKET_BUFFER);
    }
    let flags = nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_CLOEXEC;
    match (nix::unistd::pipe2(flags), nix::unistd::pipe2(flags)) {
        (Ok(up), Ok(down)) => {
            for (_, pipe_in) in [&up, &down].into_iter().filter(|_| pipe > 0) {
                // Fewer, larger moves; a pipe that stays smaller is fine.
                let _ = nix::fcntl::fcntl(pipe_in, nix::fcntl::FcntlArg::F_SETPIPE_SZ(pipe as i32));
            }
            let len = pipe.max(BUFFER);
            tokio::try_join!(
                splice_one_way(&client, &endpoint, up, len, activity),
                splice_one_way(&endpoint, &client, down, len, activity)
            )
        }
        _ => {
            // (Copied through kpx: seen as busy throughout.)
            activity.forever();
            tokio::io::copy_bidirectional_with_sizes(&mut client, &mut endpoint, BUFFER, BUFFER).await
        }
    }
}

/// When a relay last moved a byte, either way.
pub struct Activity {
    started: tokio::time::Instant,
    /// Milliseconds since `started` of the last move (u64::MAX: never idle).
    last: std::sync::atomic::AtomicU64,
}

impl Activity {
    pub fn new() -> Activity {
        Activity { started: tokio::time::Instant::now(), last: std::sync::atomic::AtomicU64::new(0) }
    }

    fn touch(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        let _ = self.last.fetch_update(
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
            |last| (last != u64::MAX).then_some(now),
        );
    }

    fn forever(&self) {
        self.last.store(u64::MAX, std::sync::atomic::Ordering::Relaxed);
    }

    /// Returns once no byte has moved for `idle`.
    pub async fn idle_for(&self, idle: Duration) {
        loop {
            let last = self.last.load(std::sync::atomic::Ordering::Relaxed);
            if last == u64::MAX {
                return std::future::pending().await;
            }
            let deadline = self.started + Duration::from_millis(last) + idle;
            if tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

impl Default for Activity {
    fn default() -> Self {
        Activity::new()
    }
}

/// `from`'s bytes into `to` through `pipe`, until `from` ends its writing,
/// which is then passed on. At most `len` bytes are in the pipe.
async fn splice_one_way(
    from: &TcpStream,
    to: &TcpStream,
    (pipe_out, pipe_in): (std::os::fd::OwnedFd, std::os::fd::OwnedFd),
    len: usize,
    activity: &Activity,
) -> io::Result<u64> {
    use nix::fcntl::{SpliceFFlags, splice};
    use tokio::io::Interest;
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
    let mut total = 0u64;
    loop {
        // The pipe is empty here: EAGAIN can only be the socket's.
        let n = loop {
            from.readable().await?;
            match from.try_io(Interest::READABLE, || Ok(splice(from, None, &pipe_in, None, len, flags)?)) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            socket2::SockRef::from(to).shutdown(std::net::Shutdown::Write)?;
            return Ok(total);
        }
        activity.touch();
        let mut left = n;
        while left > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || Ok(splice(&pipe_out, None, to, None, left, flags)?)) {
                Ok(m) => left -= m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        total += n as u64;
    }
}

/// Accepts connections on `listener` and relays each to an endpoint, until
/// the task is dropped. A connection with no endpoint to reach is closed
/// at once (the client sees its connection end without data). A failed
/// accept (out of file descriptors, say) is logged and retried after a
/// pause, as upstream does: the port stays served.
pub async fn serve(
    listener: TcpListener,
    chooser: Arc<dyn Chooser>,
    share: super::budget::Share,
    local_hop: &'static str,
    idle: Duration,
) {
    let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
    let what = || format!("TCP port {port}");
    loop {
        let (client, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("userspace: accept on {:?}: {e}", listener.local_addr().ok());
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Over the budget (all relays, the client's share or this port's):
        // closed at once, so that it holds neither a descriptor nor a
        // place in the backlog ahead of other clients.
        let Some(ticket) = share.take(peer.ip(), &what) else {
            drop(client);
            continue;
        };
        // Large pipes while few relays are open; the kernel's default
        // (64 KiB) past that, bounding what slow readers can pin.
        let pipe = if share.budget.held() <= LARGE_PIPES { PIPE } else { 0 };
        let chooser = Arc::clone(&chooser);
        tokio::spawn(async move {
            let _ticket = ticket;
            match dial(chooser.as_ref(), peer, local_hop).await {
                Ok((endpoint, to)) => {
                    let _placed = Placed { chooser: Arc::clone(&chooser), endpoint: to };
                    let activity = Activity::new();
                    tokio::select! {
                        _ = relay(client, endpoint, pipe, &activity) => {}
                        _ = activity.idle_for(idle) => {
                            tracing::debug!("userspace: a connection of {peer} to {to} idle for {idle:?} closed");
                        }
                    }
                }
                Err(e) => tracing::debug!("userspace: {e}"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::userspace::RoundRobin;

    /// A server that names itself, then echoes everything until the
    /// client ends its writing, then ends its own.
    async fn echo(name: &'static str) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    s.write_all(name.as_bytes()).await.unwrap();
                    let (mut r, mut w) = s.split();
                    tokio::io::copy(&mut r, &mut w).await.unwrap();
                    w.shutdown().await.unwrap();
                });
            }
        });
        addr
    }

    /// An address nothing listens on (connections refused).
    async fn closed() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    }

    async fn proxy(endpoints: Vec<SocketAddr>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let chooser: Arc<dyn Chooser> = Arc::new(RoundRobin::new(endpoints));
        let share = crate::userspace::budget::Share::unlimited();
        tokio::spawn(serve(listener, chooser, share, "reno", Duration::from_secs(3600)));
        addr
    }

    /// Sends `data`, ends writing, reads all: (name, echoed bytes). A
    /// half-close that is not passed on would hang: 20 s is a failure.
    async fn exchange(to: SocketAddr, data: &[u8]) -> (String, Vec<u8>) {
        tokio::time::timeout(Duration::from_secs(20), exchange_inner(to, data)).await.expect("the exchange hung")
    }

    async fn exchange_inner(to: SocketAddr, data: &[u8]) -> (String, Vec<u8>) {
        let mut s = TcpStream::connect(to).await.unwrap();
        let mut name = [0u8; 3];
        s.read_exact(&mut name).await.unwrap();
        s.write_all(data).await.unwrap();
        s.shutdown().await.unwrap();
        let mut back = Vec::new();
        s.read_to_end(&mut back).await.unwrap();
        (String::from_utf8_lossy(&name).into_owned(), back)
    }

    #[tokio::test]
    async fn relays_both_ways_with_half_close_and_large_transfers() {
        let be1 = echo("be1").await;
        let to = proxy(vec![be1]).await;
        // 4 MiB, far past both buffers: the echo only ends after our half-close.
        let data: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
        let (name, back) = exchange(to, &data).await;
        assert_eq!(name, "be1");
        assert_eq!(back.len(), data.len());
        assert!(back == data, "the bytes came back changed");
    }

    #[tokio::test]
    async fn a_refused_endpoint_is_retried_on_another() {
        let dead = closed().await;
        let be2 = echo("be2").await;
        let to = proxy(vec![dead, be2]).await;
        // Round robin starts at the dead one every other connection: all
        // must still reach be2.
        for _ in 0..6 {
            let (name, back) = exchange(to, b"ping").await;
            assert_eq!((name.as_str(), back.as_slice()), ("be2", &b"ping"[..]));
        }
    }

    #[test]
    fn a_local_hop_gets_cubic_where_listed_else_reno() {
        assert_eq!(local_hop_congestion("reno bbr cubic"), "cubic");
        assert_eq!(local_hop_congestion("reno bbr"), "reno");
        assert_eq!(local_hop_congestion("reno bbr cubicx"), "reno");
        assert_eq!(local_hop_congestion(""), "reno");
    }

    #[tokio::test]
    async fn dials_give_up_with_every_failure_named() {
        let (a, b) = (closed().await, closed().await);
        let chooser = RoundRobin::new(vec![a, b]);
        let client: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let err = dial(&chooser, client, "reno").await.unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&a.to_string()) && text.contains(&b.to_string()), "{text}");
        let none = RoundRobin::new(Vec::new());
        assert!(matches!(dial(&none, client, "reno").await, Err(Error::NoEndpoint { .. })));
    }
}
