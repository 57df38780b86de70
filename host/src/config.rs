//! Command-line flags with kube-proxy's names and defaults, validated into
//! a [`Config`]. Bad values are refused with the flag's name.

mod duration;

pub use duration::parse_duration;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use kpx_rules::model::Cidr;

/// Why the flags cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag has a value kpx refuses; exit with this message.
    #[error("invalid value {value:?} for --{flag}: {reason}")]
    InvalidFlag {
        flag: &'static str,
        value: String,
        reason: String,
    },
    /// The host name could not be read and --hostname-override is empty.
    #[error("cannot determine the node name: {0} (set --hostname-override)")]
    NodeName(std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// kpx: a Kubernetes service proxy whose proxy modes are sandboxed WebAssembly components.
#[derive(Debug, Parser)]
#[command(name = "kpx", version = crate::VERSION_TEXT)]
pub struct Flags {
    /// Which proxy mode to use: 'iptables' (default).
    #[arg(long = "proxy-mode", default_value = "iptables")]
    pub proxy_mode: String,

    /// A YAML or JSON file, or a directory of them, holding v1 Service,
    /// discovery.k8s.io/v1 EndpointSlice and v1 Node objects; watched for changes.
    #[arg(long)]
    pub manifests: PathBuf,

    /// If non-empty, will be used as the name of the Node that kpx is running on.
    #[arg(long = "hostname-override", default_value = "")]
    pub hostname_override: String,

    /// The CIDR range of the pods in the cluster (a comma-separated dual-stack pair allowed).
    #[arg(long = "cluster-cidr", default_value = "")]
    pub cluster_cidr: String,

    /// Mode to use to detect local traffic: ClusterCIDR (default when --cluster-cidr is set).
    #[arg(long = "detect-local-mode", default_value = "")]
    pub detect_local_mode: String,

    /// SNAT all traffic sent via Service cluster IPs.
    #[arg(long = "masquerade-all", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub masquerade_all: bool,

    /// The bit of the fwmark space to mark packets requiring SNAT with. Must be within [0, 31].
    #[arg(
        long = "iptables-masquerade-bit",
        default_value_t = 14,
        allow_negative_numbers = true
    )]
    pub iptables_masquerade_bit: i32,

    /// The minimum period between iptables rule resyncs (e.g. '5s', '1m', '2h22m'); 0 resyncs on every change.
    #[arg(long = "iptables-min-sync-period", default_value = "1s")]
    pub iptables_min_sync_period: String,

    /// An interval (e.g. '5s', '1m', '2h22m') indicating how frequently various re-syncing operations are performed. Must be greater than 0.
    #[arg(long = "iptables-sync-period", default_value = "30s")]
    pub iptables_sync_period: String,

    /// kpx: a backend component (.wasm) to use instead of the mode's built-in one.
    #[arg(long = "backend-plugin")]
    pub backend_plugin: Option<PathBuf>,

    /// kpx: where compiled plugins are cached.
    #[arg(long = "plugin-cache-dir", default_value = "/var/cache/kpx")]
    pub plugin_cache_dir: PathBuf,

    /// kpx: memory limit of one plugin instance, in MiB.
    #[arg(long = "plugin-memory-limit-mib", default_value_t = 1024)]
    pub plugin_memory_limit_mib: u64,

    /// kpx: base fuel (about one unit per WebAssembly instruction) of one plugin call; the host adds a share per object in the state.
    #[arg(long = "plugin-fuel", default_value_t = 2_000_000_000)]
    pub plugin_fuel: u64,

    /// kpx: largest ruleset a plugin may return, in MiB.
    #[arg(long = "plugin-max-output-mib", default_value_t = 256)]
    pub plugin_max_output_mib: u64,

    /// Number for the log level verbosity (0-10).
    #[arg(long = "v", short = 'v', default_value_t = 2)]
    pub verbosity: u8,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub mode: String,
    pub manifests: PathBuf,
    pub node_name: String,
    pub cluster_cidrs: Vec<Cidr>,
    pub detect_local_mode: DetectLocalMode,
    pub masquerade_all: bool,
    pub masquerade_bit: u8,
    pub min_sync_period: Duration,
    pub sync_period: Duration,
    pub backend_plugin: Option<PathBuf>,
    pub plugin_cache_dir: PathBuf,
    pub plugin_limits: crate::runtime::Limits,
    pub verbosity: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DetectLocalMode {
    /// No local-traffic detection (no --cluster-cidr given).
    None,
    ClusterCidr,
}

fn invalid(flag: &'static str, value: &str, reason: impl Into<String>) -> Error {
    Error::InvalidFlag {
        flag,
        value: value.to_string(),
        reason: reason.into(),
    }
}

impl Flags {
    pub fn validate(self) -> Result<Config> {
        if self.proxy_mode != "iptables" {
            return Err(invalid(
                "proxy-mode",
                &self.proxy_mode,
                "this kpx supports: iptables",
            ));
        }
        let node_name = if self.hostname_override.trim().is_empty() {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map_err(Error::NodeName)?
                .trim()
                .to_lowercase()
        } else {
            self.hostname_override.trim().to_lowercase()
        };
        let mut cluster_cidrs: Vec<Cidr> = Vec::new();
        for part in self
            .cluster_cidr
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            let cidr: Cidr = part
                .parse()
                .map_err(|e| invalid("cluster-cidr", &self.cluster_cidr, format!("{e}")))?;
            if cluster_cidrs.iter().any(|c| c.family() == cidr.family()) {
                return Err(invalid(
                    "cluster-cidr",
                    &self.cluster_cidr,
                    "at most one CIDR per IP family",
                ));
            }
            cluster_cidrs.push(cidr);
        }
        let detect_local_mode = match self.detect_local_mode.as_str() {
            "" if cluster_cidrs.is_empty() => DetectLocalMode::None,
            "" | "ClusterCIDR" => {
                if cluster_cidrs.is_empty() {
                    return Err(invalid(
                        "detect-local-mode",
                        &self.detect_local_mode,
                        "ClusterCIDR needs --cluster-cidr",
                    ));
                }
                DetectLocalMode::ClusterCidr
            }
            other => {
                return Err(invalid(
                    "detect-local-mode",
                    other,
                    "this kpx supports: ClusterCIDR",
                ));
            }
        };
        if !(0..=31).contains(&self.iptables_masquerade_bit) {
            return Err(invalid(
                "iptables-masquerade-bit",
                &self.iptables_masquerade_bit.to_string(),
                "must be within [0, 31]",
            ));
        }
        let min_sync_period = parse_duration(&self.iptables_min_sync_period).map_err(|e| {
            invalid(
                "iptables-min-sync-period",
                &self.iptables_min_sync_period,
                e,
            )
        })?;
        let sync_period = parse_duration(&self.iptables_sync_period)
            .map_err(|e| invalid("iptables-sync-period", &self.iptables_sync_period, e))?;
        if sync_period.is_zero() {
            return Err(invalid(
                "iptables-sync-period",
                &self.iptables_sync_period,
                "must be greater than 0",
            ));
        }
        if min_sync_period > sync_period {
            return Err(invalid(
                "iptables-min-sync-period",
                &self.iptables_min_sync_period,
                "must not exceed --iptables-sync-period",
            ));
        }
        if self.plugin_memory_limit_mib < 16 {
            return Err(invalid(
                "plugin-memory-limit-mib",
                &self.plugin_memory_limit_mib.to_string(),
                "at least 16",
            ));
        }
        Ok(Config {
            mode: self.proxy_mode,
            manifests: self.manifests,
            node_name,
            cluster_cidrs,
            detect_local_mode,
            masquerade_all: self.masquerade_all,
            masquerade_bit: self.iptables_masquerade_bit as u8,
            min_sync_period,
            sync_period,
            backend_plugin: self.backend_plugin,
            plugin_cache_dir: self.plugin_cache_dir,
            plugin_limits: crate::runtime::Limits {
                memory_bytes: self.plugin_memory_limit_mib << 20,
                fuel_base: self.plugin_fuel,
                fuel_per_object: 200_000,
                max_output_bytes: self.plugin_max_output_mib << 20,
            },
            verbosity: self.verbosity,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Flags {
        let mut all = vec!["kpx", "--manifests", "/x", "--hostname-override", "node-a"];
        all.extend_from_slice(args);
        Flags::try_parse_from(all).unwrap()
    }

    #[test]
    fn defaults_as_upstream() {
        let c = flags(&[]).validate().unwrap();
        assert_eq!(c.min_sync_period, Duration::from_secs(1));
        assert_eq!(c.sync_period, Duration::from_secs(30));
        assert_eq!(c.masquerade_bit, 14);
        assert_eq!(c.detect_local_mode, DetectLocalMode::None);
        assert_eq!(c.node_name, "node-a");
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (args, flag) in [
            (
                vec!["--iptables-masquerade-bit", "32"],
                "iptables-masquerade-bit",
            ),
            (
                vec!["--iptables-masquerade-bit", "-1"],
                "iptables-masquerade-bit",
            ),
            (vec!["--iptables-sync-period", "0"], "iptables-sync-period"),
            (
                vec!["--iptables-min-sync-period", "soon"],
                "iptables-min-sync-period",
            ),
            (vec!["--cluster-cidr", "10.0.0.0/99"], "cluster-cidr"),
            (vec!["--proxy-mode", "carrier-pigeon"], "proxy-mode"),
            (
                vec!["--detect-local-mode", "ClusterCIDR"],
                "detect-local-mode",
            ),
        ] {
            let err = flags(&args).validate().unwrap_err().to_string();
            assert!(err.contains(&format!("--{flag}")), "{err}");
        }
    }

    #[test]
    fn cluster_cidr_enables_detection() {
        let c = flags(&["--cluster-cidr", "10.0.0.0/8,fd00::/48"])
            .validate()
            .unwrap();
        assert_eq!(c.detect_local_mode, DetectLocalMode::ClusterCidr);
        assert_eq!(c.cluster_cidrs.len(), 2);
    }
}
