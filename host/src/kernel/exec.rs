//! Running the kernel tools (iptables-restore, iptables-save, iptables,
//! ip): with a deadline, and with their failures read in one place.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{Id, WaitPidFlag, waitid};
use nix::unistd::Pid;

use super::{Cause, Error, Result};

/// How long one tool may run before it is killed. iptables-restore of
/// tens of thousands of chains takes minutes on an nf_tables-backed
/// iptables; the sync loop must still come back.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Runs a program with arguments and optional standard input; returns its
/// standard output.
pub trait Exec: Send {
    fn run(&self, program: &str, args: &[&str], stdin: Option<&[u8]>) -> Result<String>;
}

/// The real thing.
#[derive(Debug, Clone, Copy)]
pub struct SystemExec {
    pub timeout: Duration,
}

impl Default for SystemExec {
    fn default() -> Self {
        SystemExec { timeout: DEFAULT_TIMEOUT }
    }
}

/// What a failed tool's message says: the one reader of tool messages.
pub fn classify(stderr: &str) -> Cause {
    let s = stderr.to_ascii_lowercase();
    if s.contains("already exists") || s.contains("file exists") {
        Cause::Exists
    } else if s.contains("does a matching rule exist")
        || s.contains("no chain/target/match by that name")
        || s.contains("no such file or directory")
        || s.contains("doesn't exist")
    {
        Cause::NotFound
    } else if s.contains("another app is currently holding the xtables lock")
        || s.contains("resource temporarily unavailable")
    {
        Cause::Locked
    } else {
        Cause::Other
    }
}

/// How long the outputs may stay open once the tool has exited: what
/// holds them then is a process the tool left behind, which is killed.
const LINGER: Duration = Duration::from_secs(1);

/// What the tool's watcher and output readers report.
enum Event {
    /// The tool exited (not reaped yet: its pid, and so its process
    /// group's id, stays taken until the sync thread reaps it).
    Exited,
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
}

/// Reads one output to its end on a thread of its own, reporting it on
/// `events`. Not a scoped thread: a process that escaped the tool's group
/// may hold the pipe open for ever, and the sync thread must not wait
/// for it.
fn drain(
    pipe: Option<impl Read + Send + 'static>,
    events: &mpsc::Sender<Event>,
    wrap: fn(Vec<u8>) -> Event,
) -> std::io::Result<()> {
    let events = events.clone();
    std::thread::Builder::new().name("kpx-tool-output".into()).spawn(move || {
        let mut v = Vec::new();
        if let Some(mut s) = pipe {
            let _ = s.read_to_end(&mut v);
        }
        let _ = events.send(wrap(v));
    })?;
    Ok(())
}

/// The threads that feed the tool its input, drain its outputs and watch
/// for its exit; each owns what it uses, so none can hold the sync thread.
fn supervise(child: &mut Child, stdin: Option<&[u8]>, events: &mpsc::Sender<Event>) -> std::io::Result<()> {
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A copy: a process outside the group holding the pipe would
        // block the writer, which must then not borrow the caller's bytes.
        let input = input.to_vec();
        // A tool that exits early closes the pipe; its status says why.
        std::thread::Builder::new().name("kpx-tool-input".into()).spawn(move || {
            let _ = pipe.write_all(&input);
        })?;
    }
    drain(child.stdout.take(), events, Event::Stdout)?;
    drain(child.stderr.take(), events, Event::Stderr)?;
    let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    let watcher = events.clone();
    std::thread::Builder::new().name("kpx-tool-exit".into()).spawn(move || {
        // Seen, not reaped (WNOWAIT): the group is killed, when it must
        // be, while its id cannot have been reused.
        let _ = waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT);
        let _ = watcher.send(Event::Exited);
    })?;
    Ok(())
}

/// The tool's exit and outputs as they came in.
#[derive(Default)]
struct Outcome {
    exited: bool,
    stdout: Option<Vec<u8>>,
    stderr: Option<Vec<u8>>,
}

impl Outcome {
    fn complete(&self) -> bool {
        self.exited && self.stdout.is_some() && self.stderr.is_some()
    }

    /// Takes events until `done` holds (or everything came in) or `until`
    /// passed.
    fn collect(&mut self, events: &mpsc::Receiver<Event>, until: Instant, done: fn(&Outcome) -> bool) {
        while !self.complete() && !done(self) {
            match events.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(Event::Exited) => self.exited = true,
                Ok(Event::Stdout(v)) => self.stdout = Some(v),
                Ok(Event::Stderr(v)) => self.stderr = Some(v),
                Err(_) => return,
            }
        }
    }
}

impl Exec for SystemExec {
    fn run(&self, program: &str, args: &[&str], stdin: Option<&[u8]>) -> Result<String> {
        let spawn_err = |source| Error::Spawn { program: program.to_string(), source };
        // A group of its own: a kill reaches whatever the tool started
        // too, which would otherwise keep its outputs open.
        let mut child = Command::new(program)
            .args(args)
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(spawn_err)?;
        let group = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
        let kill_group = || {
            let _ = killpg(group, Signal::SIGKILL);
        };
        let started = Instant::now();
        let deadline = started + self.timeout;
        // This thread sleeps on the channel rather than polling the tool
        // (the sync thread's time in an 8,000-rule partial write: 10 ms
        // polling every 2 ms, 5 ms not; tests/growth).
        let (events, reports) = mpsc::channel::<Event>();
        if let Err(e) = supervise(&mut child, stdin, &events) {
            // No thread to watch it: the tool does not run unwatched.
            kill_group();
            let _ = child.wait();
            return Err(spawn_err(e));
        }
        let mut outcome = Outcome::default();
        let everything: fn(&Outcome) -> bool = Outcome::complete;
        outcome.collect(&reports, deadline, |o| o.exited);
        let timed_out = !outcome.exited;
        let mut held = false;
        if timed_out {
            kill_group();
        } else if !outcome.complete() {
            // Exited, outputs still open: give them a moment to end.
            outcome.collect(&reports, Instant::now() + LINGER, everything);
            if !outcome.complete() {
                held = true;
                kill_group();
            }
        }
        // Reaped only now, after any kill of its group; killed, it dies at
        // once. The outputs end unless a process left the group, which is
        // not waited for.
        let status = child.wait();
        if timed_out || held {
            outcome.collect(&reports, Instant::now() + LINGER, everything);
        }
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let ok = !timed_out && !held && status.as_ref().is_ok_and(|s| s.success());
        tracing::debug!(program, args = args.len(), stdin_bytes = stdin.map_or(0, <[u8]>::len), ok, ms, "ran a tool");
        if timed_out {
            return Err(Error::Timeout { program: program.to_string(), seconds: self.timeout.as_secs() });
        }
        if held {
            return Err(Error::OutputHeld { program: program.to_string() });
        }
        let status = status.map_err(spawn_err)?;
        let out = outcome.stdout.unwrap_or_default();
        let err = outcome.stderr.unwrap_or_default();
        if !status.success() {
            let stderr = String::from_utf8_lossy(&err).trim().to_string();
            return Err(Error::Failed {
                program: format!("{program} {}", args.join(" ")),
                status: status.to_string(),
                cause: classify(&stderr),
                stderr,
                stdout: String::from_utf8_lossy(&out).into_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_that_hangs_is_stopped() {
        let exec = SystemExec { timeout: Duration::from_millis(300) };
        let t = Instant::now();
        let err = exec.run("sleep", &["30"], None).unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
    }

    #[test]
    fn a_process_the_tool_leaves_holding_its_output_is_killed() {
        // The tool exits at once; what it started keeps stdout open.
        let exec = SystemExec::default();
        let t = Instant::now();
        let err = exec.run("sh", &["-c", "sleep 600 & echo started"], None).unwrap_err();
        assert!(matches!(err, Error::OutputHeld { .. }), "{err}");
        assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
        // The same started with its outputs closed is no problem.
        assert_eq!(exec.run("sh", &["-c", "sleep 3 >/dev/null 2>&1 & echo started"], None).unwrap(), "started\n");
    }

    #[test]
    fn a_hung_tool_is_stopped_with_what_it_started() {
        let exec = SystemExec { timeout: Duration::from_millis(300) };
        let t = Instant::now();
        let err = exec.run("sh", &["-c", "sleep 600 & sleep 600"], None).unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
    }

    #[test]
    fn output_and_failures_come_back() {
        let exec = SystemExec::default();
        assert_eq!(exec.run("cat", &[], Some(b"hello")).unwrap(), "hello");
        let err = exec.run("sh", &["-c", "echo 'iptables: Chain already exists.' >&2; exit 1"], None).unwrap_err();
        assert_eq!(err.cause(), Cause::Exists);
    }

    #[test]
    fn messages_are_classified_once() {
        assert_eq!(classify("iptables: Bad rule (does a matching rule exist in that chain?)."), Cause::NotFound);
        assert_eq!(classify("Another app is currently holding the xtables lock."), Cause::Locked);
        assert_eq!(classify("iptables-restore: line 3 failed"), Cause::Other);
    }
}
