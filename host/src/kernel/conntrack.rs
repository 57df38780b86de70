//! kube-proxy's conntrack settings (upstream's `setupConntrack`). The
//! timeouts and tcp_be_liberal are per network namespace; nf_conntrack_max
//! is global and read-only outside the host's namespace, so a failure to
//! set it is logged and kpx goes on.

pub mod stale;
pub mod table;

use crate::config::Conntrack;

use super::sysctl::Sysctl;

/// upstream's `getConntrackMax`: max(min, per-core × CPUs); 0 leaves it.
pub fn conntrack_max(config: &Conntrack, cpus: u32) -> u32 {
    if config.max_per_core == 0 {
        return 0;
    }
    config.max_per_core.saturating_mul(cpus).max(config.min)
}

/// The (sysctl, value) pairs to write.
pub fn wanted(config: &Conntrack, be_liberal: bool, cpus: u32) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let max = conntrack_max(config, cpus);
    if max > 0 {
        out.push(("net.netfilter.nf_conntrack_max", max.to_string()));
    }
    for (name, value) in [
        ("net.netfilter.nf_conntrack_tcp_timeout_established", config.tcp_established),
        ("net.netfilter.nf_conntrack_tcp_timeout_close_wait", config.tcp_close_wait),
        ("net.netfilter.nf_conntrack_udp_timeout", config.udp),
        ("net.netfilter.nf_conntrack_udp_timeout_stream", config.udp_stream),
    ] {
        if !value.is_zero() {
            out.push((name, value.as_secs().max(1).to_string()));
        }
    }
    if be_liberal {
        out.push(("net.netfilter.nf_conntrack_tcp_be_liberal", "1".into()));
    }
    out
}

/// Writes the settings; each failure is logged.
pub fn apply(config: &Conntrack, be_liberal: bool, sysctl: &Sysctl) {
    let cpus = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1);
    for (name, value) in wanted(config, be_liberal, cpus) {
        if let Err(e) = sysctl.set(name, &value) {
            tracing::warn!(
                "cannot set {name}={value} (global settings are read-only outside the host's namespace): {e}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn upstream_defaults() -> Conntrack {
        Conntrack {
            max_per_core: 32768,
            min: 131072,
            tcp_established: Duration::from_secs(86400),
            tcp_close_wait: Duration::from_secs(3600),
            udp: Duration::ZERO,
            udp_stream: Duration::ZERO,
        }
    }

    #[test]
    fn max_follows_upstream() {
        let c = upstream_defaults();
        assert_eq!(conntrack_max(&c, 2), 131072, "min wins on small nodes");
        assert_eq!(conntrack_max(&c, 8), 262144);
        assert_eq!(conntrack_max(&Conntrack { max_per_core: 0, ..c }, 64), 0);
    }

    #[test]
    fn writes_the_settings_given() {
        let dir = std::env::temp_dir().join(format!("kpx-conntrack-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("net/netfilter")).unwrap();
        let sysctl = Sysctl::with_root(&dir);
        let config = Conntrack { udp: Duration::from_secs(45), ..upstream_defaults() };
        apply(&config, true, &sysctl);
        for (name, want) in [
            ("nf_conntrack_tcp_timeout_established", "86400"),
            ("nf_conntrack_tcp_timeout_close_wait", "3600"),
            ("nf_conntrack_udp_timeout", "45"),
            ("nf_conntrack_tcp_be_liberal", "1"),
        ] {
            assert_eq!(std::fs::read_to_string(dir.join("net/netfilter").join(name)).unwrap(), want, "{name}");
        }
        assert!(!dir.join("net/netfilter/nf_conntrack_udp_timeout_stream").exists(), "0 leaves it as-is");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
