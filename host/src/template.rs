//! `kpx new-plugin --kind scheduler|backend|extension NAME`: a plugin crate that
//! builds out of kpx's tree with one command (`cargo plugin`), with unit
//! tests on kpx-sdk's harness and a README saying how to check it with
//! `kpx conformance` and run it. The scheduler template is a complete
//! weighted-hashing scheduler that passes the conformance kit; the
//! backend template starts from kpx's own nftables generator; the
//! extension template drops (and counts) connections from the sources a
//! Service's annotation lists.

use std::path::{Path, PathBuf};

/// `kpx new-plugin`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// What the crate builds: scheduler, backend or extension.
    #[arg(long, value_parser = ["scheduler", "backend", "extension"])]
    pub kind: String,
    /// The crate's name: 1 to 32 of a-z, 0-9 and '-', starting with a letter. It is a scheduler's
    /// name too; an extension is configured under its letters and digits (cut to an extension name's
    /// length).
    pub name: String,
    /// Where to create it (default: ./NAME); must not exist or be empty.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// kpx-sdk's directory (default: the one in the source tree this kpx was built from).
    #[arg(long)]
    pub sdk: Option<PathBuf>,
}

const CARGO: &str = include_str!("template/Cargo.toml.txt");
const CONFIG: &str = include_str!("template/config.toml.txt");
const README: &str = include_str!("template/README.md.txt");
const SCHEDULER: &str = include_str!("template/scheduler.rs.txt");
const BACKEND: &str = include_str!("template/backend.rs.txt");
const EXTENSION: &str = include_str!("template/extension.rs.txt");

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("--kind {0:?}: scheduler, backend or extension")]
    Kind(String),
    #[error("{0:?}: a plugin's name is 1 to 32 of a-z, 0-9 and '-', starting with a letter")]
    Name(String),
    #[error("{}: exists and is not empty", .0.display())]
    Exists(PathBuf),
    #[error("no kpx-sdk at {}: pass --sdk with the sdk directory of kpx's source tree", .0.display())]
    NoSdk(PathBuf),
    #[error("{}: {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },
}

fn valid_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Creates the crate; returns its directory.
pub fn new_plugin(args: &Args) -> Result<PathBuf, Error> {
    let kind = args.kind.as_str();
    if !matches!(kind, "scheduler" | "backend" | "extension") {
        return Err(Error::Kind(args.kind.clone()));
    }
    if !valid_name(&args.name) {
        return Err(Error::Name(args.name.clone()));
    }
    let dir = args.dir.clone().unwrap_or_else(|| PathBuf::from(&args.name));
    if dir.read_dir().is_ok_and(|mut d| d.next().is_some()) {
        return Err(Error::Exists(dir));
    }
    let sdk = args.sdk.clone().unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk"));
    let sdk = std::path::absolute(&sdk).unwrap_or(sdk);
    if !sdk.join("Cargo.toml").is_file() {
        return Err(Error::NoSdk(sdk));
    }
    let sdk = sdk.canonicalize().unwrap_or(sdk);
    let crate_name = args.name.replace('-', "_");
    let mut cargo = CARGO.replace("{{NAME}}", &args.name).replace("{{SDK}}", &sdk.display().to_string());
    // An extension's configured name: [a-z][a-z0-9]*, at most 10 bytes.
    let ext: String =
        args.name.chars().filter(char::is_ascii_alphanumeric).take(crate::runtime::extension::MAX_NAME).collect();
    let (source, run) = match kind {
        "extension" => (
            EXTENSION,
            format!(
                "Run it: `kpx --proxy-mode nftables --extension {ext}=$PWD/target/wasm32-unknown-unknown/release/{crate_name}.wasm ...` \
                 (or iptables mode), and annotate a Service with `ext.kpx.dev/{ext}.deny-sources: \"10.1.0.0/16\"`. \
                 Check it with `kpx conformance ... --extension-annotation deny-sources=10.1.0.0/16` so that it returns rules."
            ),
        ),
        "scheduler" => (
            SCHEDULER,
            format!(
                "Run it: `kpx --scheduler-plugin {0}=$PWD/target/wasm32-unknown-unknown/release/{1}.wasm ...`, and \
                 annotate a Service with `kpx.dev/scheduler: {0}`.",
                args.name, crate_name
            ),
        ),
        _ => {
            let rules = sdk.parent().map(|p| p.join("rules")).unwrap_or_default();
            cargo = cargo.replace(
                "[dependencies]\n",
                &format!("[dependencies]\nkpx-rules = {{ path = \"{}\" }}\n", rules.display()),
            );
            (
                BACKEND,
                format!(
                    "Run it: `kpx --proxy-mode nftables --backend-plugin $PWD/target/wasm32-unknown-unknown/release/{crate_name}.wasm ...`."
                ),
            )
        }
    };
    let readme = README
        .replace("{{NAME}}", &args.name)
        .replace("{{KIND}}", kind)
        .replace("{{CRATE}}", &crate_name)
        .replace("{{RUN}}", &run);
    let files = [
        ("Cargo.toml", cargo),
        (".cargo/config.toml", CONFIG.to_string()),
        ("src/lib.rs", source.replace("{{NAME}}", &args.name).replace("{{EXT}}", &ext)),
        ("README.md", readme),
        (".gitignore", "/target\n".to_string()),
    ];
    for (file, text) in files {
        let path = dir.join(file);
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(path.parent().expect("a file in the crate"))?;
            std::fs::write(&path, text)
        };
        write().map_err(|source| Error::Write { path: path.clone(), source })?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `kpx --help` and `kpx new-plugin --help` name every kind
    /// `new-plugin` makes, and only those: each kind `--kind` lists is
    /// taken (the name is checked next), another is refused.
    #[test]
    fn the_help_names_every_kind_new_plugin_makes() {
        use clap::CommandFactory;
        let cli = crate::cli::Cli::command();
        let sub = cli.find_subcommand("new-plugin").expect("the new-plugin subcommand");
        let about = sub.get_about().map(ToString::to_string).unwrap_or_default();
        let kind = sub.get_arguments().find(|a| a.get_id() == "kind").expect("--kind");
        let kinds: Vec<String> = kind.get_possible_values().iter().map(|v| v.get_name().to_string()).collect();
        assert_eq!(kinds, ["scheduler", "backend", "extension"]);
        let dir = std::env::temp_dir().join(format!("kpx-template-help-{}", std::process::id()));
        for k in &kinds {
            assert!(about.contains(k.as_str()), "{k} missing from {about:?}");
            let args = Args { kind: k.clone(), name: "Bad".into(), dir: Some(dir.clone()), sdk: None };
            assert!(matches!(new_plugin(&args), Err(Error::Name(_))), "--kind {k} is taken");
        }
        let args = Args { kind: "vendor".into(), name: "ok".into(), dir: Some(dir.clone()), sdk: None };
        assert!(matches!(new_plugin(&args), Err(Error::Kind(_))));
        assert!(!dir.exists(), "nothing was written");
    }

    #[test]
    fn names_kinds_and_occupied_directories_are_refused_with_the_reason() {
        let args = |kind: &str, name: &str, dir: &Path| Args {
            kind: kind.into(),
            name: name.into(),
            dir: Some(dir.to_path_buf()),
            sdk: None,
        };
        let dir = std::env::temp_dir().join(format!("kpx-template-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(matches!(new_plugin(&args("vendor", "x", &dir)), Err(Error::Kind(_))));
        for bad in ["", "Upper", "9lives", "a_b", &"x".repeat(33)] {
            assert!(matches!(new_plugin(&args("scheduler", bad, &dir)), Err(Error::Name(_))), "{bad:?}");
        }
        let made = new_plugin(&args("scheduler", "my-sched", &dir)).unwrap();
        let lib = std::fs::read_to_string(made.join("src/lib.rs")).unwrap();
        assert!(lib.contains("const NAME: &str = \"my-sched\";"), "{lib}");
        let cargo = std::fs::read_to_string(made.join("Cargo.toml")).unwrap();
        assert!(cargo.contains("kpx-sdk = { path = \"/") && !cargo.contains("{{"), "{cargo}");
        assert!(matches!(new_plugin(&args("scheduler", "my-sched", &dir)), Err(Error::Exists(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
