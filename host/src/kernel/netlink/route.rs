//! rtnetlink: the message types and attributes kpx reads and writes
//! (linux/rtnetlink.h, if_link.h, if_addr.h), for kube-ipvs0
//! ([`crate::kernel::ipvs::link`]) and the node's addresses
//! ([`crate::kernel::interfaces`]).

pub const RTM_NEWLINK: u16 = 16;
pub const RTM_DELLINK: u16 = 17;
pub const RTM_GETLINK: u16 = 18;
pub const RTM_NEWADDR: u16 = 20;
pub const RTM_DELADDR: u16 = 21;
pub const RTM_GETADDR: u16 = 22;

/// `struct ifinfomsg`: family, type, index, flags, change mask.
pub const IFINFOMSG: usize = 16;
pub const IFLA_IFNAME: u16 = 3;
pub const IFLA_LINKINFO: u16 = 18;
pub const IFLA_INFO_KIND: u16 = 1;

/// `struct ifaddrmsg`: family, prefix length, flags, scope, interface index.
pub const IFADDRMSG: usize = 8;
pub const IFA_ADDRESS: u16 = 1;
pub const IFA_LOCAL: u16 = 2;
