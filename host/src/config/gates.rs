//! `--feature-gates`: Kubernetes feature gates. kube-proxy registers every
//! gate of its release (clusters pass their whole `featureGates` map to
//! it), so kpx accepts any well-formed gate. The gates kube-proxy reads are
//! listed in [`GATES`] with their upstream default at v1.38 and what kpx
//! does with them; a gate locked to its default refuses the other value,
//! as component-base does; any other gate is accepted with a warning that
//! kpx does not know it.

use std::collections::BTreeMap;

/// A gate's maturity, which `AllAlpha` and `AllBeta` follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Alpha,
    Beta,
    /// GA and locked to its default: the other value is refused.
    Locked,
    /// On its way out; its default is what upstream still does.
    Deprecated,
    /// GA or removed upstream: accepted, no effect in kpx.
    Settled,
}

/// One gate kube-proxy reads.
#[derive(Debug, Clone, Copy)]
pub struct Gate {
    pub name: &'static str,
    pub stage: Stage,
    /// upstream's default at v1.38.
    pub default: bool,
    /// What kpx does with it.
    pub effect: &'static str,
}

const fn gate(name: &'static str, stage: Stage, default: bool, effect: &'static str) -> Gate {
    Gate { name, stage, default, effect }
}

/// Every gate kpx knows (docs/FLAGS.md lists them; docs/UPSTREAM.md has
/// where each one's state was read).
pub const GATES: &[Gate] = &[
    gate(
        ALLOW_SERVICE_EXTERNAL_IPS,
        Stage::Deprecated,
        true,
        "false: Services' spec.externalIPs are not programmed, in every mode (v1.36, KEP-5707)",
    ),
    gate(
        KUBE_PROXY_IPVS,
        Stage::Deprecated,
        true,
        "false: --proxy-mode ipvs is refused at start, as an unknown mode (v1.37, KEP-5495)",
    ),
    gate(
        NFTABLES_LOCALHOST_NODEPORTS,
        Stage::Beta,
        true,
        "nftables mode's localhost node ports: rejected and counted, or relayed when --nodeport-addresses names loopback (beta in v1.38, KEP-6032)",
    ),
    gate("NFTablesNetlink", Stage::Beta, true, "accepted; kpx always reads and writes nf_tables over netlink"),
    gate(COMPONENT_FLAGZ, Stage::Beta, true, "false: no /flagz on the metrics server"),
    gate(COMPONENT_STATUSZ, Stage::Beta, true, "false: no /statusz on the metrics server"),
    gate("PreferSameTrafficDistribution", Stage::Locked, true, "node hints are always honoured"),
    gate("MultiCIDRServiceAllocator", Stage::Locked, true, "ServiceCIDRs are always read"),
    gate("TopologyAwareHints", Stage::Locked, true, "zone hints are always honoured"),
    gate("ServiceTrafficDistribution", Stage::Settled, true, "accepted; trafficDistribution is always honoured"),
    gate("NFTablesProxyMode", Stage::Settled, true, "accepted; --proxy-mode nftables is always available"),
    gate("KubeProxyDrainingTerminatingNodes", Stage::Settled, true, "accepted; always on"),
    gate("LoadBalancerIPMode", Stage::Settled, true, "accepted; ipMode Proxy is always honoured"),
    gate("ProxyTerminatingEndpoints", Stage::Settled, true, "accepted; always on"),
    gate("EndpointSliceTerminatingCondition", Stage::Settled, true, "accepted; always on"),
    gate("ServiceInternalTrafficPolicy", Stage::Settled, true, "accepted; always on"),
    gate("MixedProtocolLBService", Stage::Settled, true, "accepted; always on"),
    gate("IPv6DualStack", Stage::Settled, true, "accepted; always on"),
    gate("EndpointSliceProxying", Stage::Settled, true, "accepted; always on"),
    gate("SCTPSupport", Stage::Settled, true, "accepted; always on"),
    gate("ServiceLBNodePortControl", Stage::Settled, true, "accepted; always on"),
    gate("MinimizeIPTablesRestore", Stage::Settled, true, "accepted; always on"),
    gate("IPTablesOwnershipCleanup", Stage::Settled, true, "accepted; always on"),
    gate("WinDSR", Stage::Settled, true, "accepted; Windows only"),
    gate("WinOverlay", Stage::Settled, true, "accepted; Windows only"),
    gate("ContextualLogging", Stage::Settled, true, "accepted; no effect"),
    gate("LoggingAlphaOptions", Stage::Settled, false, "accepted; no effect"),
    gate("LoggingBetaOptions", Stage::Settled, true, "accepted; no effect"),
];

pub const ALLOW_SERVICE_EXTERNAL_IPS: &str = "AllowServiceExternalIPs";
pub const KUBE_PROXY_IPVS: &str = "KubeProxyIPVS";
pub const NFTABLES_LOCALHOST_NODEPORTS: &str = "KubeProxyNFTablesLocalhostNodePorts";
pub const COMPONENT_FLAGZ: &str = "ComponentFlagz";
pub const COMPONENT_STATUSZ: &str = "ComponentStatusz";

/// The gates as given: each known gate's value is what was set, else
/// `AllAlpha`/`AllBeta` for its stage, else upstream's default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gates {
    set: BTreeMap<String, bool>,
}

impl Gates {
    /// Whether `name` is on.
    pub fn enabled(&self, name: &str) -> bool {
        if let Some(v) = self.set.get(name) {
            return *v;
        }
        let Some(g) = GATES.iter().find(|g| g.name == name) else {
            return false;
        };
        // component-base's setUnsetAlphaGates/setUnsetBetaGates: either
        // value, for every gate of the stage not set itself.
        let all = match g.stage {
            Stage::Alpha => self.set.get("AllAlpha"),
            Stage::Beta => self.set.get("AllBeta"),
            _ => None,
        };
        all.copied().unwrap_or(g.default)
    }

    /// The gates given, as given (for /configz and /flagz).
    pub fn given(&self) -> &BTreeMap<String, bool> {
        &self.set
    }
}

/// Parses `key=bool,…`: the gates, and those kpx does not know. A
/// malformed pair or value, or a locked gate set against its lock, is an
/// error.
pub fn parse(text: &str) -> Result<(Gates, Vec<String>), String> {
    let mut out = BTreeMap::new();
    let mut unknown = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').ok_or_else(|| format!("missing bool value for {pair}"))?;
        let (key, value) = (key.trim(), value.trim());
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(format!("invalid feature gate name {key:?}"));
        }
        let enabled = super::go_bool(value).map_err(|e| format!("invalid value of {key}={value}: {e}"))?;
        match GATES.iter().find(|g| g.name == key) {
            // component-base's message for a locked gate.
            Some(g) if g.stage == Stage::Locked && enabled != g.default => {
                return Err(format!("cannot set feature gate {key} to {enabled}, feature is locked to {}", g.default));
            }
            Some(_) => {}
            None if key == "AllAlpha" || key == "AllBeta" => {}
            None => unknown.push(key.to_string()),
        }
        out.insert(key.to_string(), enabled);
    }
    Ok((Gates { set: out }, unknown))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_gates_and_go_bools() {
        let (g, unknown) = parse("MultiCIDRServiceAllocator=true, AllAlpha=F").unwrap();
        assert!(g.enabled("MultiCIDRServiceAllocator"));
        assert!(!g.enabled("AllAlpha"));
        assert!(unknown.is_empty());
        assert_eq!(parse("").unwrap().0, Gates::default());
        assert_eq!(parse("SomeOtherGate=true").unwrap().1, ["SomeOtherGate"], "accepted, reported as unknown");
        assert!(parse("Bad Gate=true").is_err());
        assert!(parse("AllAlpha").is_err());
        assert!(parse("AllAlpha=yes").is_err());
    }

    /// Defaults as upstream's at v1.38, values given win, AllBeta turns
    /// on beta gates, locked gates refuse the other value.
    #[test]
    fn defaults_overrides_and_locks() {
        let none = Gates::default();
        for on in [ALLOW_SERVICE_EXTERNAL_IPS, KUBE_PROXY_IPVS, NFTABLES_LOCALHOST_NODEPORTS, COMPONENT_FLAGZ] {
            assert!(none.enabled(on), "{on} is on by default");
        }
        assert!(!none.enabled("SomeOtherGate"));
        let (g, _) = parse("AllowServiceExternalIPs=false,KubeProxyIPVS=false").unwrap();
        assert!(!g.enabled(ALLOW_SERVICE_EXTERNAL_IPS) && !g.enabled(KUBE_PROXY_IPVS));
        let (g, _) = parse("KubeProxyNFTablesLocalhostNodePorts=false,AllBeta=true").unwrap();
        assert!(!g.enabled(NFTABLES_LOCALHOST_NODEPORTS), "an explicit value wins over AllBeta");
        assert!(g.enabled(COMPONENT_STATUSZ));
        // AllBeta=false turns every beta gate not set itself off.
        let (g, _) = parse("AllBeta=false,ComponentFlagz=true").unwrap();
        assert!(!g.enabled(COMPONENT_STATUSZ) && !g.enabled(NFTABLES_LOCALHOST_NODEPORTS));
        assert!(g.enabled(COMPONENT_FLAGZ), "an explicit value wins over AllBeta");
        assert!(g.enabled(KUBE_PROXY_IPVS), "a deprecated gate is not beta");
        let err = parse("PreferSameTrafficDistribution=false").unwrap_err();
        assert_eq!(err, "cannot set feature gate PreferSameTrafficDistribution to false, feature is locked to true");
        assert!(parse("PreferSameTrafficDistribution=true").is_ok());
    }
}
