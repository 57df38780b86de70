//! The component files kpx runs, loaded at start: the backend
//! (`--backend-plugin`, or the mode's built-in one), the scheduler
//! components (`--scheduler-plugin`, then the built-in ones) and the
//! extensions (`--extension`). A component of another kind than its flag
//! takes stops kpx, naming the flag, the file and both kinds
//! ([`LoadError::of_file`]); hot reload words its refusals the same way.

use std::sync::Arc;

use kpx_rules::model::ProxyMode;

use super::{Error, plugin_runtime};
use crate::config::Config;
use crate::runtime::load::{Digest, LoadError, digest, extension_component, read_component, scheduler_component};
use crate::runtime::{self, BackendPlugin, Runtime, SchedulerPlugin};

/// The `--extension` components, loaded (compiled or from the cache),
/// with the digests of their files' bytes as loaded. A file that cannot
/// be read or loaded is logged and left out (kube-proxy's rules do not
/// wait on a vendor's component); a replacement file is tried as any. A
/// component of another kind (a scheduler), or one that refuses the
/// flag's parameters, is a mistake in the flag, not a file to wait for:
/// an error.
pub fn load_extensions(
    runtime: &Runtime,
    config: &Config,
) -> Result<(Vec<crate::extension::Configured>, Vec<Digest>), LoadError> {
    let (mut out, mut digests) = (Vec::new(), Vec::new());
    for e in &config.extensions {
        if !matches!(config.mode, ProxyMode::Iptables | ProxyMode::Nftables) {
            return Err(LoadError::ExtensionMode { name: e.name.clone(), mode: config.mode });
        }
        let loaded = match read_component(&e.path) {
            Ok(bytes) => match extension_component(runtime, &e.name, &e.path, &e.parameters, &bytes) {
                Ok(plugin) => Ok((plugin, bytes)),
                // Mistakes in the flag, not a file to wait for.
                Err(err @ (LoadError::WrongKind { .. } | LoadError::ExtensionParameters { .. })) => return Err(err),
                Err(err) => Err(err.to_string()),
            },
            Err(err) => Err(format!("cannot read it: {err}")),
        };
        let (plugin, digest) = match loaded {
            Ok((p, bytes)) => {
                tracing::info!(extension = %e.name, file = %e.path.display(), "extension component loaded");
                (Some(Arc::new(p)), digest(&bytes))
            }
            Err(err) => {
                tracing::error!(extension = %e.name, file = %e.path.display(), "extension not loaded, kpx runs without it until its file is replaced: {err}");
                // No bytes match this: whatever the file holds next is tried.
                (None, [0; 32])
            }
        };
        out.push(crate::extension::Configured { name: e.name.clone(), plugin, parameters: e.parameters.clone() });
        digests.push(digest);
    }
    Ok((out, digests))
}

/// The scheduler components: those of `--scheduler-plugin`, in the order
/// given (a name they share with a later one is theirs), then the
/// built-in ones. Each is instantiated once here, so that a component
/// that does not fit, or fails at once, stops kpx with the reason.
pub fn load_schedulers(
    runtime: &Runtime,
    external: &[(String, std::path::PathBuf)],
) -> Result<Vec<Arc<SchedulerPlugin>>, LoadError> {
    Ok(load_schedulers_from_files(runtime, external)?.0)
}

/// [`load_schedulers`], with the digests of the external files' bytes as
/// loaded (what hot reload compares replacements with).
pub(super) fn load_schedulers_from_files(
    runtime: &Runtime,
    external: &[(String, std::path::PathBuf)],
) -> Result<(Vec<Arc<SchedulerPlugin>>, Vec<Digest>), LoadError> {
    let (mut out, mut digests) = (Vec::new(), Vec::new());
    for (name, path) in external {
        let bytes = read_component(path)
            .map_err(|source| LoadError::PluginFile { path: path.display().to_string(), source })?;
        let plugin = scheduler_component(runtime, name, &bytes).map_err(|e| e.of_file(path))?;
        out.push(Arc::new(plugin));
        digests.push(digest(&bytes));
        tracing::info!(plugin = %name, file = %path.display(), "scheduler component loaded");
    }
    let name = runtime::BUILT_IN_SCHEDULERS;
    let bytes = runtime::builtin::get(name).expect("the built-in schedulers are embedded");
    out.push(Arc::new(runtime.load_scheduler(name, bytes)?));
    Ok((out, digests))
}

/// Loads the mode's backend: `--backend-plugin` if given, else the built-in one.
pub fn load_backend(config: &Config) -> Result<BackendPlugin, Error> {
    Ok(load_backend_with(config, &plugin_runtime(config)?)?)
}

fn load_backend_with(config: &Config, runtime: &Runtime) -> Result<BackendPlugin, LoadError> {
    Ok(load_backend_file(config, runtime)?.0)
}

/// The backend, and the digest of its file's bytes as loaded (None: the
/// built-in one).
pub(super) fn load_backend_file(
    config: &Config,
    runtime: &Runtime,
) -> Result<(BackendPlugin, Option<[u8; 32]>), LoadError> {
    match &config.backend_plugin {
        Some(path) => {
            let bytes = read_component(path)
                .map_err(|source| LoadError::PluginFile { path: path.display().to_string(), source })?;
            let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("plugin");
            let plugin = runtime.load_backend(name, &bytes).map_err(|e| LoadError::from(e).of_file(path))?;
            Ok((plugin, Some(digest(&bytes))))
        }
        None => {
            let name = config.mode.as_str();
            let bytes = runtime::builtin::get(name).ok_or(LoadError::NoBuiltIn(config.mode))?;
            Ok((runtime.load_backend(name, bytes)?, None))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Kind;
    use crate::runtime::load::LoadError as Error;

    /// The configuration of these flags (besides a manifest source and a node name).
    fn config_of(flags: &[&str]) -> Config {
        let base = ["kpx", "--manifests", "/x", "--hostname-override", "n"];
        let args = base.iter().chain(flags).map(|a| std::ffi::OsString::from(*a));
        crate::cli::Cli::from_args(args).unwrap().flags.validate().unwrap()
    }

    /// A component given to the flag of another kind stops kpx at start
    /// for every role, naming the flag, the file, the kind found and the
    /// kind the flag takes; an extension's file that does not load for
    /// another reason is left out, as before.
    #[test]
    fn a_component_of_the_wrong_kind_is_refused_at_start_for_every_role() {
        let dir = std::env::temp_dir().join(format!("kpx-app-kind-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let scheduler = dir.join("sched.wasm");
        std::fs::write(&scheduler, runtime::builtin::get("schedulers").unwrap()).unwrap();
        let backend = dir.join("backend.wasm");
        std::fs::write(&backend, runtime::builtin::get("nftables").unwrap()).unwrap();
        let junk = dir.join("junk.wasm");
        std::fs::write(&junk, b"not a component").unwrap();
        let rt = Runtime::new(runtime::Limits::default(), None).unwrap();
        let (s, b) = (scheduler.display().to_string(), backend.display().to_string());

        let vendor = format!("vendor={s}");
        let err = load_extensions(&rt, &config_of(&["--proxy-mode", "nftables", "--extension", &vendor]))
            .err()
            .expect("a scheduler given to --extension is refused");
        assert!(matches!(err, Error::WrongKind { found: Kind::Scheduler, expected: Kind::Extension, .. }), "{err}");
        assert_eq!(
            err.to_string(),
            format!("--extension {s} is a scheduler component; --extension takes an extension component")
        );

        let err = load_backend_file(&config_of(&["--proxy-mode", "nftables", "--backend-plugin", &s]), &rt)
            .err()
            .expect("a scheduler given to --backend-plugin is refused");
        assert_eq!(
            err.to_string(),
            format!("--backend-plugin {s} is a scheduler component; --backend-plugin takes a backend component")
        );

        let err = load_schedulers_from_files(&rt, &[(String::from("mine"), backend.clone())])
            .err()
            .expect("a backend given to --scheduler-plugin is refused");
        assert_eq!(
            err.to_string(),
            format!("--scheduler-plugin {b} is a backend component; --scheduler-plugin takes a scheduler component")
        );

        // Not a component at all: the extension is left out, kpx goes on.
        let junk = format!("vendor={}", junk.display());
        let (loaded, digests) =
            load_extensions(&rt, &config_of(&["--proxy-mode", "nftables", "--extension", &junk])).unwrap();
        assert!(loaded.len() == 1 && loaded[0].plugin.is_none() && digests == [[0; 32]]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An extension that refuses the flag's parameters (its
    /// `check-parameters`) stops kpx at start, naming the flag, the file
    /// and the component's reason; the same file with parameters it takes
    /// loads, and a 0.2.0 component is never asked.
    #[test]
    fn an_extension_that_refuses_its_parameters_stops_kpx_at_start() {
        let dir = env!("KPX_TEST_PLUGIN_DIR");
        let rt = Runtime::new(runtime::Limits::default(), None).unwrap();
        let load = |flag: &str| load_extensions(&rt, &config_of(&["--proxy-mode", "nftables", "--extension", flag]));
        let probe = format!("{dir}/kpx_plugin_ext_probe.wasm");
        let err = load(&format!("probe={probe},do=nonsense")).err().expect("refused parameters stop kpx");
        assert!(matches!(err, Error::ExtensionParameters { .. }), "{err}");
        let text = err.to_string();
        let said = format!("--extension probe={probe}: the component refuses its parameters: ");
        assert!(text.starts_with(&said) && text.contains("do=nonsense"), "want {said:?} and do=nonsense: {text}");
        // A trap in the check is no answer: kpx stops too (an allow-list
        // must not start open).
        let err = load(&format!("probe={probe},do=trap-in-check")).err().expect("a trap in the check stops kpx");
        assert!(matches!(err, Error::ExtensionParameters { .. }), "{err}");
        assert!(err.to_string().contains("check-parameters failed"), "{err}");
        let (loaded, _) = load(&format!("probe={probe},do=count")).unwrap();
        assert!(loaded[0].plugin.is_some());
        let old = format!("old={dir}/kpx_plugin_ext_v0_2.wasm,do=nonsense");
        let (loaded, _) = load(&old).unwrap();
        assert!(loaded[0].plugin.as_ref().is_some_and(|p| p.version() == "0.2.0"), "0.2.0 takes any parameter");
    }
}
