//! Running the kernel tools (iptables-restore, iptables, ...).

use std::io::Write;
use std::process::{Command, Stdio};

use super::{Error, Result};

/// Runs a program with arguments and optional standard input; returns its
/// standard output.
pub trait Exec: Send {
    fn run(&self, program: &str, args: &[&str], stdin: Option<&[u8]>) -> Result<String>;
}

/// The real thing.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemExec;

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
        // Stdin is written from a second thread while this one drains
        // stdout and stderr, so a chatty tool cannot deadlock on a full pipe.
        let out = std::thread::scope(|scope| {
            if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
                // A tool that exits early closes the pipe; its status says why.
                scope.spawn(move || {
                    let _ = pipe.write_all(input);
                });
            }
            child.wait_with_output()
        })
        .map_err(spawn_err)?;
        if !out.status.success() {
            return Err(Error::Failed {
                program: format!("{program} {}", args.join(" ")),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}
