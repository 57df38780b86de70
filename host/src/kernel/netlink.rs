//! Netlink: the one home of kpx's netlink plumbing.

pub mod nla;
