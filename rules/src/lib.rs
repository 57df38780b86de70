//! kpx-rules: the I/O-free heart of kpx, built natively and for WebAssembly.
//!
//! It holds the rule model every mode shares ([`model`]), upstream's chain
//! name hashes ([`hash`]) and the rule generators ([`iptables`]). The host
//! links it to know what plugins are given; plugins link it to generate.
#![forbid(unsafe_code)]

pub mod hash;
pub mod iptables;
pub mod model;
pub mod nftables;
pub mod service_set;
pub mod trace;
mod wit_conversions;
