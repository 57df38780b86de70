//! kube-ipvs0: the dummy interface that holds every Service address so
//! that IPVS sees the traffic as local (upstream's name), over rtnetlink.

use std::net::IpAddr;

use netlink_packet_core::{ErrorBuffer, NetlinkBuffer};
use netlink_sys::{Socket, protocols::NETLINK_ROUTE};

use crate::kernel::nla::{Writer, attrs, find};

use super::genl::Error;

/// upstream's dummy interface.
pub const KUBE_IPVS0: &str = "kube-ipvs0";

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const HEADER: usize = 16;
const EEXIST: i32 = 17;
const EADDRNOTAVAIL: i32 = 99;
const ENODEV: i32 = 19;

fn family(ip: &IpAddr) -> u8 {
    if ip.is_ipv4() { 2 } else { 10 }
}

fn octets(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// One rtnetlink socket, for every call of a sync.
pub struct Rtnl {
    socket: Socket,
    seq: u32,
}

impl Rtnl {
    pub fn open() -> Result<Rtnl, Error> {
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(|e| Error::Socket(format!("rtnetlink: {e}")))?;
        socket.bind_auto().map_err(|e| Error::Socket(format!("rtnetlink bind: {e}")))?;
        let timeout = nix::sys::time::TimeVal::new(10, 0);
        nix::sys::socket::setsockopt(
            &std::os::fd::AsFd::as_fd(&socket),
            nix::sys::socket::sockopt::ReceiveTimeout,
            &timeout,
        )
        .map_err(|e| Error::Socket(format!("rtnetlink timeout: {e}")))?;
        Ok(Rtnl { socket, seq: std::process::id().wrapping_mul(31) })
    }

    /// Sends one message (header, fixed part, attributes) and returns the
    /// payloads of its replies until the ack or the dump's end.
    fn exchange(
        &mut self,
        msg_type: u16,
        flags: u16,
        fixed: &[u8],
        attrs: &[u8],
        op: &str,
    ) -> Result<Vec<Vec<u8>>, Error> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let len = (HEADER + fixed.len() + attrs.len()) as u32;
        let mut buf = Vec::with_capacity(len as usize);
        buf.extend_from_slice(&len.to_ne_bytes());
        buf.extend_from_slice(&msg_type.to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes());
        buf.extend_from_slice(fixed);
        buf.extend_from_slice(attrs);
        self.socket.send(&buf, 0).map_err(|e| Error::Socket(format!("rtnetlink send: {e}")))?;
        let mut out = Vec::new();
        loop {
            let mut rbuf: Vec<u8> = Vec::with_capacity(1 << 16);
            let n = self.socket.recv(&mut rbuf, 0).map_err(|e| Error::Socket(format!("rtnetlink ({op}): {e}")))?;
            let mut at = 0;
            while at + HEADER <= n.min(rbuf.len()) {
                let msg = NetlinkBuffer::new_checked(&rbuf[at..]).map_err(|e| Error::Protocol(e.to_string()))?;
                let mlen = msg.length() as usize;
                if mlen < HEADER {
                    return Err(Error::Protocol("a message shorter than its header".into()));
                }
                at += (mlen + 3) & !3;
                if msg.sequence_number() != seq {
                    continue;
                }
                match msg.message_type() {
                    NLMSG_ERROR => {
                        let e = ErrorBuffer::new_checked(msg.payload()).map_err(|e| Error::Protocol(e.to_string()))?;
                        return match e.code() {
                            Some(code) => Err(Error::Refused { op: op.to_string(), errno: -code.get() }),
                            None => Ok(out),
                        };
                    }
                    NLMSG_DONE => {
                        // A dump that failed part-way says so here.
                        let code = msg.payload().get(..4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                        return match code {
                            Some(c) if c < 0 => Err(Error::Refused { op: op.to_string(), errno: -c }),
                            _ => Ok(out),
                        };
                    }
                    _ => {
                        out.push(msg.payload().to_vec());
                        // A plain request (no ack, no dump) has one answer.
                        if flags & (NLM_F_ACK | NLM_F_DUMP) == 0 {
                            return Ok(out);
                        }
                    }
                }
            }
        }
    }
}

/// kube-ipvs0's index in this network namespace (rtnetlink), if it exists.
pub fn index_of_kube_ipvs0() -> Option<u32> {
    Rtnl::open().ok()?.link(KUBE_IPVS0).ok().flatten().map(|(index, _)| index)
}

/// `struct ifinfomsg`, all zero but the index.
fn ifinfomsg(index: u32) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[4..8].copy_from_slice(&index.to_ne_bytes());
    m
}

/// `struct ifaddrmsg` for a host address on `index`.
fn ifaddrmsg(ip: &IpAddr, index: u32) -> [u8; 8] {
    let prefix = if ip.is_ipv4() { 32 } else { 128 };
    let mut m = [family(ip), prefix, 0, 0, 0, 0, 0, 0];
    m[4..8].copy_from_slice(&index.to_ne_bytes());
    m
}

impl Rtnl {
    /// The index of the link named `name` in this socket's network
    /// namespace, and whether it is a dummy; None if there is none.
    pub fn link(&mut self, name: &str) -> Result<Option<(u32, bool)>, Error> {
        let mut w = Writer::new();
        w.str(IFLA_IFNAME, name);
        let op = format!("looking up {name}");
        let replies = match self.exchange(RTM_GETLINK, NLM_F_REQUEST, &ifinfomsg(0), &w.buf, &op) {
            Err(Error::Refused { errno: ENODEV, .. }) => return Ok(None),
            other => other?,
        };
        let Some(r) = replies.first().filter(|r| r.len() >= 16) else { return Ok(None) };
        let index = u32::from_ne_bytes([r[4], r[5], r[6], r[7]]);
        let top = attrs(&r[16..]).map_err(Error::Protocol)?;
        let dummy = find(&top, IFLA_LINKINFO)
            .and_then(|i| i.nested().ok())
            .and_then(|i| find(&i, IFLA_INFO_KIND))
            .is_some_and(|k| k.value.strip_suffix(&[0]).unwrap_or(k.value) == b"dummy");
        Ok(Some((index, dummy)))
    }

    /// Creates kube-ipvs0 (a dummy interface, left down as upstream leaves
    /// it) unless it exists; its index. An interface of that name that is
    /// not a dummy is refused: kpx would otherwise manage its addresses.
    pub fn ensure(&mut self) -> Result<u32, Error> {
        if let Some((index, dummy)) = self.link(KUBE_IPVS0)? {
            return if dummy {
                Ok(index)
            } else {
                Err(Error::Protocol(format!("{KUBE_IPVS0} exists and is not a dummy interface")))
            };
        }
        let mut w = Writer::new();
        w.str(IFLA_IFNAME, KUBE_IPVS0).nested(IFLA_LINKINFO, |w| {
            w.bytes(IFLA_INFO_KIND, b"dummy");
        });
        let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
        match self.exchange(RTM_NEWLINK, flags, &ifinfomsg(0), &w.buf, "creating kube-ipvs0") {
            Ok(_) | Err(Error::Refused { errno: EEXIST, .. }) => {}
            Err(e) => return Err(e),
        }
        match self.link(KUBE_IPVS0)? {
            Some((index, true)) => Ok(index),
            _ => Err(Error::Protocol("kube-ipvs0 was created but cannot be found".into())),
        }
    }

    /// Deletes kube-ipvs0 (and so its addresses), if it exists.
    pub fn delete(&mut self) -> Result<(), Error> {
        let Some((index, true)) = self.link(KUBE_IPVS0)? else { return Ok(()) };
        match self.exchange(RTM_DELLINK, NLM_F_REQUEST | NLM_F_ACK, &ifinfomsg(index), &[], "deleting kube-ipvs0") {
            Ok(_) | Err(Error::Refused { errno: ENODEV, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The addresses on interface `index`.
    pub fn addresses(&mut self, index: u32) -> Result<Vec<IpAddr>, Error> {
        let replies = self.exchange(RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, &[0u8; 8], &[], "listing addresses")?;
        let mut out = Vec::new();
        for r in replies {
            if r.len() < 8 || u32::from_ne_bytes([r[4], r[5], r[6], r[7]]) != index {
                continue;
            }
            let a = attrs(&r[8..]).map_err(Error::Protocol)?;
            if let Some(addr) = find(&a, IFA_LOCAL).or_else(|| find(&a, IFA_ADDRESS)) {
                match addr.value.len() {
                    4 => out.push(IpAddr::from(<[u8; 4]>::try_from(addr.value).expect("4 bytes"))),
                    16 => out.push(IpAddr::from(<[u8; 16]>::try_from(addr.value).expect("16 bytes"))),
                    _ => {}
                }
            }
        }
        Ok(out)
    }

    /// Binds a host address to interface `index` (an existing one is fine).
    pub fn add_address(&mut self, index: u32, ip: IpAddr) -> Result<(), Error> {
        let mut w = Writer::new();
        w.bytes(IFA_LOCAL, &octets(&ip)).bytes(IFA_ADDRESS, &octets(&ip));
        let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
        let op = format!("binding {ip} to kube-ipvs0");
        match self.exchange(RTM_NEWADDR, flags, &ifaddrmsg(&ip, index), &w.buf, &op) {
            Ok(_) | Err(Error::Refused { errno: EEXIST, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Unbinds a host address from interface `index` (a missing one is fine).
    pub fn delete_address(&mut self, index: u32, ip: IpAddr) -> Result<(), Error> {
        let mut w = Writer::new();
        w.bytes(IFA_LOCAL, &octets(&ip)).bytes(IFA_ADDRESS, &octets(&ip));
        let op = format!("unbinding {ip} from kube-ipvs0");
        match self.exchange(RTM_DELADDR, NLM_F_REQUEST | NLM_F_ACK, &ifaddrmsg(&ip, index), &w.buf, &op) {
            Ok(_) | Err(Error::Refused { errno: EADDRNOTAVAIL, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ifaddrmsg as `struct ifaddrmsg { u8 family, prefixlen, flags,
    /// scope; u32 index; }` lays it out.
    #[test]
    fn address_message_layout() {
        assert_eq!(ifaddrmsg(&"10.96.0.10".parse().unwrap(), 7), [2, 32, 0, 0, 7, 0, 0, 0]);
        assert_eq!(ifaddrmsg(&"fd00::a".parse().unwrap(), 7)[..2], [10, 128]);
    }
}
