//! Chain names exactly as upstream kube-proxy computes them, so that
//! dashboards, runbooks and `iptables-save | grep` habits keep working.

use sha2::{Digest, Sha256};

/// `prefix` + `base32(sha256(parts...))[..16]`, upstream's `portProtoHash`
/// family. Base32 turns each 5 bytes into 8 characters on their own, so the
/// first 16 characters are those of the first 10 bytes: nothing else is
/// encoded, and the name is one allocation.
fn hash16(prefix: &str, parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
    }
    let digest = hasher.finalize();
    let mut encoded = [0u8; 16];
    data_encoding::BASE32.encode_mut(&digest[..10], &mut encoded);
    let mut out = String::with_capacity(prefix.len() + 16);
    out.push_str(prefix);
    // Base32's alphabet is ASCII.
    out.extend(encoded.iter().map(|&b| char::from(b)));
    out
}

/// A per-service chain: `prefix` + hash of the service port name and
/// lower-case protocol (`KUBE-SVC-`, `KUBE-SVL-`, `KUBE-EXT-`, `KUBE-FW-`).
pub fn service_chain(prefix: &str, service_port_name: &str, protocol: &str) -> String {
    hash16(prefix, &[service_port_name, protocol])
}

/// The hash every per-service chain name ends with: the four prefixes
/// share it, so it is computed once per service port.
pub fn service_hash(service_port_name: &str, protocol: &str) -> String {
    hash16("", &[service_port_name, protocol])
}

/// The `KUBE-SEP-` chain of one endpoint (`endpoint` is `ip:port`, or
/// `[ip]:port` for IPv6, as Go's `net.JoinHostPort` writes it).
pub fn endpoint_chain(service_port_name: &str, protocol: &str, endpoint: &str) -> String {
    hash16("KUBE-SEP-", &[service_port_name, protocol, endpoint])
}

/// kpx's own object names: `base32(sha256(part NUL part NUL ...))`, the
/// first `len` characters (at most 52). The separators keep ("ab", "c")
/// and ("a", "bc") apart.
pub fn name_hash(parts: &[&str], len: usize) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    let mut encoded = data_encoding::BASE32_NOPAD.encode(&hasher.finalize());
    encoded.truncate(len);
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    // Vectors from upstream's TestTracePacket (pkg/proxy/iptables/proxier_test.go).
    #[test]
    fn matches_upstream_service_hash() {
        assert_eq!(service_chain("KUBE-SVC-", "ns4/svc4:p80", "tcp"), "KUBE-SVC-4SW47YFZTEDKD3PK");
        assert_eq!(service_chain("KUBE-SVC-", "ns1/svc1:p80", "tcp"), "KUBE-SVC-XPGD46QRK7WJZT7O");
    }

    #[test]
    fn first_ten_bytes_encode_as_the_whole_digest_starts() {
        for parts in [&["ns4/svc4:p80", "tcp"][..], &["a", "udp", "[fd00::1]:53"], &[""]] {
            let mut hasher = Sha256::new();
            for part in parts {
                hasher.update(part.as_bytes());
            }
            let whole = data_encoding::BASE32.encode(&hasher.finalize());
            assert_eq!(hash16("P-", parts), format!("P-{}", &whole[..16]));
        }
    }

    #[test]
    fn matches_upstream_endpoint_hash() {
        assert_eq!(endpoint_chain("ns4/svc4:p80", "tcp", "10.180.0.4:80"), "KUBE-SEP-UKSFD7AGPMPPLUHC");
        assert_eq!(endpoint_chain("ns4/svc4:p80", "tcp", "10.180.0.5:80"), "KUBE-SEP-C6EBXVWJJZMIWKLZ");
        assert_eq!(endpoint_chain("ns1/svc1:p80", "tcp", "10.180.0.1:80"), "KUBE-SEP-SXIVWICOYRO3J4NJ");
    }
}
