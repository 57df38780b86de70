//! `--feature-gates`: Kubernetes feature gates. kube-proxy registers every
//! gate of its release (clusters pass their whole `featureGates` map to
//! it), so kpx accepts any well-formed gate: those listed here are the
//! proxy's (their features are always on in kpx, or do not concern a Linux
//! service proxy); any other is accepted with a warning that kpx does not
//! know it.

use std::collections::BTreeMap;

/// (gate, what kpx does with it).
pub const KNOWN: &[(&str, &str)] = &[
    ("AllAlpha", "accepted; kpx has no alpha features behind gates"),
    ("AllBeta", "accepted; kpx has no beta features behind gates"),
    ("MultiCIDRServiceAllocator", "accepted; ServiceCIDRs are always read"),
    ("ServiceTrafficDistribution", "accepted; trafficDistribution is always honoured"),
    ("TopologyAwareHints", "accepted; hints are always honoured"),
    ("NFTablesProxyMode", "accepted; --proxy-mode nftables is always available"),
    ("KubeProxyDrainingTerminatingNodes", "accepted; always on"),
    ("LoadBalancerIPMode", "accepted; ipMode Proxy is always honoured"),
    ("ProxyTerminatingEndpoints", "accepted; always on"),
    ("EndpointSliceTerminatingCondition", "accepted; always on"),
    ("ServiceInternalTrafficPolicy", "accepted; always on"),
    ("MixedProtocolLBService", "accepted; always on"),
    ("IPv6DualStack", "accepted; always on"),
    ("EndpointSliceProxying", "accepted; always on"),
    ("SCTPSupport", "accepted; always on"),
    ("ServiceLBNodePortControl", "accepted; always on"),
    ("MinimizeIPTablesRestore", "accepted; always on"),
    ("IPTablesOwnershipCleanup", "accepted; always on"),
    ("WinDSR", "accepted; Windows only"),
    ("WinOverlay", "accepted; Windows only"),
    ("ContextualLogging", "accepted; no effect"),
    ("LoggingAlphaOptions", "accepted; no effect"),
    ("LoggingBetaOptions", "accepted; no effect"),
];

/// Parses `key=bool,…`: the gates, and those kpx does not know. A
/// malformed pair or value is an error.
pub fn parse(text: &str) -> Result<(BTreeMap<String, bool>, Vec<String>), String> {
    let mut out = BTreeMap::new();
    let mut unknown = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').ok_or_else(|| format!("missing bool value for {pair}"))?;
        let (key, value) = (key.trim(), value.trim());
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(format!("invalid feature gate name {key:?}"));
        }
        if !KNOWN.iter().any(|(k, _)| *k == key) {
            unknown.push(key.to_string());
        }
        let enabled = super::go_bool(value).map_err(|e| format!("invalid value of {key}={value}: {e}"))?;
        out.insert(key.to_string(), enabled);
    }
    Ok((out, unknown))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_gates_and_go_bools() {
        let (g, unknown) = parse("MultiCIDRServiceAllocator=true, AllAlpha=F").unwrap();
        assert!(g["MultiCIDRServiceAllocator"]);
        assert!(!g["AllAlpha"]);
        assert!(unknown.is_empty());
        assert_eq!(parse("").unwrap().0.len(), 0);
        assert_eq!(parse("ComponentFlagz=true").unwrap().1, ["ComponentFlagz"], "accepted, reported as unknown");
        assert!(parse("Bad Gate=true").is_err());
        assert!(parse("AllAlpha").is_err());
        assert!(parse("AllAlpha=yes").is_err());
    }
}
