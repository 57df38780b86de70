//! Upstream kube-proxy's nftables ruleset shape, as the reference kpx's
//! own sync is measured against (pkg/proxy/nftables/proxier.go, as
//! summarised in upstream-kube-proxy-notes.md §3): one `service-` chain
//! per service port choosing among `endpoint-` chains with `numgen random
//! mod N vmap`, one `endpoint-` chain per endpoint (masquerade mark for
//! hairpin, then DNAT), `external-` chains for NodePort and LoadBalancer
//! Services, dispatch by the `service-ips` and `service-nodeports` verdict
//! maps, names `hashAndTruncate`d. It is written as `nft -f` text, which
//! is how upstream writes (knftables runs `nft`), and loaded into a fresh
//! namespace: the time is the kernel's and nft's, what upstream's shape
//! costs to program, with none of upstream's own Go work.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use sha2::{Digest, Sha256};

use crate::cluster;
use crate::netns::Netns;

/// upstream's `hashAndTruncate`: base32(sha256(name))[:8] + "-" + name.
fn hashed(prefix: &str, name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let mut hash = data_encoding::BASE32.encode(&digest);
    hash.truncate(8);
    format!("{prefix}{hash}-{name}")
}

/// The ruleset upstream writes for the synthetic cluster of
/// `cluster::manifests(services, endpoints, None)`.
pub fn ruleset(services: usize, endpoints: usize) -> String {
    const MARK: &str = "0x4000";
    let mut chains = String::new();
    let (mut ips, mut node_ports) = (Vec::new(), Vec::new());
    for i in 0..services {
        let name = format!("bench/svc-{i}/tcp/http");
        let service = hashed("service-", &name);
        let cluster_ip = cluster::cluster_ip(i);
        let kind = i % 10;
        // Endpoint chains first: a rule's goto needs its chain declared.
        let picks: Vec<String> = (0..endpoints)
            .map(|j| {
                let ep = cluster::endpoint_ip(i, j);
                let chain = hashed("endpoint-", &format!("{name}__{ep}/8080"));
                let _ = writeln!(
                    chains,
                    "  chain {chain} {{\n    ip saddr {ep} jump mark-for-masquerade\n    meta l4proto tcp dnat to {ep}:8080\n  }}"
                );
                format!("{j} : goto {chain}")
            })
            .collect();
        let _ = writeln!(
            chains,
            "  chain {service} {{\n    ip daddr {cluster_ip} tcp dport 80 ip saddr != 10.128.0.0/9 jump mark-for-masquerade"
        );
        if !picks.is_empty() {
            let _ = writeln!(chains, "    numgen random mod {endpoints} vmap {{ {} }}", picks.join(", "));
        }
        chains.push_str("  }\n");
        ips.push(format!("{cluster_ip} . tcp . 80 : goto {service}"));
        if kind < 3 {
            let external = hashed("external-", &name);
            let _ = writeln!(chains, "  chain {external} {{\n    jump mark-for-masquerade\n    goto {service}\n  }}");
            node_ports.push(format!("tcp . {} : goto {external}", 20000 + i % 45000));
            if kind == 0 {
                ips.push(format!("{} . tcp . 80 : goto {external}", cluster::lb_ip(i)));
            }
        }
    }
    let mut out = String::with_capacity(chains.len() + 4096);
    out.push_str("table ip kube-proxy {\n");
    let _ = writeln!(
        out,
        "  chain mark-for-masquerade {{\n    mark set mark or {MARK}\n  }}\n  chain masquerading {{\n    mark and {MARK} == 0 return\n    mark set mark xor {MARK}\n    masquerade fully-random\n  }}"
    );
    out.push_str(&chains);
    // The maps after the chains their verdicts name.
    let _ = writeln!(
        out,
        "  map service-ips {{\n    type ipv4_addr . inet_proto . inet_service : verdict\n    elements = {{ {} }}\n  }}",
        ips.join(",\n      ")
    );
    if node_ports.is_empty() {
        out.push_str("  map service-nodeports {\n    type inet_proto . inet_service : verdict\n  }\n");
    } else {
        let _ = writeln!(
            out,
            "  map service-nodeports {{\n    type inet_proto . inet_service : verdict\n    elements = {{ {} }}\n  }}",
            node_ports.join(",\n      ")
        );
    }
    let _ = writeln!(
        out,
        "  chain services {{\n    ip daddr . meta l4proto . th dport vmap @service-ips\n    fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports\n  }}\n  chain nat-prerouting {{\n    type nat hook prerouting priority -100; policy accept;\n    jump services\n  }}\n  chain nat-output {{\n    type nat hook output priority -100; policy accept;\n    jump services\n  }}\n  chain nat-postrouting {{\n    type nat hook postrouting priority 100; policy accept;\n    jump masquerading\n  }}\n}}"
    );
    out
}

/// Loads upstream's shape for the size into a fresh namespace with
/// `nft -f`: (time, chains).
pub fn load(services: usize, endpoints: usize) -> Result<(Duration, usize)> {
    let text = ruleset(services, endpoints);
    let chains = text.matches("\n  chain ").count();
    let ns = Netns::new(&format!("up-{services}x{endpoints}"))?;
    let t = Instant::now();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns.0, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child.stdin.take().expect("piped").write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    let took = t.elapsed();
    if !out.status.success() {
        bail!("nft -f refused upstream's shape: {}", String::from_utf8_lossy(&out.stderr).lines().next().unwrap_or(""));
    }
    Ok((took, chains))
}
