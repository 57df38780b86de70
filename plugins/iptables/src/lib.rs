//! The built-in iptables backend: kpx-rules' generator, exported as a
//! `kpx:proxier` component. See README.md beside this crate.
#![forbid(unsafe_code)]

kpx_sdk::export_backend!(kpx_rules::iptables::IptablesProxier);
