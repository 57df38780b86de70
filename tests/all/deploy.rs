//! deploy/: every manifest parses as its Kubernetes type; the DaemonSet's
//! command runs on the ConfigMap's config.conf; the Dockerfile is well
//! formed; and the ClusterRole grants exactly the (verb, resource) pairs
//! kpx's API source used against the list/watch server (checked by
//! api_source's tests with [`check_cluster_role`]).

use std::collections::BTreeSet;
use std::path::Path;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kpx::cli::Cli;
use kpx::config::Source;

fn deploy_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy"))
}

fn documents() -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(deploy_dir().join("kpx.yaml")).expect("deploy/kpx.yaml");
    text.split("\n---\n").map(|d| serde_saphyr::from_str(d).expect("a YAML document")).collect()
}

fn typed<T: serde::de::DeserializeOwned>(kind: &str) -> T {
    let doc = documents().into_iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind} in deploy/"));
    serde_json::from_value(doc).unwrap_or_else(|e| panic!("{kind}: {e}"))
}

/// The ClusterRole's grants as (verb, `group/plural`).
fn granted() -> BTreeSet<(String, String)> {
    let role: ClusterRole = typed("ClusterRole");
    let mut out = BTreeSet::new();
    for rule in role.rules.unwrap_or_default() {
        for group in rule.api_groups.unwrap_or_default() {
            for resource in rule.resources.clone().unwrap_or_default() {
                for verb in &rule.verbs {
                    out.insert((verb.clone(), format!("{group}/{resource}")));
                }
            }
        }
    }
    out
}

/// The ClusterRole allows every request kpx made, and nothing it did not.
pub fn check_cluster_role(requests: &[kpx_listwatch::Logged]) {
    let used: BTreeSet<(String, String)> = requests.iter().map(|r| (r.verb.clone(), r.resource.clone())).collect();
    let granted = granted();
    let missing: Vec<_> = used.difference(&granted).collect();
    let unused: Vec<_> = granted.difference(&used).collect();
    assert!(missing.is_empty(), "kpx asked for what deploy/kpx.yaml's ClusterRole does not grant: {missing:?}");
    assert!(unused.is_empty(), "deploy/kpx.yaml's ClusterRole grants what kpx never asked for: {unused:?}");
}

#[test]
fn every_manifest_parses_as_its_type() {
    let kinds: Vec<String> = documents().iter().map(|d| d["kind"].as_str().unwrap_or("").to_string()).collect();
    assert_eq!(kinds, ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet"]);
    let sa: ServiceAccount = typed("ServiceAccount");
    let binding: ClusterRoleBinding = typed("ClusterRoleBinding");
    assert_eq!(binding.role_ref.name, "kpx");
    let subject = &binding.subjects.expect("a subject")[0];
    assert_eq!((subject.name.as_str(), subject.namespace.as_deref()), ("kpx", sa.metadata.namespace.as_deref()));
    let ds: DaemonSet = typed("DaemonSet");
    let pod = ds.spec.template.spec.expect("pod spec");
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.service_account_name.as_deref(), Some("kpx"));
    let container = &pod.containers[0];
    assert_eq!(container.security_context.as_ref().and_then(|s| s.privileged), Some(true));
    let mounts: Vec<&str> = container.volume_mounts.iter().flatten().map(|m| m.mount_path.as_str()).collect::<Vec<_>>();
    for path in ["/run/xtables.lock", "/lib/modules", "/var/lib/kube-proxy"] {
        assert!(mounts.contains(&path), "{path} is not mounted: {mounts:?}");
    }
    for probe in [&container.liveness_probe, &container.readiness_probe] {
        let port = probe.as_ref().and_then(|p| p.http_get.as_ref()).map(|h| h.port.clone());
        assert_eq!(port, Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(10256)));
    }
}

#[test]
fn the_daemonset_command_runs_on_the_configmap() {
    let cm: ConfigMap = typed("ConfigMap");
    let config = cm.data.expect("data")["config.conf"].clone();
    let dir = std::env::temp_dir().join(format!("kpx-deploy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.conf"), config).unwrap();
    let ds: DaemonSet = typed("DaemonSet");
    let command = ds.spec.template.spec.unwrap().containers[0].command.clone().unwrap();
    // The DaemonSet's command, with the mount and the node name substituted.
    let args: Vec<String> = command
        .iter()
        .map(|a| a.replace("/var/lib/kube-proxy", dir.to_str().unwrap()).replace("$(NODE_NAME)", "node-1"))
        .collect();
    let cli = Cli::from_args(args.iter().map(std::ffi::OsString::from)).expect("the command line parses");
    let config = cli.flags.validate().expect("the configuration is valid");
    assert_eq!(config.node_name, "node-1");
    assert_eq!(config.mode.as_str(), "iptables");
    match config.source {
        Source::Api(api) => assert!(api.kubeconfig.is_none() && api.master.is_none(), "in-cluster"),
        other => panic!("{other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_dockerfile_is_well_formed() {
    let text = std::fs::read_to_string(deploy_dir().join("Dockerfile")).expect("deploy/Dockerfile");
    let mut stages = Vec::new();
    let mut logical = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with('#') || line.trim().is_empty() {
            continue;
        }
        logical.push_str(line.trim_end().trim_end_matches('\\'));
        if line.trim_end().ends_with('\\') {
            logical.push(' ');
            continue;
        }
        let instruction = std::mem::take(&mut logical);
        let (op, rest) = instruction.trim().split_once(' ').expect("an instruction with arguments");
        match op {
            "FROM" => {
                let parts: Vec<&str> = rest.split_whitespace().collect();
                stages.push(if parts.len() == 3 && parts[1] == "AS" { parts[2].to_string() } else { String::new() });
            }
            "COPY" => {
                if let Some(from) = rest.strip_prefix("--from=") {
                    let stage = from.split_whitespace().next().unwrap();
                    assert!(stages.iter().any(|s| s == stage), "COPY --from={stage}: no such stage");
                    assert!(rest.contains("/target/release/kpx"), "the image takes the release binary: {rest}");
                }
            }
            "RUN" | "WORKDIR" | "ENTRYPOINT" | "ENV" | "ARG" | "LABEL" | "USER" | "EXPOSE" | "CMD" => {}
            other => panic!("unknown Dockerfile instruction {other:?}"),
        }
        assert!(!stages.is_empty(), "{op} before FROM");
    }
    assert_eq!(stages.len(), 2, "multi-stage: a build stage and the runtime image");
    // What every mode needs: iptables (both backends: Debian's package),
    // ipset for ipvs mode, and kube-proxy's image's kmod and nft.
    let runtime = text.rsplit("\nFROM ").next().unwrap();
    let install = runtime.split("apt-get install").nth(1).expect("the runtime image installs packages");
    let packages: BTreeSet<&str> =
        install.split("&&").next().unwrap().split_whitespace().filter(|w| !w.starts_with('-') && *w != "\\").collect();
    for needed in ["iptables", "ipset", "kmod", "nftables"] {
        assert!(packages.contains(needed), "the runtime image lacks {needed}: {packages:?}");
    }
    // kpx picks the node's iptables backend itself: nothing pins one.
    let code: String = text.lines().filter(|l| !l.trim_start().starts_with('#')).collect();
    assert!(!code.contains("update-alternatives") && !code.contains("iptables-wrapper"), "the image pins a backend");
    let manifests = std::fs::read_to_string(deploy_dir().join("kpx.yaml")).unwrap();
    assert!(
        !manifests.contains("iptables-backend") && !manifests.contains("iptablesBackend"),
        "kpx.yaml pins a backend"
    );
    assert!(text.contains("cargo build --release -p kpx-host"));
    assert!(text.contains("ln -s kpx /usr/local/bin/kube-proxy"), "kubeadm's command path must work");
}
