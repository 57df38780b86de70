//! The built-in ipvs backend: kpx-rules' generator (virtual servers),
//! exported as a `kpx:proxier` component.
#![forbid(unsafe_code)]

kpx_sdk::export_backend!(kpx_rules::ipvs::IpvsProxier);
