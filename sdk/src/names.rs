//! upstream kube-proxy's object names, for backends that write its
//! objects (the host checks every name it is given against these rules).
//!
//! ```
//! use kpx_sdk::names;
//! // upstream's TestTracePacket: ns1/svc1:p80 over TCP.
//! assert_eq!(names::service_chain("KUBE-SVC-", "ns1/svc1:p80", "tcp"), "KUBE-SVC-XPGD46QRK7WJZT7O");
//! // upstream's nftables tests: ns1/svc1, TCP, port p80.
//! assert_eq!(names::nftables_object("service-", "ns1/svc1/tcp/p80"), "service-ULMVA6XW-ns1/svc1/tcp/p80");
//! ```

/// iptables: `KUBE-SVC-`, `KUBE-SVL-`, `KUBE-EXT-` or `KUBE-FW-` and the
/// hash of the service port name (`ns/name:port`) and lower-case protocol.
pub use kpx_rules::hash::service_chain;

/// iptables: the 16-character hash those four chains share.
pub use kpx_rules::hash::service_hash;

/// iptables: the `KUBE-SEP-` chain of one endpoint (`ip:port`, `[ip]:port`
/// for IPv6).
pub use kpx_rules::hash::endpoint_chain;

/// nftables: a chain, set or map name, `prefix` + 8 characters of base32
/// SHA-256 + `-` + the name (`ns/svc/proto/port`, or for an endpoint
/// `…__ip/port` with an IPv6 address's colons as dots), cut to kpx's limit
/// of 200 bytes (upstream cuts the part after the prefix at 240 with `...`;
/// the two differ only for names longer than that).
pub use kpx_rules::nftables::hashed as nftables_object;
