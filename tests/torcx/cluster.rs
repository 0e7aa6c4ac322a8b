//! Against a real API server: the version, the runtime mappings and the boot check.

use super::*;

// ---------------------------------------------------------------------------------------------
// A real API server

/// The real API server (kube-apiserver built from the k8s.io/kubernetes module,
/// tests/support/cluster.rs): bootstrap reads its /version and the runtime-mappings ConfigMap
/// as an identity RBAC allows exactly that, and stages what they say. An identity that may not
/// read the ConfigMap gets an error naming the 403, the verb and the resource, and nothing is
/// staged: the node's own mappings file is no stand-in for a cluster that refuses.
#[test]
fn a_real_api_server_decides_as_far_as_rbac_allows() {
    let c = support::cluster::cluster();
    c.apply(
        r#"{"apiVersion":"v1","kind":"List","items":[
  {"apiVersion":"v1","kind":"Namespace","metadata":{"name":"tectonic-system"}},
  {"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"tectonic-torcx-runtime-mappings","namespace":"tectonic-system"},
   "data":{"runtime-mappings.yaml":"kind: VersionManifestV1\nversions:\n  k8s:\n    \"1.37\":\n      docker: [\"17.06\"]\n"}},
  {"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role","metadata":{"name":"nodestrap-bootstrap","namespace":"tectonic-system"},
   "rules":[{"apiGroups":[""],"resources":["configmaps"],"resourceNames":["tectonic-torcx-runtime-mappings"],"verbs":["get"]}]},
  {"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding","metadata":{"name":"nodestrap-bootstrap","namespace":"tectonic-system"},
   "roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"Role","name":"nodestrap-bootstrap"},
   "subjects":[{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"nodestrap-bootstrap"}]}]}"#,
    );
    let version = c.kubectl(&["version", "-o", "json"]);
    let version: serde_json::Value = serde_json::from_str(&version).unwrap();
    let git = version["serverVersion"]["gitVersion"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(git.starts_with("v1.37."), "{git}");

    let w = World::new();
    c.kubeconfig("nodestrap-bootstrap", &w.path("/etc/kubernetes/kubeconfig"));
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stdout.contains(&format!(
            "bootstrap done k8s={git} docker=17.06 next-os=none reboot=no"
        )),
        "{}",
        r.stdout
    );
    assert!(
        r.stderr
            .contains(&format!("nodestrap: k8s={git} from=api-server"))
            || r.stdout
                .contains(&format!("nodestrap: k8s={git} from=api-server")),
        "{}{}",
        r.stdout,
        r.stderr
    );
    assert_eq!(
        w.decision("runtime-mappings").1,
        "ConfigMap tectonic-system/tectonic-torcx-runtime-mappings key runtime-mappings.yaml"
    );
    assert_eq!(
        w.read("/etc/kubernetes/kubelet.env").unwrap(),
        format!("KUBELET_IMAGE_URL=quay.io/coreos/hyperkube\nKUBELET_IMAGE_TAG={git}\n")
    );

    let w = World::new();
    c.kubeconfig("nodestrap-nobody", &w.path("/etc/kubernetes/kubeconfig"));
    let r = w.run();
    r.assert_fails(1, "HTTP 403");
    let last = r.stderr.lines().rfind(|l| l.starts_with("error")).unwrap();
    assert!(
        last.contains(r#"User "nodestrap-nobody" cannot get resource "configmaps""#)
            && last.contains(
                "runtime mappings: the API server refused these credentials the ConfigMap"
            ),
        "{last}"
    );
    w.assert_nothing_written();
    assert_eq!(w.files.seen().len(), 0, "nothing fetched");
}

/// Errors one step short of the fix, made whole: rejected credentials come first with what
/// fixes them; a kubeconfig whose CA does not sign the server names the CA field to change; a
/// manifest that is not there names the template that built its URL, not the server's page.
#[test]
fn api_and_manifest_errors_name_the_setting_that_fixes_them() {
    let mut w = World::new();
    let (api, _ca) = w.with_api("v1.10.2+coreos.0", None);
    api.set("/version", Reply::status(401));
    w.extra.push("--version-fallback=never".into());
    let r = w.run();
    r.assert_fails(
        1,
        "unable to determine the cluster version: the API server rejected the credentials of ",
    );
    assert!(
        r.stderr.contains("give the node a kubeconfig whose credentials the cluster accepts, or set --force-kube-version"),
        "{}",
        r.stderr
    );
    // A kubeconfig whose CA is another one.
    let other = Ca::new("another CA");
    use base64::Engine as _;
    let kc = w.read("/etc/kubernetes/kubeconfig").unwrap();
    let ours = base64::engine::general_purpose::STANDARD.encode(&w.ca.pem);
    let theirs = base64::engine::general_purpose::STANDARD.encode(&other.pem);
    w.write("/etc/kubernetes/kubeconfig", &kc.replace(&ours, &theirs));
    let r = w.run();
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("UnknownIssuer") && r.stderr.contains("add its CA with certificate-authority-data (or certificate-authority) of the cluster in "),
        "{}",
        r.stderr
    );
    // No manifest for this OS: the option and its template, and no HTML.
    w.extra = vec!["--force-kube-version=v1.10.2".into()];
    let p = World::manifest_path(CUR);
    w.files.set(
        &p,
        Reply {
            body: b"<!DOCTYPE HTML>\n<html><title>404</title></html>\n".to_vec(),
            ..Reply::status(404)
        },
    );
    let r = w.run();
    r.assert_fails(
        1,
        &format!(
            "no torcx manifest for OS {CUR} board amd64-usr there: check --torcx-manifest-url ("
        ),
    );
    assert!(!r.stderr.contains("DOCTYPE"), "{}", r.stderr);
    // Manifests from a server whose CA is not given: --ca-file is the fix.
    w.extra = vec!["--force-kube-version=v1.10.2".into()];
    let args: Vec<String> = w
        .args()
        .into_iter()
        .filter(|a| !a.starts_with("--ca-file"))
        .collect();
    let r = nodestrap(&args, None, &[]);
    r.assert_fails(1, "add its CA with --ca-file (a PEM file)");
    w.assert_nothing_written();
}

/// One boot of `w`'s root: a fresh /run, the real torcx generator as at boot, then
/// `nodestrap verify` in the same mount namespace (torcx's unpacked images live there), as
/// nodestrap-verify.service runs it, with `boot_id` as the kernel's boot ID. The generator's
/// exit code and log, then verify's exit code and log.
pub(crate) fn boot_and_verify(w: &World, boot_id: &str) -> (i32, String, i32, String) {
    boot_and_verify_with(w, boot_id, "--api-wait=0")
}

/// `boot_and_verify` with verify's `args`.
pub(crate) fn boot_and_verify_with(
    w: &World,
    boot_id: &str,
    args: &str,
) -> (i32, String, i32, String) {
    let _ = std::fs::remove_dir_all(w.path("/run"));
    verify_in(w, boot_id, true, args)
}

/// `nodestrap verify ARGS` once more in the boot `boot_and_verify` left (`generator`: boot
/// first).
pub(crate) fn verify_in(
    w: &World,
    boot_id: &str,
    generator: bool,
    args: &str,
) -> (i32, String, i32, String) {
    let gen = w.path("/usr/lib/systemd/system-generators/torcx-generator");
    std::fs::create_dir_all(gen.parent().unwrap()).unwrap();
    std::fs::copy(real_torcx(), &gen).unwrap();
    std::fs::create_dir_all(w.path("/opt/bin")).unwrap();
    std::fs::copy(bin(), w.path("/opt/bin/nodestrap")).unwrap();
    for d in ["/run", "/proc", "/gen", "/bin", "/boot-id", "/dev"] {
        std::fs::create_dir_all(w.path(d)).unwrap();
    }
    // The image's docker is a shell script: this machine's sh, with what it links.
    copy_with_libraries(w, "/bin/sh");
    std::fs::write(w.path("/proc/cmdline"), "ro quiet\n").unwrap();
    std::fs::write(w.path("/boot-id/id"), format!("{boot_id}\n")).unwrap();
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(
            "if [ \"$1\" = boot ]; then\n\
               chroot \"$0\" /usr/lib/systemd/system-generators/torcx-generator /gen /gen /gen 2>\"$0/gen.log\"; echo $? >\"$0/gen.rc\"\n\
             fi\n\
             mount --bind /dev \"$0/dev\"\n\
             chroot \"$0\" /opt/bin/nodestrap verify $2",
        )
        .arg(&w.root)
        .arg(if generator { "boot" } else { "again" })
        .arg(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("NODESTRAP_BOOT_ID", "/boot-id/id")
        .env("NODESTRAP_RUN_DIR", "/run/nodestrap")
        .output()
        .unwrap();
    let gen_rc = w.read("/gen.rc").unwrap().trim().parse().unwrap();
    (
        gen_rc,
        w.read("/gen.log").unwrap_or_default(),
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `program` and the shared libraries ldd names for it, at the same paths under `w`'s root.
pub(crate) fn copy_with_libraries(w: &World, program: &str) {
    let ldd = std::process::Command::new("ldd")
        .arg(program)
        .output()
        .unwrap();
    let mut files = vec![program.to_string()];
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        if let Some(p) = line.split_whitespace().find(|t| t.starts_with('/')) {
            files.push(p.to_string());
        }
    }
    for f in files {
        let to = w.path(&f);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&f, &to).unwrap();
    }
}

/// Issue 28 on torcx, with the real torcx generator applying profiles as at boot: the boot
/// after the bootstrap runs docker 17.03 as chosen: verified, and the applied profile is kept
/// as the known-good one. The next bootstrap stages 17.06, whose archive is then broken on
/// disk: torcx does not apply the profile and docker is missing. The check finds it, records
/// expected and running, selects the known-good profile as next-profile and records the
/// reboot, which it does not take; once per boot. The boot after applies the known-good
/// profile, and the check passes again.
#[test]
fn a_torcx_profile_that_did_not_apply_is_found_and_the_known_good_one_selected() {
    if support::vars::runner().is_some() {
        // verify runs chrooted in the node's root, where no qemu-user is.
        return;
    }
    let w = World::new();
    w.with_real_images();
    w.run().assert_ok();
    assert_eq!(w.read("/etc/torcx/next-profile").unwrap(), "tectonic\n");
    let (gen, log, code, out) = boot_and_verify(&w, "boot-1");
    assert_eq!(gen, 0, "{log}");
    assert_eq!(code, 0, "{out}");
    for needle in [
        "check torcx seal: expected sealed with profile tectonic, found sealed with profile tectonic",
        "check torcx applied docker: expected docker:17.03, found docker:17.03",
        "check /run/torcx/bin/docker --version: expected version 17.03, found version 17.03",
        "check kubelet /etc/kubernetes/kubelet.env KUBELET_IMAGE_TAG: expected v1.9.6_coreos.0, found v1.9.6_coreos.0",
        "verified: torcx applied profile tectonic with docker 17.03",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    let known = w
        .read("/etc/torcx/profiles/nodestrap-known-good.json")
        .unwrap();
    assert!(known.contains("\"17.03\""), "{known}");
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    assert_eq!(rec["phase"], "verified", "{rec}");

    // The cluster moves to v1.10: docker 17.06 is staged, and its archive breaks on disk.
    w.write(
        "/etc/kubernetes/installer/kubelet.env",
        "KUBELET_IMAGE_URL=quay.io/coreos/hyperkube\nKUBELET_IMAGE_TAG=v1.10.2_coreos.0\n",
    );
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    w.run().assert_ok();
    let staged = w.path(&format!(
        "/var/lib/torcx/store/{CUR}/docker:17.06.torcx.tgz"
    ));
    assert!(staged.exists());
    std::fs::write(&staged, b"not a gzip archive any more").unwrap();
    let (gen, log, code, out) = boot_and_verify(&w, "boot-2");
    assert_ne!(gen, 0, "torcx applied a broken archive: {log}");
    assert_eq!(code, 1, "{out}");
    for needle in [
        "check torcx seal: expected sealed with profile tectonic, found not sealed (/run/metadata/torcx missing): torcx did not complete",
        "check torcx applied docker: expected docker:17.06, found torcx applied no profile",
        "reboot needed: the boot check selected the known-good profile nodestrap-known-good (docker 17.03) as next-profile",
        "the reboot is recorded, not taken",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    assert_eq!(
        w.read("/etc/torcx/next-profile").unwrap(),
        "nodestrap-known-good\n"
    );
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    let v = &rec["verification"];
    assert_eq!(v["outcome"], "mismatch", "{rec}");
    assert_eq!(v["returned"]["to"][0]["version"], "17.03", "{rec}");
    assert_eq!(rec["reboot"]["decision"], "needed", "{rec}");
    assert_eq!(rec["phase"], "done", "{rec}");

    // The same boot checked again: no second return.
    let (_, _, code, out) = verify_in(&w, "boot-2", false, "--api-wait=0");
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("expecting the known-good profile a check selected at boot boot-2"),
        "{out}"
    );

    // The next boot: torcx applies the known-good profile; the check passes.
    let (gen, log, code, out) = boot_and_verify(&w, "boot-3");
    assert_eq!(gen, 0, "{log}");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("verified: torcx applied profile nodestrap-known-good with docker 17.03"),
        "{out}"
    );
    // The next bootstrap edits its own profile, never the known-good one.
    std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env")).unwrap();
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stderr
            .contains("names \"nodestrap-known-good\", which is not a user profile"),
        "{}",
        r.stderr
    );
    assert_eq!(w.read("/etc/torcx/next-profile").unwrap(), "tectonic\n");
    assert_eq!(
        w.read("/etc/torcx/profiles/nodestrap-known-good.json")
            .unwrap(),
        known
    );
}

/// The known-good profile a first bootstrap keeps is the one torcx applied in its boot: on a
/// fresh node the vendor profile, whose docker is `com.coreos.cl` (the vendor store's link to
/// the shipped version). When the first chosen profile does not apply, the check returns to it
/// and, in the boot after, finds it running as the version the link names; the reboot it asked
/// for is then no longer pending.
#[test]
fn a_vendor_known_good_profile_is_returned_to_and_verified() {
    if support::vars::runner().is_some() {
        return;
    }
    let w = World::new();
    w.with_real_images();
    let store = w.path("/usr/share/torcx/store");
    std::fs::create_dir_all(&store).unwrap();
    std::fs::write(store.join("docker:1.12.torcx.tgz"), torcx_image("1.12")).unwrap();
    std::os::unix::fs::symlink(
        "docker:1.12.torcx.tgz",
        store.join("docker:com.coreos.cl.torcx.tgz"),
    )
    .unwrap();
    w.write(
        "/usr/share/torcx/profiles/vendor.json",
        r#"{"kind":"profile-manifest-v0","value":{"images":[{"name":"docker","reference":"com.coreos.cl"}]}}"#,
    );
    // Boot 0: torcx applies the vendor profile (no record yet: nothing to verify).
    let (gen, log, _, _) = boot_and_verify(&w, "boot-0");
    assert_eq!(gen, 0, "{log}");
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stderr.contains(&format!(
            "{r}/run/torcx/profile.json kept as {r}/etc/torcx/profiles/nodestrap-known-good.json",
            r = w.root.display()
        )),
        "{}",
        r.stderr
    );
    let staged = w.path(&format!(
        "/var/lib/torcx/store/{CUR}/docker:17.03.torcx.tgz"
    ));
    std::fs::write(&staged, b"broken on disk").unwrap();
    let (gen, _, code, out) = boot_and_verify(&w, "boot-1");
    assert_ne!(gen, 0);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("the known-good profile nodestrap-known-good (docker 1.12) as next-profile"),
        "{out}"
    );
    let (gen, log, code, out) = boot_and_verify(&w, "boot-2");
    assert_eq!(gen, 0, "{log}");
    assert_eq!(code, 0, "{out}");
    for needle in [
        "check torcx applied docker: expected docker:1.12, found docker:1.12",
        "verified: torcx applied profile nodestrap-known-good with docker 1.12",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    assert_eq!(rec["reboot"]["decision"], "no", "{rec}");
    assert_eq!(rec["phase"], "verified", "{rec}");
}

/// The torcx check asks the real kube-apiserver: a Node whose nodeInfo reports the chosen
/// kubelet and docker at the chosen release line (as a dockershim kubelet spells it, leading
/// zeros dropped) confirms the boot. A Node reporting a containerd the applied image does not
/// carry is the runtime's mismatch: the known-good profile is selected for the next boot. A
/// Node reporting another kubelet is recorded and fails, and the profile is left alone: the
/// kubelet comes from kubelet.env.
#[test]
fn the_real_api_server_confirms_or_contradicts_a_torcx_node() {
    if support::vars::runner().is_some() {
        return;
    }
    let c = support::cluster::cluster();
    let w = World::new();
    w.with_real_images();
    w.run().assert_ok();
    let node = format!("torcx-verify-{}", std::process::id());
    // The node's own identity, as its kubelet has it: the check also tells its Node.
    c.node_identity(&node, &w.path("/etc/kubernetes/kubelet.conf"));
    c.apply(&format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{{\"name\":\"{node}\"}}}}"
    ));
    // As the kubelet reports: its versions, and its Ready heartbeat (now, or `at`).
    let report_at =
        |kubelet: &str, runtime: &str, at: &str| c.report_node(&node, kubelet, runtime, at);
    let report = |kubelet: &str, runtime: &str| report_at(kubelet, runtime, &support::utc_now());
    let args = |wait: u32| format!("--node-name={node} --api-wait={wait}");
    // A Node whose kubelet has not reported since this boot began is not judged: unreached.
    report_at("v1.9.5+coreos.0", "docker://17.3.2", "2020-01-01T00:00:00Z");
    let (gen, log, code, out) = boot_and_verify_with(&w, "boot-0", &args(3));
    assert_eq!(gen, 0, "{log}");
    assert_eq!(code, 0, "{out}");
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    assert_eq!(rec["verification"]["api"], "unreached", "{rec}");
    assert!(
        rec["verification"]["api_note"].as_str().unwrap().contains(
            "has not reported since this boot began (its Ready heartbeat: 2020-01-01T00:00:00Z)"
        ),
        "{rec}"
    );
    report("v1.9.6+coreos.0", "docker://17.3.2");
    let (gen, log, code, out) = boot_and_verify_with(&w, "boot-1", &args(20));
    assert_eq!(gen, 0, "{log}");
    assert_eq!(code, 0, "{out}");
    for needle in [
        format!("check Node {node} nodeInfo.kubeletVersion: expected v1.9.6+coreos.0, found v1.9.6+coreos.0"),
        format!("check Node {node} nodeInfo.containerRuntimeVersion: expected docker://17.03, or a runtime in /run/torcx/bin at the version it says, found docker://17.3.2"),
    ] {
        assert!(out.contains(&needle), "{needle}: {out}");
    }
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    assert_eq!(rec["verification"]["api"], "confirmed", "{rec}");
    assert!(rec["verification"]["local_s"].as_f64().is_some(), "{rec}");
    // What the Node was told (docs/verify.md, "On the Node").
    let told = || {
        c.kubectl(&[
            "get",
            "node",
            &node,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"NodestrapVerified\")].status} {.status.conditions[?(@.type==\"NodestrapVerified\")].reason} {.metadata.labels.nodestrap\\.io/kubernetes} {.metadata.labels.nodestrap\\.io/trust}",
        ])
        .trim()
        .to_string()
    };
    assert_eq!(told(), "True Verified v1.9.6-coreos.0 torcx");
    assert!(
        rec["verification"]["reported"]
            .as_str()
            .is_some_and(|t| t.contains("condition NodestrapVerified=True")),
        "{rec}"
    );

    // Another kubelet: recorded, failed, the profile left alone.
    report("v1.9.5+coreos.0", "docker://17.3.2");
    let (_, _, code, out) = boot_and_verify_with(&w, "boot-2", &args(3));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "check Node {node} nodeInfo.kubeletVersion: expected v1.9.6+coreos.0, found v1.9.5+coreos.0"
        )) && out.contains("nothing to return to: the kubelet comes from kubelet.env"),
        "{out}"
    );
    assert_eq!(w.read("/etc/torcx/next-profile").unwrap(), "tectonic\n");
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    assert_eq!(rec["verification"]["api"], "mismatch", "{rec}");
    assert_eq!(rec["reboot"]["decision"], "no", "{rec}");
    assert!(told().starts_with("False Mismatch"), "{}", told());

    // A containerd the applied image does not carry: the runtime is not the chosen one.
    report("v1.9.6+coreos.0", "containerd://1.7.24");
    let (_, _, code, out) = boot_and_verify_with(&w, "boot-3", &args(3));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "check Node {node} nodeInfo.containerRuntimeVersion: expected docker://17.03, or a runtime in /run/torcx/bin at the version it says, found containerd://1.7.24"
        )) && out.contains("as next-profile"),
        "{out}"
    );
    assert_eq!(
        w.read("/etc/torcx/next-profile").unwrap(),
        "nodestrap-known-good\n"
    );
}

/// Issue 34 on torcx: versions only go forward. A bootstrap for a v1.10 cluster stages docker
/// 17.06; the cluster's version goes back to v1.9, whose mappings want 17.03, validly signed
/// and offered: refused, naming the floor, and nothing changes. A wiped store does not lower
/// the floor. `--allow-downgrade docker=17.03` lets that exact version through once: logged,
/// recorded as a `downgrade` decision, and the floor is lowered to it.
#[test]
fn a_torcx_image_never_goes_below_its_floor_unless_named() {
    let mut w = World::new();
    let to = |w: &World, tag: &str| {
        w.write(
            "/etc/kubernetes/installer/kubelet.env",
            &format!("KUBELET_IMAGE_URL=quay.io/coreos/hyperkube\nKUBELET_IMAGE_TAG={tag}\n"),
        );
        let _ = std::fs::remove_file(w.path("/etc/kubernetes/kubelet.env"));
    };
    to(&w, "v1.10.2_coreos.0");
    w.run().assert_ok();
    assert_eq!(w.decision("docker").0, "17.06");
    let floor: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/torcx-floor.json").unwrap()).unwrap();
    assert_eq!(floor["floor"][0]["name"], "docker", "{floor}");
    assert_eq!(floor["floor"][0]["version"], "17.06", "{floor}");
    assert_eq!(floor["floor"][0]["how"], "raised", "{floor}");

    to(&w, "v1.9.6_coreos.0");
    let profile = w.read("/etc/torcx/profiles/tectonic.json").unwrap();
    std::fs::remove_dir_all(w.path("/var/lib/torcx/store")).unwrap();
    let r = w.run();
    r.assert_fails(1, "docker: every version");
    for needle in [
        "maps to is below the version floor: docker 17.03, 1.12 below the version floor 17.06 (staged at ",
        "/var/lib/nodestrap/torcx-floor.json) not considered; --allow-downgrade docker=VERSION lets one exact version through",
    ] {
        assert!(r.stderr.contains(needle), "{needle}: {}", r.stderr);
    }
    assert!(!w.path("/etc/kubernetes/kubelet.env").exists());
    assert_eq!(
        w.read("/etc/torcx/profiles/tectonic.json").unwrap(),
        profile
    );
    assert!(w
        .read("/var/lib/nodestrap/torcx-floor.json")
        .unwrap()
        .contains("\"17.06\""));

    w.extra = vec!["--allow-downgrade=docker=17.03".into()];
    let r = w.run();
    r.assert_ok();
    assert!(
        r.stderr.contains(
            "docker downgraded to 17.03 below its floor 17.06 (--allow-downgrade): the floor is lowered"
        ),
        "{}",
        r.stderr
    );
    assert_eq!(w.decision("docker").0, "17.03");
    let (what, src) = w.decision("downgrade");
    assert_eq!(
        (what.as_str(), src.as_str()),
        ("docker 17.03", "--allow-downgrade, below the floor 17.06")
    );
    let floor: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/torcx-floor.json").unwrap()).unwrap();
    assert_eq!(floor["floor"][0]["version"], "17.03", "{floor}");
    assert_eq!(floor["floor"][0]["how"], "lowered", "{floor}");
}

/// The torcx manifest's locations as `oci://HOST/REPO@sha256:…`: the images published to
/// Debian's real docker-registry by deploy/publish-oci, each location pinned by its artifact's
/// manifest digest inside the signed manifest. Trust stays with the manifest's sha512.
#[test]
fn torcx_images_from_a_registry_pinned_by_digest_in_the_signed_manifest() {
    const USER: &str = "node";
    const PASSWORD: &str = "torcx-pull-s3cret";
    let mut w = World::new();
    let reg = Registry::start(
        &w.ca,
        RegistryAuth::Basic {
            user: USER.into(),
            password: PASSWORD.into(),
        },
        None,
    );
    let auth = reg.auth_json(USER, PASSWORD);
    let dir = unique_dir("torcx-images");
    let mut paths = Vec::new();
    for v in ["17.03", "17.06"] {
        let p = dir.join(format!("docker:{v}.torcx.tgz"));
        std::fs::write(&p, image(v)).unwrap();
        paths.push(p);
    }
    let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    let said = reg.publish_as("torcx", &refs, "torcx/docker", Some(&auth), &w.ca_file);
    let location = |v: &str| {
        said.lines()
            .find_map(|l| l.strip_prefix(&format!("location docker:{v}.torcx.tgz: ")))
            .unwrap_or_else(|| panic!("no location for {v} in {said}"))
            .to_string()
    };
    assert!(
        location("17.03").starts_with(&format!("oci://{}/torcx/docker@sha256:", reg.host())),
        "{said}"
    );
    let manifest = |loc_03: &str| {
        format!(
            r#"{{"kind":"torcx-package-list-v0","value":{{"packages":[{{"name":"docker","versions":[{{"version":"17.03","hash":"{}","locations":[{{"url":"{loc_03}"}}]}},{{"version":"17.06","hash":"{}","locations":[{{"url":"{}"}}]}}]}}]}}}}"#,
            sha512(&image("17.03")),
            sha512(&image("17.06")),
            location("17.06")
        )
    };
    w.publish(CUR, &manifest(&location("17.03")));
    // The https copies are gone: only the registry has the images.
    w.files.set("/pkgs/docker-17.03.tgz", Reply::status(404));

    // Without credentials: refused, naming the option; nothing staged, no kubelet.env.
    let r = w.run();
    r.assert_fails(1, "--registry-auth");
    assert!(w.store_listing().is_empty(), "{:?}", w.store_listing());
    assert!(w.read("/etc/kubernetes/kubelet.env").is_none());

    w.extra.push(format!("--registry-auth={}", auth.display()));
    let r = w.run();
    r.assert_ok();
    assert_eq!(
        std::fs::read(w.store_file(CUR, "17.03")).unwrap(),
        image("17.03")
    );
    assert!(r.stderr.contains("hash verified"), "{}", r.stderr);
    assert!(!r.stderr.contains(PASSWORD));
    let log = reg.log();
    assert!(
        log.contains(&format!(
            "\"GET /v2/torcx/docker/manifests/{} HTTP/1.1\" 200",
            location("17.03").rsplit_once('@').unwrap().1
        )),
        "the manifest by its pinned digest: {log}"
    );
    assert!(
        !log.contains("\"GET /v2/torcx/docker/manifests/docker-"),
        "no tag asked for: {log}"
    );

    // A location pinned to another artifact (17.06's) for 17.03: its layer is not titled
    // docker:17.03.torcx.tgz; refused, the store left as it was.
    let before = w.store_listing();
    std::fs::remove_file(w.store_file(CUR, "17.03")).unwrap();
    w.publish(CUR, &manifest(&location("17.06")));
    let r = w.run();
    r.assert_fails(1, "no layer titled docker:17.03.torcx.tgz");
    assert_eq!(w.store_listing().len(), before.len() - 1);

    // A blob swapped in the registry's storage: refused by the signed sha512.
    w.publish(CUR, &manifest(&location("17.03")));
    let hex = format!("{:x}", sha2::Sha256::digest(image("17.03")));
    let mut other = image("17.03");
    other[0] ^= 0xff;
    std::fs::write(reg.blob(&hex), &other).unwrap();
    let r = w.run();
    r.assert_fails(1, "hash mismatch");
    assert!(!w.store_file(CUR, "17.03").exists());
}
