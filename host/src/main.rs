use kpx::cli::{Cli, CliError, Command};
use kpx::config::Flags;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};

/// klog's verbosity as tracing levels.
fn level(v: u8) -> &'static str {
    match v {
        0 => "warn",
        1..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    }
}

/// The log filter: -v, refined by --vmodule's `module=N` (a module of kpx:
/// `sync=4` is `kpx::sync` at debug), or by KPX_LOG when set.
fn filter(flags: &Flags) -> EnvFilter {
    if let Ok(f) = EnvFilter::try_from_env("KPX_LOG") {
        return f;
    }
    let mut directives = vec![level(flags.verbosity).to_string()];
    for pair in flags.vmodule.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match pair.split_once('=').map(|(m, n)| (m.trim().trim_end_matches(".go"), n.trim().parse::<u8>())) {
            Some((module, Ok(n)))
                if !module.is_empty() && module.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') =>
            {
                let target = if module.starts_with("kpx") { module.to_string() } else { format!("kpx::{module}") };
                directives.push(format!("{target}={}", level(n)));
            }
            _ => eprintln!(
                "kpx: --vmodule {pair:?} ignored: kpx takes module=N with a module of kpx (glob patterns do not map)"
            ),
        }
    }
    EnvFilter::new(directives.join(","))
}

/// klog's destinations: stderr (--logtostderr, the default), or a file
/// (--log-file, or kpx.log in --log-dir), or both (--alsologtostderr).
fn writer(flags: &Flags) -> anyhow::Result<BoxMakeWriter> {
    let path = match (flags.log_file.as_str(), flags.log_dir.as_str()) {
        ("", "") => None,
        ("", dir) => Some(std::path::Path::new(dir).join("kpx.log")),
        (file, _) => Some(std::path::PathBuf::from(file)),
    };
    let file = match (&path, flags.logtostderr) {
        (Some(p), false) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| anyhow::anyhow!("cannot open the log file {}: {e}", p.display()))?,
        ),
        _ => None,
    };
    Ok(match file {
        None => BoxMakeWriter::new(std::io::stderr),
        Some(f) if flags.alsologtostderr => BoxMakeWriter::new(std::sync::Mutex::new(f).and(std::io::stderr)),
        Some(f) => BoxMakeWriter::new(std::sync::Mutex::new(f)),
    })
}

fn main() -> anyhow::Result<()> {
    // Before any thread starts: large blocks mapped on their own, given
    // back when freed (kpx_heap's doc has the figures).
    kpx_heap::keep_large_blocks_mapped();
    let cli = match Cli::from_args(std::env::args_os()) {
        Ok(cli) => cli,
        Err(CliError::Clap(e)) => e.exit(),
        Err(e) => {
            eprintln!("kpx: {e}");
            std::process::exit(1);
        }
    };
    match &cli.command {
        Some(Command::Trace(args)) => {
            print!("{}", kpx::trace::run(args)?);
            return Ok(());
        }
        Some(Command::Conformance(args)) => {
            let kpx = std::env::current_exe()?;
            match kpx::conformance::run(args, &kpx) {
                Ok(report) => {
                    println!("{report}");
                    std::process::exit(if report.failures() == 0 { 0 } else { 1 });
                }
                Err(e) => {
                    eprintln!("kpx conformance {}: {e}", args.component);
                    std::process::exit(2);
                }
            }
        }
        Some(Command::NewPlugin(args)) => match kpx::template::new_plugin(args) {
            Ok(dir) => {
                println!("created {} ({} component {}): see its README.md", dir.display(), args.kind, args.name);
                return Ok(());
            }
            Err(e) => {
                eprintln!("kpx new-plugin: {e}");
                std::process::exit(2);
            }
        },
        Some(Command::Demo(args)) => {
            if let Err(e) = kpx::demo::run(args, &std::env::current_exe()?) {
                eprintln!("kpx demo: {e}");
                std::process::exit(1);
            }
            return Ok(());
        }
        None => {}
    }
    let (flags, warnings) = (cli.flags, cli.warnings);
    match flags.version.as_deref().map(|v| (v, kpx::config::go_bool(v))) {
        Some((_, Ok(true))) => {
            println!("kpx {}", kpx::VERSION_TEXT);
            return Ok(());
        }
        Some(("raw", _)) => {
            println!(
                "kpx {}\nplugin contract: kpx:proxier 0.3.0 (backends), 0.4.0 (schedulers, extensions) and 0.2.0 (every world)\nplatform: {}/{}",
                kpx::VERSION_TEXT,
                std::env::consts::OS,
                std::env::consts::ARCH
            );
            return Ok(());
        }
        _ => {}
    }
    let ansi = flags.logtostderr
        && std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt().with_env_filter(filter(&flags)).with_writer(writer(&flags)?);
    if flags.logging_format == "json" {
        builder.json().init();
    } else {
        builder.with_ansi(ansi).init();
    }
    for w in warnings {
        tracing::warn!("{w}");
    }
    let config = flags.validate()?;
    if let Some(path) = &config.extra.write_config_to {
        kpx::app::write_config(&config, path)?;
        return Ok(());
    }
    if config.cleanup {
        kpx::app::cleanup(&config)?;
        return Ok(());
    }
    if config.extra.init_only {
        kpx::app::init(&config);
        return Ok(());
    }
    kpx::app::run(config)?;
    Ok(())
}
