use clap::Parser;
use kpx::config::{Cli, Command};
use tracing_subscriber::EnvFilter;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(Command::Trace(args)) = &cli.command {
        print!("{}", kpx::trace::run(args, &kpx::kernel::SystemExec::default())?);
        return Ok(());
    }
    let flags = cli.flags;
    let level = match flags.verbosity {
        0 => "warn",
        1..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_env("KPX_LOG").unwrap_or_else(|_| EnvFilter::new(level));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).init();
    let config = flags.validate()?;
    if config.cleanup {
        kpx::app::cleanup()?;
        return Ok(());
    }
    kpx::app::run(config)?;
    Ok(())
}
