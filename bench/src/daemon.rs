//! The daemon as an operator runs it: kpx started in a fresh namespace on
//! the synthetic cluster, from one manifest file or from the list/watch
//! server of tests/listwatch; its first sync; then one endpoint added to
//! one Service at a time on an idle proxy. Every figure is the daemon's
//! own: the time from its start to its first sync logged, the stages it
//! logs for that sync ("read the manifests"; "synced rules" with host,
//! plugin, check and kernel), each change's latency from the moment it is
//! visible to kpx (the file renamed into place; the object stored by the
//! server, which wakes its watches) to the "synced rules" line kpx logs
//! once the kernel's write has returned, and the peak RSS of the whole
//! run, changes included.

use std::io::Read as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, bail};
use kpx_listwatch::{ENDPOINT_SLICES, ListWatch, NODES, Resource, SERVICES};
use serde_json::{Value, json};

use crate::args::{Args, Source};
use crate::cluster::{self, NODE};
use crate::netns::Netns;

/// The min sync period the daemon runs with: a change made after this
/// long without one is synced at once (an idle proxy).
const MIN_SYNC_PERIOD: &str = "100ms";
/// The pause between changes: longer than the min sync period.
const IDLE: Duration = Duration::from_millis(150);
/// The pause before the first change: the first pass's other family and
/// its work after the write (30k Services: about 250 ms) done, so that
/// the first change, too, meets an idle proxy.
const SETTLE: Duration = Duration::from_secs(2);

/// One "synced rules family=IPv4" line of the daemon's log.
#[derive(Debug, Clone, Default)]
pub struct Synced {
    /// When it was logged, in seconds since the Unix epoch.
    pub at: f64,
    pub full: bool,
    pub changes: usize,
    pub elapsed_ms: f64,
    pub host_ms: f64,
    pub plugin_ms: f64,
    pub check_ms: f64,
    pub kernel_ms: f64,
}

impl Synced {
    fn parse(line: &str) -> Option<Synced> {
        if !line.contains("synced rules") || field(line, "family") != Some("IPv4") {
            return None;
        }
        let number = |key: &str| field(line, key).and_then(|v| v.parse::<f64>().ok());
        Some(Synced {
            at: unix_seconds(line.split_whitespace().next()?)?,
            full: field(line, "full") == Some("true"),
            changes: number("changes")? as usize,
            elapsed_ms: number("elapsed_ms")?,
            host_ms: number("host_ms")?,
            plugin_ms: number("plugin_ms")?,
            check_ms: number("check_ms")?,
            kernel_ms: number("kernel_ms")?,
        })
    }

    /// kpx's own part of the sync: everything but the kernel's.
    pub fn own_ms(&self) -> f64 {
        self.elapsed_ms - self.kernel_ms
    }
}

/// What one daemon run measured.
#[derive(Debug, Clone)]
pub struct DaemonRun {
    pub source: Source,
    /// From spawning the process to its first IPv4 sync logged.
    pub to_first_sync: Duration,
    /// The manifest source's first complete read (parsing included).
    pub read_ms: Option<f64>,
    /// The first (full) pass's work after its writes ("sync pass done").
    pub first_pass_after_ms: Option<f64>,
    pub first: Synced,
    /// Each change's latency (ms), in order.
    pub changes: Vec<f64>,
    /// The daemon's split of each change's sync.
    pub change_syncs: Vec<Synced>,
    /// Peak RSS over the whole run (MiB).
    pub rss_mib: f64,
    /// How the wait for a quiet machine before the daemon's start ended.
    pub quiet_before_start: crate::quiet::Settled,
}

impl DaemonRun {
    /// The `q` quantile of the changes' latency (ms).
    pub fn change_quantile(&self, q: f64) -> f64 {
        quantile(self.changes.clone(), q)
    }

    /// The median of one stage over the changes' syncs.
    pub fn change_stage(&self, stage: fn(&Synced) -> f64) -> f64 {
        quantile(self.change_syncs.iter().map(stage).collect(), 0.5)
    }

    /// From process start to the kernel holding everything, less the
    /// kernel's part: kpx's own (start-up, source, state, plugin, checks).
    pub fn own_to_first_sync_ms(&self) -> f64 {
        self.to_first_sync.as_secs_f64() * 1e3 - self.first.kernel_ms
    }

    pub fn json(&self) -> Value {
        let synced = |s: &Synced| json!({"elapsed_ms": s.elapsed_ms, "host_ms": s.host_ms, "plugin_ms": s.plugin_ms, "check_ms": s.check_ms, "kernel_ms": s.kernel_ms});
        json!({
            "source": self.source.name(),
            "to_first_sync_ms": self.to_first_sync.as_secs_f64() * 1e3,
            "own_to_first_sync_ms": self.own_to_first_sync_ms(),
            "read_manifests_ms": self.read_ms,
            "first_pass_after_ms": self.first_pass_after_ms,
            "first_sync": synced(&self.first),
            "changes": self.changes.len(),
            "change_latency_ms": {"p50": self.change_quantile(0.5), "p99": self.change_quantile(0.99), "max": self.change_quantile(1.0), "all": self.changes},
            "change_sync_median_ms": {"elapsed": self.change_stage(|s| s.elapsed_ms), "host": self.change_stage(|s| s.host_ms), "plugin": self.change_stage(|s| s.plugin_ms), "check": self.change_stage(|s| s.check_ms), "kernel": self.change_stage(|s| s.kernel_ms)},
            "peak_rss_mib": self.rss_mib,
            "quiet_before_start": {"waited_ms": self.quiet_before_start.waited.as_secs_f64() * 1e3, "quiet": self.quiet_before_start.quiet},
        })
    }
}

fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// `key=value` of a log line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!(" {key}="))? + key.len() + 2;
    line[start..].split_whitespace().next()
}

/// A full pass's work after its writes, from kpx's "sync pass done" line.
fn full_pass_after_ms(line: &str) -> Option<f64> {
    if !line.contains("sync pass done") || field(line, "full") != Some("true") {
        return None;
    }
    field(line, "after_ms")?.parse().ok()
}

/// `2026-11-24T15:58:58.318646Z` in seconds since the Unix epoch.
fn unix_seconds(stamp: &str) -> Option<f64> {
    let (date, time) = stamp.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|x| x.parse::<i64>().ok());
    let (h, min, s) = (t.next()??, t.next()??, t.next()??);
    let frac: f64 = format!("0.{frac}").parse().ok()?;
    // Days from the civil date (H. Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    Some((days * 86_400 + h * 3_600 + min * 60 + s) as f64 + frac)
}

fn now_unix() -> f64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The daemon's log, read as it grows.
struct Log {
    file: std::fs::File,
    partial: Vec<u8>,
    /// Lines read and not yet handed out.
    ready: std::collections::VecDeque<String>,
}

impl Log {
    /// The next completed line, if any (read as bytes, so that a read
    /// ending inside a character loses nothing).
    fn next_line(&mut self) -> Option<String> {
        if self.ready.is_empty() {
            let _ = self.file.read_to_end(&mut self.partial);
            let end = self.partial.iter().rposition(|&b| b == b'\n')?;
            self.ready.extend(String::from_utf8_lossy(&self.partial[..end]).lines().map(str::to_string));
            self.partial.drain(..=end);
        }
        self.ready.pop_front()
    }
}

/// kpx running in its namespace, killed when dropped.
struct Daemon {
    child: Child,
    log: Log,
    path: std::path::PathBuf,
}

impl Daemon {
    /// Waits for the next IPv4 sync line `wanted` accepts, also handing
    /// every line to `seen`.
    fn wait(
        &mut self,
        within: Duration,
        wanted: impl Fn(&Synced) -> bool,
        mut seen: impl FnMut(&str),
    ) -> Result<Synced> {
        let deadline = Instant::now() + within;
        loop {
            while let Some(line) = self.log.next_line() {
                seen(&line);
                if let Some(s) = Synced::parse(&line).filter(&wanted) {
                    return Ok(s);
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                bail!("kpx exited ({status}); its log: {}", self.path.display());
            }
            if Instant::now() > deadline {
                bail!("kpx did not sync within {within:?}; its log: {}", self.path.display());
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }

    fn peak_rss_mib(&self) -> Result<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let hwm = status.lines().find(|l| l.starts_with("VmHWM:")).context("no VmHWM")?;
        let kib: f64 = hwm.split_whitespace().nth(1).context("VmHWM")?.parse()?;
        Ok(kib / 1024.0)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The objects of the synthetic manifests as the API server stores them.
fn objects(manifests: &str) -> Result<Vec<(Resource, Value)>> {
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}});
    let mut out = vec![(NODES, node)];
    for doc in manifests.split("---\n").filter(|d| !d.trim().is_empty()) {
        let object: Value = serde_saphyr::from_str(doc).context("synthetic manifest")?;
        let resource = match object["kind"].as_str() {
            Some("Service") => SERVICES,
            Some("EndpointSlice") => ENDPOINT_SLICES,
            other => bail!("no resource for {other:?}"),
        };
        out.push((resource, object));
    }
    Ok(out)
}

/// Change `c`: a second EndpointSlice for one Service, with one endpoint
/// (Services taken in a spread order, each once while there are enough).
fn change(c: usize, services: usize) -> (usize, String) {
    let i = (c * 7_919 + services / 3) % services;
    let ip = cluster::endpoint_ip(i, 100 + (c / services) % 27);
    let yaml = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc-{i}-x{c}, namespace: bench, labels: {{kubernetes.io/service-name: svc-{i}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints:\n- addresses: [{ip}]\n"
    );
    (i, yaml)
}

/// One daemon run: first sync, then `args.changes` changes.
pub fn run(args: &Args, mode: &str, services: usize, manifests: &str, dir: &Path, source: Source) -> Result<DaemonRun> {
    let tag = format!("{mode}-{services}-{}", if source == Source::Manifests { "files" } else { "api" });
    let ns = Netns::new(&format!("d-{tag}"))?;
    let run_dir = dir.join(format!("daemon-{tag}"));
    let _ = std::fs::remove_dir_all(&run_dir);
    let (mdir, staging) = (run_dir.join("manifests"), run_dir.join("staging"));
    std::fs::create_dir_all(&mdir)?;
    std::fs::create_dir_all(&staging)?;
    let mut kpx_args: Vec<String> = [
        "--proxy-mode",
        mode,
        "--hostname-override",
        NODE,
        "--cluster-cidr",
        "10.128.0.0/9",
        "--iptables-min-sync-period",
        MIN_SYNC_PERIOD,
        "--plugin-cache-dir",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    kpx_args.push(dir.join("plugin-cache").display().to_string());
    let server = match source {
        Source::Manifests => {
            std::fs::write(mdir.join("cluster.yaml"), manifests)?;
            kpx_args.extend(["--manifests".into(), mdir.display().to_string()]);
            None
        }
        Source::ListWatch => {
            let status = Command::new("ip").args(["-n", &ns.0, "link", "set", "lo", "up"]).status()?;
            if !status.success() {
                bail!("cannot bring up loopback in {}", ns.0);
            }
            let listener = ns.ns().enter(|| std::net::TcpListener::bind(("127.0.0.1", 0)))??;
            let server = ListWatch::start(listener)?;
            for (resource, object) in objects(manifests)? {
                server.apply(resource, object).map_err(|e| anyhow::anyhow!("the server refused an object: {e:?}"))?;
            }
            let kubeconfig = run_dir.join("kubeconfig");
            std::fs::write(&kubeconfig, server.kubeconfig())?;
            kpx_args.extend(["--kubeconfig".into(), kubeconfig.display().to_string()]);
            Some(server)
        }
    };
    let log_path = run_dir.join("kpx.log");
    // The namespace of the measurement before this one is still being
    // freed by the kernel.
    let quiet_before_start = crate::quiet::settle(crate::quiet::LIMIT)?;
    let started = now_unix();
    let child = Command::new("ip")
        .args(["netns", "exec", &ns.0])
        .arg(&args.kpx)
        .args(&kpx_args)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path)?)
        .spawn()?;
    let mut daemon = Daemon {
        child,
        log: Log { file: std::fs::File::open(&log_path)?, partial: Vec::new(), ready: Default::default() },
        path: log_path,
    };
    let mut read_ms = None;
    let mut first_pass_after_ms = None;
    let mut pass_done = |line: &str| {
        if first_pass_after_ms.is_none() {
            first_pass_after_ms = full_pass_after_ms(line);
        }
    };
    let first = daemon.wait(
        Duration::from_secs(900),
        |_| true,
        |line| {
            if line.contains("read the manifests") {
                read_ms = field(line, "elapsed_ms").and_then(|v| v.parse().ok());
            }
        },
    )?;
    let to_first_sync = Duration::from_secs_f64((first.at - started).max(0.0));
    std::thread::sleep(SETTLE);
    let (mut changes, mut change_syncs) = (Vec::new(), Vec::new());
    for c in 0..args.changes {
        let (i, yaml) = change(c, services);
        let t0 = match &server {
            None => {
                let file = format!("change-{c}.yaml");
                std::fs::write(staging.join(&file), &yaml)?;
                let t0 = now_unix();
                std::fs::rename(staging.join(&file), mdir.join(&file))?;
                t0
            }
            Some(server) => {
                let object: Value = serde_saphyr::from_str(&yaml)?;
                let t0 = now_unix();
                server.apply(ENDPOINT_SLICES, object).map_err(|e| anyhow::anyhow!("change refused: {e:?}"))?;
                t0
            }
        };
        let synced = daemon
            .wait(Duration::from_secs(60), |s| !s.full && s.changes >= 1 && s.at >= t0, &mut pass_done)
            .with_context(|| format!("change {c} (Service svc-{i})"))?;
        changes.push((synced.at - t0) * 1e3);
        change_syncs.push(synced);
        std::thread::sleep(IDLE);
    }
    let rss_mib = daemon.peak_rss_mib()?;
    drop(daemon);
    drop(server);
    Ok(DaemonRun {
        source,
        to_first_sync,
        read_ms,
        first_pass_after_ms,
        first,
        changes,
        change_syncs,
        rss_mib,
        quiet_before_start,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_daemons_sync_lines() {
        let line = "2026-11-24T15:58:58.318646Z  INFO kpx::sync: synced rules family=IPv4 full=true changes=10000 bytes=9031448 elapsed_ms=1319 host_ms=126.44 plugin_ms=482.03 check_ms=237.95 kernel_ms=400.74 extensions_ms=0.0";
        let s = Synced::parse(line).unwrap();
        assert!(s.full);
        assert_eq!(s.changes, 10000);
        assert_eq!(
            (s.elapsed_ms, s.host_ms, s.plugin_ms, s.check_ms, s.kernel_ms),
            (1319.0, 126.44, 482.03, 237.95, 400.74)
        );
        // `date -u -d 2026-11-24T15:58:58Z +%s` = 1795535938.
        assert!((s.at - 1_795_535_938.318_646).abs() < 1e-6, "{}", s.at);
        assert!(Synced::parse(&line.replace("IPv4", "IPv6")).is_none());
        assert_eq!(unix_seconds("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(unix_seconds("2000-03-01T00:00:01.5Z"), Some(951_868_801.5));
    }

    #[test]
    fn reads_the_pass_line_kpx_logs() {
        // As host/src/sync.rs logs it (tracing's default format).
        let line = "2026-11-24T20:05:01.123456Z  INFO kpx::sync: sync pass done ok=true full=true elapsed_ms=1162.56 after_ms=69.56";
        assert_eq!(full_pass_after_ms(line), Some(69.56));
        assert_eq!(full_pass_after_ms(&line.replace("full=true", "full=false")), None);
        assert_eq!(full_pass_after_ms(&line.replace("sync pass done", "synced rules")), None);
    }

    #[test]
    fn the_log_hands_out_every_complete_line_once_in_order() {
        let path = std::env::temp_dir().join(format!("kpx-bench-log-{}", std::process::id()));
        std::fs::write(&path, "one\ntwo\nthree\npart").unwrap();
        let mut log = Log { file: std::fs::File::open(&path).unwrap(), partial: Vec::new(), ready: Default::default() };
        assert_eq!(log.next_line().as_deref(), Some("one"));
        // What is appended meanwhile comes after the lines already read.
        std::io::Write::write_all(&mut std::fs::OpenOptions::new().append(true).open(&path).unwrap(), b"ial\nfive\n")
            .unwrap();
        let rest: Vec<String> = std::iter::from_fn(|| log.next_line()).collect();
        assert_eq!(rest, ["two", "three", "partial", "five"]);
        assert_eq!(log.next_line(), None);
        std::fs::remove_file(&path).unwrap();
    }
}
