//! `activate --images`: the images kubeadm runs come from archives on the node, imported into a
//! real containerd (Debian's, a private instance) and checked against the real kubeadm's own
//! list; kubeadm's preflight, through containerd's CRI, is the judge of what it finds there.

use std::io::Write as _;
use std::process::{Child, Command};

use sha2::{Digest, Sha256};

use super::*;

const VERSION: &str = "v1.37.2";

/// A containerd of its own (state, content and socket in a temp folder), killed when dropped.
struct Containerd {
    child: Child,
    dir: PathBuf,
    sock: PathBuf,
    snapshotter: &'static str,
}

impl Containerd {
    fn start() -> Containerd {
        let dir = unique_dir("containerd");
        let sock = dir.join("containerd.sock");
        let snapshotter = snapshotter_for(&dir);
        let conf = format!(
            "version = 2\nroot = \"{d}/root\"\nstate = \"{d}/state\"\n[grpc]\n  address = \"{s}\"\n\
             [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"{snapshotter}\"\n",
            d = dir.display(),
            s = sock.display()
        );
        write(&dir.join("config.toml"), &conf);
        let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("containerd (Debian package containerd) must be installed");
        let c = Containerd {
            child,
            dir,
            sock,
            snapshotter,
        };
        let end = Instant::now() + Duration::from_secs(30);
        while !c.ctr(&["version"]).status.success() {
            assert!(
                Instant::now() < end,
                "containerd did not answer within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        c
    }

    fn ctr_line(&self) -> String {
        format!("/usr/bin/ctr --address {}", self.sock.display())
    }

    fn ctr(&self, args: &[&str]) -> std::process::Output {
        Command::new("/usr/bin/ctr")
            .arg("--address")
            .arg(&self.sock)
            .args(args)
            .output()
            .unwrap()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Its content and snapshots are a gigabyte once the control plane's images are in.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// overlayfs, as on a node: each layer is unpacked once. The native snapshotter copies every
/// parent into each child (gigabytes for the control plane's images), so it is only for a test
/// folder on an overlay already, where overlay does not nest.
fn snapshotter_for(dir: &Path) -> &'static str {
    let fs = Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(dir)
        .output()
        .unwrap();
    match String::from_utf8_lossy(&fs.stdout).trim() {
        "overlayfs" => "native",
        _ => "overlayfs",
    }
}

fn sha256(b: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(b))
}

/// An OCI image archive (OCI layout in a tar) of one small layer, named `reference` for
/// containerd's import (`io.containerd.image.name`).
fn oci_archive(path: &Path, reference: &str) {
    let mut layer = tar::Builder::new(Vec::new());
    let text = format!("{reference}\n");
    let mut h = tar::Header::new_gnu();
    h.set_size(text.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    layer
        .append_data(&mut h, "image-name", text.as_bytes())
        .unwrap();
    let layer = layer.into_inner().unwrap();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux", "config": {"Entrypoint": ["/image-name"]},
        "rootfs": {"type": "layers", "diff_ids": [sha256(&layer)]}
    }))
    .unwrap();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(&config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": sha256(&layer), "size": layer.len()}]
    }))
    .unwrap();
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha256(&manifest),
            "size": manifest.len(), "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": reference}}]
    }))
    .unwrap();
    let mut t = tar::Builder::new(std::fs::File::create(path).unwrap());
    let mut add = |name: String, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        t.append_data(&mut h, name, data).unwrap();
    };
    for blob in [&layer, &config, &manifest] {
        add(format!("blobs/sha256/{}", &sha256(blob)[7..]), blob);
    }
    add("oci-layout".into(), br#"{"imageLayoutVersion":"1.0.0"}"#);
    add("index.json".into(), &index);
    t.into_inner().unwrap().flush().unwrap();
}

fn kubeadm_images(kubeadm: &Path) -> Vec<String> {
    let out = Command::new(kubeadm)
        .args(["config", "images", "list", "--kubernetes-version", VERSION])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert!(v.len() >= 6, "kubeadm's list: {v:?}");
    v
}

#[test]
fn kubeadm_init_images_come_from_archives_and_a_missing_one_keeps_the_node_fresh() {
    let kubeadm = vars::kube_bin().join("kubeadm");
    let ctd = Containerd::start();
    let pki = Pki::new();
    let node = Node::new(&pki, "images", None);
    // Every image kubeadm lists for the version, as an archive on the node, but etcd's.
    let needed = kubeadm_images(&kubeadm);
    let etcd = needed
        .iter()
        .find(|n| n.contains("/etcd:"))
        .unwrap()
        .clone();
    let dir = node.root.join("usr/share/nodestrap/images");
    std::fs::create_dir_all(&dir).unwrap();
    for (i, n) in needed.iter().enumerate().filter(|(_, n)| **n != etcd) {
        oci_archive(&dir.join(format!("{i}.tar")), n);
    }
    std::fs::write(dir.join("README"), "not an archive").unwrap();
    let mut args = node.args(&[]);
    args.extend(s(&["--images", "/usr/share/nodestrap/images", "--ctr"]));
    args.push(ctd.ctr_line());
    let act = Proc::start(args);
    let port = act.port();
    let admin = Admin::new(&pki, None);

    // Asked to initialize without etcd's image: refused, named, nothing pulled, node fresh.
    let r = Proc::start(admin.args_for(port, VERSION)).wait(120);
    r.assert_fails(1, "missing_images");
    assert!(r.stderr.contains(&etcd), "{}", r.stderr);
    assert!(node.state().is_none(), "the node lock was taken");
    assert!(
        node.all_calls()
            .iter()
            .all(|c| c.starts_with("config validate") || c.starts_with("config images list")),
        "{:?}",
        node.all_calls()
    );
    let listed = String::from_utf8_lossy(&ctd.ctr(&["-n", "k8s.io", "images", "ls", "-q"]).stdout)
        .to_string();
    for n in needed.iter().filter(|n| **n != etcd) {
        assert!(
            listed.lines().any(|l| l == n),
            "{n} not imported:\n{listed}"
        );
    }

    // etcd's archive arrives; asked again, the node imports it and initializes.
    oci_archive(&dir.join("etcd.tar"), &etcd);
    let r = Proc::start(admin.args_for(port, VERSION)).wait(120);
    r.assert_ok();
    act.wait(60).assert_ok();
    let inits: Vec<String> = node
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("init"))
        .collect();
    assert_eq!(inits.len(), 1, "{:?}", node.all_calls());

    // kubeadm itself, through containerd's CRI, finds every image it needs: its preflight
    // (which pulls what is missing) tries to pull nothing.
    let cfg = node.dir.join("preflight.yaml");
    write(
        &cfg,
        &format!(
            "apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\nnodeRegistration:\n  \
             criSocket: unix://{}\n---\napiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\n\
             kubernetesVersion: \"{VERSION}\"\n",
            ctd.sock.display()
        ),
    );
    preflight_pulls_nothing(&kubeadm, &cfg);
}

/// kubeadm's own preflight under `cfg` (its criSocket the test's containerd), which pulls what
/// it does not find through the CRI, wants to pull nothing.
fn preflight_pulls_nothing(kubeadm: &Path, cfg: &Path) {
    let out = Command::new(kubeadm)
        .args([
            "init",
            "phase",
            "preflight",
            "--ignore-preflight-errors=all",
            "--config",
        ])
        .arg(cfg)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains("ImagePull") && !text.contains("PullImage"),
        "kubeadm's preflight wanted to pull:\n{text}"
    );
}

#[test]
fn the_operators_image_names_are_what_kubeadm_reads_and_lists() {
    let kubeadm = vars::kube_bin().join("kubeadm");
    let ctd = Containerd::start();
    let pki = Pki::new();
    let node = Node::new(&pki, "image-names", None);
    // The names the operator's archives carry, made here from the rule kubeadm documents
    // (REPOSITORY/NAME:TAG), not from kubeadm: etcd at Debian's version, no addon images.
    let pause = kubeadm_images(&kubeadm)
        .into_iter()
        .find(|n| n.contains("/pause:"))
        .unwrap();
    let repo = "localhost:5000/nodestrap";
    let mut want: Vec<String> = [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ]
    .iter()
    .map(|c| format!("{repo}/{c}:{VERSION}"))
    .collect();
    want.push(format!(
        "{repo}/pause:{}",
        pause.rsplit_once(':').unwrap().1
    ));
    want.push(format!("{repo}/etcd:3.5.16-0"));
    let dir = node.root.join("usr/share/nodestrap/images");
    std::fs::create_dir_all(&dir).unwrap();
    for (i, n) in want.iter().enumerate() {
        oci_archive(&dir.join(format!("{i}.tar")), n);
    }
    let mut args = node.args(&[]);
    args.extend(s(&[
        "--images",
        "/usr/share/nodestrap/images",
        "--image-repository",
        repo,
        "--etcd-image-tag",
        "3.5.16-0",
        "--skip-addons",
        "coredns,kube-proxy",
        "--ctr",
    ]));
    args.push(ctd.ctr_line());
    let act = Proc::start(args);
    let port = act.port();
    let admin = Admin::new(&pki, None);

    // Addons can be left out only from kubeadm's v1beta4 config on: an older version is refused
    // before anything runs.
    let r = Proc::start(admin.args_for(port, "v1.30.9")).wait(60);
    r.assert_fails(1, "--skip-addons needs kubeadm's v1beta4 config");
    assert!(node.all_calls().is_empty(), "{:?}", node.all_calls());

    let mut args = admin.args_for(port, VERSION);
    args.extend(s(&["--control-plane-endpoint", "10.0.2.2:6443"]));
    Proc::start(args).wait(120).assert_ok();
    act.wait(60).assert_ok();
    let cfg = node.bin.join("init-config.yaml");
    assert!(
        read(&cfg).contains("controlPlaneEndpoint: \"10.0.2.2:6443\"\n"),
        "{}",
        read(&cfg)
    );
    // The real kubeadm reads the config nodestrap wrote, and lists exactly the operator's
    // images under it: what nodestrap checked in containerd is what kubeadm init runs.
    kubeadm_reads(&cfg);
    let out = Command::new(&kubeadm)
        .args(["config", "images", "list", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut listed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    listed.sort();
    want.sort();
    assert_eq!(listed, want);
    let c = node.all_calls();
    assert!(
        c[0].starts_with("config validate --config ")
            && c[1].starts_with("config images list --config ")
            && c[2].starts_with("init --config "),
        "{c:?}"
    );
}

/// `dest` holds `src`'s bytes: a hard link where the file systems allow, else a copy.
fn place(src: &Path, dest: &Path) {
    if std::fs::hard_link(src, dest).is_err() {
        std::fs::copy(src, dest).unwrap();
    }
}

#[test]
fn the_control_plane_qemu_build_images_makes_is_what_kubeadm_init_runs() {
    let kubeadm = vars::kube_bin().join("kubeadm");
    let ctd = Containerd::start();
    let pki = Pki::new();
    let node = Node::new(&pki, "control-plane", None);
    // The archives where a node's payload carries them: the control plane and the sandbox image.
    let dir = node.root.join("usr/share/kubernetes/images");
    std::fs::create_dir_all(&dir).unwrap();
    let built = vars::control_plane_images();
    for e in std::fs::read_dir(&built).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "tar") {
            place(&p, &dir.join(p.file_name().unwrap()));
        }
    }
    place(&vars::pause_image(), &dir.join("pause.oci.tar"));
    // etcd is named by its own version: the node says so (--etcd-image-tag).
    let etcd = Command::new(vars::etcd_image())
        .arg("--version")
        .output()
        .unwrap();
    let etcd_v = String::from_utf8_lossy(&etcd.stdout)
        .split_whitespace()
        .nth(2)
        .unwrap()
        .to_string();
    let mut args = node.args(&[]);
    args.extend(s(&[
        "--images",
        "/usr/share/kubernetes/images",
        "--etcd-image-tag",
        &format!("{etcd_v}-0"),
        "--skip-addons",
        "coredns",
        "--ctr",
    ]));
    args.push(ctd.ctr_line());
    let act = Proc::start(args);
    let port = act.port();
    Proc::start(Admin::new(&pki, None).args_for(port, VERSION))
        .wait(300)
        .assert_ok();
    act.wait(60).assert_ok();

    // kubeadm's own preflight, under the config activate wrote and through containerd's CRI,
    // finds every image kubeadm init runs and pulls none.
    let cfg = read(&node.bin.join("init-config.yaml")).replacen(
        "kind: InitConfiguration\n",
        &format!(
            "kind: InitConfiguration\nnodeRegistration:\n  criSocket: unix://{}\n",
            ctd.sock.display()
        ),
        1,
    );
    let cfg_path = node.dir.join("preflight.yaml");
    write(&cfg_path, &cfg);
    preflight_pulls_nothing(&kubeadm, &cfg_path);

    // Each image runs what kubeadm's manifests run (a name on the image's PATH), under the real
    // runc, and it is the release it is named for.
    let runs = [
        (
            "kube-apiserver",
            VERSION,
            "kube-apiserver --version",
            "Kubernetes v1.37.2",
        ),
        (
            "kube-controller-manager",
            VERSION,
            "kube-controller-manager --version",
            "Kubernetes v1.37.2",
        ),
        (
            "kube-scheduler",
            VERSION,
            "kube-scheduler --version",
            "Kubernetes v1.37.2",
        ),
        (
            "kube-proxy",
            VERSION,
            "kube-proxy --version",
            "Kubernetes v1.37.2",
        ),
        (
            "kube-proxy",
            VERSION,
            "iptables-restore --version",
            "(nf_tables)",
        ),
        (
            "etcd",
            &format!("{etcd_v}-0"),
            "etcd --version",
            &format!("etcd Version: {etcd_v}"),
        ),
    ];
    for (i, (name, tag, cmd, want)) in runs.iter().enumerate() {
        let image = format!("registry.k8s.io/{name}:{tag}");
        let id = format!("nodestrap-test-{i}");
        let mut argv = vec![
            "-n",
            "k8s.io",
            "run",
            "--rm",
            "--snapshotter",
            ctd.snapshotter,
            &image,
            &id,
        ];
        argv.extend(cmd.split(' '));
        let out = ctd.ctr(&argv);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(want),
            "{image}: {cmd}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
