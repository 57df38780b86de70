//! The command line: kube-proxy's flags ([`Flags`]) or a kpx subcommand,
//! parsed as Kubernetes components parse theirs, with `--config` read in.
//! Above the commands it names (trace, conformance, new-plugin, demo) and
//! the configuration it fills.

use clap::Parser;

use crate::config::{Flags, file};

/// kpx: a Kubernetes service proxy whose proxy modes are sandboxed WebAssembly components.
/// The command line: kube-proxy's flags, or a kpx subcommand.
#[derive(Debug, Parser)]
#[command(name = "kpx", disable_version_flag = true, args_conflicts_with_subcommands = true, args_override_self = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub flags: Flags,
    /// Flags given with --config that the file replaced, and the
    /// configuration file's unknown fields: warnings for once logging runs.
    #[arg(skip)]
    pub warnings: Vec<String>,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Explain where a packet goes through this node's live rules.
    Trace(crate::trace::Args),
    /// Check a plugin component (a scheduler, a backend or an extension:
    /// its kind is read from its exports) against the contract, hostile
    /// inputs, (backends) the conformance flows and (schedulers) the
    /// distribution checks; prints a pass/fail table and exits non-zero on
    /// any failure.
    Conformance(crate::conformance::Args),
    /// Create a plugin crate (--kind scheduler, backend or extension) that
    /// builds out of kpx's tree with `cargo plugin`.
    NewPlugin(crate::template::Args),
    /// The demo: kpx on its embedded manifests in network namespaces, with
    /// real traffic (root only; the host's own network is not touched).
    Demo(crate::demo::Args),
}

/// Every listed flag with its value as given on the command line, or its
/// default (upstream's /flagz: command-line values, not the configuration
/// in effect).
fn flag_values(matches: &clap::ArgMatches) -> Vec<(String, String)> {
    use clap::CommandFactory;
    let mut out = Vec::new();
    for arg in Flags::command().get_arguments().filter(|a| !a.is_hide_set()) {
        let Some(long) = arg.get_long() else { continue };
        let given = matches
            .try_get_raw(arg.get_id().as_str())
            .ok()
            .flatten()
            .map(|values| values.map(|v| v.to_string_lossy().into_owned()).collect::<Vec<_>>().join(","));
        let value = given.unwrap_or_else(|| {
            arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect::<Vec<_>>().join(",")
        });
        out.push((long.to_string(), value));
    }
    out
}

/// As Kubernetes components normalize flag names: `_` and `-` are the
/// same in a long flag's name (`--log_file` is `--log-file`).
pub fn normalize_args<I: IntoIterator<Item = std::ffi::OsString>>(args: I) -> Vec<std::ffi::OsString> {
    let mut out = Vec::new();
    let mut rest = false;
    for arg in args {
        let text = match arg.to_str() {
            Some(t) if !rest && t.starts_with("--") && t.len() > 2 => t,
            _ => {
                out.push(arg);
                continue;
            }
        };
        let (name, value) = match text.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (text, None),
        };
        let mut fixed = name.replace('_', "-");
        if let Some(v) = value {
            fixed.push('=');
            fixed.push_str(v);
        }
        out.push(fixed.into());
        if text == "--" {
            rest = true;
        }
    }
    out
}

impl Cli {
    /// Parses a command line as Kubernetes components do (see
    /// [`normalize_args`], [`crate::config::go_bool`]; a repeated flag's last value
    /// wins), and reads --config: the file's values replace the flags',
    /// except the flags [`Flags::copy_arg`] copies (upstream: logging and
    /// --hostname-override; and kpx's own); any other flag given with
    /// --config is ignored with a warning, as upstream ignores it.
    pub fn from_args<I: IntoIterator<Item = std::ffi::OsString>>(args: I) -> std::result::Result<Cli, CliError> {
        use clap::{CommandFactory, FromArgMatches};
        let matches = Cli::command().try_get_matches_from(normalize_args(args))?;
        let mut cli = Cli::from_arg_matches(&matches)?;
        cli.flags.flagz = flag_values(&matches);
        if cli.command.is_some() || cli.flags.config.is_empty() {
            return Ok(cli);
        }
        let path = cli.flags.config.clone();
        let text = std::fs::read_to_string(&path).map_err(|source| file::Error::Read { path: path.clone(), source })?;
        let parsed = file::parse(&path, &text)?;
        let mut flags = Flags::defaults();
        parsed.apply(&mut flags);
        let given = |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
        let mut ignored = Vec::new();
        for id in Flags::command().get_arguments().map(|a| a.get_id().to_string()) {
            if !given(&id) {
                continue;
            }
            if !flags.copy_arg(&cli.flags, &id) {
                ignored.push(format!("--{}", id.replace('_', "-")));
            }
        }
        if !ignored.is_empty() {
            cli.warnings
                .push(format!("ignoring {} because --config is given (as kube-proxy does)", ignored.join(", ")));
        }
        cli.warnings.extend(
            parsed
                .unknown_fields()
                .into_iter()
                .map(|f| format!("--config {path}: unknown field {f} ignored (kube-proxy decodes leniently too)")),
        );
        flags.flagz = std::mem::take(&mut cli.flags.flagz);
        cli.flags = flags;
        Ok(cli)
    }
}

/// A command line that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Clap(#[from] clap::Error),
    #[error(transparent)]
    File(#[from] file::Error),
}
