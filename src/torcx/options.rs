//! The options bootstrap and the hook share, checked before anything is read, and what they
//! make of them: the manifest URL template, the keyring, the HTTP and API clients.

use std::time::Duration;

use crate::cli::{at_most, Bootstrap, Common, Input, DEFAULT_MANIFEST_URL};
use crate::crypto::openpgp::Keyring;
use crate::error::{Error, Result};
use crate::net::fetch::{AttemptLimits, Http, Retry, Tls};
use crate::node::root::{plain_name, Root};

/// Step 0 for everything given on the command line; returns the manifest URL template.
/// Also checks each config file and kernel command line value (`config::check_value`).
pub fn check_options(a: &Bootstrap) -> Result<ManifestUrl> {
    let template = check_common(&a.common())?;
    // Empty --kubeconfig means none (the API server is not asked); empty --kubelet-env-path
    // means kubelet.env is not written.
    let mut node_paths = vec![
        ("--version-manifest", &a.version_manifest),
        ("--installer-kubelet-env", &a.installer_kubelet_env),
    ];
    for (flag, p) in [
        ("--kubeconfig", &a.kubeconfig),
        ("--kubelet-env-path", &a.kubelet_env_path),
    ] {
        if !p.is_empty() {
            node_paths.push((flag, p));
        }
    }
    for (flag, p) in node_paths {
        if !p.starts_with('/') || p.ends_with('/') {
            return Err(Error::config(format!(
                "{flag} {p:?}: expected an absolute file path on the node"
            )));
        }
    }
    if let Some(v) = &a.force_kube_version {
        if crate::torcx::mappings::major_minor(v).is_none() {
            return Err(Error::config(format!(
                "--force-kube-version {v:?}: expected a version like v1.10.2"
            )));
        }
    }
    at_most("--update-timeout", a.update_timeout, 7 * 24 * 3600)?;
    Ok(template)
}

/// Checks of the options the hook shares; returns the manifest URL template.
pub fn check_common(a: &Common) -> Result<ManifestUrl> {
    if !plain_name(a.torcx_profile) {
        return Err(Error::config(format!(
            "--torcx-profile {:?} is not a plain name",
            a.torcx_profile
        )));
    }
    let template = if a.torcx_manifest_url.is_empty() {
        DEFAULT_MANIFEST_URL
    } else {
        a.torcx_manifest_url
    };
    let template = ManifestUrl::parse(template)?;
    at_most("--api-tries", a.api_tries as u64, 100)?;
    at_most("--api-retry-delay", a.api_retry_delay, 3600)?;
    at_most("--fetch-attempts", a.fetch_attempts as u64, 100)?;
    at_most("--fetch-backoff-ms", a.fetch_backoff_ms, 60_000)?;
    AttemptLimits::from_options(a.fetch_timeout, a.fetch_min_rate, a.fetch_min_rate_window)?;
    Ok(template)
}

/// The keyring that signs manifests, or `None` (with a warning) under --no-verify-signatures.
pub fn read_keyring(a: &Common, root: &Root) -> Result<Option<Keyring>> {
    if a.no_verify_signatures {
        log::warn!("--no-verify-signatures: torcx manifests will NOT be authenticated; anyone on the path can choose what runs on this node");
        return Ok(None);
    }
    let data = a.keyring.read(root, 16 << 20, "keyring")?;
    let name = a.keyring.label(root);
    let k = Keyring::parse(&data, &name).map_err(|e| e.with_kind(a.keyring.kind()))?;
    log::debug!("keyring {name}: {}", k.fingerprints().join(", "));
    Ok(Some(k))
}

pub fn api_retry(a: &Common) -> Retry {
    Retry::fixed(a.api_tries, Duration::from_secs(a.api_retry_delay))
}

/// The HTTPS client for manifests and images: system roots plus `--ca-file`.
pub fn manifest_client(a: &Common, root: &Root) -> Result<Http> {
    let mut tls = Tls::system(root)?;
    match a.ca_file {
        Some(Input::Host(p)) => tls.add_file(p, "--ca-file")?,
        Some(ca) => {
            let pem = ca.read(root, 16 << 20, "ca-file")?;
            tls.add_pem(&pem, &ca.name(root, "ca-file"))?;
        }
        None => {}
    }
    if tls.sources.is_empty() {
        log::warn!("no trust anchors: no system CA bundle found and no --ca-file; HTTPS will fail");
    } else {
        log::debug!("trust anchors: {}", tls.sources.join(", "));
    }
    let limits =
        AttemptLimits::from_options(a.fetch_timeout, a.fetch_min_rate, a.fetch_min_rate_window)?;
    let retry = Retry::exponential(a.fetch_attempts, Duration::from_millis(a.fetch_backoff_ms));
    Ok(Http::new(&tls, retry).with_limits(limits))
}

/// `--torcx-manifest-url`: an http(s) URL with placeholders for the board and the OS version
/// (Go template or shell spelling, as tectonic-torcx took them), and nothing else to fill in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestUrl(String);

impl ManifestUrl {
    /// Checked by rendering it once: an unknown placeholder or another scheme is refused here,
    /// before anything is fetched.
    pub fn parse(template: &str) -> Result<ManifestUrl> {
        render_url(template, "amd64-usr", "1.0.0")?;
        Ok(ManifestUrl(template.to_string()))
    }

    /// The manifest's URL for `board` and `os_version`.
    pub fn render(&self, board: &str, os_version: &str) -> Result<String> {
        render_url(&self.0, board, os_version)
    }
}

fn render_url(template: &str, board: &str, os_version: &str) -> Result<String> {
    let mut u = template.to_string();
    for (k, v) in [
        ("{{.Board}}", board),
        ("{{ .Board }}", board),
        ("${COREOS_BOARD}", board),
        ("{{.OSVersion}}", os_version),
        ("{{ .OSVersion }}", os_version),
        ("${VERSION_ID}", os_version),
    ] {
        u = u.replace(k, v);
    }
    if u.contains("{{") || u.contains("${") {
        return Err(Error::config(format!("--torcx-manifest-url {template:?}: unknown placeholder (known: {{{{.Board}}}} {{{{.OSVersion}}}} ${{COREOS_BOARD}} ${{VERSION_ID}})")));
    }
    if !(u.starts_with("https://") || u.starts_with("http://")) {
        return Err(Error::config(format!(
            "--torcx-manifest-url {template:?}: not an http(s) URL"
        )));
    }
    Ok(u)
}
