//! `nodestrap verify` after a boot: the boot is this machine's real systemd-sysext merging the
//! node's layout in a private mount namespace, as the real root's systemd-sysext.service does;
//! what runs is then compared with the bootstrap's status record.

use super::*;

/// A boot of the world's node: its /etc/extensions and /var/lib/nodestrap bound into the
/// namespace, the merge, then `script`.
pub(super) fn boot(w: &World, bus: &Bus, script: &str) -> String {
    let r = w.root.display();
    let (ok, out) = in_namespace(
        &w.path("/opt"),
        &format!(
            "mkdir -p /var/lib/nodestrap /etc/extensions {r}/var/lib/nodestrap {r}/etc/extensions\nmount --bind {r}/var/lib/nodestrap /var/lib/nodestrap\nmount --bind {r}/etc/extensions /etc/extensions\nsystemd-sysext merge >/dev/null\n{script}"
        ),
        &[("DBUS_SYSTEM_BUS_ADDRESS", &bus.address)],
    );
    assert!(ok, "{out}");
    out
}

/// `nodestrap verify` in a boot's script: prints `VERIFY exit=N`.
fn verify(args: &str) -> String {
    format!(
        "if {} verify --kubeconfig=/nonexistent/kubelet.conf {args} 2>&1; then echo 'VERIFY exit=0'; else echo \"VERIFY exit=$?\"; fi\n",
        bin()
    )
}

fn json(w: &World, node_path: &str) -> serde_json::Value {
    serde_json::from_str(&w.read(node_path).unwrap_or_default()).unwrap_or_default()
}

/// Boot 1 of a node (a v1.31 cluster, kubernetes v1.31.9 staged, merged, verified: the
/// known-good set), then a bootstrap for a v1.32 cluster that stages a v1.32.3 image whose
/// kubelet says v1.32.9: the node as the next boot finds it.
pub(super) fn lying_boot(w: &World, bus: &Bus) {
    w.write(
        "/etc/kubernetes/installer/kubelet.env",
        "KUBELET_IMAGE_TAG=v1.31.2\n",
    );
    w.run().assert_ok();
    let out = boot(w, bus, &verify("--api-wait=1"));
    assert!(out.contains("VERIFY exit=0"), "{out}");
    for needle in [
        "check kubernetes /usr/bin/kubelet --version: expected version 1.31.9, found version 1.31.9",
        "check kubernetes merged image: expected read by a loop device, found read by a loop device",
        "check containerd merged for /usr: expected listed by systemd-sysext status, found listed by systemd-sysext status",
        "recorded as unreached",
        "verified: the node runs kubernetes v1.31.9, containerd v1.7.24 as",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    let rec = json(w, "/var/lib/nodestrap/status.json");
    assert_eq!(rec["phase"], "verified", "{rec}");
    assert_eq!(rec["verification"]["outcome"], "verified", "{rec}");
    assert_eq!(rec["verification"]["api"], "unreached", "{rec}");
    let known = json(w, "/var/lib/nodestrap/known-good.json");
    assert_eq!(
        known["set"][0]["image"], "/opt/extensions/kubernetes/kubernetes-v1.31.9-x86-64.raw",
        "{known}"
    );

    // Boot 2: the cluster is v1.32; the source's v1.32.3 carries a kubelet that says v1.32.9.
    let k = vec![
        (
            "kubernetes-v1.32.1-x86-64.raw".to_string(),
            kubernetes(&w.work, "1.32.1", ANY),
        ),
        (
            "kubernetes-v1.32.3-x86-64.raw".to_string(),
            kubernetes(&w.work, "1.32.9", ANY),
        ),
    ];
    w.publish("kubernetes", &k, "");
    w.write(
        "/etc/kubernetes/installer/kubelet.env",
        "KUBELET_IMAGE_TAG=v1.32.4\n",
    );
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    w.run().assert_ok();
    assert_eq!(
        w.link("kubernetes").as_deref(),
        Some("/opt/extensions/kubernetes/kubernetes-v1.32.3-x86-64.raw")
    );
}

/// Issue 28's first proof, on this machine's systemd-sysext: a kubernetes image whose kubelet
/// says another version than its name is found after the boot, recorded, refused for good, and
/// the node goes back to the set the boot before verified; the kubelet restarts on it.
#[test]
fn a_boot_that_runs_another_kubelet_than_chosen_returns_to_the_known_good_set() {
    let w = World::new();
    let mut bus = Bus::start();
    let calls = unique_dir("systemd").join("calls");
    bus.systemd(&["--record", calls.to_str().unwrap()]);
    lying_boot(&w, &bus);
    let out = boot(
        &w,
        &bus,
        &format!(
            "{}readlink /etc/extensions/kubernetes.raw\nkubelet --version\nif {b} status 2>&1; then echo 'STATUS exit=0'; else echo \"STATUS exit=$?\"; fi\necho again\n{}",
            verify("--api-wait=0"),
            verify("--api-wait=0"),
            b = bin()
        ),
    );
    let (first, again) = out.split_once("again\n").unwrap();
    assert!(first.contains("VERIFY exit=1"), "{out}");
    for needle in [
        "check kubernetes /usr/bin/kubelet --version: expected version 1.32.3, found \"Kubernetes v1.32.9\"",
        "kubernetes v1.32.3 (sha256-",
        "refused: never staged again on this node",
        "returned to the known-good set verified at",
        "/opt/extensions/kubernetes/kubernetes-v1.31.9-x86-64.raw\nKubernetes v1.31.9\n",
        // `nodestrap status` tells the operator, and exits 5.
        "after boot       MISMATCH at ",
        "returned         to the known-good set kubernetes v1.31.9, containerd v1.7.24 (merged)",
        "STATUS exit=5",
    ] {
        assert!(first.contains(needle), "{needle}: {out}");
    }
    // What ran from the lying image restarts on the known-good one.
    assert_eq!(
        std::fs::read_to_string(&calls).unwrap_or_default(),
        "TryRestartUnit kubelet.service replace\n",
        "{out}"
    );
    // Asked again in the same boot: the known-good set runs, no second return.
    assert!(
        again.contains("VERIFY exit=0") && again.contains("expecting the known-good set"),
        "{again}"
    );
    assert!(
        !again.contains("returned to the known-good set verified"),
        "{again}"
    );
    let rec = json(&w, "/var/lib/nodestrap/status.json");
    assert_eq!(rec["verification"]["returned"]["result"], "merged", "{rec}");
    assert_eq!(
        rec["chosen"][0]["version"], "v1.32.3",
        "the record keeps what the bootstrap chose: {rec}"
    );
    let known = json(&w, "/var/lib/nodestrap/known-good.json");
    assert_eq!(known["refused"][0]["version"], "v1.32.3", "{known}");
    // The refused image holds no version floor: it is back at the known-good version.
    assert_eq!(known["floor"][0]["version"], "v1.31.9", "{known}");
    assert_eq!(known["floor"][0]["how"], "back", "{known}");

    // The next bootstrap never stages the refused image: the next newest patch instead.
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stderr
            .contains("kubernetes v1.32.3 not considered: refused by the boot check")
            && r.stderr
                .contains("kubernetes v1.32.1 chosen for a v1.32.4 cluster"),
        "{}",
        r.stderr
    );
    // The known-good image is kept whatever the pruning.
    assert!(w
        .path("/opt/extensions/kubernetes/kubernetes-v1.31.9-x86-64.raw")
        .exists());
}

/// A return under every fault of the fault matrix (tests/support/faults.rs: EIO, ENOSPC and
/// SIGKILL on entry at its mutating calls, strace's injection, the check's own process), then
/// the check again in the same boot: it passes, or returns once and the next one passes; nothing
/// nodestrap names as temporary is left in /etc/extensions or /var/lib/nodestrap, the records
/// are whole, and the node ends on the known-good set.
#[test]
fn a_return_faulted_at_any_step_converges_in_the_same_boot() {
    use support::faults::{self, Fault, Threads};
    if !faults::native() {
        return;
    }
    let w = World::new();
    let mut bus = Bus::start();
    let calls = unique_dir("systemd").join("calls");
    bus.systemd(&["--record", calls.to_str().unwrap()]);
    lying_boot(&w, &bus);
    let pristine = w.work.join("pristine");
    faults::copy_tree(&w.root, &pristine);
    let plain = "--kubeconfig=/nonexistent/kubelet.conf --api-wait=0";
    let trace = w.work.join("verify.trace");
    let out = boot(
        &w,
        &bus,
        &format!(
            "if strace -f -qq -o {} -e trace={} {} verify {plain} >/dev/null 2>&1; then echo 'TRACED exit=0'; else echo \"TRACED exit=$?\"; fi\n",
            trace.display(),
            faults::MUTATING.join(","),
            bin()
        ),
    );
    assert!(out.contains("TRACED exit=1"), "{out}");
    let found = faults::calls_in(&trace, Threads::Main);
    assert!(found.len() >= 6, "{found:?}");
    let injected = w.work.join("verify.inject");
    let mut judge = |c: &faults::Case| -> Result<String, String> {
        faults::copy_tree(&pristine, &w.root);
        let sys = &c.call.syscall;
        let out = boot(
            &w,
            &bus,
            &format!(
                "if strace -qq -o {o} -e trace={sys} -e inject={sys}:{i} {b} verify {plain} >/dev/null 2>&1; then echo 'FAULTED exit=0'; else echo \"FAULTED exit=$?\"; fi\necho second\n{}echo third\n{}readlink /etc/extensions/kubernetes.raw\nls -A /etc/extensions /var/lib/nodestrap\n",
                verify("--api-wait=0"),
                verify("--api-wait=0"),
                o = injected.display(),
                i = c.inject(),
                b = bin()
            ),
        );
        if !faults::was_injected(&injected) {
            return Err("strace did not inject it".into());
        }
        faults::records_whole(&w.root)?;
        let rest = out.split_once("second\n").map_or("", |(_, r)| r);
        let (second, third) = rest.split_once("third\n").unwrap_or((rest, ""));
        let outcome = if second.contains("VERIFY exit=0") {
            "the next check passed"
        } else if second.contains("VERIFY exit=1")
            && second.contains("returned to the known-good set verified at")
            && third.contains("VERIFY exit=0")
        {
            "returned once more, then passed"
        } else {
            return Err(format!("did not converge:\n{out}"));
        };
        let on_good = third.contains("/opt/extensions/kubernetes/kubernetes-v1.31.9-x86-64.raw");
        let left = third.lines().any(|l| l.contains(".nodestrap-"));
        if (c.fault == Fault::Kill && out.contains("FAULTED exit=0")) || !on_good || left {
            return Err(format!(
                "killed yet 0, off the known-good set or temps left:\n{out}"
            ));
        }
        Ok(outcome.into())
    };
    faults::each_case("verify's return", &faults::cases(&found), &mut judge);
}

/// Two checks started together in a boot that mismatches: the second waits for the first (the
/// links' lock, taken before the record is read) and judges what it left: the known-good set,
/// which runs, and the first check's return stays in the record.
#[test]
fn a_second_check_waits_for_the_first_and_judges_what_it_left() {
    let w = World::new();
    let mut bus = Bus::start();
    let calls = unique_dir("systemd").join("calls");
    bus.systemd(&["--record", calls.to_str().unwrap()]);
    lying_boot(&w, &bus);
    let out = boot(
        &w,
        &bus,
        &format!(
            "(if {} verify --kubeconfig=/nonexistent/kubelet.conf --api-wait=0 >/tmp/first.log 2>&1; then echo 'FIRST exit=0'; else echo \"FIRST exit=$?\"; fi >>/tmp/first.log) &\n{}wait\ncat /tmp/first.log\n",
            bin(),
            verify("--api-wait=0"),
        ),
    );
    // One of them returned (exit 1), the other found the known-good set running (exit 0).
    let ok = out.matches("exit=0").count();
    let failed = out.matches("exit=1").count();
    assert!(ok == 1 && failed == 1, "{out}");
    assert_eq!(
        out.matches("returned to the known-good set verified at")
            .count(),
        1,
        "{out}"
    );
    let rec = json(&w, "/var/lib/nodestrap/status.json");
    assert_eq!(rec["verification"]["returned"]["result"], "merged", "{rec}");
}

/// Issue 28's second case: the runtime missing after the boot. The new containerd image is
/// for Debian 13 (as the node's os-release says when it is staged) but the system that boots
/// is this machine's Debian 12, whose systemd-sysext refuses it: every other extension merges,
/// the runtime does not. The check finds it, refuses that image and puts the known-good
/// containerd back.
#[test]
fn a_runtime_refused_at_boot_is_found_and_the_known_good_one_returns() {
    let w = World::new();
    let mut bus = Bus::start();
    let calls = unique_dir("systemd").join("calls");
    bus.systemd(&["--record", calls.to_str().unwrap()]);
    w.publish_versions("containerd", &["1.7.20"]);
    w.run().assert_ok();
    let out = boot(&w, &bus, &verify("--api-wait=0"));
    assert!(out.contains("VERIFY exit=0"), "{out}");

    let mut images = vec![(
        "containerd-v1.7.20-x86-64.raw".to_string(),
        containerd(&w.work, "1.7.20", 0),
    )];
    images.push((
        "containerd-v1.7.24-x86-64.raw".to_string(),
        squashfs(
            &w.work,
            "containerd",
            "ID=debian\nVERSION_ID=13\nARCHITECTURE=x86-64\n",
            &[(
                "usr/bin/containerd",
                "#!/bin/sh\necho 'containerd github.com/containerd/containerd 1.7.24'\n".into(),
                0o755,
            )],
            0,
        ),
    ));
    w.publish("containerd", &images, "");
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    w.run().assert_ok();
    assert_eq!(
        w.link("containerd").as_deref(),
        Some("/opt/extensions/containerd/containerd-v1.7.24-x86-64.raw")
    );
    let out = boot(
        &w,
        &bus,
        &format!(
            "{}readlink /etc/extensions/containerd.raw\ncontainerd --version\n",
            verify("--api-wait=0")
        ),
    );
    for needle in [
        "VERIFY exit=1",
        "check containerd merged for /usr: expected listed by systemd-sysext status, found not listed (merged: kubernetes)",
        "containerd v1.7.24 (sha256-",
        "returned to the known-good set verified at",
        "/opt/extensions/containerd/containerd-v1.7.20-x86-64.raw\ncontainerd github.com/containerd/containerd 1.7.20\n",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    // Restarted if it ran, and started: it was missing from the boot's merge.
    assert_eq!(
        std::fs::read_to_string(&calls).unwrap_or_default(),
        "TryRestartUnit containerd.service replace\nStartUnit containerd.service replace\n",
        "{out}"
    );
    assert!(
        out.contains("containerd.service started: containerd was missing from this boot's merge"),
        "{out}"
    );
    let known = json(&w, "/var/lib/nodestrap/known-good.json");
    assert_eq!(known["refused"][0]["name"], "containerd", "{known}");
}

/// The return takes away what the known-good set never ran: a node verified without a runtime
/// of nodestrap's (the user had opted out of containerd) lifts the opt-out; the containerd
/// staged then is refused at boot; the known-good set has no containerd, so its link goes
/// (nodestrap's own link only), and the kubernetes extension stays as it was.
#[test]
fn a_return_unlinks_an_extension_the_known_good_set_never_ran() {
    let w = World::new();
    let mut bus = Bus::start();
    bus.systemd(&[]);
    std::fs::create_dir_all(w.path("/etc/extensions")).unwrap();
    std::os::unix::fs::symlink("/dev/null", w.path("/etc/extensions/containerd.raw")).unwrap();
    w.run().assert_ok();
    let out = boot(&w, &bus, &verify("--api-wait=0"));
    assert!(out.contains("VERIFY exit=0"), "{out}");
    let known = json(&w, "/var/lib/nodestrap/known-good.json");
    assert_eq!(known["set"].as_array().unwrap().len(), 1, "{known}");

    // The opt-out is lifted; the only containerd offered is for another Debian than this
    // machine's, which its systemd-sysext refuses at boot.
    std::fs::remove_file(w.path("/etc/extensions/containerd.raw")).unwrap();
    w.publish(
        "containerd",
        &[(
            "containerd-v1.7.24-x86-64.raw".to_string(),
            squashfs(
                &w.work,
                "containerd",
                "ID=debian\nVERSION_ID=13\nARCHITECTURE=x86-64\n",
                &[(
                    "usr/bin/containerd",
                    "#!/bin/sh\necho 'containerd github.com/containerd/containerd 1.7.24'\n".into(),
                    0o755,
                )],
                0,
            ),
        )],
        "",
    );
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    w.run().assert_ok();
    assert_eq!(
        w.link("containerd").as_deref(),
        Some("/opt/extensions/containerd/containerd-v1.7.24-x86-64.raw")
    );
    let kubernetes = w.link("kubernetes");
    let out = boot(&w, &bus, &verify("--api-wait=0"));
    for needle in [
        "VERIFY exit=1",
        "found not listed (merged: kubernetes)",
        "/etc/extensions/containerd.raw removed: containerd v1.7.24 is not in the known-good set",
        "returned to the known-good set verified at",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    assert!(w.link("containerd").is_none(), "{out}");
    assert_eq!(w.link("kubernetes"), kubernetes);
}

/// A later bootstrap that fails (here a list signed by no key of the keyring) leaves the node
/// as it was: the boot after it checks the known-good set, and passes. A record written before
/// the boot check (no `chosen`) is not a failure either, and changes nothing.
#[test]
fn a_failed_bootstrap_or_an_older_record_checks_what_is_known_to_run() {
    let w = World::new();
    let bus = Bus::start();
    w.run().assert_ok();
    let out = boot(&w, &bus, &verify("--api-wait=0"));
    assert!(out.contains("VERIFY exit=0"), "{out}");
    let known_before = w.read("/var/lib/nodestrap/known-good.json").unwrap();

    // The patch stream's next run fails: the list is no longer signed by the keyring's key.
    w.files.set(
        "/ext/kubernetes/SHA256SUMS.gpg",
        Reply::ok(b"not a signature".to_vec()),
    );
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    let r = w.run();
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(
        json(&w, "/var/lib/nodestrap/status.json")["state"],
        "failed"
    );
    let out = boot(&w, &bus, &verify("--api-wait=0"));
    assert!(
        out.contains("VERIFY exit=0")
            && out.contains("the last bootstrap failed: it chose nothing that can run; expecting the known-good set")
            && out.contains("verified: the node runs the known-good set (kubernetes v1.32.3, containerd v1.7.24)"),
        "{out}"
    );
    assert_eq!(
        json(&w, "/var/lib/nodestrap/status.json")["verification"],
        serde_json::Value::Null,
        "a failed run's record is left as it is"
    );

    // A done record without `chosen`, as a nodestrap before the boot check wrote it.
    let mut rec = json(&w, "/var/lib/nodestrap/status.json");
    rec["state"] = "done".into();
    rec["exit_code"] = 0.into();
    rec.as_object_mut().unwrap().remove("chosen");
    rec["decisions"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"what": "activation", "value": "staged", "source": "older"}));
    w.write("/var/lib/nodestrap/status.json", &rec.to_string());
    let out = boot(&w, &bus, &verify("--api-wait=0"));
    assert!(
        out.contains("VERIFY exit=0") && out.contains("names no extension set"),
        "{out}"
    );
    let known_after = json(&w, "/var/lib/nodestrap/known-good.json");
    let known_before: serde_json::Value = serde_json::from_str(&known_before).unwrap();
    assert_eq!(
        known_after["set"], known_before["set"],
        "the known-good set stays"
    );
}

/// Without a completed sysext bootstrap there is nothing to verify, and verify says why.
#[test]
fn verify_needs_a_completed_sysext_bootstrap() {
    let w = World::new();
    std::fs::create_dir_all(w.path("/opt")).unwrap();
    let bus = Bus::start();
    let out = boot(&w, &bus, &verify("--api-wait=0"));
    assert!(
        out.contains("VERIFY exit=1") && out.contains("no bootstrap has run, nothing to verify"),
        "{out}"
    );
}

/// The API part against the real kube-apiserver: the Node's nodeInfo (set through the status
/// subresource, as the kubelet sets it) confirms the boot; a Node that reports another kubelet
/// fails the check once the wait ends, and is recorded as such.
#[test]
fn the_real_api_server_confirms_or_contradicts_the_node() {
    let c = support::cluster::cluster();
    let w = World::new();
    let bus = Bus::start();
    w.run().assert_ok();
    let node = format!("verify-{}", std::process::id());
    let user = format!("nodestrap-verify-{}", std::process::id());
    let kubeconfig = unique_dir("verify-kubeconfig").join("kubelet.conf");
    c.node_reader(&user, &kubeconfig);
    c.apply(&format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{{\"name\":\"{node}\"}}}}"
    ));
    let report =
        |kubelet: &str| c.report_node(&node, kubelet, "containerd://1.7.24", &support::utc_now());
    report("v1.32.3");
    let args = |wait: u32| {
        format!(
            "if {} verify --kubeconfig={} --node-name={node} --api-wait={wait} 2>&1; then echo 'VERIFY exit=0'; else echo \"VERIFY exit=$?\"; fi\n",
            bin(),
            kubeconfig.display()
        )
    };
    let out = boot(&w, &bus, &args(20));
    assert!(out.contains("VERIFY exit=0"), "{out}");
    assert!(
        out.contains(&format!(
            "check Node {node} nodeInfo.kubeletVersion: expected v1.32.3, found v1.32.3"
        )) && out.contains(&format!(
            "check Node {node} nodeInfo.containerRuntimeVersion: expected containerd://1.7.24, found containerd://1.7.24"
        )),
        "{out}"
    );
    assert_eq!(
        json(&w, "/var/lib/nodestrap/status.json")["verification"]["api"],
        "confirmed"
    );

    // The Node says another kubelet: after the wait, a mismatch; the node itself runs the
    // known-good set, so there is nothing to return to and nothing is refused.
    report("v1.32.1");
    let out = boot(&w, &bus, &args(3));
    assert!(out.contains("VERIFY exit=1"), "{out}");
    assert!(
        out.contains(&format!(
            "check Node {node} nodeInfo.kubeletVersion: expected v1.32.3, found v1.32.1"
        )) && out
            .contains("nothing to return to: the known-good set itself does not run as recorded"),
        "{out}"
    );
    let rec = json(&w, "/var/lib/nodestrap/status.json");
    assert_eq!(rec["verification"]["api"], "mismatch", "{rec}");
    assert_eq!(rec["verification"]["outcome"], "mismatch", "{rec}");
    assert_eq!(
        json(&w, "/var/lib/nodestrap/known-good.json")["refused"],
        serde_json::json!([])
    );
}

/// Issue 49's one rule for temp names: whatever a killed run of any command left in any folder
/// nodestrap writes to (the one list, `node::temps::FOLDERS`), the next run of a command that
/// writes to the node removes (here the sysext bootstrap, the patch stream's run); a temp file a
/// live run holds stays.
#[test]
fn every_folder_nodestrap_writes_is_swept_by_the_next_run() {
    let w = World::new();
    w.run().assert_ok();
    let mut planted = Vec::new();
    for f in nodestrap::node::temps::FOLDERS {
        let dir = match f.strip_suffix("/*") {
            Some(parent) => format!("{parent}/some"),
            None => f.to_string(),
        };
        std::fs::create_dir_all(w.path(&dir)).unwrap();
        let stale = format!("{dir}/.file.nodestrap-0123456789ab");
        std::fs::write(w.path(&stale), "left by a killed run").unwrap();
        planted.push(stale);
    }
    // One a live run holds (its lock) stays.
    let live = "/var/lib/nodestrap/.live.nodestrap-abcdef012345";
    let held = std::fs::File::create(w.path(live)).unwrap();
    rustix::fs::flock(&held, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
    let out = w.run();
    out.assert_ok();
    let left: Vec<&String> = planted.iter().filter(|p| w.path(p).exists()).collect();
    assert!(left.is_empty(), "left: {left:?}\n{}", out.stderr);
    assert!(
        w.path(live).exists(),
        "a held temp file was taken: {}",
        out.stderr
    );
    drop(held);
}

/// Issue 51: the boot check tells the Node itself, with the node's own identity (the Node
/// authorizer and NodeRestriction, nothing granted beside): the `NodestrapVerified` condition
/// beside the kubelet's own, labels that `kubectl get nodes -L` shows, events that `kubectl
/// describe node` shows; a second check counts its events again instead of adding new ones; an
/// API server that does not answer costs a bounded time and fails nothing.
#[test]
fn the_node_is_told_with_its_own_credentials() {
    let c = support::cluster::cluster();
    let w = World::new();
    let bus = Bus::start();
    w.run().assert_ok();
    let node = format!("told-{}", std::process::id());
    let kubeconfig = unique_dir("told").join("kubelet.conf");
    c.node_identity(&node, &kubeconfig);
    c.apply(&format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{{\"name\":\"{node}\"}}}}"
    ));
    c.report_node(&node, "v1.32.3", "containerd://1.7.24", &support::utc_now());
    let args = |kc: &Path, wait: u32| {
        format!(
            "if {} verify --kubeconfig={} --node-name={node} --api-wait={wait} 2>&1; then echo 'VERIFY exit=0'; else echo \"VERIFY exit=$?\"; fi\n",
            bin(),
            kc.display()
        )
    };
    let out = boot(&w, &bus, &args(&kubeconfig, 20));
    assert!(out.contains("VERIFY exit=0"), "{out}");
    let get = |path: &str| {
        c.kubectl(&["get", "node", &node, "-o", &format!("jsonpath={path}")])
            .trim()
            .to_string()
    };
    let cond = "{.status.conditions[?(@.type==\"NodestrapVerified\")]";
    assert_eq!(
        get(&format!("{cond}.status}} {cond}.reason}}")),
        "True Verified"
    );
    assert!(
        get(&format!("{cond}.message}}")).contains("runs kubernetes v1.32.3, containerd"),
        "{}",
        get(&format!("{cond}.message}}"))
    );
    // The kubelet's own condition as the kubelet left it.
    assert_eq!(
        get("{.status.conditions[?(@.type==\"Ready\")].status}"),
        "True"
    );
    let cols = c.kubectl(&[
        "get",
        "node",
        &node,
        "--no-headers",
        "-L",
        "nodestrap.io/kubernetes,nodestrap.io/runtime,nodestrap.io/trust",
    ]);
    assert!(
        cols.contains("v1.32.3") && cols.contains("containerd-1.7.24"),
        "{cols}"
    );
    let events = || {
        c.kubectl(&[
            "get",
            "events",
            "-n",
            "default",
            "--field-selector",
            &format!("involvedObject.name={node}"),
            "-o",
            "jsonpath={range .items[*]}{.reason}={.count} {end}",
        ])
    };
    // NodeRestriction is in force for this identity: the labels it reserves are refused.
    let kubectl_as_node = std::process::Command::new(support::cluster::kube_bin().join("kubectl"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args([
            "label",
            "node",
            &node,
            "node-restriction.kubernetes.io/test=x",
        ])
        .output()
        .unwrap();
    assert!(
        !kubectl_as_node.status.success()
            && String::from_utf8_lossy(&kubectl_as_node.stderr).contains("forbidden"),
        "{kubectl_as_node:?}"
    );
    let ev = events();
    assert!(ev.contains("Staged=1") && ev.contains("Verified=1"), "{ev}");
    let described = c.kubectl(&["describe", "node", &node]);
    assert!(
        described.contains("NodestrapVerified") && described.contains("nodestrap"),
        "{described}"
    );
    let rec = json(&w, "/var/lib/nodestrap/status.json");
    let told = rec["verification"]["reported"].as_str().unwrap_or_default();
    assert!(
        told.contains("condition NodestrapVerified=True")
            && told.contains("3 labels")
            && told.contains("2 events")
            && !told.contains("not sent"),
        "{rec}"
    );

    // Again: the same events counted, no new ones.
    let out = boot(&w, &bus, &args(&kubeconfig, 20));
    assert!(out.contains("VERIFY exit=0"), "{out}");
    let ev = events();
    assert!(ev.contains("Staged=2") && ev.contains("Verified=2"), "{ev}");
    assert_eq!(ev.split_whitespace().count(), 2, "{ev}");

    // The API server at a port nobody listens on: bounded, the check passes on the node's own
    // word (the API part `unreached`), and the record says what was not sent.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let down = kubeconfig.with_file_name("down.conf");
    let text = std::fs::read_to_string(&kubeconfig).unwrap();
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .unwrap()
        .to_string();
    std::fs::write(
        &down,
        text.replace(&server, &format!("https://127.0.0.1:{closed}")),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let out = boot(&w, &bus, &args(&down, 3));
    let took = started.elapsed();
    assert!(out.contains("VERIFY exit=0"), "{out}");
    assert!(took < std::time::Duration::from_secs(60), "{took:?}: {out}");
    let rec = json(&w, "/var/lib/nodestrap/status.json");
    assert_eq!(rec["verification"]["api"], "unreached", "{rec}");
    assert!(
        rec["verification"]["reported"]
            .as_str()
            .is_some_and(|t| t.starts_with("not sent")),
        "{rec}"
    );
}

/// Issue 28's events across runs: a bootstrap whose receiver is down finishes as always, its
/// events kept in the run folder's spool (as switch-root carries /run over); the boot check,
/// with the receiver up, sends them first, then its own, in order, and records the counts.
#[test]
fn events_of_a_run_without_its_receiver_go_with_the_boot_check() {
    let run = unique_dir("run");
    let run_env = run.display().to_string();
    let mut w = World::new();
    let mut bus = Bus::start();
    bus.systemd(&[]);
    let ca = Ca::new("events receiver CA");
    let receiver = Server::start(&ca.server(), None);
    receiver.set("/events", Reply::ok(""));
    let ca_pem = w.work.join("events-ca.pem");
    std::fs::write(&ca_pem, &ca.pem).unwrap();
    // A port nobody listens on: the receiver is down.
    let down = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    w.extra = vec![
        format!("--events-url=https://127.0.0.1:{down}/events"),
        format!("--events-ca-file={}", ca_pem.display()),
    ];
    let out = nodestrap(
        &w.args_for(&w.root.display().to_string()),
        None,
        &[("NODESTRAP_RUN_DIR", &run_env)],
    );
    out.assert_ok();
    assert!(
        out.stderr.contains("events wait in memory")
            && out.stderr.contains("left for the next run of this boot"),
        "{}",
        out.stderr
    );
    let rec = json(&w, "/var/lib/nodestrap/status.json");
    let n = rec["events"]["spooled"].as_u64().unwrap();
    assert!(n > 5, "{rec}");
    assert_eq!(rec["events"]["sent"], 0, "{rec}");
    assert_eq!(rec["events"]["dropped"], 0, "{rec}");
    let spool = std::fs::read_to_string(run.join("events.jsonl")).unwrap();
    assert_eq!(spool.lines().count() as u64, n, "{spool}");

    let out = boot(
        &w,
        &bus,
        &format!(
            "export NODESTRAP_RUN_DIR={run_env}\n{}",
            verify(&format!(
                "--api-wait=0 --events-url={} --events-ca-file={}",
                receiver.url("/events"),
                ca_pem.display()
            ))
        ),
    );
    assert!(out.contains("VERIFY exit=0"), "{out}");
    let got: Vec<serde_json::Value> = receiver
        .requests("POST", "/events")
        .iter()
        .map(|s| serde_json::from_slice(&s.body).unwrap())
        .collect();
    let (before, mine) = got.split_at(n as usize);
    for (i, e) in before.iter().enumerate() {
        assert_eq!(e["command"], "bootstrap", "{e}");
        assert_eq!(e["seq"], i as u64 + 1, "{e}");
    }
    assert_eq!(before.last().unwrap()["kind"], "finished");
    let kinds: Vec<&str> = mine.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"started"), "{kinds:?}");
    assert_eq!(
        &kinds[kinds.len() - 3..],
        &["phase", "verification", "finished"],
        "{kinds:?}"
    );
    assert!(
        kinds[1..kinds.len() - 3].iter().all(|k| *k == "check"),
        "{kinds:?}"
    );
    assert!(mine.iter().all(|e| e["command"] == "verify"));
    assert_eq!(mine[kinds.len() - 2]["outcome"], "verified");
    let rec = json(&w, "/var/lib/nodestrap/status.json");
    let d = &rec["verification"]["events"];
    assert_eq!(d["from_spool"], n, "{rec}");
    assert_eq!(d["sent"], got.len() as u64, "{rec}");
    assert_eq!(d["spooled"], 0, "{rec}");
    assert!(!run.join("events.jsonl").exists());
}
