//! The conformance cases (tests/cases/*.yaml, embedded in the binary at
//! build time): manifests, node, kube-proxy flags, and packet flows with
//! their expected outcome, in a form that does not depend on the proxy
//! mode. The tracer runner, the real-kernel runner and `kpx conformance`
//! read them.

use std::collections::BTreeMap;
use std::net::IpAddr;

use clap::Parser;
use kpx_rules::model::{IpFamily, Protocol, ServicePort};
use serde::Deserialize;

use crate::config::{Config, Flags};
use crate::source::Event;
use crate::source::manifests::parse_documents;
use crate::state::State;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/conformance_cases.rs"));
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// The case file's name (`07-nodeport.yaml`).
    #[serde(skip)]
    pub name: String,
    /// What the case shows.
    pub about: String,
    /// kube-proxy flags (besides --manifests and --hostname-override).
    #[serde(default)]
    pub flags: Vec<String>,
    pub node: CaseNode,
    /// Ordinary Kubernetes YAML.
    pub manifests: String,
    pub flows: Vec<Flow>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseNode {
    pub name: String,
    /// The node's addresses; the first of each family is its primary.
    pub addresses: Vec<IpAddr>,
    #[serde(default, rename = "podCIDRs")]
    pub pod_cidrs: Vec<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Flow {
    pub name: String,
    /// Source address; a node address or loopback means the node itself.
    pub from: IpAddr,
    /// `ip:port` or `[ip]:port`.
    pub to: String,
    #[serde(default = "tcp")]
    pub proto: String,
    /// Interface the packet arrives on (interface-based local detection).
    #[serde(default)]
    pub iface: Option<String>,
    /// "ip:port, ip:port", "DROP", "REJECT" or "ACCEPT".
    pub expect: String,
    #[serde(default)]
    pub masq: bool,
    /// Where upstream's nftables mode differs by design (no localhost node
    /// ports; unused cluster-IP ports rejected; ServiceCIDR drops).
    #[serde(default)]
    pub expect_nftables: Option<String>,
    /// Where upstream's ipvs mode differs by design, with the reason in
    /// the case (Service addresses are local on kube-ipvs0; no localhost
    /// node ports; an empty virtual server answers port-unreachable).
    #[serde(default)]
    pub expect_ipvs: Option<String>,
    /// Whether ipvs mode masquerades, where it differs from `masq`.
    #[serde(default)]
    pub masq_ipvs: Option<bool>,
    /// Where kpx's userspace mode differs, with the reason in the case.
    /// (Its relay always masquerades: the endpoint sees the node.)
    #[serde(default)]
    pub expect_userspace: Option<String>,
    /// Repeated connections from one client stay on one endpoint.
    #[serde(default)]
    pub sticky: bool,
    /// Why no real packet can make this flow (the tracer alone checks
    /// it): e.g. a source that is the destination address itself.
    #[serde(default)]
    pub traced_only: Option<String>,
}

fn tcp() -> String {
    "TCP".into()
}

impl Flow {
    pub fn protocol(&self) -> Protocol {
        match self.proto.as_str() {
            "UDP" => Protocol::Udp,
            "SCTP" => Protocol::Sctp,
            _ => Protocol::Tcp,
        }
    }

    pub fn destination(&self) -> (IpAddr, u16) {
        // Checked when the case was read.
        let parsed: std::net::SocketAddr = self.to.parse().expect("a checked destination");
        (parsed.ip(), parsed.port())
    }

    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.destination().0)
    }

    /// Whether the endpoint sees the node's address in a mode.
    pub fn masquerades(&self, mode: &str) -> bool {
        match (mode, self.masq_ipvs) {
            // The proxy's own connection: a userspace proxy cannot keep the
            // client's address.
            ("userspace", _) => true,
            ("ipvs", Some(m)) => m,
            _ => self.masq,
        }
    }

    /// The expected outcome in a mode.
    pub fn expected(&self, mode: &str) -> &str {
        match (mode, &self.expect_nftables, &self.expect_ipvs, &self.expect_userspace) {
            ("nftables", Some(e), _, _) | ("ipvs", _, Some(e), _) | ("userspace", _, _, Some(e)) => e,
            _ => &self.expect,
        }
    }

    /// Whether the node itself sends the packet.
    pub fn from_node(&self, case: &Case) -> bool {
        self.from.is_loopback() || case.node.addresses.contains(&self.from)
    }

    fn check(&self) -> Result<(), String> {
        if !matches!(self.proto.as_str(), "TCP" | "UDP" | "SCTP") {
            return Err(format!("flow {:?}: unknown protocol {}", self.name, self.proto));
        }
        self.to.parse::<std::net::SocketAddr>().map_err(|e| format!("flow {:?}: to {:?}: {e}", self.name, self.to))?;
        Ok(())
    }
}

impl Case {
    /// Reads one case file's text.
    pub fn parse(name: &str, text: &str) -> Result<Case, String> {
        let mut case: Case = serde_saphyr::from_str(text).map_err(|e| format!("{name}: {e}"))?;
        case.name = name.to_string();
        for flow in &case.flows {
            flow.check().map_err(|e| format!("{name}: {e}"))?;
        }
        Ok(case)
    }

    /// Every case that ships in the binary, in file order.
    pub fn all() -> Vec<Case> {
        embedded::CASES
            .iter()
            .map(|(name, text)| Case::parse(name, text).unwrap_or_else(|e| panic!("an embedded case: {e}")))
            .collect()
    }

    pub fn label(&self) -> &str {
        &self.name
    }

    /// The Node object the case describes, as YAML.
    pub fn node_manifest(&self) -> String {
        let addresses: Vec<String> =
            self.node.addresses.iter().map(|a| format!("{{type: InternalIP, address: \"{a}\"}}")).collect();
        let labels: Vec<String> = self.node.labels.iter().map(|(k, v)| format!("{k}: \"{v}\"")).collect();
        let cidrs: Vec<String> = self.node.pod_cidrs.iter().map(|c| format!("\"{c}\"")).collect();
        format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: {}, labels: {{{}}}}}\nspec: {{podCIDRs: [{}]}}\nstatus: {{addresses: [{}]}}\n",
            self.node.name,
            labels.join(", "),
            cidrs.join(", "),
            addresses.join(", ")
        )
    }

    /// kpx's command-line arguments for the case (its flags after
    /// `--manifests` and `--hostname-override`), plus `extra`.
    pub fn args(&self, manifests: &std::path::Path, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "--manifests".into(),
            manifests.display().to_string(),
            "--hostname-override".into(),
            self.node.name.clone(),
        ];
        args.extend(self.flags.iter().cloned());
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    /// kpx's configuration for the case's flags, plus `extra` arguments.
    pub fn config(&self, manifests: &std::path::Path, extra: &[&str]) -> Result<Config, String> {
        let args = std::iter::once("kpx".to_string()).chain(self.args(manifests, extra));
        Flags::try_parse_from(args)
            .map_err(|e| format!("{}: flags: {e}", self.name))?
            .validate()
            .map_err(|e| format!("{}: flags: {e}", self.name))
    }

    /// The state the case's manifests and node produce.
    pub fn state(&self) -> Result<State, String> {
        let config = self.config(std::path::Path::new("."), &[])?;
        let external_ips = config.extra.feature_gates.enabled(crate::config::gates::ALLOW_SERVICE_EXTERNAL_IPS);
        let mut state = State::new(self.node.name.clone()).allow_external_ips(external_ips);
        for text in [self.manifests.as_str(), &self.node_manifest()] {
            let (objects, errors) = parse_documents(text);
            if let Some(e) = errors.first() {
                return Err(format!("{}: {e}", self.name));
            }
            for o in objects {
                state.apply(Event::Apply(o));
            }
        }
        state.apply(Event::Synced);
        Ok(state)
    }

    pub fn service_ports(&self, state: &State, family: IpFamily) -> Vec<ServicePort> {
        let names: Vec<_> = state.service_names().cloned().collect();
        names.iter().flat_map(|n| state.service_ports(family, n)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_embedded_case_reads_and_builds_its_state() {
        let cases = Case::all();
        assert!(cases.len() >= 23, "{} cases", cases.len());
        let flows: usize = cases.iter().map(|c| c.flows.len()).sum();
        assert!(flows >= 60, "the suite has only {flows} flows");
        for case in &cases {
            case.state().unwrap();
            case.config(std::path::Path::new("/dev/null"), &[]).unwrap();
        }
        assert!(Case::parse("bad.yaml", "about: x\nnode: {name: n, addresses: []}\nmanifests: ''\nflows: [{name: f, from: 10.0.0.1, to: nowhere, expect: DROP}]").unwrap_err().contains("flow \"f\": to \"nowhere\""));
    }
}
