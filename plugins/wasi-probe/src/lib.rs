//! A test-only scheduler component that imports WASI 0.2, as components
//! built for wasm32-wasip2 by other toolchains do, and reports what kpx
//! gives it. Each of its scheduler names makes one probe when a connection
//! is picked:
//!
//! - `probe` answers (as its error, which the host reports) with what the
//!   environment, the preopened directories and the random interfaces gave;
//! - `clock`, `wall-clock`, `socket`, `stdout`, `exit` call the interface of
//!   that name, which kpx must refuse (a trap); if the call returns, the
//!   pick says so in its error;
//! - `random-loop` draws random bytes without end (the host's answers are
//!   paid from the fuel: a trap), `big-random` asks for 1 MiB at once.
#![forbid(unsafe_code)]

use kpx_rules::plan::Plan;
use kpx_sdk::scheduler::{PickRequest, Request, Scheduler};
use wasip2::{cli, clocks, filesystem, random, sockets};

struct Probe;

impl Scheduler for Probe {
    fn names() -> Vec<String> {
        ["probe", "clock", "wall-clock", "socket", "stdout", "exit", "random-loop", "big-random"]
            .map(String::from)
            .to_vec()
    }

    fn uses_load(_: &str) -> bool {
        false
    }

    fn plan(request: Request) -> Result<Plan, String> {
        Err(format!("{} plans nothing", request.name))
    }

    fn pick(r: PickRequest) -> Result<Option<u32>, String> {
        match r.name.as_str() {
            "probe" => {
                let env = cli::environment::get_environment();
                let args = cli::environment::get_arguments();
                let cwd = cli::environment::initial_cwd();
                let dirs = filesystem::preopens::get_directories();
                let bytes = random::random::get_random_bytes(8);
                let n = random::random::get_random_u64();
                let insecure = random::insecure::get_insecure_random_u64();
                let seed = random::insecure_seed::insecure_seed();
                Err(format!(
                    "env={} args={} cwd={cwd:?} dirs={} bytes={bytes:02x?} random={n:x} insecure={insecure:x} seed={:x},{:x}",
                    env.len(),
                    args.len(),
                    dirs.len(),
                    seed.0,
                    seed.1
                ))
            }
            "clock" => Err(format!("the monotonic clock answered {}", clocks::monotonic_clock::now())),
            "wall-clock" => Err(format!("the wall clock answered {}", clocks::wall_clock::now().seconds)),
            "socket" => {
                let _network = sockets::instance_network::instance_network();
                Err("a network was handed out".into())
            }
            "stdout" => {
                let out = cli::stdout::get_stdout();
                let written = out.blocking_write_and_flush(b"hello from a plugin\n");
                Err(format!("stdout was writable: {written:?}"))
            }
            "random-loop" => {
                // The host's work for WASI answers is paid from the fuel.
                let mut sum = 0u64;
                for _ in 0..1_000_000_000u64 {
                    sum = sum.wrapping_add(random::random::get_random_bytes(4096).len() as u64);
                }
                Err(format!("drew {sum} random bytes"))
            }
            "big-random" => Err(format!("got {} random bytes", random::random::get_random_bytes(1 << 20).len())),
            "exit" => {
                cli::exit::exit(Ok(()));
                Err("exit returned".into())
            }
            other => Err(format!("no probe {other}")),
        }
    }
}

kpx_sdk::export_scheduler!(Probe);
