//! Test-only: kpx-rules' nftables generator, the built-in nftables
//! backend's, exported against kpx:proxier 0.2.0 (its state crossing as
//! `service-port` records). The host tests that it renders what the
//! built-in 0.3.0 component renders.
#![forbid(unsafe_code)]

kpx_sdk::export_backend_v0_2!(kpx_rules::nftables::NftablesProxier);
