//! kube-ipvs0: the dummy interface that holds every Service address so
//! that IPVS sees the traffic as local (upstream's name), over rtnetlink.

use std::net::IpAddr;

use netlink_sys::protocols::NETLINK_ROUTE;

use crate::kernel::netlink::nla::{Writer, attrs, find};
use crate::kernel::netlink::route::{
    IFA_ADDRESS, IFA_LOCAL, IFADDRMSG, IFINFOMSG, IFLA_IFNAME, IFLA_INFO_KIND, IFLA_LINKINFO, RTM_DELADDR, RTM_DELLINK,
    RTM_GETADDR, RTM_GETLINK, RTM_NEWADDR, RTM_NEWLINK,
};
use crate::kernel::netlink::{
    Error, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, REPLY_TIMEOUT, Socket, check_end,
};

/// upstream's dummy interface.
pub const KUBE_IPVS0: &str = "kube-ipvs0";

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
}

impl Rtnl {
    pub fn open() -> Result<Rtnl, Error> {
        Ok(Rtnl { socket: Socket::open(NETLINK_ROUTE, REPLY_TIMEOUT)? })
    }

    fn exchange(
        &mut self,
        msg_type: u16,
        flags: u16,
        fixed: &[u8],
        attrs: &[u8],
        op: &str,
    ) -> Result<Vec<Vec<u8>>, Error> {
        self.socket.exchange(msg_type, flags, &[fixed, attrs], op)
    }
}

/// kube-ipvs0's index in this network namespace (rtnetlink), if it exists.
pub fn index_of_kube_ipvs0() -> Option<u32> {
    Rtnl::open().ok()?.link(KUBE_IPVS0).ok().flatten().map(|(index, _)| index)
}

/// `struct ifinfomsg`, all zero but the index.
fn ifinfomsg(index: u32) -> [u8; IFINFOMSG] {
    let mut m = [0u8; IFINFOMSG];
    m[4..8].copy_from_slice(&index.to_ne_bytes());
    m
}

/// `struct ifaddrmsg` for a host address on `index`.
fn ifaddrmsg(ip: &IpAddr, index: u32) -> [u8; IFADDRMSG] {
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
            Err(Error::Refused { errno: nix::libc::ENODEV, .. }) => return Ok(None),
            other => other?,
        };
        let Some(r) = replies.first().filter(|r| r.len() >= IFINFOMSG) else { return Ok(None) };
        let index = u32::from_ne_bytes([r[4], r[5], r[6], r[7]]);
        let top = attrs(&r[IFINFOMSG..]).map_err(Error::protocol)?;
        let dummy = find(&top, IFLA_LINKINFO)
            .and_then(|i| i.nested().ok())
            .and_then(|i| find(&i, IFLA_INFO_KIND))
            .is_some_and(|k| k.value.strip_suffix(&[0]).unwrap_or(k.value) == b"dummy");
        Ok(Some((index, dummy)))
    }

    /// Creates kube-ipvs0 (a dummy interface, left down as upstream leaves
    /// it) unless it exists; its index, and whether this call created it.
    /// An interface of that name that is not a dummy is refused: kpx would
    /// otherwise manage its addresses.
    pub fn ensure(&mut self) -> Result<(u32, bool), Error> {
        if let Some((index, dummy)) = self.link(KUBE_IPVS0)? {
            return if dummy {
                Ok((index, false))
            } else {
                Err(Error::protocol(format!("{KUBE_IPVS0} exists and is not a dummy interface")))
            };
        }
        let mut w = Writer::new();
        w.str(IFLA_IFNAME, KUBE_IPVS0).nested(IFLA_LINKINFO, |w| {
            w.bytes(IFLA_INFO_KIND, b"dummy");
        });
        let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
        match self.exchange(RTM_NEWLINK, flags, &ifinfomsg(0), &w.buf, "creating kube-ipvs0") {
            Ok(_) | Err(Error::Refused { errno: nix::libc::EEXIST, .. }) => {}
            Err(e) => return Err(e),
        }
        match self.link(KUBE_IPVS0)? {
            Some((index, true)) => Ok((index, true)),
            _ => Err(Error::protocol("kube-ipvs0 was created but cannot be found".into())),
        }
    }

    /// Deletes kube-ipvs0 (and so its addresses), if it exists.
    pub fn delete(&mut self) -> Result<(), Error> {
        let Some((index, true)) = self.link(KUBE_IPVS0)? else { return Ok(()) };
        match self.exchange(RTM_DELLINK, NLM_F_REQUEST | NLM_F_ACK, &ifinfomsg(index), &[], "deleting kube-ipvs0") {
            Ok(_) | Err(Error::Refused { errno: nix::libc::ENODEV, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The addresses on interface `index` (one dump of every address,
    /// asked again while interrupted).
    pub fn addresses(&mut self, index: u32) -> Result<Vec<IpAddr>, Error> {
        let op = "listing addresses";
        let body: [&[u8]; 1] = [&[0u8; IFADDRMSG]];
        let (out, errno) =
            self.socket.dump(RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, &body, op, |out: &mut Vec<IpAddr>, _, r| {
                if r.len() < IFADDRMSG || u32::from_ne_bytes([r[4], r[5], r[6], r[7]]) != index {
                    return Ok(());
                }
                let a = attrs(&r[IFADDRMSG..])?;
                if let Some(addr) = find(&a, IFA_LOCAL).or_else(|| find(&a, IFA_ADDRESS)) {
                    match addr.value.len() {
                        4 => out.push(IpAddr::from(<[u8; 4]>::try_from(addr.value).expect("4 bytes"))),
                        16 => out.push(IpAddr::from(<[u8; 16]>::try_from(addr.value).expect("16 bytes"))),
                        _ => {}
                    }
                }
                Ok(())
            })?;
        check_end(errno, op)?;
        Ok(out)
    }

    /// Binds a host address to interface `index` (an existing one is fine).
    pub fn add_address(&mut self, index: u32, ip: IpAddr) -> Result<(), Error> {
        let mut w = Writer::new();
        w.bytes(IFA_LOCAL, &octets(&ip)).bytes(IFA_ADDRESS, &octets(&ip));
        let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
        let op = format!("binding {ip} to kube-ipvs0");
        match self.exchange(RTM_NEWADDR, flags, &ifaddrmsg(&ip, index), &w.buf, &op) {
            Ok(_) | Err(Error::Refused { errno: nix::libc::EEXIST, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Unbinds a host address from interface `index` (a missing one is fine).
    pub fn delete_address(&mut self, index: u32, ip: IpAddr) -> Result<(), Error> {
        let mut w = Writer::new();
        w.bytes(IFA_LOCAL, &octets(&ip)).bytes(IFA_ADDRESS, &octets(&ip));
        let op = format!("unbinding {ip} from kube-ipvs0");
        match self.exchange(RTM_DELADDR, NLM_F_REQUEST | NLM_F_ACK, &ifaddrmsg(&ip, index), &w.buf, &op) {
            Ok(_) | Err(Error::Refused { errno: nix::libc::EADDRNOTAVAIL, .. }) => Ok(()),
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
