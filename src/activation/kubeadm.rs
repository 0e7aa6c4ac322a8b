//! kubeadm as activate and join-service use it: a bounded runner for external commands (time
//! limit, output kept as a bounded tail, the whole process group killed on timeout), kubeadm
//! configuration files, and bootstrap tokens (format check, and scrubbing them from any text
//! that could reach a log or an answer).

use std::time::Duration;

use crate::activation::nodelock::Role;
use crate::cli::Addons;
use crate::error::{Error, Result};
use crate::node::exec::{self, Command};

/// kubeadm and the token command print a few lines; their stdout is read whole up to this.
const STDOUT_CAP: usize = 1 << 20;

#[derive(Debug)]
pub(crate) struct Ran {
    pub(crate) ok: bool,
    /// `exit status 1`, `killed by signal SIGKILL (9)`…
    pub(crate) status: String,
    pub(crate) stdout: Vec<u8>,
    /// The end of stderr then stdout, tokens scrubbed.
    pub(crate) tail: String,
}

/// Run `argv` (no shell; the program looked up in PATH, our environment) for at most
/// `timeout`. An error only when it cannot be started or runs too long; a failing exit is
/// `Ran { ok: false, .. }`.
pub(crate) fn run(argv: &[String], timeout: Duration) -> Result<Ran> {
    let c = Command::new(argv, timeout)?;
    let label = match argv {
        [prog, sub, ..] if !sub.starts_with('-') => format!("{prog} {sub}"),
        _ => c.program.display().to_string(),
    };
    let r = exec::capture(&c, &label, STDOUT_CAP)?;
    // The last 16 KiB of stderr then stdout, as answers and logs promise.
    let tail = scrub(&r.tail);
    let mut cut = tail.len().saturating_sub(exec::TAIL);
    while !tail.is_char_boundary(cut) {
        cut += 1;
    }
    Ok(Ran {
        ok: r.exit.success(),
        status: r.exit.to_string(),
        stdout: r.stdout,
        tail: tail[cut..].to_string(),
    })
}

/// `argv`'s stdout when it exits 0; else an error saying `what`, how it ended and its last lines.
pub(crate) fn succeeded(argv: &[String], timeout: Duration, what: &str) -> Result<Vec<u8>> {
    let ran = run(argv, timeout)?;
    if !ran.ok {
        return Err(Error::failed(format!(
            "{what}: {}: {}",
            ran.status,
            last_lines(&ran.tail, 3)
        )));
    }
    Ok(ran.stdout)
}

/// kubeadm's own judgement of a config file (`kubeadm config validate`: strict fields, and the
/// versions this kubeadm can deploy), asked before anything on the node changes. `kubeadm` is
/// one program, as for init and join.
pub(crate) fn validate(kubeadm: &str, config: &str) -> Result<()> {
    let argv = [kubeadm, "config", "validate", "--config", config].map(String::from);
    succeeded(
        &argv,
        Duration::from_secs(60),
        &format!("kubeadm config validate {config}"),
    )
    .map(drop)
}

/// Split a configured command line on white space (no shell, no quoting).
pub(crate) fn argv(cmd: &str, flag: &str) -> Result<Vec<String>> {
    let v: Vec<String> = cmd.split_whitespace().map(str::to_string).collect();
    if v.is_empty() {
        return Err(Error::config(format!("{flag}: empty command")));
    }
    Ok(v)
}

/// The last `n` non-empty lines of a command's output tail, on one line: enough to say why it
/// failed in a log line or an error.
pub(crate) fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

// ---------------------------------------------------------------------------------------------
// Bootstrap tokens: `[a-z0-9]{6}.[a-z0-9]{16}` (kubeadm's format).

fn token_char(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

pub(crate) fn valid_token(t: &str) -> bool {
    let b = t.as_bytes();
    b.len() == 23 && b[6] == b'.' && b[..6].iter().chain(&b[7..]).all(|&c| token_char(c))
}

/// Replace anything shaped like a bootstrap token: command output can carry one (kubeadm
/// prints join commands), and neither logs nor answers may.
pub(crate) fn scrub(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut copied = 0;
    while i + 23 <= b.len() {
        let starts_word = i == 0 || !token_char(b[i - 1]);
        let ends_word = i + 23 == b.len() || !token_char(b[i + 23]);
        if starts_word && ends_word && text.is_char_boundary(i) && valid_token(&text[i..i + 23]) {
            out.push_str(&text[copied..i]);
            out.push_str("[token]");
            i += 23;
            copied = i;
        } else {
            i += 1;
        }
    }
    out.push_str(&text[copied..]);
    out
}

// ---------------------------------------------------------------------------------------------
// Configuration files

/// kubeadm's config API for a Kubernetes version: v1beta4 from 1.31 (where it appeared), else
/// v1beta3 (1.22 on). Unknown versions get v1beta3, which kubeadm still reads.
fn api_version(k8s: Option<&str>) -> &'static str {
    let minor = k8s
        .and_then(|v| v.trim_start_matches('v').split('.').nth(1))
        .and_then(|m| m.parse::<u32>().ok());
    match minor {
        Some(m) if m >= 31 => "kubeadm.k8s.io/v1beta4",
        _ => "kubeadm.k8s.io/v1beta3",
    }
}

pub(crate) struct InitSpec<'a> {
    pub(crate) cluster_name: &'a str,
    pub(crate) kubernetes_version: &'a str,
    pub(crate) pod_cidr: &'a str,
    pub(crate) service_cidr: &'a str,
    pub(crate) sans: &'a [String],
    pub(crate) control_plane_endpoint: Option<&'a str>,
    /// What the node's images are named (`activate --image-repository`, `--etcd-image-tag`)
    /// and which addons it leaves out.
    pub(crate) images: &'a ImageNames,
}

/// The node's side of kubeadm's image names: they must match what its archives hold.
#[derive(Debug, Default)]
pub(crate) struct ImageNames {
    pub(crate) repository: Option<String>,
    pub(crate) etcd_tag: Option<String>,
    pub(crate) skip: Addons,
}

impl ImageNames {
    /// Addons can be left out only from kubeadm's v1beta4 config on (Kubernetes 1.31).
    pub(crate) fn check_version(&self, k8s: &str) -> std::result::Result<(), String> {
        if self.skip.any() && api_version(Some(k8s)) != "kubeadm.k8s.io/v1beta4" {
            return Err(format!(
                "kubernetes_version {k8s}: --skip-addons needs kubeadm's v1beta4 config, from Kubernetes 1.31"
            ));
        }
        Ok(())
    }
}

/// InitConfiguration + ClusterConfiguration. Every value was validated (names, CIDRs,
/// versions, image names), so double-quoted scalars are enough.
pub(crate) fn init_config(s: &InitSpec) -> String {
    let api = api_version(Some(s.kubernetes_version));
    // The first API call of `kubeadm init` (its admin's ClusterRoleBinding) polls until the new
    // API server answers, for at most kubeadm's API-call timeout: 1 min by default, less than a
    // first boot still importing images may need; a failure there resets the node for good.
    // 4 min, as long as kubeadm already waits for the control plane to be healthy (v1beta4 only).
    let timeouts = if api == "kubeadm.k8s.io/v1beta4" {
        "timeouts:\n  kubernetesAPICall: \"4m0s\"\n"
    } else {
        ""
    };
    let mut y = format!(
        "apiVersion: {api}\nkind: InitConfiguration\n{timeouts}---\napiVersion: {api}\nkind: ClusterConfiguration\n\
         clusterName: \"{}\"\nkubernetesVersion: \"{}\"\nnetworking:\n  podSubnet: \"{}\"\n  serviceSubnet: \"{}\"\n",
        s.cluster_name, s.kubernetes_version, s.pod_cidr, s.service_cidr
    );
    if !s.sans.is_empty() {
        y.push_str("apiServer:\n  certSANs:\n");
        for san in s.sans {
            y.push_str(&format!("  - \"{san}\"\n"));
        }
    }
    if let Some(e) = s.control_plane_endpoint {
        y.push_str(&format!("controlPlaneEndpoint: \"{e}\"\n"));
    }
    let n = s.images;
    if let Some(r) = &n.repository {
        y.push_str(&format!("imageRepository: \"{r}\"\n"));
    }
    if let Some(t) = &n.etcd_tag {
        y.push_str(&format!("etcd:\n  local:\n    imageTag: \"{t}\"\n"));
    }
    if n.skip.coredns {
        y.push_str("dns:\n  disabled: true\n");
    }
    if n.skip.kube_proxy {
        y.push_str("proxy:\n  disabled: true\n");
    }
    y
}

pub(crate) struct JoinSpec<'a> {
    pub(crate) api_server_endpoint: &'a str,
    pub(crate) token: &'a str,
    pub(crate) ca_cert_hash: &'a str,
    pub(crate) role: Role,
    pub(crate) kubernetes_version: Option<&'a str>,
}

/// JoinConfiguration with bootstrap-token discovery: the token stays in a 0600 file, out of
/// argv (where `ps` shows it). A control-plane join uses the certificates placed in
/// /etc/kubernetes/pki beforehand, so nothing is downloaded.
pub(crate) fn join_config(s: &JoinSpec) -> String {
    let mut y = format!(
        "apiVersion: {}\nkind: JoinConfiguration\ndiscovery:\n  bootstrapToken:\n    apiServerEndpoint: \"{}\"\n    \
         token: \"{}\"\n    caCertHashes:\n    - \"{}\"\n",
        api_version(s.kubernetes_version),
        s.api_server_endpoint,
        s.token,
        s.ca_cert_hash
    );
    if s.role == Role::ControlPlane {
        y.push_str("controlPlane: {}\n");
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens() {
        assert!(valid_token("abcdef.0123456789abcdef"));
        for bad in [
            "abcdef0123456789abcdef0",
            "ABCDEF.0123456789abcdef",
            "abcde.0123456789abcdefg",
            "abcdef.0123456789abcde",
            "",
        ] {
            assert!(!valid_token(bad), "{bad}");
        }
        assert_eq!(
            scrub("kubeadm join 1.2.3.4:6443 --token abcdef.0123456789abcdef --x\nabcdef.0123456789abcdef"),
            "kubeadm join 1.2.3.4:6443 --token [token] --x\n[token]"
        );
        // Longer runs of the same characters are not tokens; text around survives (UTF-8 too).
        assert_eq!(
            scrub("xabcdef.0123456789abcdef ü"),
            "xabcdef.0123456789abcdef ü"
        );
    }

    #[test]
    fn configs() {
        let sans = vec!["10.0.0.1".to_string(), "api.example.com".to_string()];
        let c = init_config(&InitSpec {
            cluster_name: "demo",
            kubernetes_version: "v1.31.2",
            pod_cidr: "10.244.0.0/16",
            service_cidr: "10.96.0.0/12",
            sans: &sans,
            control_plane_endpoint: Some("api.example.com:6443"),
            images: &ImageNames {
                repository: Some("registry.example.com:5000/k8s".into()),
                etcd_tag: Some("3.5.16-0".into()),
                skip: Addons {
                    coredns: true,
                    kube_proxy: false,
                },
            },
        });
        assert!(
            c.starts_with(
                "apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\n\
                 timeouts:\n  kubernetesAPICall: \"4m0s\"\n---\n"
            ),
            "{c}"
        );
        assert!(
            c.contains("  podSubnet: \"10.244.0.0/16\"\n")
                && c.contains("  - \"api.example.com\"\n")
                && c.contains("controlPlaneEndpoint: \"api.example.com:6443\"\n")
                && c.contains("imageRepository: \"registry.example.com:5000/k8s\"\n")
                && c.contains("etcd:\n  local:\n    imageTag: \"3.5.16-0\"\n")
                && c.contains("dns:\n  disabled: true\n")
                && !c.contains("proxy:"),
            "{c}"
        );
        let old = ImageNames {
            skip: Addons {
                coredns: false,
                kube_proxy: true,
            },
            ..ImageNames::default()
        };
        // kubeadm's v1beta3 has no timeouts.
        let c = init_config(&InitSpec {
            cluster_name: "demo",
            kubernetes_version: "v1.30.4",
            pod_cidr: "10.244.0.0/16",
            service_cidr: "10.96.0.0/12",
            sans: &[],
            control_plane_endpoint: None,
            images: &ImageNames::default(),
        });
        assert!(
            c.starts_with("apiVersion: kubeadm.k8s.io/v1beta3\nkind: InitConfiguration\n---\n"),
            "{c}"
        );
        assert!(old.check_version("v1.31.0").is_ok());
        assert!(old
            .check_version("v1.30.9")
            .unwrap_err()
            .contains("--skip-addons"));
        let j = join_config(&JoinSpec {
            api_server_endpoint: "10.0.0.1:6443",
            token: "abcdef.0123456789abcdef",
            ca_cert_hash: "sha256:00",
            role: Role::Worker,
            kubernetes_version: Some("1.29.0"),
        });
        assert!(
            j.starts_with("apiVersion: kubeadm.k8s.io/v1beta3\n") && !j.contains("controlPlane"),
            "{j}"
        );
    }

    #[test]
    fn runs_through_the_one_runner_and_scrubs_tokens() {
        let sh = |s: &str| vec!["/bin/sh".to_string(), "-c".to_string(), s.to_string()];
        let r = run(
            &sh("echo out; echo 'token abcdef.0123456789abcdef' >&2; exit 3"),
            Duration::from_secs(10),
        )
        .unwrap();
        assert!(!r.ok && r.status == "exit status 3", "{}", r.status);
        assert!(
            !r.tail.contains("0123456789abcdef") && r.tail.ends_with("out\n"),
            "{:?}",
            r.tail
        );
        let e = run(&sh("sleep 30"), Duration::from_millis(300)).unwrap_err();
        assert!(e.to_string().contains("timed out after 0.3 s"), "{e}");
        assert!(run(
            &["/nonexistent/kubeadm".to_string()],
            Duration::from_secs(1)
        )
        .is_err());
        assert_eq!(last_lines("a\n\nb\n  \nc\nd\n", 3), "b | c | d");
        assert_eq!(last_lines("only\n", 3), "only");
    }
}
