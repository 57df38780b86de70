//! kpx-rules: the I/O-free heart of kpx, built natively and for WebAssembly.
//!
//! It holds the rule model every mode shares ([`model`]), the typed rules
//! a backend returns ([`ops`]), upstream's chain name hashes ([`hash`]),
//! the rule generators ([`iptables`], [`nftables`]) and the packet tracer
//! over typed rules ([`trace`]). The host links it to know what plugins are
//! given and what they return; plugins link it to generate.
#![forbid(unsafe_code)]

pub mod backend;
pub mod hash;
pub mod iptables;
pub mod ipvs;
pub mod mode;
pub mod model;
pub mod nftables;
pub mod ops;
pub mod plan;
pub mod promise;
pub mod service_set;
pub mod table;
pub mod trace;
mod wit_conversions;
