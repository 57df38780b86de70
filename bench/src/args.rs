//! What one benchmark run measures: the choices of its command line
//! (main.rs parses them), read by every measurement.

use std::path::PathBuf;

use anyhow::{Result, bail};

#[derive(Debug, Clone)]
pub struct Args {
    pub kpx: PathBuf,
    pub modes: Vec<String>,
    /// (services, endpoints per service), by mode.
    pub sizes: Vec<(String, usize, usize)>,
    /// (mode, services) for the first-packet latency runs.
    pub latency: Vec<(String, usize)>,
    pub json: PathBuf,
    /// userspace mode: only the in-process pick path (no namespaces).
    pub picks_only: bool,
    /// Only the WASM render against the native generator (no kernel).
    pub plugin_only: bool,
    /// One-endpoint changes made through each daemon run.
    pub changes: usize,
    /// The sources each daemon run reads the cluster from.
    pub sources: Vec<Source>,
}

/// Where kpx reads the cluster from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// One manifest file; changes are files renamed into its directory.
    Manifests,
    /// The list/watch server; changes are objects stored in it.
    ListWatch,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Manifests => "manifests",
            Source::ListWatch => "list/watch",
        }
    }

    pub fn parse(name: &str) -> Result<Source> {
        match name {
            "manifests" => Ok(Source::Manifests),
            "listwatch" | "list/watch" => Ok(Source::ListWatch),
            other => bail!("unknown source {other:?} (manifests, listwatch)"),
        }
    }
}
