//! nodestrap: prepares a machine to join a Kubernetes cluster before anything else runs.

mod bootstrap;
mod cli;
mod dbus;
mod envfile;
mod error;
mod fetch;
mod kube;
mod logger;
mod mappings;
mod reboot;
mod root;
mod torcx;
mod verify;
mod yaml;

use argh::FromArgs;

fn main() {
    std::process::exit(run());
}

fn run() -> i32 {
    let mut argv: Vec<String> = std::env::args().collect();
    // Multicall compatibility with tectonic-torcx's symlink name.
    let prog = argv
        .first()
        .map(|a| a.rsplit('/').next().unwrap_or(a).to_string())
        .unwrap_or_default();
    if prog == "tectonic-torcx-bootstrap" {
        argv.insert(1, "bootstrap".into());
    }
    let args = cli::normalize(&argv[1..]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let cli = match cli::Cli::from_args(&["nodestrap"], &refs) {
        Ok(c) => c,
        Err(e) if e.status.is_ok() => {
            print!("{}", e.output);
            return 0;
        }
        Err(e) => {
            eprint!("{}", e.output);
            return 2;
        }
    };
    let cli::Cmd::Bootstrap(b) = &cli.cmd;
    let Some(level) = logger::parse_level(&b.verbose) else {
        eprintln!(
            "error: --verbose {:?}: expected error, warn, info or debug",
            b.verbose
        );
        return 2;
    };
    logger::init(level);
    match bootstrap::run(b) {
        Ok(()) => 0,
        Err(e) => {
            log::error!("{e}");
            e.exit_code()
        }
    }
}
