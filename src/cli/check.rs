//! Option checks made before anything is read (exit 2), and the option types that carry a
//! rule: the torcx manifest URL template and the sysext source URL template.

use crate::cli::{at_most, Bootstrap, Common, Payload, DEFAULT_MANIFEST_URL};
use crate::error::{Error, Result};
use crate::node::root::plain_name;

/// Options only the torcx payload acts on, by their settings key.
pub(crate) const TORCX_ONLY: &[&str] = &[
    "torcx-manifest-url",
    "torcx-profile",
    "torcx-skip-setup",
    "upgrade-os",
    "update-timeout",
    "reboot",
];
/// Options only the sysext payload acts on.
pub(crate) const SYSEXT_ONLY: &[&str] = &[
    "sysext-url",
    "sysext-trust",
    "sysext-verity-certs",
    "kube-minor",
    "self-update",
];

/// Step 0 for the merged options: each value, then the rules between options; returns the
/// manifest URL template.
pub(crate) fn check_options(a: &Bootstrap) -> Result<ManifestUrl> {
    let template = check_values(a)?;
    // Between options, so only once all sources are merged (a config file may name the payload
    // on one line and its source on the next).
    if a.sysext_trust == crate::cli::SysextTrust::Signed && a.sysext_verity_certs.is_none() {
        return Err(Error::config(
            "--sysext-trust signed needs --sysext-verity-certs (the PEM file of the certificates that sign the images' verity root hashes)",
        ));
    }
    if a.self_update && a.no_verify_signatures {
        return Err(Error::config(
            "--self-update needs the signed list: nodestrap does not replace itself with a release whose SHA256SUMS is not verified (--no-verify-signatures)",
        ));
    }
    if a.payload == Payload::Sysext && a.sysext_url.is_empty() {
        return Err(Error::config(
            "--payload sysext needs --sysext-url (the directory holding SHA256SUMS and the images)",
        ));
    }
    Ok(template)
}

/// Each option's value on its own; also how each config file and kernel command line value is
/// checked (`settings::check_value`). Returns the manifest URL template.
pub(crate) fn check_values(a: &Bootstrap) -> Result<ManifestUrl> {
    let template = check_common(&a.common())?;
    if let Some(u) = &a.events_url {
        crate::net::events::check_url(u, "--events-url")?;
    }
    downgrades(&a.allow_downgrade)?;
    if let Some(m) = &a.kube_minor {
        if !crate::node::mappings::is_minor_only(m) || !m.starts_with('v') {
            return Err(Error::config(format!(
                "--kube-minor {m:?}: expected a Kubernetes minor like v1.33"
            )));
        }
    }
    // Empty --kubeconfig means none (the API server is not asked); empty --kubelet-env-path
    // means kubelet.env is not written.
    let mut node_paths = vec![
        ("--version-manifest", &a.version_manifest),
        ("--installer-kubelet-env", &a.installer_kubelet_env),
    ];
    for (flag, p) in [
        ("--kubeconfig", &a.kubeconfig),
        ("--kubelet-kubeconfig", &a.kubelet_kubeconfig),
        ("--bootstrap-kubeconfig", &a.bootstrap_kubeconfig),
        ("--join-config", &a.join_config),
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
    if let Some(d) = a.metrics_dir.as_ref().filter(|d| !d.starts_with('/')) {
        return Err(Error::config(format!(
            "--metrics-dir {d:?}: expected an absolute folder on the node"
        )));
    }
    if let Some(m) = a.image_max_mib {
        crate::cli::check_image_max(m)?;
    }
    if let Some(v) = &a.force_kube_version {
        if crate::node::mappings::minor_of(v).is_none() {
            return Err(Error::config(format!(
                "--force-kube-version {v:?}: expected a version like v1.31.7 (that patch) or v1.31 (the newest patch of the minor)"
            )));
        }
    }
    if !a.api_server.is_empty() {
        let rest = a.api_server.strip_prefix("https://").unwrap_or_default();
        if rest.is_empty() || rest.starts_with('/') || a.api_server.contains(['?', '#']) {
            return Err(Error::config(format!(
                "--api-server {:?}: expected https://HOST[:PORT]",
                a.api_server
            )));
        }
    }
    at_most("--update-timeout", a.update_timeout, 7 * 24 * 3600)?;
    if !a.sysext_url.is_empty() {
        SysextUrl::parse(&a.sysext_url)?;
    }
    Ok(template)
}

/// Checks of the options the hook shares; returns the manifest URL template.
pub(crate) fn check_common(a: &Common) -> Result<ManifestUrl> {
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
    crate::net::mirrors::check_config_path(a.registry_config_path)?;
    a.check_fetch()?;
    Ok(template)
}

/// `--torcx-manifest-url`: an http(s) URL with placeholders for the board and the OS version
/// (Go template or shell spelling, as tectonic-torcx took them), and nothing else to fill in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ManifestUrl(String);

impl ManifestUrl {
    /// Checked by rendering it once: an unknown placeholder or another scheme is refused here,
    /// before anything is fetched.
    pub(crate) fn parse(template: &str) -> Result<ManifestUrl> {
        render_url(template, "amd64-usr", "1.0.0")?;
        Ok(ManifestUrl(template.to_string()))
    }

    /// The template as given, for messages.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// The manifest's URL for `board` and `os_version`.
    pub(crate) fn render(&self, board: &str, os_version: &str) -> Result<String> {
        render_url(&self.0, board, os_version)
    }
}

fn render_url(template: &str, board: &str, os_version: &str) -> Result<String> {
    let u = render_template(
        "--torcx-manifest-url",
        template,
        &[
            ("{{.Board}}", board),
            ("{{ .Board }}", board),
            ("${COREOS_BOARD}", board),
            ("{{.OSVersion}}", os_version),
            ("{{ .OSVersion }}", os_version),
            ("${VERSION_ID}", os_version),
        ],
    )?;
    if !(u.starts_with("https://") || u.starts_with("http://")) {
        return Err(Error::config(format!(
            "--torcx-manifest-url {template:?}: not an http(s) URL"
        )));
    }
    Ok(u)
}

/// A URL template with its `known` placeholders filled in. What is left must be a URL and
/// nothing else: a placeholder of another spelling (`{NAME}`, `$NAME`, `%n`, `{{ .X }}`) and an
/// empty path segment (`…/ext//`, what a shell leaves of `${NAME}` inside double quotes) are
/// refused, naming the accepted forms, before anything is fetched.
fn render_template(option: &str, template: &str, known: &[(&str, &str)]) -> Result<String> {
    let mut u = template.to_string();
    for (k, v) in known {
        u = u.replace(k, v);
    }
    let forms = known.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(" ");
    let refuse = |why: String| {
        Error::config(format!(
            "{option} {template:?}: {why}; the accepted placeholders are {forms} (in single quotes on a shell's command line)"
        ))
    };
    let b = u.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        let escape = c == b'%'
            && b.get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit));
        if matches!(c, b'{' | b'}' | b'$' | b'%') && !escape {
            let rest: String = u[i..].chars().take(12).collect();
            return Err(refuse(format!("an unknown placeholder at {rest:?}")));
        }
    }
    let after_scheme = u.split_once("://").map_or("", |(_, rest)| rest);
    let host = after_scheme.split('/').next().unwrap_or("");
    let host = host.rsplit('@').next().unwrap_or(host);
    let host = host.split(':').next().unwrap_or(host).to_ascii_lowercase();
    if is_example_host(&host) {
        return Err(Error::config(format!(
            "{option} {template:?}: {host} is the placeholder the examples ship (RFC 2606 keeps example domains for examples): set the address of your own source"
        )));
    }
    let path = after_scheme.split_once('/').map_or("", |(_, p)| p);
    if path.contains("//") || path.starts_with('/') {
        return Err(refuse(
            "an empty path segment (\"//\"), as a shell leaves of a placeholder it expanded to nothing".into(),
        ));
    }
    Ok(u)
}

/// A host RFC 2606 keeps for documentation (`example.com`, `.net`, `.org`, and `.example`): a
/// URL with one was left as an example shipped it, and can never answer.
fn is_example_host(host: &str) -> bool {
    ["example.com", "example.net", "example.org", "example"]
        .iter()
        .any(|d| host == *d || host.ends_with(&format!(".{d}")))
}

/// `--allow-downgrade`: `NAME=VERSION` pairs, comma-separated; a name at most once.
pub(crate) fn downgrades(v: &str) -> Result<Vec<(String, String)>> {
    let mut out: Vec<(String, String)> = Vec::new();
    for pair in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = |why: &str| {
            Error::config(format!(
                "--allow-downgrade {v:?}: {pair:?} {why}: expected NAME=VERSION, as kubernetes=v1.37.1 or docker=17.03"
            ))
        };
        let (name, version) = pair.split_once('=').ok_or_else(|| bad("has no ="))?;
        let digits = version.strip_prefix('v').unwrap_or(version);
        if !plain_name(name) || name.contains('=') {
            return Err(bad("names no extension or torcx image"));
        }
        if digits.is_empty()
            || !digits
                .split('.')
                .all(|p| !p.is_empty() && p.len() <= 9 && p.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(bad("is not a version"));
        }
        if out.iter().any(|(n, _)| n == name) {
            return Err(bad("names its extension or image twice"));
        }
        out.push((name.to_string(), version.to_string()));
    }
    Ok(out)
}

/// `--sysext-url`: the http(s) URL of a directory holding `SHA256SUMS`, its detached signature
/// and the images, or an OCI repository standing for one (`oci://HOST[:PORT]/REPO`,
/// docs/oci.md), with the extension's name as its one placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SysextUrl(String);

impl SysextUrl {
    pub(crate) fn parse(template: &str) -> Result<SysextUrl> {
        if template.is_empty() {
            return Err(Error::config(
                "--payload sysext needs --sysext-url (the directory holding SHA256SUMS and the images)",
            ));
        }
        let u = SysextUrl(template.to_string());
        u.dir("kubernetes")?;
        Ok(u)
    }

    /// The directory's URL for extension `name`, with a trailing slash.
    pub(crate) fn dir(&self, name: &str) -> Result<String> {
        let mut u = render_template(
            "--sysext-url",
            &self.0,
            &[("${NAME}", name), ("{{.Name}}", name)],
        )?;
        if crate::net::oci::Location::parse_dir(&u)
            .map_err(|e| e.context(format!("--sysext-url {:?}", self.0)))?
            .is_some()
        {
            if !u.ends_with('/') {
                u.push('/');
            }
            return Ok(u);
        }
        let rest = u
            .strip_prefix("https://")
            .or_else(|| u.strip_prefix("http://"));
        if !rest.is_some_and(|r| !r.is_empty() && !r.starts_with('/')) {
            return Err(Error::config(format!(
                "--sysext-url {:?}: not an http(s) URL, nor an oci://HOST[:PORT]/REPOSITORY",
                self.0
            )));
        }
        if u.contains(['?', '#']) {
            return Err(Error::config(format!(
                "--sysext-url {:?}: a directory URL takes no query or fragment",
                self.0
            )));
        }
        if !u.ends_with('/') {
            u.push('/');
        }
        Ok(u)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_templates_take_only_their_placeholders() {
        let ok = SysextUrl::parse("https://h/ext/${NAME}").unwrap();
        assert_eq!(ok.dir("kubernetes").unwrap(), "https://h/ext/kubernetes/");
        assert_eq!(
            SysextUrl::parse("https://h/{{.Name}}/%2Fx")
                .unwrap()
                .dir("a")
                .unwrap(),
            "https://h/a/%2Fx/"
        );
        assert!(SysextUrl::parse("https://h/ext/").is_ok());
        for (bad, needle) in [
            ("https://h/{NAME}/", "an unknown placeholder at \"{NAME}/\""),
            ("https://h/$NAME/", "an unknown placeholder at \"$NAME/\""),
            ("https://h/%n/", "an unknown placeholder at \"%n/\""),
            ("https://h/{{ .Name }}/", "an unknown placeholder"),
            ("https://h/ext//", "an empty path segment"),
            ("https://h//ext/", "an empty path segment"),
            ("oci://h/ext//", "an empty path segment"),
            (
                "https://extensions.example.com/${NAME}/",
                "extensions.example.com is the placeholder the examples ship",
            ),
            ("oci://r.example:5000/ext", "r.example is the placeholder"),
        ] {
            let e = SysextUrl::parse(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}");
            let m = e.to_string();
            assert!(m.contains(needle), "{bad}: {m}");
            // Each refusal says what fixes it: the accepted forms, or that the host is the
            // examples' own.
            let fix = if needle.contains("placeholder the examples ship")
                || needle.contains("is the placeholder")
            {
                "RFC 2606"
            } else {
                "the accepted placeholders are ${NAME} {{.Name}}"
            };
            assert!(m.contains(fix), "{bad}: {m}");
        }
        assert!(ManifestUrl::parse("https://h/${COREOS_BOARD}/${VERSION_ID}/m.json").is_ok());
        let m = ManifestUrl::parse("https://h/$VERSION_ID/m.json")
            .unwrap_err()
            .to_string();
        assert!(m.starts_with("--torcx-manifest-url"), "{m}");
        assert!(m.contains("${COREOS_BOARD}"), "{m}");
        let m = ManifestUrl::parse("https://h//m.json")
            .unwrap_err()
            .to_string();
        assert!(m.contains("an empty path segment"), "{m}");
    }
}
