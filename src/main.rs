//! nodestrap: the command-line entry point; the work is in the library (src/lib.rs).

use argh::FromArgs;
use nodestrap::activation::{activate, init_cluster, join_service};
use nodestrap::inplace::reprovision;
use nodestrap::torcx::{bootstrap, config, hook};
use nodestrap::{cli, error, logger};

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
    match prog.as_str() {
        "tectonic-torcx-bootstrap" => argv.insert(1, "bootstrap".into()),
        "tectonic-torcx-hook-pre" => argv.insert(1, "hook".into()),
        _ => {}
    }
    let user = cli::normalize(&argv[1..]);
    // The command line alone first: it says where the other settings are (--root, --config,
    // --cmdline), and usage errors and --help come before any file is read.
    let cli = match parse(&user) {
        Ok(c) => c,
        Err(code) => return code,
    };
    // preflight and reprovision, like the hook, take a pod's command line only.
    let cli = match cli.cmd {
        cli::Cmd::Preflight(p) => return reprovision_cmd(p.into(), true),
        cli::Cmd::Reprovision(r) => return reprovision_cmd(r, false),
        cmd => cli::Cli { cmd },
    };
    let b = match &cli.cmd {
        cli::Cmd::Bootstrap(b) => b,
        // The hook takes the command line only: no config file, no kernel arguments.
        cli::Cmd::Hook(h) => {
            let Some(level) = log_level(&h.verbose) else {
                return 2;
            };
            logger::init(level);
            return exit_code(hook::run(h));
        }
        // Activation's commands, like the hook, take the command line only.
        cli::Cmd::Activate(x) => return with_log(&x.verbose, || activate::run(x)),
        cli::Cmd::JoinService(x) => return with_log(&x.verbose, || join_service::run(x)),
        cli::Cmd::InitCluster(x) => return with_log(&x.verbose, || init_cluster::run(x)),
        cli::Cmd::Preflight(_) | cli::Cmd::Reprovision(_) => unreachable!("handled above"),
    };
    let merged = match config::merge(b, &user) {
        Ok(m) => m,
        Err(e) => {
            logger::init(log::LevelFilter::Info);
            log::error!("{e}");
            return e.exit_code();
        }
    };
    let cli = match parse(&merged.args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let cli::Cmd::Bootstrap(b) = &cli.cmd else {
        unreachable!("merged arguments keep the subcommand")
    };
    let Some(level) = log_level(&b.verbose) else {
        return 2;
    };
    logger::init(level);
    for n in &merged.notes {
        log::info!("{n}");
    }
    exit_code(bootstrap::run(b))
}

fn reprovision_cmd(r: cli::Reprovision, only_check: bool) -> i32 {
    with_log(&r.verbose, || {
        if only_check {
            reprovision::preflight(&r)
        } else {
            reprovision::run(&r)
        }
    })
}

fn with_log(verbose: &str, f: impl FnOnce() -> error::Result<()>) -> i32 {
    let Some(level) = log_level(verbose) else {
        return 2;
    };
    logger::init(level);
    exit_code(f())
}

fn log_level(verbose: &str) -> Option<log::LevelFilter> {
    let l = logger::parse_level(verbose);
    if l.is_none() {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "error: --verbose {verbose:?}: expected panic, fatal, error, warn, info, debug or trace"
        );
    }
    l
}

fn exit_code(r: error::Result<()>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            log::error!("{e}");
            e.exit_code()
        }
    }
}

/// argh over normalised arguments; `Err` is the exit code once its output is printed.
fn parse(args: &[String]) -> Result<cli::Cli, i32> {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    cli::Cli::from_args(&["nodestrap"], &refs).map_err(|e| {
        use std::io::Write as _;
        // A closed stdout or stderr must not panic; the exit code still tells.
        if e.status.is_ok() {
            match std::io::stdout().write_all(e.output.as_bytes()) {
                Ok(()) => 0,
                Err(_) => 1,
            }
        } else {
            let _ = std::io::stderr().write_all(e.output.as_bytes());
            2
        }
    })
}
