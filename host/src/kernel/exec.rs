//! Running the kernel tools (iptables-restore, iptables-save, iptables,
//! ip): with a deadline, and with their failures read in one place.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

impl Exec for SystemExec {
    fn run(&self, program: &str, args: &[&str], stdin: Option<&[u8]>) -> Result<String> {
        let spawn_err = |source| Error::Spawn { program: program.to_string(), source };
        let mut child = Command::new(program)
            .args(args)
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_err)?;
        let started = Instant::now();
        let deadline = started + self.timeout;
        // Stdin is written and the outputs drained from threads, so a
        // chatty tool cannot deadlock on a full pipe while this one waits.
        let (status, out, err) = std::thread::scope(|scope| {
            if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
                // A tool that exits early closes the pipe; its status says why.
                scope.spawn(move || {
                    let _ = pipe.write_all(input);
                });
            }
            // Each output's reader says when it reached the end: the tool
            // closed it, which it does by exiting. Until then this thread
            // sleeps on the channel rather than polling the tool every 2 ms:
            // the polls' CPU time grew with the tool's own time (the sync
            // thread's time in an 8,000-rule partial write: 10 ms polling,
            // 5 ms not; tests/growth).
            let (ended, end) = std::sync::mpsc::channel::<()>();
            let drain = |pipe: Option<Box<dyn Read + Send>>| {
                let ended = ended.clone();
                scope.spawn(move || {
                    let mut v = Vec::new();
                    if let Some(mut s) = pipe {
                        let _ = s.read_to_end(&mut v);
                    }
                    let _ = ended.send(());
                    v
                })
            };
            let out = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
            let err = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
            for _ in 0..2 {
                if end.recv_timeout(deadline.saturating_duration_since(Instant::now())).is_err() {
                    break;
                }
            }
            // Both closed (the tool exited, or is exiting), or the deadline
            // passed; a tool that closed its outputs and ran on is polled.
            let status = loop {
                match child.try_wait() {
                    Ok(Some(status)) => break Ok(status),
                    Ok(None) if Instant::now() >= deadline => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break Err(Error::Timeout { program: program.to_string(), seconds: self.timeout.as_secs() });
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(2)),
                    Err(e) => break Err(spawn_err(e)),
                }
            };
            (status, out.join().unwrap_or_default(), err.join().unwrap_or_default())
        });
        tracing::debug!(
            program,
            args = args.len(),
            stdin_bytes = stdin.map_or(0, <[u8]>::len),
            ok = status.as_ref().is_ok_and(|s| s.success()),
            ms = started.elapsed().as_secs_f64() * 1e3,
            "ran a tool"
        );
        let status = status?;
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
