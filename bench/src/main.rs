//! kpx-bench: where a sync's time goes, against the kernel's own limit.
//! Run it with `cargo xtask bench` (release build, root for the kernel
//! parts). See README.md, "Benchmarks".

mod args;
mod cluster;
mod daemon;
mod measure;
mod netns;
mod quiet;
mod relay;
mod upstream;

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use args::{Args, Source};

fn parse_args() -> Result<Args> {
    let mut args = Args {
        kpx: PathBuf::from("target/release/kpx"),
        modes: vec!["iptables".into(), "nftables".into()],
        // iptables-restore needs minutes for 10k Services x 10 endpoints
        // (110k chains) on an nf_tables-backed iptables: the default keeps
        // its run short; --sizes asks for any size in every mode.
        sizes: [
            ("iptables", 1000, 10),
            ("iptables", 10000, 1),
            ("nftables", 1000, 10),
            ("nftables", 3000, 10),
            ("nftables", 10000, 10),
            ("nftables", 30000, 10),
        ]
        .into_iter()
        .map(|(m, s, e)| (m.to_string(), s, e))
        .collect(),
        latency: [("iptables", 1000), ("iptables", 10000), ("nftables", 1000), ("nftables", 30000)]
            .into_iter()
            .map(|(m, s)| (m.to_string(), s))
            .collect(),
        json: PathBuf::from("target/bench.json"),
        picks_only: false,
        plugin_only: false,
        changes: 100,
        sources: vec![Source::Manifests, Source::ListWatch],
    };
    let mut sizes: Option<Vec<(usize, usize)>> = None;
    let mut latency: Option<Vec<usize>> = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--kpx" => args.kpx = value()?.into(),
            "--json" => args.json = value()?.into(),
            "--modes" => args.modes = value()?.split(',').map(str::to_string).collect(),
            "--sizes" => {
                sizes = Some(
                    value()?
                        .split(',')
                        .map(|s| {
                            let (a, b) =
                                s.split_once('x').with_context(|| format!("size {s:?}: want SERVICESxENDPOINTS"))?;
                            Ok((a.parse()?, b.parse()?))
                        })
                        .collect::<Result<_>>()?,
                )
            }
            "--latency" => {
                let v = value()?;
                latency = Some(if v == "none" {
                    Vec::new()
                } else {
                    v.split(',').map(|s| s.parse()).collect::<Result<_, _>>()?
                });
            }
            "--picks-only" => args.picks_only = true,
            "--changes" => args.changes = value()?.parse()?,
            "--sources" => {
                args.sources = value()?.split(',').map(Source::parse).collect::<Result<_>>()?;
            }
            "--plugin-only" => args.plugin_only = true,
            "--quick" => {
                sizes = Some(vec![(1000, 10)]);
                latency = Some(vec![1000]);
            }
            "--help" | "-h" => {
                println!("usage: kpx-bench {USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?} ({USAGE})"),
        }
    }
    for m in &args.modes {
        if !matches!(m.as_str(), "iptables" | "nftables" | "userspace") {
            bail!("unknown mode {m:?}");
        }
    }
    if let Some(sizes) = sizes {
        args.sizes = args.modes.iter().flat_map(|m| sizes.iter().map(move |&(s, e)| (m.clone(), s, e))).collect();
    }
    if let Some(latency) = latency {
        args.latency = args.modes.iter().flat_map(|m| latency.iter().map(move |&s| (m.clone(), s))).collect();
    }
    let modes = args.modes.clone();
    args.sizes.retain(|(m, _, _)| modes.contains(m));
    args.latency.retain(|(m, _)| modes.contains(m));
    Ok(args)
}

const USAGE: &str = "[--kpx PATH] [--json PATH] [--modes iptables,nftables,userspace] [--sizes 1000x10,...] [--latency 1000,...|none] [--changes N] [--sources manifests,listwatch] [--quick] [--picks-only] [--plugin-only]";

fn main() -> Result<()> {
    let args = parse_args()?;
    if args.plugin_only {
        return measure::plugin_only(&args);
    }
    // userspace mode has no rules to sync at scale: its figures are the
    // relay's (relay.rs).
    let relay = if args.modes.iter().any(|m| m == "userspace") { Some(relay::run(&args)?) } else { None };
    let mut json = serde_json::json!({});
    if args.modes.iter().any(|m| m != "userspace") {
        let report = measure::run(&args)?;
        println!("{}", report.table());
        json = report.json();
    }
    if let Some(r) = &relay {
        println!("{}", r.table());
        json["userspace"] = r.json();
        if json.get("commit").is_none() {
            let (machine, commit, date) = measure::provenance();
            json["machine"] = machine.into();
            json["commit"] = commit.into();
            json["date"] = date.into();
        }
    }
    if let Some(dir) = args.json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&json)?)?;
    println!("JSON: {}", args.json.display());
    Ok(())
}
