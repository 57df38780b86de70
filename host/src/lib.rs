//! kpx: a Kubernetes service proxy whose proxy modes are sandboxed
//! WebAssembly components. See docs/ARCHITECTURE.md.
#![deny(unsafe_code)]

pub mod app;
pub mod cli;
pub mod config;
pub mod conformance;
pub mod cpu_time;
pub mod demo;
pub mod extension;
pub mod family;
pub mod kernel;
pub mod reload;
pub mod runtime;
pub mod scratch;
pub mod serve;
pub mod settings;
pub mod source;
pub mod state;
pub mod sync;
pub mod syntax;
pub mod template;
pub mod trace;
pub mod userspace;
pub mod validate;
pub mod wellknown;

/// What `kpx --version` prints.
pub const VERSION_TEXT: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (plugin contract kpx:proxier 0.3.0 for backends, 0.4.0 for schedulers and extensions, and 0.2.0)"
);
