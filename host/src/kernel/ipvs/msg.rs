//! IPVS generic-netlink messages (include/uapi/linux/ip_vs.h; the
//! kernel's policies in net/netfilter/ipvs/ip_vs_ctl.c): typed services
//! and destinations to attributes and back.
//!
//! Encoding, as the kernel reads it: u16 and u32 attributes in host order
//! except ports (big-endian, `nla_get_be16`); addresses as 16 bytes (a
//! `union nf_inet_addr`, IPv4 in the first 4, as ipvsadm's libipvs sends
//! them); `FLAGS` as `struct ip_vs_flags { u32 flags; u32 mask; }`;
//! `NETMASK` 0xffffffff for IPv4 and 128 for IPv6. NEW and SET commands
//! carry every attribute the kernel requires (scheduler, flags, timeout,
//! netmask; a destination's forwarding method, weight and thresholds).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::kernel::netlink::nla::{Attr, Writer, attrs, find, need};

pub const IPVS_GENL_NAME: &str = "IPVS";
pub const IPVS_GENL_VERSION: u8 = 1;

pub const CMD_NEW_SERVICE: u8 = 1;
pub const CMD_SET_SERVICE: u8 = 2;
pub const CMD_DEL_SERVICE: u8 = 3;
pub const CMD_GET_SERVICE: u8 = 4;
pub const CMD_NEW_DEST: u8 = 5;
pub const CMD_SET_DEST: u8 = 6;
pub const CMD_DEL_DEST: u8 = 7;
pub const CMD_GET_DEST: u8 = 8;
pub const CMD_SET_CONFIG: u8 = 12;
pub const CMD_GET_CONFIG: u8 = 13;
pub const CMD_FLUSH: u8 = 17;

const CMD_ATTR_SERVICE: u16 = 1;
const CMD_ATTR_DEST: u16 = 2;
const CMD_ATTR_TIMEOUT_TCP: u16 = 4;
const CMD_ATTR_TIMEOUT_TCP_FIN: u16 = 5;
const CMD_ATTR_TIMEOUT_UDP: u16 = 6;

const SVC_ATTR_AF: u16 = 1;
const SVC_ATTR_PROTOCOL: u16 = 2;
const SVC_ATTR_ADDR: u16 = 3;
const SVC_ATTR_PORT: u16 = 4;
const SVC_ATTR_FWMARK: u16 = 5;
const SVC_ATTR_SCHED_NAME: u16 = 6;
const SVC_ATTR_FLAGS: u16 = 7;
const SVC_ATTR_TIMEOUT: u16 = 8;
const SVC_ATTR_NETMASK: u16 = 9;

const DEST_ATTR_ADDR: u16 = 1;
const DEST_ATTR_PORT: u16 = 2;
const DEST_ATTR_FWD_METHOD: u16 = 3;
const DEST_ATTR_WEIGHT: u16 = 4;
const DEST_ATTR_U_THRESH: u16 = 5;
const DEST_ATTR_L_THRESH: u16 = 6;
const DEST_ATTR_ACTIVE_CONNS: u16 = 7;
const DEST_ATTR_INACT_CONNS: u16 = 8;
const DEST_ATTR_PERSIST_CONNS: u16 = 9;
const DEST_ATTR_ADDR_FAMILY: u16 = 11;

pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

/// IP_VS_SVC_F_PERSISTENT: ClientIP affinity, with the service's timeout.
pub const SVC_F_PERSISTENT: u32 = 0x1;
/// IP_VS_SVC_F_HASHED: set by the kernel; masked off when comparing.
pub const SVC_F_HASHED: u32 = 0x2;
/// IP_VS_SVC_F_SCHED1..3 (sh-fallback, sh-port; mh-fallback, mh-port).
pub const SVC_F_SCHED1: u32 = 0x8;
pub const SVC_F_SCHED2: u32 = 0x10;

/// IP_VS_CONN_F_MASQ: NAT to the destination.
pub const FWD_MASQ: u32 = 0;

/// What identifies a virtual service: an address, protocol and port, or
/// a firewall mark (then the address is the family's unspecified one,
/// protocol and port 0, as the kernel reports such a service).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    pub address: IpAddr,
    /// IPPROTO_TCP / UDP / SCTP.
    pub protocol: u16,
    pub port: u16,
    /// Non-zero: a firewall-mark service (any packet with this mark).
    pub fwmark: u32,
}

/// As ipvsadm names a virtual service: `TCP 10.96.0.10:80`, `FWM 7`.
impl std::fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.fwmark != 0 {
            return write!(f, "FWM {}", self.fwmark);
        }
        let protocol = match self.protocol {
            6 => "TCP".to_string(),
            17 => "UDP".to_string(),
            132 => "SCTP".to_string(),
            other => format!("protocol {other}"),
        };
        write!(f, "{protocol} {}", std::net::SocketAddr::new(self.address, self.port))
    }
}

impl ServiceKey {
    pub fn new(address: IpAddr, protocol: u16, port: u16) -> ServiceKey {
        ServiceKey { address, protocol, port, fwmark: 0 }
    }

    /// The firewall-mark service of a family.
    pub fn fwmark(family_of: &IpAddr, mark: u32) -> ServiceKey {
        let address = match family_of {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        ServiceKey { address, protocol: 0, port: 0, fwmark: mark }
    }
}

/// A virtual service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    pub key: ServiceKey,
    pub scheduler: String,
    /// IP_VS_SVC_F_* (without HASHED).
    pub flags: u32,
    /// Persistence timeout in seconds (with SVC_F_PERSISTENT).
    pub timeout: u32,
}

/// A real server of a service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Destination {
    pub address: IpAddr,
    pub port: u16,
    pub weight: u32,
    /// Read back only.
    pub active: u32,
    pub inactive: u32,
    pub persistent: u32,
}

impl Destination {
    pub fn new(address: IpAddr, port: u16, weight: u32) -> Destination {
        Destination { address, port, weight, active: 0, inactive: 0, persistent: 0 }
    }
}

fn af(ip: &IpAddr) -> u16 {
    if ip.is_ipv4() { AF_INET } else { AF_INET6 }
}

fn addr16(ip: &IpAddr) -> [u8; 16] {
    let mut out = [0u8; 16];
    match ip {
        IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => out = v6.octets(),
    }
    out
}

/// The identifying attributes of a service.
fn key_attrs(w: &mut Writer, key: &ServiceKey) {
    w.u16_ne(SVC_ATTR_AF, af(&key.address));
    if key.fwmark != 0 {
        w.u32_ne(SVC_ATTR_FWMARK, key.fwmark);
        return;
    }
    w.u16_ne(SVC_ATTR_PROTOCOL, key.protocol)
        .bytes(SVC_ATTR_ADDR, &addr16(&key.address))
        .bytes(SVC_ATTR_PORT, &key.port.to_be_bytes());
}

/// NEW_SERVICE / SET_SERVICE: the service nest with every required attribute.
pub fn service(s: &Service) -> Writer {
    let mut w = Writer::new();
    w.nested(CMD_ATTR_SERVICE, |w| {
        key_attrs(w, &s.key);
        let mut flags = [0u8; 8];
        flags[..4].copy_from_slice(&s.flags.to_ne_bytes());
        flags[4..].copy_from_slice(&u32::MAX.to_ne_bytes());
        let netmask = if s.key.address.is_ipv4() { u32::MAX } else { 128 };
        w.str(SVC_ATTR_SCHED_NAME, &s.scheduler)
            .bytes(SVC_ATTR_FLAGS, &flags)
            .u32_ne(SVC_ATTR_TIMEOUT, s.timeout)
            .u32_ne(SVC_ATTR_NETMASK, netmask);
    });
    w
}

/// DEL_SERVICE, GET_DEST: the service nest with its identifying attributes.
pub fn service_key(key: &ServiceKey) -> Writer {
    let mut w = Writer::new();
    w.nested(CMD_ATTR_SERVICE, |w| key_attrs(w, key));
    w
}

/// NEW_DEST / SET_DEST / DEL_DEST: the service's key and the destination
/// (masquerading, no thresholds).
pub fn destination(key: &ServiceKey, d: &Destination) -> Writer {
    let mut w = service_key(key);
    w.nested(CMD_ATTR_DEST, |w| {
        w.bytes(DEST_ATTR_ADDR, &addr16(&d.address))
            .bytes(DEST_ATTR_PORT, &d.port.to_be_bytes())
            .u32_ne(DEST_ATTR_FWD_METHOD, FWD_MASQ)
            .u32_ne(DEST_ATTR_WEIGHT, d.weight)
            .u32_ne(DEST_ATTR_U_THRESH, 0)
            .u32_ne(DEST_ATTR_L_THRESH, 0)
            .u16_ne(DEST_ATTR_ADDR_FAMILY, af(&d.address));
    });
    w
}

/// SET_CONFIG: the connection timeouts (0 leaves one as it is).
pub fn timeouts(tcp: u32, tcp_fin: u32, udp: u32) -> Writer {
    let mut w = Writer::new();
    w.u32_ne(CMD_ATTR_TIMEOUT_TCP, tcp).u32_ne(CMD_ATTR_TIMEOUT_TCP_FIN, tcp_fin).u32_ne(CMD_ATTR_TIMEOUT_UDP, udp);
    w
}

fn u16_ne(a: Attr) -> Result<u16, String> {
    let b: [u8; 2] = a.value.try_into().map_err(|_| format!("attribute {} is not 2 bytes", a.kind))?;
    Ok(u16::from_ne_bytes(b))
}

fn u32_ne(a: Attr) -> Result<u32, String> {
    let b: [u8; 4] = a.value.try_into().map_err(|_| format!("attribute {} is not 4 bytes", a.kind))?;
    Ok(u32::from_ne_bytes(b))
}

fn port(a: Attr) -> Result<u16, String> {
    let b: [u8; 2] = a.value.try_into().map_err(|_| "a port is not 2 bytes".to_string())?;
    Ok(u16::from_be_bytes(b))
}

fn address(family: u16, a: Attr) -> Result<IpAddr, String> {
    match family {
        AF_INET if a.value.len() >= 4 => Ok(IpAddr::V4(Ipv4Addr::new(a.value[0], a.value[1], a.value[2], a.value[3]))),
        AF_INET6 if a.value.len() >= 16 => {
            let b: [u8; 16] = a.value[..16].try_into().expect("16 bytes");
            Ok(IpAddr::V6(Ipv6Addr::from(b)))
        }
        _ => Err(format!("an address of family {family} in {} bytes", a.value.len())),
    }
}

/// A GET_SERVICE reply (the attributes after the genetlink header).
pub fn parse_service(payload: &[u8]) -> Result<Service, String> {
    let top = attrs(payload)?;
    let nest = need(&top, CMD_ATTR_SERVICE, "a service reply")?.nested()?;
    let family = u16_ne(need(&nest, SVC_ATTR_AF, "a service")?)?;
    let fwmark = find(&nest, SVC_ATTR_FWMARK).map(u32_ne).transpose()?.unwrap_or(0);
    let key = if fwmark != 0 {
        let any = match family {
            AF_INET => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            AF_INET6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            other => return Err(format!("a firewall-mark service of family {other}")),
        };
        ServiceKey::fwmark(&any, fwmark)
    } else {
        ServiceKey::new(
            address(family, need(&nest, SVC_ATTR_ADDR, "a service")?)?,
            u16_ne(need(&nest, SVC_ATTR_PROTOCOL, "a service")?)?,
            port(need(&nest, SVC_ATTR_PORT, "a service")?)?,
        )
    };
    let flags = match find(&nest, SVC_ATTR_FLAGS) {
        Some(a) if a.value.len() >= 4 => u32::from_ne_bytes(a.value[..4].try_into().expect("4 bytes")),
        _ => 0,
    };
    Ok(Service {
        key,
        scheduler: need(&nest, SVC_ATTR_SCHED_NAME, "a service")?.string()?,
        flags: flags & !SVC_F_HASHED,
        timeout: find(&nest, SVC_ATTR_TIMEOUT).map(u32_ne).transpose()?.unwrap_or(0),
    })
}

/// A GET_DEST reply; `family` is the service's (older kernels send no
/// destination family).
pub fn parse_destination(payload: &[u8], family: u16) -> Result<Destination, String> {
    let top = attrs(payload)?;
    let nest = need(&top, CMD_ATTR_DEST, "a destination reply")?.nested()?;
    let family = find(&nest, DEST_ATTR_ADDR_FAMILY).map(u16_ne).transpose()?.unwrap_or(family);
    let count = |kind: u16| find(&nest, kind).map(u32_ne).transpose().map(Option::unwrap_or_default);
    Ok(Destination {
        address: address(family, need(&nest, DEST_ATTR_ADDR, "a destination")?)?,
        port: port(need(&nest, DEST_ATTR_PORT, "a destination")?)?,
        weight: u32_ne(need(&nest, DEST_ATTR_WEIGHT, "a destination")?)?,
        active: count(DEST_ATTR_ACTIVE_CONNS)?,
        inactive: count(DEST_ATTR_INACT_CONNS)?,
        persistent: count(DEST_ATTR_PERSIST_CONNS)?,
    })
}

/// The address family of a key, as IPVS numbers it.
pub fn family_of(key: &ServiceKey) -> u16 {
    af(&key.address)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ServiceKey {
        ServiceKey::new("10.96.0.10".parse().unwrap(), 6, 80)
    }

    /// Bytes written out by hand from the kernel's structures (x86-64,
    /// little-endian): nla_len, nla_type, value, padding to 4.
    #[test]
    fn new_service_bytes() {
        let s = Service { key: key(), scheduler: "rr".into(), flags: SVC_F_PERSISTENT, timeout: 10800 };
        #[rustfmt::skip]
        let want: Vec<u8> = vec![
            // CMD_ATTR_SERVICE, nested (0x8001), length 4 + 8+8+20+8+8+12+8+8 = 84
            84, 0, 0x01, 0x80,
            6, 0, 1, 0, 2, 0, 0, 0,                // AF = AF_INET (u16) + 2 pad
            6, 0, 2, 0, 6, 0, 0, 0,                // PROTOCOL = 6
            20, 0, 3, 0, 10, 96, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // ADDR, 16 bytes
            6, 0, 4, 0, 0, 80, 0, 0,               // PORT, big-endian 80
            7, 0, 6, 0, b'r', b'r', 0, 0,          // SCHED_NAME "rr\0" + pad
            12, 0, 7, 0, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, // FLAGS {flags 1, mask ~0}
            8, 0, 8, 0, 0x30, 0x2a, 0, 0,          // TIMEOUT 10800
            8, 0, 9, 0, 0xff, 0xff, 0xff, 0xff,    // NETMASK /32
        ];
        assert_eq!(service(&s).buf, want);
    }

    #[test]
    fn ipv6_netmask_is_a_prefix_length() {
        let s = Service {
            key: ServiceKey::new("fd00::10".parse().unwrap(), 17, 53),
            scheduler: "sh".into(),
            flags: 0,
            timeout: 0,
        };
        let buf = service(&s).buf;
        assert_eq!(&buf[buf.len() - 8..], &[8, 0, 9, 0, 128, 0, 0, 0]);
        assert_eq!(&buf[4..8], &[6, 0, 1, 0], "AF attribute");
        assert_eq!(&buf[8..10], &[10, 0], "AF_INET6");
    }

    #[test]
    fn firewall_mark_service_bytes() {
        let s = Service {
            key: ServiceKey::fwmark(&"10.0.0.1".parse().unwrap(), 0x1002),
            scheduler: "rr".into(),
            flags: 0,
            timeout: 0,
        };
        #[rustfmt::skip]
        let want: Vec<u8> = vec![
            // CMD_ATTR_SERVICE nest: 4 + 8+8+8+12+8+8 = 56
            56, 0, 0x01, 0x80,
            6, 0, 1, 0, 2, 0, 0, 0,                // AF = AF_INET
            8, 0, 5, 0, 0x02, 0x10, 0, 0,          // FWMARK 0x1002 (host order)
            7, 0, 6, 0, b'r', b'r', 0, 0,          // SCHED_NAME
            12, 0, 7, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
            8, 0, 8, 0, 0, 0, 0, 0,                // TIMEOUT
            8, 0, 9, 0, 0xff, 0xff, 0xff, 0xff,    // NETMASK
        ];
        assert_eq!(service(&s).buf, want);
        assert_eq!(parse_service(&want).unwrap(), s, "read back as written");
    }

    #[test]
    fn new_dest_bytes() {
        let d = Destination::new("10.244.1.5".parse().unwrap(), 8080, 3);
        #[rustfmt::skip]
        let want: Vec<u8> = vec![
            // CMD_ATTR_SERVICE nest with the key only: 4 + 8+8+20+8 = 48
            48, 0, 0x01, 0x80,
            6, 0, 1, 0, 2, 0, 0, 0,
            6, 0, 2, 0, 6, 0, 0, 0,
            20, 0, 3, 0, 10, 96, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            6, 0, 4, 0, 0, 80, 0, 0,
            // CMD_ATTR_DEST nest (0x8002): 4 + 20+8+8+8+8+8+8 = 72
            72, 0, 0x02, 0x80,
            20, 0, 1, 0, 10, 244, 1, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // ADDR
            6, 0, 2, 0, 0x1f, 0x90, 0, 0,          // PORT 8080 big-endian
            8, 0, 3, 0, 0, 0, 0, 0,                // FWD_METHOD masq
            8, 0, 4, 0, 3, 0, 0, 0,                // WEIGHT 3
            8, 0, 5, 0, 0, 0, 0, 0,                // U_THRESH
            8, 0, 6, 0, 0, 0, 0, 0,                // L_THRESH
            6, 0, 11, 0, 2, 0, 0, 0,               // ADDR_FAMILY AF_INET
        ];
        assert_eq!(destination(&key(), &d).buf, want);
    }

    #[test]
    fn timeouts_bytes() {
        assert_eq!(
            timeouts(900, 120, 300).buf,
            vec![8, 0, 4, 0, 0x84, 3, 0, 0, 8, 0, 5, 0, 120, 0, 0, 0, 8, 0, 6, 0, 0x2c, 1, 0, 0]
        );
    }

    #[test]
    fn replies_parse_back() {
        // The kernel's reply carries the same nest (plus HASHED and stats).
        let mut s =
            Service { key: key(), scheduler: "wrr".into(), flags: SVC_F_PERSISTENT | SVC_F_HASHED, timeout: 60 };
        let parsed = parse_service(&service(&s).buf).unwrap();
        s.flags = SVC_F_PERSISTENT;
        assert_eq!(parsed, s);
        let d = Destination::new("10.244.1.5".parse().unwrap(), 8080, 3);
        let w = destination(&key(), &d);
        assert_eq!(parse_destination(&w.buf, AF_INET).unwrap(), d);
    }
}
