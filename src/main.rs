//! nodestrap: the command-line entry point. It only dispatches: the work is in the library
//! (src/lib.rs), one folder per product family over shared floors (README.md, "Layout").

use nodestrap::activation::{activate, init_cluster, join_service};
use nodestrap::cli::{self, logged, recorded, Cmd, Payload, SendsEvents};
use nodestrap::inplace::reprovision;
use nodestrap::sysext;
use nodestrap::torcx::{self as torcx, bootstrap, hook};

fn main() {
    std::process::exit(run());
}

fn run() -> i32 {
    let args = cli::args();
    // The command line alone first: usage errors and --help come before any file is read.
    let cli = match cli::parse(&args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match cli.cmd {
        // Bootstrap also reads settings from the node (config file, kernel command line).
        // The payload family may be chosen there, so it is dispatched once they are merged.
        Cmd::Bootstrap(b) => cli::bootstrap(&b, &args, &|b| match b.payload {
            Payload::Torcx => bootstrap::run(b),
            Payload::Sysext => sysext::bootstrap::run(b),
        }),
        // Every other command takes its command line only.
        // Each keeps a status record of its last run (docs/status.md), a dry run none.
        Cmd::Hook(h) => recorded("hook", &h.root, false, &h.verbose, h.events_to(), || {
            hook::run(&h)
        }),
        Cmd::Preflight(p) => {
            let r: cli::Reprovision = p.into();
            recorded(
                "preflight",
                &r.root,
                false,
                &r.verbose,
                r.events_to(),
                || reprovision::preflight(&r),
            )
        }
        Cmd::Reprovision(r) => recorded(
            "reprovision",
            &r.root,
            r.dry_run,
            &r.verbose,
            r.events_to(),
            || reprovision::run(&r),
        ),
        Cmd::Activate(x) => recorded(
            "activate",
            &x.root,
            false,
            &x.verbose,
            x.events_to(),
            || activate::run(&x),
        ),
        Cmd::JoinService(x) => recorded(
            "join-service",
            &x.root,
            false,
            &x.verbose,
            x.events_to(),
            || join_service::run(&x),
        ),
        Cmd::InitCluster(x) => logged(&x.verbose, || init_cluster::run(&x)),
        // Reads the last run's record; writes nothing.
        Cmd::Status(s) => cli::status(&s),
        // The boot check of the payload the last bootstrap staged.
        Cmd::Verify(v) => cli::verify(&v, &|v| {
            if nodestrap::node::status::last_bootstrap_was_torcx(std::path::Path::new("/")) {
                torcx::verify::run(v)
            } else {
                sysext::verify::run(v)
            }
        }),
    }
}
