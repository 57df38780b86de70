//! The built-in nftables backend: kpx-rules' generator, exported as a
//! `kpx:proxier` component. See README.md beside this crate.
#![forbid(unsafe_code)]

kpx_sdk::export_backend!(kpx_rules::nftables::NftablesProxier);
