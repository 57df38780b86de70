//! UDP relaying, as upstream's userspace proxier does it: a session per
//! client address, with its own socket connected to the endpoint chosen
//! for the client's first datagram; the client's datagrams go there and
//! the endpoint's replies come back from the service port; a session idle
//! for `--udp-timeout` (250 ms by default) ends, and the client's next
//! datagram starts a new one (and may reach another endpoint).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;

use super::tcp::{Chooser, Placed};

/// The largest datagram relayed.
const DATAGRAM: usize = 64 * 1024;

struct Session {
    endpoint: Arc<UdpSocket>,
    last: Instant,
}

type Sessions = Arc<Mutex<HashMap<SocketAddr, Session>>>;

/// Relays datagrams arriving on `socket` until the task is dropped (a
/// failed receive is logged and the port stays served).
pub async fn serve(socket: UdpSocket, chooser: Arc<dyn Chooser>, idle: Duration, share: super::budget::Share) {
    let port = socket.local_addr().map(|a| a.port()).unwrap_or_default();
    let what = || format!("UDP port {port}");
    let socket = Arc::new(socket);
    let sessions: Sessions = Arc::new(Mutex::new(HashMap::new()));
    let mut buf = vec![0u8; DATAGRAM];
    loop {
        let (n, client) = match socket.recv_from(&mut buf).await {
            Ok(received) => received,
            Err(e) => {
                tracing::warn!("userspace: receive on {:?}: {e}", socket.local_addr().ok());
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let existing = {
            let mut table = sessions.lock().expect("sessions");
            table.get_mut(&client).map(|s| {
                s.last = Instant::now();
                Arc::clone(&s.endpoint)
            })
        };
        let endpoint = match existing {
            Some(e) => e,
            None => {
                // Over the budget (all relays, the client address's share
                // or this port's), a new session's datagram is dropped.
                let Some(permit) = share.take(client.ip(), &what) else { continue };
                // UDP has no failed dial to retry: the first choice holds.
                let Some(to) = chooser.choose(client, 0, &[]) else { continue };
                let bind: SocketAddr = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().expect("address");
                let endpoint = match UdpSocket::bind(bind).await {
                    Ok(s) => Arc::new(s),
                    Err(e) => {
                        tracing::warn!("userspace: a session socket for {client} to {to}: {e}");
                        chooser.release(to);
                        continue;
                    }
                };
                if endpoint.connect(to).await.is_err() {
                    chooser.release(to);
                    continue;
                }
                sessions
                    .lock()
                    .expect("sessions")
                    .insert(client, Session { endpoint: Arc::clone(&endpoint), last: Instant::now() });
                let ended = (Placed { chooser: Arc::clone(&chooser), endpoint: to }, permit);
                tokio::spawn(replies(
                    Arc::clone(&socket),
                    Arc::clone(&endpoint),
                    client,
                    Arc::clone(&sessions),
                    idle,
                    ended,
                ));
                endpoint
            }
        };
        let _ = endpoint.send(&buf[..n]).await;
    }
}

/// The endpoint's replies to `client`, until the session has been idle
/// (neither way) for `idle`.
async fn replies(
    socket: Arc<UdpSocket>,
    endpoint: Arc<UdpSocket>,
    client: SocketAddr,
    sessions: Sessions,
    idle: Duration,
    _ended: (Placed, super::budget::Ticket),
) {
    let mut buf = vec![0u8; DATAGRAM];
    loop {
        match tokio::time::timeout(idle, endpoint.recv(&mut buf)).await {
            Ok(Ok(n)) => {
                if let Some(s) = sessions.lock().expect("sessions").get_mut(&client) {
                    s.last = Instant::now();
                }
                let _ = socket.send_to(&buf[..n], client).await;
            }
            Ok(Err(_)) => break,
            Err(_) => {
                let table = sessions.lock().expect("sessions");
                if table.get(&client).is_none_or(|s| s.last.elapsed() >= idle) {
                    break;
                }
            }
        }
    }
    let mut table = sessions.lock().expect("sessions");
    if table.get(&client).is_some_and(|s| Arc::ptr_eq(&s.endpoint, &endpoint)) {
        table.remove(&client);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::userspace::RoundRobin;

    /// A UDP server answering each datagram with its name.
    async fn named(name: &'static str) -> SocketAddr {
        let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = s.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            loop {
                let (_, from) = s.recv_from(&mut buf).await.unwrap();
                s.send_to(name.as_bytes(), from).await.unwrap();
            }
        });
        addr
    }

    async fn ask(client: &UdpSocket, to: SocketAddr) -> String {
        client.send_to(b"who", to).await.unwrap();
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(5), client.recv(&mut buf)).await.expect("no reply").unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[tokio::test]
    async fn a_client_sticks_within_the_timeout_and_moves_after_it() {
        let endpoints = vec![named("be1").await, named("be2").await];
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let to = socket.local_addr().unwrap();
        // Longer than upstream's 250 ms default: a loaded test machine must
        // not end a session between two of the client's datagrams.
        let idle = Duration::from_secs(1);
        let chooser: Arc<dyn Chooser> = Arc::new(RoundRobin::new(endpoints));
        tokio::spawn(serve(socket, chooser, idle, crate::userspace::budget::Share::unlimited()));
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let first: Vec<String> = {
            let mut v = Vec::new();
            for _ in 0..5 {
                v.push(ask(&client, to).await);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            v
        };
        assert!(first.iter().all(|s| s == &first[0]), "one session, one endpoint: {first:?}");
        // Idle past the timeout: a new session, the next endpoint.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let after = ask(&client, to).await;
        assert_ne!(after, first[0], "a new session after {idle:?} idle");
        // Another client meanwhile has its own session.
        let other = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let theirs = ask(&other, to).await;
        assert_ne!(theirs, after, "round robin gives the second client the other endpoint");
    }
}
