//! Conformance cases (tests/cases/*.yaml): manifests, node, kube-proxy
//! flags, and packet flows with their expected outcome, in a form that does
//! not depend on the proxy mode. Both the tracer runner and the real-kernel
//! runner read them.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use clap::Parser;
use kpx::config::{Config, Flags};
use kpx::source::Event;
use kpx::source::manifests::parse_documents;
use kpx::state::State;
use kpx_rules::model::{IpFamily, Protocol, ServicePort};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    #[serde(skip)]
    pub file: PathBuf,
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
}

fn tcp() -> String {
    "TCP".into()
}

impl Flow {
    pub fn protocol(&self) -> Protocol {
        match self.proto.as_str() {
            "UDP" => Protocol::Udp,
            "SCTP" => Protocol::Sctp,
            "TCP" => Protocol::Tcp,
            other => panic!("flow {:?}: unknown protocol {other}", self.name),
        }
    }

    pub fn destination(&self) -> (IpAddr, u16) {
        let parsed: std::net::SocketAddr = self.to.parse().unwrap_or_else(|e| panic!("flow {:?}: {e}", self.name));
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
}

impl Case {
    pub fn load_all() -> Vec<Case> {
        // Lexically (no `..`): in the ipvs guest only this directory exists.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").join("tests/cases");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        files.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
        files.sort();
        files
            .into_iter()
            .map(|file| {
                let text = std::fs::read_to_string(&file).unwrap();
                let mut case: Case =
                    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                case.file = file;
                case
            })
            .collect()
    }

    pub fn label(&self) -> String {
        self.file.file_name().unwrap().to_string_lossy().into_owned()
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

    /// kpx's configuration for the case's flags, plus `extra` arguments.
    pub fn config(&self, manifests: &Path, extra: &[&str]) -> Config {
        let mut args: Vec<String> = vec![
            "kpx".into(),
            "--manifests".into(),
            manifests.display().to_string(),
            "--hostname-override".into(),
            self.node.name.clone(),
        ];
        args.extend(self.flags.iter().cloned());
        args.extend(extra.iter().map(|s| s.to_string()));
        Flags::try_parse_from(&args)
            .unwrap_or_else(|e| panic!("{}: flags: {e}", self.label()))
            .validate()
            .unwrap_or_else(|e| panic!("{}: flags: {e}", self.label()))
    }

    /// The state the case's manifests and node produce.
    pub fn state(&self) -> State {
        let mut state = State::new(self.node.name.clone());
        for text in [self.manifests.as_str(), &self.node_manifest()] {
            let (objects, errors) = parse_documents(text);
            assert!(errors.is_empty(), "{}: {errors:?}", self.label());
            for o in objects {
                state.apply(Event::Apply(o));
            }
        }
        state.apply(Event::Synced);
        state
    }

    pub fn service_ports(&self, state: &State, family: IpFamily) -> Vec<ServicePort> {
        let names: Vec<_> = state.service_names().cloned().collect();
        names.iter().flat_map(|n| state.service_ports(family, n)).collect()
    }
}
