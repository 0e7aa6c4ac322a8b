//! Issue 49: the node lock and the file ledger under faults. `activate` through a whole init and
//! through a join, and `join-service` through a ticket and the node's word that it keeps it, each
//! failing (EIO, ENOSPC) at every mutating call of any of its threads and killed (SIGKILL), then
//! started again as systemd would. Their rules are the judge (docs/activate.md): kubeadm never
//! runs twice, a fresh node is one kubeadm never touched, an answer of success is a durable
//! record, a node killed before its lock gets a ticket again, and every file the run wrote, the
//! marker, the ledger and the status records, is whole.

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

/// How many times kubeadm `verb` (init, join) ran on the node (its stand-in's log).
fn kubeadm_runs(node: &Node, verb: &str) -> usize {
    node.calls()
        .iter()
        .filter(|c| c.strip_prefix(verb).is_some_and(|r| r.starts_with(' ')))
        .count()
}

/// The next start of a node the faulted run left `done`, `committed` or `reset` (`state`): it
/// only starts the kubelet (done), or refuses without kubeadm (exit 2).
fn next_start_of_a_taken_node(state: &str, again: &Run) -> Result<&'static str, String> {
    match state {
        "done" if again.code == 0 && again.stdout.contains("activate already done") => Ok("done"),
        "committed" | "reset"
            if again.code == 2 && again.stderr.contains("will not init or join again") =>
        {
            Ok(match state {
                "committed" => "committed, refused by the next start",
                _ => "reset, refused by the next start",
            })
        }
        s => Err(format!("{s}, but the next start: {}", again.stderr)),
    }
}

/// After the next start: kubeadm `verb` ran at most once, the node is not fresh, every record
/// is whole and no temp file is left.
fn settled(node: &Node, verb: &str) -> Result<(), String> {
    let n = kubeadm_runs(node, verb);
    if n > 1 || lock_state(&node.root)?.is_none() {
        return Err(format!("after the next start: kubeadm {verb} ×{n}"));
    }
    faults::records_whole(&node.root)?;
    let temps = faults::temps_under(&node.root);
    match temps.is_empty() {
        true => Ok(()),
        false => Err(format!("temp files left after the next start: {temps:?}")),
    }
}

/// The admin's init-cluster, giving up on an unreachable node after 2 s (a killed node does
/// not come back within the case). Its records go to a run folder of its own, as on the
/// admin's machine: in the node's, its temp files would meet the node's sweeps.
fn admin_init(admin: &Admin, port: u16) -> Run {
    let mut a = admin.args(port);
    let w = a.iter().position(|x| x == "--wait").unwrap();
    a[w + 1] = "2".into();
    let mut cmd = command(&a, None);
    cmd.env("NODESTRAP_RUN_DIR", admin.dir.join("run"));
    Proc::spawn(cmd, "init-cluster").wait(90)
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
        let n = kubeadm_runs(&node, "init");
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
            Some(s) => next_start_of_a_taken_node(s, &Proc::start(node.args(&[])).wait(30))?,
        };
        settled(&node, "init")?;
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

/// What a node run asks of a join service, in order: `Some(session)` a ticket from that run,
/// `None` to say it keeps its ticket (once its ticket came).
type Asks<'a> = &'a [Option<char>];

/// The node's asks to the join service started as `cmd` (on `port`), then its stop (SIGTERM, as
/// systemd stops it): each answer's status, if one came, and the run.
fn one_ticket(cmd: Command, port: u16, pki: &Pki, leaf: &Leaf, asks: Asks) -> (Vec<u16>, Run) {
    let mut svc = Proc::spawn(cmd, "join-service");
    let mut got = Vec::new();
    if listening(&mut svc, port, 30) {
        for ask in asks {
            let r = match ask {
                Some(session) => ticket_in(port, &pki.cluster, leaf, *session),
                None => kept(port, &pki.cluster, leaf),
            };
            match r {
                Ok((s, _)) => got.push(s),
                Err(_) => break,
            }
        }
    }
    sigterm(&svc);
    (got, svc.wait(30))
}

/// `join-service --ledger file` issuing one ticket and hearing that the node keeps it, under
/// every fault of every thread: an answer of 200 is always recorded first, the record is
/// whole, and with the next start the node converges: a node that got its ticket says it
/// keeps it; one that did not (a fault before the answer, recorded or not) asks again from a
/// new run and gets one; and then the identity is kept and refused to any further run.
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
    let asks = [Some('a'), None];
    let (status, run) = one_ticket(faults::traced(&cmd(), &trace), port, &pki, &leaf, &asks);
    run.assert_ok();
    assert_eq!(status, [200, 200]);
    assert_eq!(ledger(&svc.root).unwrap().len(), 1);
    let calls = faults::calls_in(&trace, Threads::All);
    assert!(
        calls.iter().any(|c| c.line.contains("issued.json")),
        "{calls:#?}"
    );

    let out = work.join("inject");
    let mut judge = |c: &Case| -> Result<String, String> {
        faults::copy_tree(&pristine, &svc.root);
        let (first, run) = one_ticket(c.command(&cmd(), &out), port, &pki, &leaf, &asks);
        if !faults::was_injected(&out) {
            return Err("strace did not inject it".into());
        }
        let recorded = ledger(&svc.root)?;
        faults::records_whole(&svc.root)?;
        let got = first.first() == Some(&200);
        if got && recorded.len() != 1 {
            return Err(format!("a ticket left unrecorded:\n{}", run.stderr));
        }
        if first.get(1) == Some(&200) && kept_entry(&svc.root)? != Some(true) {
            return Err(format!("kept answered, not recorded:\n{}", run.stderr));
        }
        // The node's next run: it says it keeps the ticket it got, or asks for one as a new run;
        // then any further run is refused.
        let next: &[Option<char>] = match got {
            true => &[None, Some('c')],
            false => &[Some('b'), None, Some('c')],
        };
        let (second, again) = one_ticket(cmd(), port, &pki, &leaf, next);
        let want: &[u16] = match got {
            true => &[200, 409],
            false => &[200, 200, 409],
        };
        if second != want || again.code != 0 {
            return Err(format!(
                "recorded {}, the next start answered {second:?} (exit {}):\n{}",
                recorded.len(),
                again.code,
                again.stderr
            ));
        }
        if ledger(&svc.root)?.len() != 1 || kept_entry(&svc.root)? != Some(true) {
            return Err("the identity is not recorded once, kept, after the next start".into());
        }
        faults::records_whole(&svc.root)?;
        let temps = faults::temps_under(&svc.root);
        if !temps.is_empty() {
            return Err(format!("temp files left after the next start: {temps:?}"));
        }
        Ok(
            match (got, first.get(1) == Some(&200), recorded.is_empty()) {
                (true, true, _) => "ticket kept",
                (true, false, _) => "ticket, kept by the next start",
                (false, _, true) => "no ticket, issued by the next start",
                (false, _, false) => "recorded without its ticket, issued again by the next start",
            }
            .into(),
        )
    };
    eprintln!("join-service's file ledger: {} mutating calls", calls.len());
    faults::each_case(
        "join-service's file ledger",
        &faults::cases(&calls),
        &mut judge,
    );
    let _ = std::fs::remove_dir_all(&svc.dir);
}

/// A join service with the file ledger on `port`, from `svc`'s files.
fn join_service_on(svc: &JoinSvc, port: u16) -> Proc {
    let mut args = svc.args();
    let l = args.iter().position(|x| x == "--listen").unwrap();
    args[l + 1] = format!("127.0.0.1:{port}");
    let mut p = Proc::spawn(command(&args, None), "join-service");
    assert!(listening(&mut p, port, 30), "{}", p.stderr());
    p
}

/// The file ledger's entry for the one identity it holds: (kept, whole).
fn kept_entry(root: &Path) -> Result<Option<bool>, String> {
    const ISSUED: &str = "var/lib/nodestrap/join-service/issued.json";
    let v: serde_json::Value = match std::fs::read(root.join(ISSUED)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        r => serde_json::from_slice(&r.map_err(|e| format!("{ISSUED}: {e}"))?)
            .map_err(|e| format!("{ISSUED}: not whole: {e}"))?,
    };
    Ok(v["issued"]
        .as_object()
        .and_then(|m| m.values().next())
        .map(|e| e["kept"] == true))
}

/// `activate` through a join: a ticket from a real join service, the node lock, the service
/// told the node keeps it, kubeadm join; under every fault of every thread of activate. A fault
/// before the lock leaves a fresh node: the next start, a new run, asks again and gets a new
/// ticket (the first was never said kept) and joins. One after the lock leaves `committed` or
/// `reset`, which the next start refuses (exit 2) without kubeadm. kubeadm join never runs
/// twice, and after the next start no temp file is left.
#[test]
fn fault_matrix_of_a_join() {
    if !faults::native() {
        return;
    }
    let pki = Pki::new();
    let mut svc = JoinSvc::new(&pki, &pki.cluster);
    svc.stop().assert_ok();
    let node = Node::new(&pki, "faults-join", None);
    let work = node.dir.join("faults");
    std::fs::create_dir_all(&work).unwrap();
    let (pristine, svc_pristine) = (work.join("pristine"), work.join("svc-pristine"));
    faults::copy_tree(&node.root, &pristine);
    faults::copy_tree(&svc.root, &svc_pristine);
    let (port, svc_port) = (free_port(), free_port());
    let url = format!("https://127.0.0.1:{svc_port}");
    let cmd = || command(&activate_args_to(&node, port, &url), None);
    let skip = ["var/lib/nodestrap", "run/nodestrap"];

    let service = join_service_on(&svc, svc_port);
    let trace = work.join("trace");
    let run = Proc::spawn(faults::traced(&cmd(), &trace), "activate").wait(60);
    run.assert_ok();
    assert_eq!(lock_state(&node.root).unwrap().as_deref(), Some("done"));
    assert_eq!(kept_entry(&svc.root), Ok(Some(true)));
    sigterm(&service);
    service.wait(30).assert_ok();
    let after = faults::snapshot(&node.root, &skip);
    let calls = faults::calls_in(&trace, Threads::All);
    assert!(
        calls.iter().any(|c| c.line.contains("node-state")),
        "{calls:#?}"
    );

    let out = work.join("inject");
    let mut judge = |c: &Case| -> Result<String, String> {
        faults::copy_tree(&pristine, &node.root);
        faults::copy_tree(&svc_pristine, &svc.root);
        let _ = std::fs::remove_file(node.bin.join("kubeadm.log"));
        // Killed when dropped, on every way out of the case.
        let service = join_service_on(&svc, svc_port);
        let run = Proc::spawn(c.command(&cmd(), &out), "activate").wait(60);
        if !faults::was_injected(&out) {
            return Err("strace did not inject it".into());
        }
        let state = lock_state(&node.root)?;
        faults::records_whole(&node.root)?;
        let n = kubeadm_runs(&node, "join");
        let broken = if n > 1 {
            Some("kubeadm join ran twice")
        } else if state.is_none() && n > 0 {
            Some("kubeadm ran on a node that is still fresh")
        } else if run.code == 0 && state.as_deref() != Some("done") {
            Some("exit 0 without the marker done")
        } else if c.fault == Fault::Kill && run.code == 0 {
            Some("the kill did not end the run")
        } else {
            None
        };
        if let Some(why) = broken {
            return Err(format!(
                "{why}: exit {}, marker {state:?}, kubeadm join ×{n}\n{}",
                run.code, run.stderr
            ));
        }
        // The next start, as systemd's: a new run.
        let again = Proc::start(activate_args_to(&node, port, &url)).wait(60);
        let outcome = match state.as_deref() {
            None => {
                let now = faults::snapshot(&node.root, &skip);
                if again.code != 0 || now != after || kept_entry(&svc.root)? != Some(true) {
                    return Err(format!(
                        "fresh, but the next start did not join it (exit {}, ledger {:?}):\n{}\n{}",
                        again.code,
                        kept_entry(&svc.root),
                        faults::diff(&after, &now),
                        again.stderr
                    ));
                }
                match again.stderr.contains("ticket from") && run.stderr.contains("ticket from") {
                    true => "fresh with a lost ticket, joined by the next start with a new one",
                    false => "fresh, joined by the next start",
                }
            }
            Some(s) => next_start_of_a_taken_node(s, &again)?,
        };
        sigterm(&service);
        let served = service.wait(30);
        if served.code != 0 {
            return Err(format!("the join service: {}", served.stderr));
        }
        settled(&node, "join")?;
        Ok(outcome.into())
    };
    eprintln!("activate's join: {} mutating calls", calls.len());
    faults::each_case("activate's join", &faults::cases(&calls), &mut judge);
    let _ = std::fs::remove_dir_all(&node.dir);
    let _ = std::fs::remove_dir_all(&svc.dir);
}

/// `activate`'s arguments for `node` on `port`, asking the join service at `url`.
fn activate_args_to(node: &Node, port: u16, url: &str) -> Vec<String> {
    let mut a = node.args(&[url.to_string()]);
    let l = a.iter().position(|x| x == "--listen").unwrap();
    a[l + 1] = format!("127.0.0.1:{port}");
    a
}
