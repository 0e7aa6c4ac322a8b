//! The environment the integration tests read, all of it, in one place (docs/build.md, "Test
//! variables"): what tests/run.sh sets, and what a developer sets to run one test by hand.

use std::path::PathBuf;

/// A variable tests/run.sh always sets: its value, or a panic naming what sets it.
fn required(name: &str, what: &str) -> PathBuf {
    PathBuf::from(std::env::var_os(name).unwrap_or_else(|| {
        panic!("{name}: {what} (tests/run.sh sets it; run `tests/run.sh integration`, or set it by hand)")
    }))
}

/// `NODESTRAP_BIN`: the binary under test (CI points it at the static release build, or at
/// another architecture's build run through qemu-user); unset, cargo's own build.
pub fn bin() -> String {
    std::env::var("NODESTRAP_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_nodestrap").to_string())
}

/// `NODESTRAP_NEXT_BIN`: a later release of the binary under test (the same code built with
/// the next patch version, `NODESTRAP_VERSION` at build time), to move a node's nodestrap to.
pub fn next_bin() -> PathBuf {
    required(
        "NODESTRAP_NEXT_BIN",
        "a build of this code with the next patch version (tests/run.sh builds it)",
    )
}

/// `NODESTRAP_RUNNER`: the emulator the binary runs under (CI's qemu-aarch64 for the arm64
/// build); unset or empty, none.
pub fn runner() -> Option<String> {
    std::env::var("NODESTRAP_RUNNER")
        .ok()
        .filter(|r| !r.is_empty())
}

/// `NODESTRAP_KUBE_BIN`: the folder of real Kubernetes binaries qemu/build-kubernetes prints as
/// KUBE_BIN (kube-apiserver, kubeadm, kubectl, kubelet).
pub fn kube_bin() -> PathBuf {
    required(
        "NODESTRAP_KUBE_BIN",
        "the folder qemu/build-kubernetes prints as KUBE_BIN",
    )
}

/// `NODESTRAP_CONTROL_PLANE_IMAGES`: the folder of control-plane image archives qemu/build-images
/// prints as CONTROL_PLANE_IMAGES (kube-apiserver, kube-controller-manager, kube-scheduler,
/// kube-proxy, etcd).
pub fn control_plane_images() -> PathBuf {
    required(
        "NODESTRAP_CONTROL_PLANE_IMAGES",
        "the folder qemu/build-images prints as CONTROL_PLANE_IMAGES (with KUBE_BIN set)",
    )
}

/// `NODESTRAP_PAUSE_IMAGE`: the sandbox image archive qemu/build-images prints as PAUSE_IMAGE.
pub fn pause_image() -> PathBuf {
    required(
        "NODESTRAP_PAUSE_IMAGE",
        "the archive qemu/build-images prints as PAUSE_IMAGE",
    )
}

/// `NODESTRAP_ETCD_IMAGE`: the etcd in the control plane's etcd image, the version kubeadm pins
/// (qemu/build-etcd prints it as ETCD_IMAGE_BIN).
pub fn etcd_image() -> PathBuf {
    required(
        "NODESTRAP_ETCD_IMAGE",
        "the etcd qemu/build-etcd prints as ETCD_IMAGE_BIN",
    )
}

/// `NODESTRAP_ETCD`: the etcd the test cluster runs; unset, Debian 13's from .ci/setup.
pub fn etcd() -> PathBuf {
    std::env::var_os("NODESTRAP_ETCD")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/usr/local/lib/nodestrap-ci/etcd".into())
}

/// `NODESTRAP_TORCX`: the real torcx qemu/build-torcx prints (github.com/coreos/torcx v0.2.0).
pub fn torcx() -> PathBuf {
    required(
        "NODESTRAP_TORCX",
        "the real torcx, as qemu/build-torcx prints it",
    )
}

/// `NODESTRAP_DDI_TOOLS`: the Debian 13 root holding systemd-repart and containerd
/// (qemu/build-ddi-tools).
pub fn ddi_tools() -> PathBuf {
    required(
        "NODESTRAP_DDI_TOOLS",
        "the Debian 13 root qemu/build-ddi-tools prints",
    )
}

/// `NODESTRAP_SYSTEMD_FORKY`: the Debian 14 root whose systemd (259 or later) reads its image
/// policy from sysext.conf (qemu/build-systemd-forky).
pub fn systemd_forky() -> PathBuf {
    required(
        "NODESTRAP_SYSTEMD_FORKY",
        "the Debian 14 root qemu/build-systemd-forky prints",
    )
}

/// `NODESTRAP_KUBECTL`: the kubectl that is the oracle of kubeconfig semantics; unset, Debian
/// 13's from .ci/setup.
pub fn kubectl() -> String {
    std::env::var("NODESTRAP_KUBECTL")
        .unwrap_or_else(|_| "/usr/local/lib/nodestrap-ci/kubectl".into())
}

/// `NODESTRAP_LEDGER_NODES`: how many nodes each herd of tests/activation/ledger.rs activates;
/// unset, 500.
pub fn ledger_nodes() -> usize {
    std::env::var("NODESTRAP_LEDGER_NODES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(500)
}

/// `NODESTRAP_FAULTS`: `all` runs every case of the fault matrices (tests/support/faults.rs);
/// unset, the sample CI runs.
pub fn all_faults() -> bool {
    std::env::var("NODESTRAP_FAULTS").is_ok_and(|v| v == "all")
}
