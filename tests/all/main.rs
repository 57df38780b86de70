//! kpx's integration tests, one binary (see docs/DESIGN.md, "Tests").
//! Real-kernel tests need root and network namespaces; where the machine
//! lacks them they print `SKIPPED: <reason>` and return.

mod api_source;
mod canary;
mod churn;
mod conformance;
mod conformance_kernel;
mod conntrack;
mod deploy;
mod extension;
mod faults;
mod golden;
mod guide;
mod hairpin;
mod ipvs;
mod kernel_iptables;
mod kernel_nftables;
mod layers;
mod refused;
mod reload;
mod restart;
mod roundtrip;
mod sandbox;
mod schedulers;
mod servers;
mod support;
mod userspace;
