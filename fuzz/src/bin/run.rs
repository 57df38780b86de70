//! Runs inputs through a target without libFuzzer, to reproduce a crash
//! in an ordinary build: `cargo run -p kpx-fuzz --bin kpx-fuzz-run --
//! TARGET FILE...`.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((name, files)) = args.split_first() else {
        eprintln!("usage: kpx-fuzz-run TARGET FILE...");
        std::process::exit(2);
    };
    let Some(run) = kpx_fuzz::target(name) else {
        let names: Vec<_> = kpx_fuzz::TARGETS.iter().map(|(n, _)| *n).collect();
        eprintln!("kpx-fuzz-run: no target {name} (there are: {})", names.join(", "));
        std::process::exit(2);
    };
    for file in files {
        let input = std::fs::read(file).unwrap_or_else(|e| panic!("read {file}: {e}"));
        eprintln!("{name}: {file} ({} bytes)", input.len());
        run(&input);
    }
}
