//! kube-proxy's conntrack settings (upstream's `conntrack.SetSysctls`,
//! pkg/proxy/conntrack/sysctls.go at 3520f8d6, with v1.36's cap and v1.38's
//! rule for `nf_conntrack_max`). The timeouts and tcp_be_liberal are per
//! network namespace; nf_conntrack_max and the hash size are global and
//! read-only outside the host's namespace, so a failure to set one is
//! logged and kpx goes on (upstream's start fails there: kpx runs in
//! namespaces as well, docs/UPSTREAM.md).

pub mod stale;
pub mod table;

use std::path::{Path, PathBuf};

use crate::config::Conntrack;

use super::sysctl::Sysctl;

/// The most `--conntrack-max-per-core` × CPUs may ask for: v1.36 caps the
/// scaled value at 1,048,576 (kubernetes/kubernetes#137002, "when using
/// automatic calculation"), so large machines do not hold a table of
/// millions of entries; an explicit `--conntrack-min` above it stands.
pub const MAX_SCALED: u32 = 1 << 20;

/// The conntrack hash table's size, a module parameter.
pub const HASHSIZE: &str = "/sys/module/nf_conntrack/parameters/hashsize";

/// upstream's `getConntrackMax`: max(min, per-core × CPUs, capped at
/// [`MAX_SCALED`]); 0 leaves it.
pub fn conntrack_max(config: &Conntrack, cpus: u32) -> u32 {
    if config.max_per_core == 0 {
        return 0;
    }
    config.max_per_core.saturating_mul(cpus).min(MAX_SCALED).max(config.min)
}

/// The per-namespace (sysctl, value) pairs to write, in upstream's order.
pub fn wanted(config: &Conntrack, be_liberal: bool) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let secs = |d: std::time::Duration| d.as_secs().max(1).to_string();
    for (name, value) in [
        ("net.netfilter.nf_conntrack_tcp_timeout_established", config.tcp_established),
        ("net.netfilter.nf_conntrack_tcp_timeout_close_wait", config.tcp_close_wait),
    ] {
        if !value.is_zero() {
            out.push((name, secs(value)));
        }
    }
    if be_liberal {
        out.push(("net.netfilter.nf_conntrack_tcp_be_liberal", "1".into()));
    }
    for (name, value) in [
        ("net.netfilter.nf_conntrack_udp_timeout", config.udp),
        ("net.netfilter.nf_conntrack_udp_timeout_stream", config.udp_stream),
    ] {
        if !value.is_zero() {
            out.push((name, secs(value)));
        }
    }
    out
}

/// What [`set_max`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum MaxOutcome {
    /// Nothing asked (`--conntrack-max-per-core 0`).
    Untouched,
    /// The node's value is already at least the one wanted: left as is,
    /// as upstream does since v1.38 (kubernetes/kubernetes#142035).
    AlreadyHigher(u64),
    /// Written; and the hash size raised to max/4 when it was below.
    Set { hashsize: Option<u64> },
}

/// Where the settings live (other roots in tests).
#[derive(Debug, Clone)]
pub struct Globals {
    pub sysctl: Sysctl,
    pub hashsize: PathBuf,
}

impl Default for Globals {
    fn default() -> Self {
        Globals { sysctl: Sysctl::default(), hashsize: PathBuf::from(HASHSIZE) }
    }
}

fn read_number(path: &Path) -> Result<u64, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.trim().parse().map_err(|_| format!("{}: {:?} is not a number", path.display(), text.trim()))
}

/// upstream's `SetMax`: nf_conntrack_max raised to `max` (never lowered),
/// then the hash size raised to max/4 when it is below.
pub fn set_max(max: u32, globals: &Globals) -> Result<MaxOutcome, String> {
    if max == 0 {
        return Ok(MaxOutcome::Untouched);
    }
    let current = globals.sysctl.get("net.netfilter.nf_conntrack_max").map_err(|e| e.to_string())?;
    if let Ok(current) = current.parse::<u64>()
        && current >= u64::from(max)
    {
        return Ok(MaxOutcome::AlreadyHigher(current));
    }
    tracing::info!(nf_conntrack_max = max, "setting nf_conntrack_max");
    globals.sysctl.set("net.netfilter.nf_conntrack_max", &max.to_string()).map_err(|e| e.to_string())?;
    let hashsize = read_number(&globals.hashsize)?;
    let quarter = u64::from(max / 4);
    if hashsize >= quarter {
        return Ok(MaxOutcome::Set { hashsize: None });
    }
    tracing::info!(hashsize = quarter, "setting the conntrack hash size");
    std::fs::write(&globals.hashsize, quarter.to_string())
        .map_err(|e| format!("{}: {e}", globals.hashsize.display()))?;
    Ok(MaxOutcome::Set { hashsize: Some(quarter) })
}

/// This machine's CPUs, as upstream counts them (the machine's topology,
/// not a cgroup's share): /sys/devices/system/cpu/online.
pub fn machine_cpus() -> u32 {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let count = cpu_list_len(online.trim());
    if count > 0 {
        return count;
    }
    std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1)
}

/// The number of CPUs of a kernel CPU list ("0-3,8,10-11").
fn cpu_list_len(list: &str) -> u32 {
    let mut n = 0u32;
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        match (a.parse::<u32>(), b.parse::<u32>()) {
            (Ok(a), Ok(b)) if b >= a => n = n.saturating_add(b - a + 1),
            _ => return 0,
        }
    }
    n
}

/// Writes the settings; each failure is logged.
pub fn apply(config: &Conntrack, be_liberal: bool, globals: &Globals) {
    let max = conntrack_max(config, machine_cpus());
    match set_max(max, globals) {
        Ok(MaxOutcome::AlreadyHigher(current)) => tracing::info!(
            "nf_conntrack_max is {current}, at least the {max} kpx would set: left as is (as kube-proxy since v1.38)"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(
            "cannot set nf_conntrack_max={max} (global settings are read-only outside the host's namespace): {e}"
        ),
    }
    for (name, value) in wanted(config, be_liberal) {
        if let Err(e) = globals.sysctl.set(name, &value) {
            tracing::warn!("cannot set {name}={value}: {e}");
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
        // v1.36's cap on the scaled value (kubernetes/kubernetes#137002):
        // 256 CPUs would ask for 8M.
        assert_eq!(conntrack_max(&c, 256), 1_048_576);
        assert_eq!(conntrack_max(&c, 32), 1_048_576, "exactly the cap");
        assert_eq!(conntrack_max(&Conntrack { min: 2_000_000, ..c }, 256), 2_000_000, "an explicit minimum stands");
    }

    #[test]
    fn cpu_lists_count_as_the_kernel_writes_them() {
        assert_eq!(cpu_list_len("0-1"), 2);
        assert_eq!(cpu_list_len("0-3,8,10-11"), 7);
        assert_eq!(cpu_list_len("0"), 1);
        assert_eq!(cpu_list_len(""), 0);
        assert_eq!(cpu_list_len("3-1"), 0, "malformed");
        assert!(machine_cpus() >= 1);
    }

    /// A scratch tree with net/netfilter and the hash size parameter.
    fn globals(tag: &str, max: &str, hashsize: &str) -> (std::path::PathBuf, Globals) {
        let dir = std::env::temp_dir().join(format!("kpx-conntrack-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("net/netfilter")).unwrap();
        std::fs::write(dir.join("net/netfilter/nf_conntrack_max"), format!("{max}\n")).unwrap();
        std::fs::write(dir.join("hashsize"), format!("{hashsize}\n")).unwrap();
        let g = Globals { sysctl: Sysctl::with_root(&dir), hashsize: dir.join("hashsize") };
        (dir, g)
    }

    #[test]
    fn writes_the_settings_given() {
        let (dir, g) = globals("given", "65536", "16384");
        let config = Conntrack { udp: Duration::from_secs(45), ..upstream_defaults() };
        apply(&config, true, &g);
        for (name, want) in [
            ("nf_conntrack_tcp_timeout_established", "86400"),
            ("nf_conntrack_tcp_timeout_close_wait", "3600"),
            ("nf_conntrack_udp_timeout", "45"),
            ("nf_conntrack_tcp_be_liberal", "1"),
        ] {
            assert_eq!(std::fs::read_to_string(dir.join("net/netfilter").join(name)).unwrap(), want, "{name}");
        }
        assert!(!dir.join("net/netfilter/nf_conntrack_udp_timeout_stream").exists(), "0 leaves it as-is");
        let max = conntrack_max(&config, machine_cpus());
        assert_eq!(std::fs::read_to_string(dir.join("net/netfilter/nf_conntrack_max")).unwrap(), max.to_string());
        assert_eq!(std::fs::read_to_string(dir.join("hashsize")).unwrap(), (max / 4).to_string(), "raised to max/4");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// v1.38 (kubernetes/kubernetes#142035): a node tuned above what kpx
    /// would set keeps its value, and its hash size.
    #[test]
    fn a_higher_nf_conntrack_max_is_never_lowered() {
        let (dir, g) = globals("higher", "4194304", "1048576");
        assert_eq!(set_max(262144, &g), Ok(MaxOutcome::AlreadyHigher(4194304)));
        assert_eq!(set_max(4194304, &g), Ok(MaxOutcome::AlreadyHigher(4194304)), "equal is left too");
        assert_eq!(std::fs::read_to_string(dir.join("net/netfilter/nf_conntrack_max")).unwrap(), "4194304\n");
        assert_eq!(std::fs::read_to_string(dir.join("hashsize")).unwrap(), "1048576\n");
        // Lower than wanted: raised; the hash size only when below max/4.
        assert_eq!(set_max(8_388_608, &g), Ok(MaxOutcome::Set { hashsize: Some(2_097_152) }));
        std::fs::write(dir.join("net/netfilter/nf_conntrack_max"), "1000").unwrap();
        assert_eq!(set_max(4000, &g), Ok(MaxOutcome::Set { hashsize: None }), "a larger hash size stays");
        assert_eq!(set_max(0, &g), Ok(MaxOutcome::Untouched));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
