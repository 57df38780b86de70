//! `cargo xtask fuzz [--time SECONDS] [--parallel N] [TARGET...]`: every
//! fuzz target (fuzz/src/lib.rs) under libFuzzer with coverage for a time
//! budget each, then the committed corpus minimized with what was found.
//!
//! It builds on the stable toolchain: coverage from LLVM's sancov pass
//! (what cargo-fuzz passes with `--sanitizer none`), libFuzzer from the
//! libfuzzer-sys crate. A crash stops its target and is left under
//! fuzz/artifacts/TARGET/; once fixed, the input goes to
//! fuzz/regressions/TARGET/, which `cargo xtask test` runs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// Instrumentation flags: 8-bit edge counters, the PC table and compare
/// tracing (libFuzzer's value profile), as cargo-fuzz sets them.
const RUSTFLAGS: &str = "-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
    -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing";

struct Options {
    seconds: u64,
    parallel: usize,
    targets: Vec<String>,
}

fn options(args: &[String]) -> Result<Options> {
    let mut o = Options { seconds: 600, parallel: 1, targets: Vec::new() };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--time" => o.seconds = it.next().context("--time SECONDS")?.parse().context("--time SECONDS")?,
            "--parallel" => o.parallel = it.next().context("--parallel N")?.parse().context("--parallel N")?,
            t if !t.starts_with('-') => o.targets.push(t.to_string()),
            other => bail!("cargo xtask fuzz: unknown option {other}"),
        }
    }
    Ok(o)
}

/// What one target's run showed.
struct Run {
    target: String,
    seconds: f64,
    executions: u64,
    coverage: u64,
    features: u64,
    corpus_before: usize,
    corpus_after: usize,
    crash: Option<PathBuf>,
}

pub fn run(args: &[String]) -> Result<()> {
    let o = options(args)?;
    crate::setup::compiler()?;
    let all = targets()?;
    let targets = if o.targets.is_empty() { all.clone() } else { o.targets.clone() };
    for t in &targets {
        if !all.contains(t) {
            bail!("cargo xtask fuzz: no target {t} (there are: {})", all.join(", "));
        }
    }
    let triple = host_triple()?;
    eprintln!("+ RUSTFLAGS=<sancov> cargo build --profile fuzz -p kpx-fuzz --features libfuzzer --target {triple}");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--profile", "fuzz", "-p", "kpx-fuzz", "--features", "libfuzzer", "--bin", "kpx-fuzz"])
        .args(["--target", &triple, "--target-dir", "target/fuzz"])
        .env("RUSTFLAGS", RUSTFLAGS)
        .status()
        .context("run cargo")?;
    if !status.success() {
        bail!("building the fuzz driver failed");
    }
    let binary = PathBuf::from(format!("target/fuzz/{triple}/fuzz/kpx-fuzz"));
    let mut runs = Vec::new();
    for batch in targets.chunks(o.parallel.max(1)) {
        let started: Vec<_> = batch
            .iter()
            .map(|t| {
                let (binary, t, seconds) = (binary.clone(), t.clone(), o.seconds);
                std::thread::spawn(move || fuzz_one(&binary, &t, seconds))
            })
            .collect();
        // Every thread joined before an error is returned: none is left
        // replacing a corpus when the process exits.
        let results: Vec<_> = started.into_iter().map(|s| s.join()).collect();
        for r in results {
            runs.push(r.map_err(|_| anyhow::anyhow!("a fuzz thread panicked"))??);
        }
    }
    println!(
        "{:<16} {:>8} {:>12} {:>9} {:>7} {:>7} {:>14}  crash",
        "target", "seconds", "executions", "exec/s", "cov", "ft", "corpus"
    );
    for r in &runs {
        println!(
            "{:<16} {:>8.0} {:>12} {:>9.0} {:>7} {:>7} {:>6} -> {:<5}  {}",
            r.target,
            r.seconds,
            r.executions,
            r.executions as f64 / r.seconds.max(1e-9),
            r.coverage,
            r.features,
            r.corpus_before,
            r.corpus_after,
            r.crash.as_ref().map_or("none".to_string(), |p| p.display().to_string())
        );
    }
    let crashed: Vec<_> = runs.iter().filter(|r| r.crash.is_some()).map(|r| r.target.as_str()).collect();
    if !crashed.is_empty() {
        bail!("crashes in {}: fix them, then move each input to fuzz/regressions/TARGET/", crashed.join(", "));
    }
    Ok(())
}

/// The targets the library names (its `TARGETS`), read from its source so
/// that no second list is kept here.
fn targets() -> Result<Vec<String>> {
    let lib = std::fs::read_to_string("fuzz/src/lib.rs").context("read fuzz/src/lib.rs")?;
    let start = lib.find("pub const TARGETS").context("fuzz/src/lib.rs has no TARGETS")?;
    let end = start + lib[start..].find("];").context("TARGETS ends")?;
    Ok(lib[start..end]
        .lines()
        .filter_map(|l| l.trim().strip_prefix("(\"").and_then(|r| r.split('"').next()))
        .map(str::to_string)
        .collect())
}

fn host_triple() -> Result<String> {
    let out = Command::new("rustc").arg("-vV").output().context("run rustc -vV")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .context("rustc -vV names no host")
}

fn files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.filter_map(Result::ok).filter(|e| e.path().is_file()).count())
}

/// One target: `seconds` of fuzzing into a scratch corpus seeded from the
/// committed one, then the committed corpus replaced by the minimal set
/// covering both.
fn fuzz_one(binary: &Path, target: &str, seconds: u64) -> Result<Run> {
    let corpus = PathBuf::from("fuzz/corpus").join(target);
    let work = PathBuf::from("target/fuzz/work").join(target);
    let artifacts = PathBuf::from("fuzz/artifacts").join(target);
    for d in [&corpus, &work, &artifacts] {
        std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
    }
    let corpus_before = files(&corpus);
    // Crashes of earlier runs stay where they are and do not count.
    let earlier: std::collections::HashSet<PathBuf> =
        std::fs::read_dir(&artifacts)?.filter_map(Result::ok).map(|e| e.path()).collect();
    let log = PathBuf::from("target/fuzz").join(format!("{target}.log"));
    eprintln!("+ fuzzing {target} for {seconds} s (log: {})", log.display());
    let start = Instant::now();
    let status = Command::new(binary)
        .env("KPX_FUZZ_TARGET", target)
        .args([
            format!("-max_total_time={seconds}"),
            "-timeout=20".into(),
            "-rss_limit_mb=2048".into(),
            "-max_len=65536".into(),
            "-print_final_stats=1".into(),
            format!("-artifact_prefix={}/", artifacts.display()),
        ])
        .arg(&work)
        .arg(&corpus)
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::create(log.with_extension("err"))?)
        .status()
        .context("run the fuzz driver")?;
    let seconds = start.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(log.with_extension("err")).unwrap_or_default();
    let stat = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(&format!("stat::{name}:")).and_then(|v| v.trim().parse().ok()))
    };
    // The last status line: "#N ... cov: C ft: F corp: K/..."
    let field = |name: &str| {
        text.lines()
            .rev()
            .find_map(|l| l.split_whitespace().skip_while(|w| *w != name).nth(1).and_then(|v| v.parse().ok()))
            .unwrap_or(0)
    };
    let crash = std::fs::read_dir(&artifacts)
        .ok()
        .and_then(|d| d.filter_map(Result::ok).map(|e| e.path()).find(|p| p.is_file() && !earlier.contains(p)));
    if !status.success() && crash.is_none() {
        bail!("{target}: the fuzz driver failed with {status} (see {})", log.with_extension("err").display());
    }
    // Keep the committed corpus minimal: merge both into a fresh directory.
    let merged = PathBuf::from("target/fuzz/merged").join(target);
    let _ = std::fs::remove_dir_all(&merged);
    std::fs::create_dir_all(&merged)?;
    let ok = Command::new(binary)
        .env("KPX_FUZZ_TARGET", target)
        .args(["-set_cover_merge=1", "-timeout=20", "-rss_limit_mb=2048", "-max_len=65536"])
        .arg(&merged)
        .arg(&corpus)
        .arg(&work)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log.with_extension("merge"))?)
        .status()
        .context("run the corpus merge")?
        .success();
    if ok && files(&merged) > 0 {
        replace_corpus(&corpus, &merged)?;
    }
    Ok(Run {
        target: target.to_string(),
        seconds,
        executions: stat("number_of_executed_units").unwrap_or(0),
        coverage: field("cov:"),
        features: field("ft:"),
        corpus_before,
        corpus_after: files(&corpus),
        crash,
    })
}

/// The committed corpus becomes its seeds plus `merged` (what the merge
/// kept that is not a seed): built beside it, then swapped in by renames,
/// so that an interruption leaves one whole corpus or the other.
fn replace_corpus(corpus: &Path, merged: &Path) -> Result<()> {
    let next = corpus.with_extension("next");
    let old = corpus.with_extension("old");
    for d in [&next, &old] {
        let _ = std::fs::remove_dir_all(d);
    }
    std::fs::create_dir_all(&next)?;
    let mut seeds = std::collections::HashSet::new();
    for entry in std::fs::read_dir(corpus)?.filter_map(Result::ok) {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with("seed-") {
            seeds.insert(std::fs::read(entry.path())?);
            std::fs::copy(entry.path(), next.join(&name))?;
        }
    }
    for entry in std::fs::read_dir(merged)?.filter_map(Result::ok) {
        if !seeds.contains(&std::fs::read(entry.path())?) {
            std::fs::copy(entry.path(), next.join(entry.file_name()))?;
        }
    }
    std::fs::rename(corpus, &old).with_context(|| format!("move {} aside", corpus.display()))?;
    std::fs::rename(&next, corpus).with_context(|| format!("put the new {} in place", corpus.display()))?;
    std::fs::remove_dir_all(&old)?;
    Ok(())
}
