//! IPVS through generic netlink: virtual services and their real
//! servers, written and read back with the kernel's own messages
//! (`msg`: encoding, golden byte tests; the socket is
//! [`crate::kernel::netlink::genl`]).

pub mod dataplane;
pub mod iptables;
pub mod link;
pub mod msg;
pub mod sets;
pub mod slots;

pub use crate::kernel::netlink::Error;
pub use msg::{Destination, Service, ServiceKey};

use crate::kernel::netlink::genl::Genl;
use crate::kernel::netlink::nla::Writer;

/// The kernel's IPVS table.
pub struct Ipvs {
    genl: Genl,
}

impl Ipvs {
    /// Opens the IPVS family; `Error::NoFamily` when the kernel has no ip_vs.
    pub fn open() -> Result<Ipvs, Error> {
        Ok(Ipvs { genl: Genl::open(msg::IPVS_GENL_NAME, msg::IPVS_GENL_VERSION)? })
    }

    /// Every virtual service, firewall-mark ones included.
    pub fn services(&mut self) -> Result<Vec<Service>, Error> {
        let mut nest = Writer::new();
        nest.nested(1, |_| {});
        let replies = self.genl.dump(msg::CMD_GET_SERVICE, &nest, "listing IPVS services")?;
        replies.iter().map(|r| msg::parse_service(r).map_err(Error::protocol)).collect()
    }

    /// The real servers of a service, with their connection counts.
    pub fn destinations(&mut self, key: &ServiceKey) -> Result<Vec<Destination>, Error> {
        let op = format!("listing the destinations of {}", describe(key));
        let replies = self.genl.dump(msg::CMD_GET_DEST, &msg::service_key(key), &op)?;
        let family = msg::family_of(key);
        replies.iter().map(|r| msg::parse_destination(r, family).map_err(Error::protocol)).collect()
    }

    pub fn add_service(&mut self, s: &Service) -> Result<(), Error> {
        self.genl.request(msg::CMD_NEW_SERVICE, &msg::service(s), &format!("adding {}", describe(&s.key)))
    }

    pub fn update_service(&mut self, s: &Service) -> Result<(), Error> {
        self.genl.request(msg::CMD_SET_SERVICE, &msg::service(s), &format!("updating {}", describe(&s.key)))
    }

    pub fn delete_service(&mut self, key: &ServiceKey) -> Result<(), Error> {
        self.genl.request(msg::CMD_DEL_SERVICE, &msg::service_key(key), &format!("deleting {}", describe(key)))
    }

    pub fn add_destination(&mut self, key: &ServiceKey, d: &Destination) -> Result<(), Error> {
        let op = format!("adding {} to {}", endpoint(d), describe(key));
        self.genl.request(msg::CMD_NEW_DEST, &msg::destination(key, d), &op)
    }

    pub fn update_destination(&mut self, key: &ServiceKey, d: &Destination) -> Result<(), Error> {
        let op = format!("updating {} of {}", endpoint(d), describe(key));
        self.genl.request(msg::CMD_SET_DEST, &msg::destination(key, d), &op)
    }

    pub fn delete_destination(&mut self, key: &ServiceKey, d: &Destination) -> Result<(), Error> {
        let op = format!("deleting {} from {}", endpoint(d), describe(key));
        self.genl.request(msg::CMD_DEL_DEST, &msg::destination(key, d), &op)
    }

    /// `--ipvs-tcp-timeout`, `--ipvs-tcpfin-timeout`, `--ipvs-udp-timeout`
    /// (seconds; 0 keeps the kernel's).
    pub fn set_timeouts(&mut self, tcp: u32, tcp_fin: u32, udp: u32) -> Result<(), Error> {
        self.genl.request(msg::CMD_SET_CONFIG, &msg::timeouts(tcp, tcp_fin, udp), "setting the IPVS timeouts")
    }

    /// Removes every virtual service.
    pub fn flush(&mut self) -> Result<(), Error> {
        self.genl.request(msg::CMD_FLUSH, &Writer::new(), "flushing IPVS")
    }
}

fn protocol_name(p: u16) -> &'static str {
    match p {
        6 => "TCP",
        17 => "UDP",
        132 => "SCTP",
        _ => "?",
    }
}

fn describe(key: &ServiceKey) -> String {
    if key.fwmark != 0 {
        return format!("IPVS firewall-mark service {:#x}", key.fwmark);
    }
    format!("IPVS service {} {}", protocol_name(key.protocol), kpx_rules::model::join_host_port(&key.address, key.port))
}

fn endpoint(d: &Destination) -> String {
    kpx_rules::model::join_host_port(&d.address, d.port)
}
