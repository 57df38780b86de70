//! `kpx conformance COMPONENT`: the conformance kit for plugin authors.
//!
//! The component's kind is read from what it exports (a scheduler or a
//! backend); the cases ship inside the binary. A backend is checked for
//! the contract (fresh instances agree; changes applied one by one render
//! what a reset renders; partial renders pass the host's checks), the
//! conformance flows through the packet tracer (and, with `--kernel`, real
//! packets through the real kernel in network namespaces), and hostile but
//! valid inputs (every refusal by the host is shown). A scheduler is checked
//! for its names, its plans in every mode, its per-connection picks, the
//! promises each name states (and no other: a 0.2.0 component is checked
//! as spreading), and, for the names IPVS defines, the behaviour the name
//! implies. An extension is checked for the contract on every case's
//! state and the hostile inputs, in both rule modes and families, its
//! rules through the host's checks and layout (and, with `--kernel`, real
//! connections through its rules and the mode's built-in backend in
//! network namespaces, against what its rules say, and its counters).
//! Each check is a row of a pass/fail table; any failure makes the command
//! exit non-zero.

pub mod backend;
pub mod cases;
pub mod extension;
pub mod extension_kernel;
pub mod kernel;
pub mod scheduler;
pub mod tracer;

use std::fmt;
use std::path::PathBuf;

use kpx_rules::model::ProxyMode;

use crate::runtime::{self, Limits, Runtime};

/// `kpx conformance [--mode M] [--kernel] COMPONENT`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The component: a .wasm file, or `builtin:NAME` (iptables, nftables,
    /// ipvs, schedulers) for one of kpx's own.
    pub component: String,
    /// A backend's proxy mode (iptables, nftables or ipvs); by default the
    /// kind of rules it returns for the first case. For an extension, with
    /// --kernel: the mode of its real-traffic flows (iptables or nftables;
    /// by default both).
    #[arg(long)]
    pub mode: Option<String>,
    /// Also send real packets through the real kernel: each case in its
    /// own network namespaces, with kpx running the component (root only;
    /// an extension runs beside the mode's built-in backend).
    #[arg(long)]
    pub kernel: bool,
    /// A backend's parameters (`KEY=VALUE`, repeatable), as
    /// `--backend-param` gives them to kpx.
    #[arg(long = "backend-param")]
    pub backend_params: Vec<String>,
    /// An extension's parameters (`key=value`, repeatable), as
    /// `--extension NAME=FILE,key=value` would give them.
    #[arg(long = "extension-param")]
    pub extension_params: Vec<String>,
    /// An annotation every Service of the kit's states carries for the
    /// extension (`key=value`, repeatable; the kit configures it as `kit`,
    /// so the Services get `ext.kpx.dev/kit.key`).
    #[arg(long = "extension-annotation")]
    pub extension_annotations: Vec<String>,
    /// Where compiled components are cached (default: compile in memory).
    #[arg(long = "plugin-cache-dir")]
    pub plugin_cache_dir: Option<PathBuf>,
}

/// What kind of component a file is, from its exports.
pub use crate::runtime::Kind;

/// One row of the table: a feature and the outcome of its checks.
#[derive(Debug, Clone, Default)]
pub struct Row {
    pub feature: String,
    pub passed: usize,
    pub failures: Vec<String>,
    /// Checks not run, one entry each (what the table's SKIP column
    /// counts), with the reason.
    pub skipped: Vec<String>,
    /// What the component refused, or the host refused of it, where that
    /// is allowed: shown, not failed.
    pub notes: Vec<String>,
}

impl Row {
    pub fn pass(&mut self) {
        self.passed += 1;
    }

    pub fn fail(&mut self, why: impl Into<String>) {
        self.failures.push(why.into());
    }

    pub fn skip(&mut self, why: impl Into<String>) {
        self.skipped.push(why.into());
    }

    pub fn note(&mut self, what: impl Into<String>) {
        self.notes.push(what.into());
    }

    /// Each reason checks were not run for, with how many, in the order
    /// first given: the counts add up to the SKIP column.
    pub fn skip_reasons(&self) -> Vec<(usize, &str)> {
        let mut out: Vec<(usize, &str)> = Vec::new();
        for why in &self.skipped {
            match out.iter_mut().find(|(_, seen)| *seen == why.as_str()) {
                Some((n, _)) => *n += 1,
                None => out.push((1, why.as_str())),
            }
        }
        out
    }

    /// Passes when `outcome` is Ok, fails with its reason otherwise.
    pub fn record(&mut self, outcome: Result<(), String>) {
        match outcome {
            Ok(()) => self.pass(),
            Err(why) => self.fail(why),
        }
    }
}

/// The whole run: a title and the rows, in the order they were checked.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub title: String,
    pub rows: Vec<Row>,
}

impl Report {
    /// The row for `feature`, added at the end when new.
    pub fn row(&mut self, feature: &str) -> &mut Row {
        match self.rows.iter().position(|r| r.feature == feature) {
            Some(i) => &mut self.rows[i],
            None => {
                self.rows.push(Row { feature: feature.to_string(), ..Row::default() });
                self.rows.last_mut().expect("just pushed")
            }
        }
    }

    pub fn failures(&self) -> usize {
        self.rows.iter().map(|r| r.failures.len()).sum()
    }

    pub fn checks(&self) -> usize {
        self.rows.iter().map(|r| r.passed + r.failures.len()).sum()
    }

    /// Every failure, as `feature: reason` lines.
    pub fn failure_lines(&self) -> Vec<String> {
        self.rows.iter().flat_map(|r| r.failures.iter().map(move |f| format!("{}: {f}", r.feature))).collect()
    }
}

/// Failures listed per row (the rest are counted).
const SHOWN_PER_ROW: usize = 4;

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.title)?;
        let width = self.rows.iter().map(|r| r.feature.chars().count()).max().unwrap_or(0).max(7);
        writeln!(f, "{:<width$}  {:>6}  {:>6}  {:>6}  RESULT", "FEATURE", "PASS", "FAIL", "SKIP")?;
        for r in &self.rows {
            let result = match (r.failures.len(), r.passed) {
                (0, 0) if !r.notes.is_empty() => "refused",
                (0, 0) => "skipped",
                (0, _) => "pass",
                _ => "FAIL",
            };
            writeln!(
                f,
                "{:<width$}  {:>6}  {:>6}  {:>6}  {result}",
                r.feature,
                r.passed,
                r.failures.len(),
                r.skipped.len()
            )?;
        }
        // Each skip is one check not run: a reason given for several says
        // how many, so the note adds up to the SKIP column.
        let not_run: Vec<String> = self
            .rows
            .iter()
            .flat_map(|r| {
                r.skip_reasons().into_iter().map(move |(n, why)| match n {
                    1 => format!("{}: {why}", r.feature),
                    n => format!("{}: {n} skipped: {why}", r.feature),
                })
            })
            .collect();
        let refusals: Vec<String> = self
            .rows
            .iter()
            .flat_map(|r| {
                let mut seen = std::collections::BTreeSet::new();
                r.notes.iter().filter(move |s| seen.insert(*s)).map(move |s| format!("{}: {s}", r.feature))
            })
            .collect();
        for (heading, lines) in [
            ("not run (each skip counted in its row's SKIP column)", not_run),
            ("refusals (shown, not failures)", refusals),
        ] {
            if !lines.is_empty() {
                writeln!(f, "\n{heading}:")?;
                for s in lines {
                    writeln!(f, "  {s}")?;
                }
            }
        }
        let failures = self.failure_lines();
        if !failures.is_empty() {
            writeln!(f, "\nfailures:")?;
            for r in self.rows.iter().filter(|r| !r.failures.is_empty()) {
                for s in r.failures.iter().take(SHOWN_PER_ROW) {
                    writeln!(f, "  {}: {s}", r.feature)?;
                }
                if r.failures.len() > SHOWN_PER_ROW {
                    writeln!(f, "  {}: ... and {} more", r.feature, r.failures.len() - SHOWN_PER_ROW)?;
                }
            }
        }
        let verdict = if failures.is_empty() { "PASS" } else { "FAIL" };
        write!(f, "\n{verdict}: {} checks, {} failed", self.checks(), failures.len())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    File { path: String, source: std::io::Error },
    #[error("no built-in component is named {0:?} (there are iptables, nftables, ipvs and schedulers)")]
    NoBuiltIn(String),
    #[error("--mode {0:?}: a backend's mode is iptables, nftables or ipvs")]
    Mode(String),
    #[error("{0}")]
    Plugin(#[from] runtime::Error),
    #[error("{component} is not a scheduler, a backend or an extension component: {scheduler}; {backend}; {extension}")]
    Kind { component: String, scheduler: String, backend: String, extension: String },
    #[error("{0}")]
    Other(String),
}

/// The component's bytes and the name kpx gives it.
fn read(component: &str) -> Result<(String, Vec<u8>), Error> {
    if let Some(name) = component.strip_prefix("builtin:") {
        let bytes = runtime::builtin::get(name).ok_or_else(|| Error::NoBuiltIn(name.to_string()))?;
        return Ok((name.to_string(), bytes.to_vec()));
    }
    let path = std::path::Path::new(component);
    let bytes = std::fs::read(path).map_err(|source| Error::File { path: component.to_string(), source })?;
    let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("plugin").to_string();
    Ok((name, bytes))
}

/// Runs the kit on one component. `kpx`: the binary the kernel flows run
/// (this one).
pub fn run(args: &Args, kpx: &std::path::Path) -> Result<Report, Error> {
    let (name, bytes) = read(&args.component)?;
    let runtime = Runtime::new(Limits::default(), args.plugin_cache_dir.clone())?;
    let version = runtime::read_contract_version(&bytes)
        .map_err(|message| runtime::Error::Load { plugin: name.clone(), message })?
        .unwrap_or_default();
    match runtime.load_scheduler(&name, &bytes) {
        Ok(plugin) => {
            if args.kernel
                || args.mode.is_some()
                || !args.extension_params.is_empty()
                || !args.extension_annotations.is_empty()
                || !args.backend_params.is_empty()
            {
                return Err(Error::Other(format!(
                    "{} is a scheduler component: --kernel and --mode are for backends and extensions, --backend-param for backends, --extension-param and --extension-annotation for extensions",
                    args.component
                )));
            }
            let mut report = Report {
                title: format!("kpx conformance: {} — scheduler component (kpx:proxier {version})", args.component),
                rows: Vec::new(),
            };
            scheduler::check(&mut report, &plugin);
            Ok(report)
        }
        // Not a scheduler: another kind (its exports say), or none kpx knows.
        Err(scheduler_err @ (runtime::Error::Load { .. } | runtime::Error::WrongKind { .. })) => {
            let plugin = match runtime.load_backend(&name, &bytes) {
                Ok(plugin) => plugin,
                Err(backend_err @ (runtime::Error::Load { .. } | runtime::Error::WrongKind { .. })) => {
                    let plugin =
                        runtime.load_extension(&name, &bytes).map_err(|extension_err| match extension_err {
                            runtime::Error::Load { .. } | runtime::Error::WrongKind { .. } => Error::Kind {
                                component: args.component.clone(),
                                scheduler: scheduler_err.to_string(),
                                backend: backend_err.to_string(),
                                extension: extension_err.to_string(),
                            },
                            other => Error::Plugin(other),
                        })?;
                    return extension_report(args, &plugin, &version, &runtime, kpx);
                }
                Err(other) => return Err(Error::Plugin(other)),
            };
            if !args.extension_params.is_empty() || !args.extension_annotations.is_empty() {
                return Err(Error::Other(format!(
                    "{} is a backend: --extension-param is for extensions",
                    args.component
                )));
            }
            let mode = match args.mode.as_deref() {
                Some(m) => match m.parse::<ProxyMode>() {
                    Ok(mode @ (ProxyMode::Iptables | ProxyMode::Nftables | ProxyMode::Ipvs)) => mode,
                    _ => return Err(Error::Mode(m.to_string())),
                },
                None => backend::mode_of(&plugin, &args.backend_params).map_err(Error::Other)?,
            };
            let mut report = Report {
                title: format!(
                    "kpx conformance: {} — backend component (kpx:proxier {version}), {mode} rules",
                    args.component
                ),
                rows: Vec::new(),
            };
            backend::check(&mut report, &plugin, mode, &args.backend_params);
            if args.kernel {
                kernel::check(
                    &mut report,
                    &args.component,
                    mode,
                    kpx,
                    args.plugin_cache_dir.as_deref(),
                    &args.backend_params,
                );
            }
            Ok(report)
        }
        Err(other) => Err(Error::Plugin(other)),
    }
}

/// The kit's run on an extension (`--extension-param` its parameters);
/// `kpx`: the binary its real-traffic flows run (`--kernel`).
fn extension_report(
    args: &Args,
    plugin: &runtime::ExtensionPlugin,
    version: &str,
    runtime: &Runtime,
    kpx: &std::path::Path,
) -> Result<Report, Error> {
    if !args.backend_params.is_empty() {
        return Err(Error::Other(format!(
            "{} is an extension component: --backend-param is for backends (an extension takes --extension-param, \
             --extension-annotation, and --kernel with --mode iptables or nftables)",
            args.component
        )));
    }
    let modes = extension_modes(args)?;
    // One pair per flag: a value may hold commas (a list of CIDRs).
    let pairs = |flag: &str, values: &[String]| {
        values
            .iter()
            .map(|p| crate::wellknown::pair(p).ok_or_else(|| Error::Other(format!("{flag} {p:?}: want key=value"))))
            .collect::<Result<Vec<_>, _>>()
    };
    let parameters = pairs("--extension-param", &args.extension_params)?;
    let annotations = pairs("--extension-annotation", &args.extension_annotations)?;
    let mut report = Report {
        title: format!(
            "kpx conformance: {} — extension component (kpx:proxier {version}), configured as {:?}",
            args.component,
            extension::NAME
        ),
        rows: Vec::new(),
    };
    extension::check(&mut report, plugin, &parameters, &annotations);
    if args.kernel {
        let setup = extension_kernel::Setup {
            plugin,
            file: std::path::Path::new(&args.component),
            parameters: &parameters,
            run_parameters: None,
            annotations: &annotations,
            kpx,
            cache: args.plugin_cache_dir.as_deref(),
        };
        extension_kernel::check(&mut report, runtime, &setup, &modes);
    }
    Ok(report)
}

/// The modes of an extension's real-traffic flows: `--mode` (iptables or
/// nftables, which only `--kernel` takes), else both.
fn extension_modes(args: &Args) -> Result<Vec<ProxyMode>, Error> {
    let Some(m) = args.mode.as_deref() else { return Ok(extension_kernel::MODES.to_vec()) };
    if !args.kernel {
        return Err(Error::Other(format!(
            "{} is an extension component: --mode {m:?} picks the mode of --kernel's real-traffic flows (without \
             --kernel, its rules are checked in both modes)",
            args.component
        )));
    }
    match m.parse::<ProxyMode>() {
        Ok(mode @ (ProxyMode::Iptables | ProxyMode::Nftables)) => Ok(vec![mode]),
        _ => Err(Error::Other(format!("--mode {m:?}: an extension runs in the iptables and nftables modes"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table's (PASS, FAIL, SKIP) for `feature`.
    fn columns(text: &str, feature: &str) -> (usize, usize, usize) {
        let line = text.lines().find(|l| l.starts_with(feature)).unwrap_or_else(|| panic!("no row {feature}:\n{text}"));
        let n: Vec<usize> = line[feature.len()..].split_whitespace().take(3).map(|x| x.parse().unwrap()).collect();
        (n[0], n[1], n[2])
    }

    /// A reason given for many skipped checks (the extension kit skips
    /// one layout check per state that got no rules) is listed once with
    /// how many: the number the note gives is the table's SKIP.
    #[test]
    fn the_not_run_note_counts_what_the_skip_column_counts() {
        let mut report = Report { title: "kit".into(), rows: Vec::new() };
        let objects = report.row("objects");
        objects.pass();
        for _ in 0..56 {
            objects.skip("the state got no rules");
        }
        objects.skip("another reason");
        report.row("flows").skip("ipvs rules are not traced");
        let text = report.to_string();
        assert_eq!(columns(&text, "objects"), (1, 0, 57), "{text}");
        assert_eq!(columns(&text, "flows"), (0, 0, 1), "{text}");
        let note: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("not run")).skip(1).take(3).collect();
        assert_eq!(
            note,
            [
                "  objects: 56 skipped: the state got no rules",
                "  objects: another reason",
                "  flows: ipvs rules are not traced"
            ],
            "{text}"
        );
        let listed: usize = report.rows.iter().flat_map(|r| r.skip_reasons()).map(|(n, _)| n).sum();
        assert_eq!(listed, report.rows.iter().map(|r| r.skipped.len()).sum::<usize>());
    }
}
