//! The ports userspace mode listens on: taken from `--proxy-port-range`
//! (upstream's syntax; empty: any port the kernel hands out), on every
//! address of one family, each served by a task in the relay runtime until
//! the listener is dropped.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use kpx_rules::model::{IpFamily, Protocol};
use socket2::{Domain, Socket, Type};

use super::Relays;
use super::tcp::Chooser;

/// Why no port could be taken.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no free {protocol} port in --proxy-port-range {first}-{last}")]
    RangeFull { protocol: Protocol, first: u16, last: u16 },
    #[error("cannot listen for {protocol}: {source}")]
    Io { protocol: Protocol, source: std::io::Error },
}

/// A port kpx listens on for one side of a service port; dropping it stops
/// the task (and closes the port; relayed connections go on to their end).
pub struct Listener {
    pub port: u16,
    task: tokio::task::AbortHandle,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Every address of a family.
fn any(family: IpFamily) -> IpAddr {
    match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

fn socket(address: IpAddr, protocol: Protocol, port: u16) -> std::io::Result<Socket> {
    let family = IpFamily::of(&address);
    let domain = if family == IpFamily::V4 { Domain::IPV4 } else { Domain::IPV6 };
    let kind = if protocol == Protocol::Udp { Type::DGRAM } else { Type::STREAM };
    let s = Socket::new(domain, kind, None)?;
    if family == IpFamily::V6 {
        // The IPv4 listeners are separate sockets.
        s.set_only_v6(true)?;
    }
    if protocol == Protocol::Tcp {
        // A restarted kpx takes its ports back past TIME_WAIT connections.
        s.set_reuse_address(true)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&SocketAddr::new(address, port).into())?;
    if protocol == Protocol::Tcp {
        s.listen(1024)?;
    }
    Ok(s)
}

/// A socket on a free port of `range` (tried from a random place in it),
/// or on any port the kernel gives when there is no range; never one of
/// `avoid` (ports other listeners are about to take back).
fn bind(
    address: IpAddr,
    protocol: Protocol,
    range: Option<(u16, u16)>,
    avoid: &dyn Fn(u16) -> bool,
) -> Result<(Socket, u16), Error> {
    let io = |source| Error::Io { protocol, source };
    let Some((first, last)) = range else {
        // Held while another is asked for: the kernel gives each once.
        let mut held = Vec::new();
        for _ in 0..64 {
            let s = socket(address, protocol, 0).map_err(io)?;
            let port = s.local_addr().map_err(io)?.as_socket().map_or(0, |a| a.port());
            if !avoid(port) {
                return Ok((s, port));
            }
            held.push(s);
        }
        return Err(Error::Io {
            protocol,
            source: std::io::Error::other("the kernel kept handing out reserved ports"),
        });
    };
    let size = u32::from(last - first) + 1;
    let start = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    for i in 0..size {
        let port = first + ((start.wrapping_add(i)) % size) as u16;
        if avoid(port) {
            continue;
        }
        match socket(address, protocol, port) {
            Ok(s) => return Ok((s, port)),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(e) => return Err(io(e)),
        }
    }
    Err(Error::RangeFull { protocol, first, last })
}

/// Listens for `protocol` on a port of `range` (`preferred` first, when
/// it is in the range and free) and relays what arrives through
/// `chooser`, in the relays' runtime.
pub fn open(
    relays: &Relays,
    family: IpFamily,
    protocol: Protocol,
    range: Option<(u16, u16)>,
    preferred: Option<u16>,
    avoid: &dyn Fn(u16) -> bool,
    chooser: Arc<dyn Chooser>,
) -> Result<Listener, Error> {
    let in_range = |p: u16| range.is_none_or(|(a, b)| (a..=b).contains(&p));
    let taken = preferred
        .filter(|p| *p > 0 && in_range(*p))
        .and_then(|p| socket(any(family), protocol, p).ok().map(|s| (s, p)));
    let (s, port) = match taken {
        Some(taken) => taken,
        None => bind(any(family), protocol, range, avoid)?,
    };
    serve(relays, s, port, protocol, chooser)
}

/// Listens for TCP on exactly `address` (localhost node ports).
pub fn open_at(relays: &Relays, address: SocketAddr, chooser: Arc<dyn Chooser>) -> Result<Listener, Error> {
    let protocol = Protocol::Tcp;
    let s = socket(address.ip(), protocol, address.port()).map_err(|source| Error::Io { protocol, source })?;
    serve(relays, s, address.port(), protocol, chooser)
}

fn serve(
    relays: &Relays,
    s: Socket,
    port: u16,
    protocol: Protocol,
    chooser: Arc<dyn Chooser>,
) -> Result<Listener, Error> {
    let io = |source| Error::Io { protocol, source };
    let runtime = &relays.runtime;
    // This listener's share of the relays.
    let share = super::budget::Share { budget: Arc::clone(&relays.budget), port: super::budget::Port::new() };
    let _in = runtime.enter();
    let task = match protocol {
        Protocol::Udp => {
            let socket = tokio::net::UdpSocket::from_std(s.into()).map_err(io)?;
            runtime.spawn(super::udp::serve(socket, chooser, relays.udp_timeout, share))
        }
        _ => {
            let listener = tokio::net::TcpListener::from_std(s.into()).map_err(io)?;
            runtime.spawn(super::tcp::serve(listener, chooser, share, relays.local_hop, relays.tcp_idle))
        }
    };
    Ok(Listener { port, task: task.abort_handle() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_come_from_the_range_and_a_full_range_is_named() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let (a, pa) = bind(lo, Protocol::Tcp, Some((47011, 47012)), &|_| false).unwrap();
        let (b, pb) = bind(lo, Protocol::Tcp, Some((47011, 47012)), &|_| false).unwrap();
        let mut got = [pa, pb];
        got.sort();
        assert_eq!(got, [47011, 47012]);
        let err = bind(lo, Protocol::Tcp, Some((47011, 47012)), &|_| false).err().unwrap();
        assert_eq!(err.to_string(), "no free tcp port in --proxy-port-range 47011-47012");
        // UDP ports are another space.
        let (_c, pc) = bind(lo, Protocol::Udp, Some((47011, 47011)), &|_| false).unwrap();
        assert_eq!(pc, 47011);
        drop((a, b));
        let (_any, p) = bind(lo, Protocol::Tcp, None, &|_| false).unwrap();
        assert!(p > 0);
    }
}
