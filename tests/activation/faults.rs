//! Issue 49: the node lock and the file ledger under faults. `activate` through a whole init,
//! and `join-service` through a ticket, each failing (EIO, ENOSPC) at every mutating call of any
//! of its threads and killed (SIGKILL) at every rename and fsync, then started again as systemd
//! would. Their rules are the judge (docs/activate.md): kubeadm never runs twice, a fresh node is
//! one kubeadm never touched, an answer of success is a durable record, and every file the run
//! wrote, the marker, the ledger and the status records, is whole.

use std::process::Command;

use super::*;
use support::faults::{self, Case, Fault, Threads};

/// A port that was free a moment ago: the node listens there, so that finding it does not
/// depend on a log line (a case may fail the write of that very line).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether `p` listens on `port`: true once it accepts, false once it has ended without.
fn listening(p: &mut Proc, port: u16, secs: u64) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        if !p.running() {
            return false;
        }
        assert!(
            Instant::now() < end,
            "{}: neither listening nor ended within {secs} s:\n{}",
            p.what,
            p.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `activate`'s arguments for `node`, listening on `port`.
fn activate_args(node: &Node, port: u16) -> Vec<String> {
    let mut a = node.args(&[]);
    let l = a.iter().position(|x| x == "--listen").unwrap();
    a[l + 1] = format!("127.0.0.1:{port}");
    a
}

/// SIGTERM, as systemd stops a unit, to nodestrap in `p`: strace blocks fatal signals (`-I3`
/// with `-o`), so the signal goes to the process it runs.
fn sigterm(p: &Proc) {
    let pid = p.child.id();
    let target = faults::tracee(pid).unwrap_or(pid);
    unsafe { libc::kill(target as i32, libc::SIGTERM) };
}

/// The node lock's state, read whole: None on a fresh node.
fn lock_state(root: &Path) -> Result<Option<String>, String> {
    let bytes = match std::fs::read(root.join(STATE)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        r => r.map_err(|e| format!("{STATE}: {e}"))?,
    };
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("{STATE}: not whole: {e}"))?;
    match v["state"].as_str() {
        Some(s) => Ok(Some(s.to_string())),
        None => Err(format!("{STATE}: no state: {v}")),
    }
}

/// How many times kubeadm init ran on the node (its stand-in's log).
fn inits(node: &Node) -> usize {
    node.calls()
        .iter()
        .filter(|c| c.starts_with("init "))
        .count()
}

/// The admin's init-cluster, giving up on an unreachable node after 2 s (a killed node does
/// not come back within the case).
fn admin_init(admin: &Admin, port: u16) -> Run {
    let mut a = admin.args(port);
    let w = a.iter().position(|x| x == "--wait").unwrap();
    a[w + 1] = "2".into();
    Proc::start(a).wait(90)
}

/// One init: the node started as `cmd` (on `port`), and the admin's request once it listens.
/// A node that answered the request with an error and is still fresh goes on serving
/// (docs/activate.md); it is stopped (SIGTERM), as the admin gives up, and the case goes on
/// from what it left.
fn one_init(cmd: Command, port: u16, admin: &Admin, root: &Path) -> (Run, Option<Run>) {
    let mut act = Proc::spawn(cmd, "activate");
    let admin_run = listening(&mut act, port, 30).then(|| admin_init(admin, port));
    let refused = admin_run.as_ref().is_some_and(|r| r.code != 0);
    if refused && act.running() && matches!(lock_state(root), Ok(None)) {
        sigterm(&act);
    }
    (act.wait(60), admin_run)
}

/// What a faulted run may have done, by the rules of the lock.
fn faulted_init_keeps_the_rules(
    c: &Case,
    run: &Run,
    admin: Option<&Run>,
    state: Option<&str>,
    n: usize,
) -> Result<(), String> {
    let admin_ok = admin.is_some_and(|r| r.code == 0);
    let broken = if n > 1 {
        Some("kubeadm init ran twice")
    } else if state.is_none() && n > 0 {
        Some("kubeadm ran on a node that is still fresh")
    } else if run.code == 0 && !matches!(state, None | Some("done")) {
        // 0: activated, or stopped while still fresh (the SIGTERM of `one_init`).
        Some("exit 0 with the marker neither done nor absent")
    } else if admin_ok && state != Some("done") {
        Some("the admin was told of success without the marker done")
    } else if c.fault == Fault::Kill && run.code == 0 {
        Some("the kill did not end the run")
    } else if state == Some("reset") && run.code == 0 {
        Some("reset, yet exit 0")
    } else {
        None
    };
    match broken {
        None => Ok(()),
        Some(why) => Err(format!(
            "{why}: exit {}, marker {state:?}, kubeadm init ×{n}, admin {:?}\n{}",
            run.code,
            admin.map(|r| r.code),
            run.stderr
        )),
    }
}

/// `activate` through an init: the node lock and kubeadm under every fault of every thread. A
/// fault before the lock leaves a fresh node that the next start initializes; one after it
/// leaves `committed` or `reset`, which the next start refuses (exit 2) without kubeadm; a
/// `done` node's next start only starts the kubelet. After the next start no temp file is left.
#[test]
fn fault_matrix_of_an_init() {
    if !faults::native() {
        return;
    }
    let pki = Pki::new();
    let node = Node::new(&pki, "faults-init", None);
    let admin = Admin::new(&pki, None);
    let work = node.dir.join("faults");
    std::fs::create_dir_all(&work).unwrap();
    let pristine = work.join("pristine");
    faults::copy_tree(&node.root, &pristine);
    let port = free_port();
    let cmd = || command(&activate_args(&node, port), None);
    // What the records and the marker hold differs by the clock; they are judged on their own.
    let skip = ["var/lib/nodestrap", "run/nodestrap"];

    let trace = work.join("trace");
    let (run, admin_run) = one_init(faults::traced(&cmd(), &trace), port, &admin, &node.root);
    run.assert_ok();
    admin_run.unwrap().assert_ok();
    assert_eq!(lock_state(&node.root).unwrap().as_deref(), Some("done"));
    let after = faults::snapshot(&node.root, &skip);
    let calls = faults::calls_in(&trace, Threads::All);
    assert!(
        calls.iter().any(|c| c.line.contains("node-state")),
        "{calls:#?}"
    );

    let out = work.join("inject");
    let mut judge = |c: &Case| -> Result<String, String> {
        faults::copy_tree(&pristine, &node.root);
        let _ = std::fs::remove_file(node.bin.join("kubeadm.log"));
        let (run, admin_run) = one_init(c.command(&cmd(), &out), port, &admin, &node.root);
        if !faults::was_injected(&out) {
            return Err("strace did not inject it".into());
        }
        let state = lock_state(&node.root)?;
        faults::records_whole(&node.root)?;
        let n = inits(&node);
        faulted_init_keeps_the_rules(c, &run, admin_run.as_ref(), state.as_deref(), n)?;
        // The next start, as systemd's.
        let outcome = match state.as_deref() {
            None => {
                let (again, admin_again) = one_init(cmd(), port, &admin, &node.root);
                let now = faults::snapshot(&node.root, &skip);
                if again.code != 0 || admin_again.is_none_or(|r| r.code != 0) || now != after {
                    return Err(format!(
                        "fresh, but the next start did not initialize it (exit {}):\n{}\n{}",
                        again.code,
                        faults::diff(&after, &now),
                        again.stderr
                    ));
                }
                "fresh, initialized by the next start"
            }
            Some("done") => {
                let again = Proc::start(node.args(&[])).wait(30);
                if again.code != 0 || !again.stdout.contains("activate already done") {
                    return Err(format!("done, but the next start: {}", again.stderr));
                }
                "done"
            }
            Some(s) => {
                let again = Proc::start(node.args(&[])).wait(30);
                if again.code != 2 || !again.stderr.contains("will not init or join again") {
                    return Err(format!("{s}, but the next start: {}", again.stderr));
                }
                if s == "committed" {
                    "committed, refused by the next start"
                } else {
                    "reset, refused by the next start"
                }
            }
        };
        if inits(&node) > 1 || lock_state(&node.root)?.is_none() {
            return Err(format!(
                "after the next start: kubeadm init ×{}",
                inits(&node)
            ));
        }
        faults::records_whole(&node.root)?;
        let temps = faults::temps_under(&node.root);
        if !temps.is_empty() {
            return Err(format!("temp files left after the next start: {temps:?}"));
        }
        Ok(outcome.into())
    };
    eprintln!("activate's init: {} mutating calls", calls.len());
    faults::each_case("activate's init", &faults::cases(&calls), &mut judge);
    let _ = std::fs::remove_dir_all(&node.dir);
}

/// The file ledger's identities (`issued`), read whole: empty when there is no record yet.
fn ledger(root: &Path) -> Result<Vec<String>, String> {
    const ISSUED: &str = "var/lib/nodestrap/join-service/issued.json";
    let bytes = match std::fs::read(root.join(ISSUED)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        r => r.map_err(|e| format!("{ISSUED}: {e}"))?,
    };
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("{ISSUED}: not whole: {e}"))?;
    let issued = v["issued"]
        .as_object()
        .ok_or_else(|| format!("{ISSUED}: no issued: {v}"))?;
    Ok(issued.keys().cloned().collect())
}

/// One ticket request to the join service started as `cmd` (on `port`), then its stop
/// (SIGTERM, as systemd stops it): the answer's status, if one came, and the run.
fn one_ticket(cmd: Command, port: u16, pki: &Pki, leaf: &Leaf) -> (Option<u16>, Run) {
    let mut svc = Proc::spawn(cmd, "join-service");
    let status = listening(&mut svc, port, 30)
        .then(|| ticket(port, &pki.cluster, leaf).ok().map(|(s, _)| s))
        .flatten();
    sigterm(&svc);
    (status, svc.wait(30))
}

/// `join-service --ledger file` issuing one ticket, under every fault of every thread: an answer
/// of 200 is always recorded first, the record is whole, and the next start refuses a recorded
/// identity and gives an unrecorded one its ticket, so one identity gets one ticket at most.
/// A fault after the record is durable and before the ticket leaves keeps the identity
/// recorded without its ticket: the file ledger has no retry window (docs/join-service.md).
#[test]
fn fault_matrix_of_a_file_ledger() {
    if !faults::native() {
        return;
    }
    let pki = Pki::new();
    let mut svc = JoinSvc::new(&pki, &pki.cluster);
    svc.stop().assert_ok();
    let leaf = both_ways(&pki.nodes, "faults-node", None);
    let port = free_port();
    let mut args = svc.args();
    let l = args.iter().position(|x| x == "--listen").unwrap();
    args[l + 1] = format!("127.0.0.1:{port}");
    let cmd = || command(&args, None);
    let work = svc.dir.join("faults");
    std::fs::create_dir_all(&work).unwrap();
    let pristine = work.join("pristine");
    faults::copy_tree(&svc.root, &pristine);

    let trace = work.join("trace");
    let (status, run) = one_ticket(faults::traced(&cmd(), &trace), port, &pki, &leaf);
    run.assert_ok();
    assert_eq!(status, Some(200));
    assert_eq!(ledger(&svc.root).unwrap().len(), 1);
    let calls = faults::calls_in(&trace, Threads::All);
    assert!(
        calls.iter().any(|c| c.line.contains("issued.json")),
        "{calls:#?}"
    );

    let out = work.join("inject");
    let mut judge = |c: &Case| -> Result<String, String> {
        faults::copy_tree(&pristine, &svc.root);
        let (first, run) = one_ticket(c.command(&cmd(), &out), port, &pki, &leaf);
        if !faults::was_injected(&out) {
            return Err("strace did not inject it".into());
        }
        let recorded = ledger(&svc.root)?;
        faults::records_whole(&svc.root)?;
        if first == Some(200) && recorded.len() != 1 {
            return Err(format!("a ticket left unrecorded:\n{}", run.stderr));
        }
        let (second, again) = one_ticket(cmd(), port, &pki, &leaf);
        let want = if recorded.is_empty() { 200 } else { 409 };
        if second != Some(want) || again.code != 0 {
            return Err(format!(
                "recorded {}, the next start answered {second:?} (exit {}):\n{}",
                recorded.len(),
                again.code,
                again.stderr
            ));
        }
        if ledger(&svc.root)?.len() != 1 {
            return Err("the identity is not recorded once after the next start".into());
        }
        faults::records_whole(&svc.root)?;
        let temps = faults::temps_under(&svc.root);
        if !temps.is_empty() {
            return Err(format!("temp files left after the next start: {temps:?}"));
        }
        Ok(match (first, recorded.is_empty()) {
            (Some(200), _) => "ticket, refused again by the next start",
            (_, true) => "no ticket, issued by the next start",
            (_, false) => "recorded without its ticket, refused by the next start",
        }
        .into())
    };
    eprintln!("join-service's file ledger: {} mutating calls", calls.len());
    faults::each_case(
        "join-service's file ledger",
        &faults::cases(&calls),
        &mut judge,
    );
    let _ = std::fs::remove_dir_all(&svc.dir);
}
