//! `nodestrap bootstrap`: tectonic-torcx's node bootstrap, step by step (torcx.md 2.2), with
//! the fixes its reference lists: atomic writes, stable kubelet.env, a deadline on the update
//! wait, retries on 5xx, and a reboot only when one is really needed.
//! The steps the pre-reboot hook shares (options, manifests, staging) are `pub(crate)` here.

use std::io::Write as _;
use std::time::Duration;

use crate::cli::{Bootstrap, Common, RebootMode, DEFAULT_MANIFEST_URL};
use crate::config::Input;
use crate::dbus::{self, Update};
use crate::envfile::EnvFile;
use crate::error::{Error, Result};
use crate::fetch::{AttemptLimits, Backoff, Http, Request, Retry, Tls};
use crate::kube::{ApiRetry, Kube};
use crate::mappings::Mappings;
use crate::root::{Persist, Root};
use crate::torcx::{self, PackageList, Source, Staged};
use crate::verify::Keyring;

pub const OS_RELEASE: &str = "/usr/lib/os-release";
pub const RUNTIME: &str = "docker";
const MAPPINGS_NS: &str = "tectonic-system";
const MAPPINGS_CM: &str = "tectonic-torcx-runtime-mappings";
const MAPPINGS_KEY: &str = "runtime-mappings.yaml";
const MANIFEST_CAP: u64 = 1 << 20;
const SIGNATURE_CAP: u64 = 64 << 10;

/// `--dry-run` prints its plan on stdout, one `plan:` line per change it would make; the log on
/// stderr still carries the decisions.
pub fn run(a: &Bootstrap) -> Result<()> {
    // 0. Everything that can be checked without the node or the network: exit 2 if wrong.
    let root = Root::open(&a.root)?;
    let template = check_options(a)?;
    let torcx_on = !a.torcx_skip_setup;
    let keyring = if torcx_on {
        read_keyring(&a.common(), &root)?
    } else {
        None
    };
    let http = if torcx_on {
        Some(manifest_client(&a.common(), &root)?)
    } else {
        None
    };
    let api_retry = api_retry(&a.common());
    let rebooter = crate::reboot::for_run(&root, a.reboot == RebootMode::Auto, a.dry_run);

    // 1. OS version and board.
    let os = OsInfo::read(&root)?;
    let by_arch = if os.board_from_arch {
        ", board by architecture"
    } else {
        ""
    };
    log::info!(
        "OS version {} board {} (from {}{by_arch})",
        os.version,
        os.board,
        root.show(OS_RELEASE)
    );

    // 2. Kubernetes version: forced, API server, or the installer's kubelet.env.
    let kube = if a.kubeconfig.is_empty() {
        None
    } else if a.force_kube_version.is_none() || torcx_on {
        Kube::from_kubeconfig(&root, &a.kubeconfig, api_retry)?
    } else {
        None
    };
    let k8s = kube_version(&root, a, kube.as_ref())?;

    // 3. Runtime mappings: the ConfigMap, else the node's file.
    let wanted = if torcx_on {
        Some(runtime_versions(&root, a, kube.as_ref(), &k8s)?)
    } else {
        None
    };

    // 4. update_engine.
    let update = os_update(a, &root)?;
    let next = match &update {
        Update::Pending(v) => Some(v.clone()),
        _ => None,
    };
    if update == Update::PendingUnknown {
        // Nothing can be staged for an OS whose version is unknown: boot into it first and
        // bootstrap there. kubelet.env is not written, so the unit runs again after the reboot.
        let why = "an OS update of unknown version is pending; bootstrapping after the reboot";
        crate::outln!("nodestrap: bootstrap deferred k8s={k8s} reboot=needed ({why})")?;
        return rebooter.reboot(why);
    }

    // 5-8. torcx: choose, fetch and verify, stage, profile.
    let chosen = match (&http, &wanted) {
        (Some(http), Some(wanted)) => {
            let m = Manifests {
                http,
                template: &template,
                board: &os.board,
                keyring: keyring.as_ref(),
            };
            stage_runtime(
                &root,
                &m,
                &os.version,
                next.as_deref(),
                wanted,
                &a.torcx_profile,
                a.dry_run,
            )?
        }
        _ => {
            log::info!("torcx setup skipped (--torcx-skip-setup)");
            None
        }
    };

    // 9. Decide the reboot and prepare for it before the done marker exists: once kubelet.env
    //    is written this unit never runs again, so nothing that can fail may come after it.
    let applied = match chosen {
        Some(_) => torcx::applied_reference(&root, RUNTIME)?,
        None => None,
    };
    let reasons = reboot_reasons(&update, applied.as_ref(), chosen.as_deref());
    if !reasons.is_empty() && runtime_changes(applied.as_ref(), chosen.as_deref()) {
        install_cleanup(&root, a.dry_run)?;
    }

    // 10. kubelet.env: the done marker.
    let marker = write_kubelet_env(&root, a, &k8s)?;

    // 11. Report, and reboot only when needed. From here on the marker exists: whatever fails
    //     (stdout gone, the reboot refused) takes it back, so the unit runs again rather than
    //     starting the kubelet on a half-done node.
    let finish = || -> Result<()> {
        let reboot = if reasons.is_empty() {
            "no".to_string()
        } else {
            format!("needed ({})", reasons.join("; "))
        };
        crate::outln!(
            "nodestrap: bootstrap {} k8s={k8s} {RUNTIME}={} next-os={} reboot={reboot}",
            if a.dry_run { "planned" } else { "done" },
            chosen.as_deref().unwrap_or("unchanged"),
            next.as_deref().unwrap_or("none"),
        )?;
        if reasons.is_empty() {
            log::info!("no reboot needed");
            return Ok(());
        }
        rebooter.reboot(&reasons.join("; "))
    };
    finish().map_err(|e| match marker {
        Some(m) => m.take_back(e),
        None => e,
    })
}

/// kubelet.env written by this run, taken back when the run fails after writing it.
struct Marker<'a> {
    root: &'a Root,
    path: &'a str,
}

impl Marker<'_> {
    /// Remove the marker (and fsync its directory); the run's error says so.
    fn take_back(&self, e: Error) -> Error {
        match self.root.remove(self.path) {
            Ok(()) => e.context(format!(
                "removed {} again so bootstrap runs again",
                self.root.show(self.path)
            )),
            Err(r) => {
                log::error!("{r}");
                e.context(format!(
                    "could NOT remove {}; remove it before kubelet starts",
                    self.root.show(self.path)
                ))
            }
        }
    }
}

/// Step 0 for everything given on the command line; returns the manifest URL template.
/// Also checks each config file and kernel command line value (`config::check_value`).
pub fn check_options(a: &Bootstrap) -> Result<String> {
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
        if crate::mappings::major_minor(v).is_none() {
            return Err(Error::config(format!(
                "--force-kube-version {v:?}: expected a version like v1.10.2"
            )));
        }
    }
    at_most("--update-timeout", a.update_timeout, 7 * 24 * 3600)?;
    Ok(template)
}

/// Checks of the options the hook shares; returns the manifest URL template.
pub(crate) fn check_common(a: &Common) -> Result<String> {
    if !torcx::plain_name(a.torcx_profile) {
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
    render_url(template, "amd64-usr", "1.0.0")?;
    at_most("--api-tries", a.api_tries as u64, 100)?;
    at_most("--api-retry-delay", a.api_retry_delay, 3600)?;
    at_most("--fetch-attempts", a.fetch_attempts as u64, 100)?;
    at_most("--fetch-backoff-ms", a.fetch_backoff_ms, 60_000)?;
    AttemptLimits::from_options(a.fetch_timeout, a.fetch_min_rate, a.fetch_min_rate_window)?;
    Ok(template.to_string())
}

pub(crate) fn at_most(flag: &str, value: u64, max: u64) -> Result<()> {
    if value > max {
        return Err(Error::config(format!("{flag} {value}: at most {max}")));
    }
    Ok(())
}

/// The keyring that signs manifests, or `None` (with a warning) under --no-verify-signatures.
pub(crate) fn read_keyring(a: &Common, root: &Root) -> Result<Option<Keyring>> {
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

pub(crate) fn api_retry(a: &Common) -> ApiRetry {
    ApiRetry {
        tries: a.api_tries,
        delay: Duration::from_secs(a.api_retry_delay),
    }
}

/// The HTTPS client for manifests and images: system roots plus `--ca-file`.
pub(crate) fn manifest_client(a: &Common, root: &Root) -> Result<Http> {
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
    let backoff = Backoff::Exponential {
        initial: Duration::from_millis(a.fetch_backoff_ms),
        cap: Duration::from_secs(60),
    };
    let limits =
        AttemptLimits::from_options(a.fetch_timeout, a.fetch_min_rate, a.fetch_min_rate_window)?;
    Ok(Http::new(
        &tls,
        Retry {
            attempts: a.fetch_attempts.max(1),
            backoff,
            budget: Duration::from_secs(600),
        },
    )
    .with_limits(limits))
}

pub struct OsInfo {
    pub version: String,
    pub board: String,
    pub board_from_arch: bool,
}

impl OsInfo {
    pub fn read(root: &Root) -> Result<OsInfo> {
        let name = root.show(OS_RELEASE);
        let text = root
            .read_text(OS_RELEASE)?
            .ok_or_else(|| Error::failed(format!("{name}: does not exist")))?;
        let env = EnvFile::parse(&text, &name)?;
        let version = env
            .get("VERSION_ID")
            .filter(|v| !v.is_empty())
            .ok_or_else(|| Error::failed(format!("{name}: no VERSION_ID")))?
            .to_string();
        if !torcx::plain_name(&version) {
            return Err(Error::failed(format!(
                "{name}: VERSION_ID {version:?} is not a plain version"
            )));
        }
        let (board, board_from_arch) = match env.get("COREOS_BOARD").filter(|b| !b.is_empty()) {
            Some(b) if torcx::plain_name(b) => (b.to_string(), false),
            Some(b) => {
                return Err(Error::failed(format!(
                    "{name}: COREOS_BOARD {b:?} is not a plain name"
                )))
            }
            None => (arch_board()?.to_string(), true),
        };
        Ok(OsInfo {
            version,
            board,
            board_from_arch,
        })
    }
}

/// Container Linux boards by the architecture this binary was built for.
fn arch_board() -> Result<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => Ok("amd64-usr"),
        "aarch64" => Ok("arm64-usr"),
        a => Err(Error::failed(format!(
            "no COREOS_BOARD in os-release and no board for architecture {a}"
        ))),
    }
}

pub fn render_url(template: &str, board: &str, os_version: &str) -> Result<String> {
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

fn kube_version(root: &Root, a: &Bootstrap, kube: Option<&Kube>) -> Result<String> {
    if let Some(v) = &a.force_kube_version {
        log::info!("Kubernetes version {v} (from --force-kube-version)");
        return Ok(v.clone());
    }
    match kube {
        Some(k) => match k.server_version() {
            Ok(v) => {
                let from = format!(
                    "the API server, GET /version, credentials from {}",
                    k.source
                );
                log::info!("Kubernetes version {v} (from {from})");
                return checked_version(v, &from);
            }
            Err(e) => log::warn!("API server version unavailable: {e}"),
        },
        None => log::info!(
            "no kubeconfig at {}: not asking the API server",
            root.show(&a.kubeconfig)
        ),
    }
    kubelet_env_version(root, &a.installer_kubelet_env)?.ok_or_else(|| {
        Error::failed(format!(
            "unable to determine the cluster version: API server unavailable and {} does not exist",
            root.show(&a.installer_kubelet_env)
        ))
    })
}

/// The Kubernetes version a kubelet.env names (`KUBELET_IMAGE_TAG`); `None` if it does not exist.
pub(crate) fn kubelet_env_version(root: &Root, node_path: &str) -> Result<Option<String>> {
    let name = root.show(node_path);
    let Some(text) = root.read_text(node_path)? else {
        return Ok(None);
    };
    let env = EnvFile::parse(&text, &name)?;
    let tag = env
        .get("KUBELET_IMAGE_TAG")
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            Error::failed(format!(
                "unable to determine the cluster version: {name} has no KUBELET_IMAGE_TAG"
            ))
        })?;
    // Docker tags cannot hold '+', so the installer wrote '_'.
    let v = tag.replace('_', "+");
    log::info!("Kubernetes version {v} (from KUBELET_IMAGE_TAG in {name})");
    checked_version(v, &format!("KUBELET_IMAGE_TAG in {name}")).map(Some)
}

/// A version the mappings can be looked up by (`v1.10.2+coreos.0`), or an error naming its source.
fn checked_version(v: String, from: &str) -> Result<String> {
    match crate::mappings::major_minor(&v) {
        Some(_) => Ok(v),
        None => Err(Error::failed(format!(
            "Kubernetes version {v:?} from {from} is not a version like v1.10.2"
        ))),
    }
}

fn runtime_versions(root: &Root, a: &Bootstrap, kube: Option<&Kube>, k8s: &str) -> Result<Wanted> {
    let from_api = kube.map(|k| k.configmap_key(MAPPINGS_NS, MAPPINGS_CM, MAPPINGS_KEY));
    let mappings = match from_api {
        // Data the API gave us that does not parse is an error, not a reason to use older data.
        Some(Ok(text)) => Mappings::parse(
            &text,
            &format!("ConfigMap {MAPPINGS_NS}/{MAPPINGS_CM} key {MAPPINGS_KEY}"),
        )?,
        other => {
            if let Some(Err(e)) = other {
                log::warn!("runtime mappings from the API unavailable: {e}");
            }
            let name = root.show(&a.version_manifest);
            let text = root.read_text(&a.version_manifest)?.ok_or_else(|| {
                Error::failed(format!(
                    "no runtime mappings: API unavailable and {name} does not exist"
                ))
            })?;
            Mappings::parse(&text, &name)?
        }
    };
    pick_versions(&mappings, k8s)
}

/// The runtime versions the mappings give for a Kubernetes version, most preferred first, and
/// where they come from (for the error when the manifest offers none of them).
pub(crate) struct Wanted {
    pub versions: Vec<String>,
    pub source: String,
}

/// At most this many items of a list go into an error message.
const LIST_IN_ERRORS: usize = 20;

/// `a, b, c` of at most LIST_IN_ERRORS items, each cut to 64 characters, and how many more.
fn bounded_list<'a>(items: impl ExactSizeIterator<Item = &'a str>) -> String {
    let n = items.len();
    let mut out: Vec<String> = items
        .take(LIST_IN_ERRORS)
        .map(|s| crate::error::excerpt(s, 64))
        .collect();
    if n > LIST_IN_ERRORS {
        out.push(format!("and {} more", n - LIST_IN_ERRORS));
    }
    if out.is_empty() {
        "nothing".to_string()
    } else {
        out.join(", ")
    }
}

/// The runtime versions the mappings give for `k8s`, most preferred first.
pub(crate) fn pick_versions(mappings: &Mappings, k8s: &str) -> Result<Wanted> {
    let wanted = mappings.runtime_for(k8s, RUNTIME)?;
    for v in &wanted {
        if !torcx::plain_name(v) {
            return Err(Error::failed(format!(
                "{}: {RUNTIME} version {v:?} is not a plain version",
                mappings.source
            )));
        }
    }
    log::info!(
        "{RUNTIME} versions for Kubernetes {k8s}: {} (from {})",
        wanted.join(", "),
        mappings.source
    );
    Ok(Wanted {
        versions: wanted,
        source: mappings.source.clone(),
    })
}

/// update_engine is asked whatever `--root` is: the hook runs with the host root mounted
/// elsewhere and its bus is the node's; in the initramfs there is no update_engine at all.
fn os_update(a: &Bootstrap, root: &Root) -> Result<Update> {
    let u = if a.upgrade_os && !a.dry_run {
        if !root.is_host() {
            log::warn!("--upgrade-os with --root {}: the update_engine asked is the one on this system bus", root.show("/"));
        }
        log::info!(
            "asking update_engine for an OS update (AttemptUpdate), waiting up to {}s",
            a.update_timeout
        );
        dbus::attempt_update(
            Duration::from_secs(a.update_timeout),
            Duration::from_secs(5),
        )?
    } else {
        dbus::update_status()?
    };
    match &u {
        Update::Unavailable(why) => {
            log::info!("no pending OS update: update_engine is not on the system bus ({why})")
        }
        Update::Pending(v) => log::info!("OS update to {v} pending a reboot (from update_engine)"),
        Update::PendingUnknown => log::warn!(
            "OS update pending a reboot, but update_engine does not say to which version"
        ),
        Update::None(op) => log::info!("no pending OS update (update_engine status {op})"),
    }
    Ok(u)
}

/// Fetches and authenticates package lists.
pub(crate) struct Manifests<'a> {
    pub http: &'a Http,
    pub template: &'a str,
    pub board: &'a str,
    pub keyring: Option<&'a Keyring>,
}

impl Manifests<'_> {
    fn url(&self, os_version: &str) -> Result<String> {
        render_url(self.template, self.board, os_version)
    }

    fn get(&self, os_version: &str) -> Result<PackageList> {
        let url = self.url(os_version)?;
        let body = self.http.fetch(&Request::get(&url), MANIFEST_CAP)?;
        match self.keyring {
            Some(k) => {
                let sig_url = format!("{url}.asc");
                let sig = self.http.fetch(&Request::get(&sig_url), SIGNATURE_CAP)?;
                let by = k.verify_detached(&body, &sig, &url)?;
                log::info!("manifest {url}: good signature by {by}");
            }
            None => log::warn!("manifest {url}: signature NOT checked (--no-verify-signatures)"),
        }
        PackageList::parse(&body, &url)
    }
}

/// Steps 5-8 (the hook's too). Returns the runtime version the profile now names, if torcx
/// was set up.
pub(crate) fn stage_runtime(
    root: &Root,
    m: &Manifests,
    current: &str,
    next: Option<&str>,
    wanted: &Wanted,
    profile_default: &str,
    dry_run: bool,
) -> Result<Option<String>> {
    // 5. The upcoming OS decides (we bet it will not roll back); the current one is staged
    //    too when it offers the same version.
    let primary = next.unwrap_or(current);
    if !torcx::supports_remote(primary) {
        log::warn!(
            "OS {primary} is older than {}: it has no torcx manifests; runtime left as shipped",
            torcx::MIN_REMOTE_OS
        );
        return Ok(None);
    }
    let list = m.get(primary)?;
    let (version, source) = wanted
        .versions
        .iter()
        .find_map(|v| list.source_for(RUNTIME, v).map(|s| (v.clone(), s)))
        .ok_or_else(|| {
            let offered = list.versions_of(RUNTIME);
            Error::failed(format!(
                "no suitable {RUNTIME} version for OS {primary}: {} maps to {}; manifest {} offers {}",
                wanted.source,
                bounded_list(wanted.versions.iter().map(String::as_str)),
                m.url(primary).unwrap_or_default(),
                bounded_list(offered.into_iter()),
            ))
        })?;
    log::info!("{RUNTIME} {version} chosen for OS {primary} (first of the mapped versions the manifest offers)");
    let mut targets = vec![(primary.to_string(), source)];
    if let Some(cur) = next.map(|_| current).filter(|c| torcx::supports_remote(c)) {
        match m.get(cur)?.source_for(RUNTIME, &version) {
            Some(s) => targets.push((cur.to_string(), s)),
            None => log::info!(
                "OS {cur} does not offer {RUNTIME} {version}: staging only for {primary}"
            ),
        }
    }

    // 6-7. Stage each image, verified, atomically.
    for (os, source) in &targets {
        let file = torcx::image_file(RUNTIME, &version);
        match source {
            Source::Vendored(p) => {
                log::info!("{file} for OS {os}: shipped in its /usr ({p}), nothing to download")
            }
            Source::Remote { url, digest } if dry_run => crate::outln!(
                "plan: fetch {url} ({digest}) into {}",
                root.show(&format!("{}/{os}/{file}", torcx::USER_STORE))
            )?,
            Source::Remote { url, digest } => {
                match torcx::stage_image(root, m.http, os, RUNTIME, &version, url, digest)? {
                    Staged::Kept => {
                        log::info!("{file} for OS {os}: already in the store with the right hash")
                    }
                    Staged::Copied(from) => {
                        log::info!("{file} for OS {os}: copied from {from} (hash verified)")
                    }
                    Staged::Downloaded(n) => {
                        log::info!(
                            "{file} for OS {os}: downloaded {n} bytes from {url}, hash verified"
                        )
                    }
                }
            }
        }
    }

    // 8. Profile and next-profile.
    let (profile, why) = torcx::choose_profile(root, profile_default)?;
    if dry_run {
        crate::outln!(
            "plan: profile {profile} ({why}) gets {RUNTIME}:{version}, selected as next-profile"
        )?;
    } else {
        torcx::set_profile_image(root, &profile, RUNTIME, &version)?;
        log::info!("profile {profile} ({why}) now names {RUNTIME}:{version}; next-profile set");
    }
    Ok(Some(version))
}

/// Write kubelet.env last; `Some` once it is in place (not in a dry run or without a path).
fn write_kubelet_env<'a>(
    root: &'a Root,
    a: &'a Bootstrap,
    k8s: &str,
) -> Result<Option<Marker<'a>>> {
    if a.kubelet_env_path.is_empty() {
        log::info!("--kubelet-env-path is empty: not writing kubelet.env");
        return Ok(None);
    }
    let name = root.show(&a.installer_kubelet_env);
    let text = root.read_text(&a.installer_kubelet_env)?.ok_or_else(|| {
        Error::failed(format!(
            "{name} does not exist: it is the template for kubelet.env"
        ))
    })?;
    let mut env = EnvFile::parse(&text, &name)?;
    env.set("KUBELET_IMAGE_TAG", &k8s.replace('+', "_"));
    let out = root.show(&a.kubelet_env_path);
    if a.dry_run {
        crate::outln!("plan: write {out}:\n{}", env.render().trim_end())?;
        return Ok(None);
    }
    let marker = Marker {
        root,
        path: &a.kubelet_env_path,
    };
    let (dir, file) = root.parent_of(&a.kubelet_env_path)?;
    let mut t = dir.create_temp(&file, 0o644)?;
    t.write_all(env.render().as_bytes())
        .map_err(|e| Error::failed(format!("writing {out}: {e}")))?;
    match t.persist_steps() {
        Ok(()) => {}
        Err((Persist::NotRenamed, e)) => return Err(e),
        // Visible but perhaps not durable: a done marker that may vanish or survive a crash
        // at random is no marker at all.
        Err((Persist::Renamed, e)) => return Err(marker.take_back(e)),
    }
    log::info!("wrote {out} (from {name}, KUBELET_IMAGE_TAG for {k8s})");
    Ok(Some(marker))
}

pub fn reboot_reasons(
    update: &Update,
    applied: Option<&Option<String>>,
    chosen: Option<&str>,
) -> Vec<String> {
    let mut r = Vec::new();
    if let Update::Pending(v) = update {
        r.push(format!("OS update to {v} is pending"));
    }
    // torcx applies profiles once per boot; if it already ran with another runtime, only a
    // reboot brings ours in. In the initramfs it has not run yet, so nothing is needed.
    if let (Some(applied), Some(chosen)) = (applied, chosen) {
        if applied.as_deref() != Some(chosen) {
            r.push(format!(
                "torcx applied {RUNTIME} {} in this boot, {chosen} is staged",
                applied.as_deref().unwrap_or("(none)")
            ));
        }
    }
    r
}

/// Whether the runtime torcx applied in this boot is not the one now staged, so docker's data
/// dir (which cannot be downgraded) must be wiped at the shutdown before the reboot. In the
/// initramfs torcx has not run (`applied` is `None`): nothing to wipe.
pub fn runtime_changes(applied: Option<&Option<String>>, chosen: Option<&str>) -> bool {
    matches!((applied, chosen), (Some(a), Some(c)) if a.as_deref() != Some(c))
}

/// Install the docker cleanup unit in /run and make systemd load it (only on the system we run
/// on: another root's systemd is not ours to reload).
fn install_cleanup(root: &Root, dry_run: bool) -> Result<()> {
    if dry_run {
        crate::outln!(
            "plan: install {} to wipe /var/lib/docker at shutdown",
            torcx::CLEANUP_UNIT
        )?;
        return Ok(());
    }
    torcx::install_cleanup_unit(root)?;
    log::info!(
        "installed {} in {}: /var/lib/docker is wiped at shutdown (docker cannot downgrade its data)",
        torcx::CLEANUP_UNIT,
        root.show("/run/systemd/system")
    );
    if root.is_host() {
        dbus::systemd_reload()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_templates() {
        assert_eq!(
            render_url(DEFAULT_MANIFEST_URL, "amd64-usr", "1632.3.0").unwrap(),
            "https://tectonic-torcx.release.core-os.net/manifests/amd64-usr/1632.3.0/torcx_manifest.json"
        );
        assert_eq!(
            render_url(
                "https://h/${COREOS_BOARD}/${VERSION_ID}/m.json",
                "arm64-usr",
                "1.2.3"
            )
            .unwrap(),
            "https://h/arm64-usr/1.2.3/m.json"
        );
        assert!(render_url("https://h/{{.Channel}}/m.json", "b", "v").is_err());
        assert!(render_url("file:///m.json", "b", "v").is_err());
    }

    #[test]
    fn reboot_only_when_needed() {
        let none = Update::None(dbus::IDLE.into());
        // initramfs: torcx has not run.
        assert!(reboot_reasons(&none, None, Some("17.06")).is_empty());
        // first boot: torcx applied the vendor runtime.
        assert_eq!(
            reboot_reasons(&none, Some(&Some("com.coreos.cl".into())), Some("17.06")).len(),
            1
        );
        assert!(reboot_reasons(&none, Some(&Some("17.06".into())), Some("17.06")).is_empty());
        assert!(reboot_reasons(&none, Some(&Some("com.coreos.cl".into())), None).is_empty());
        let pending = Update::Pending("1632.3.0".into());
        assert_eq!(
            reboot_reasons(&pending, None, None),
            vec!["OS update to 1632.3.0 is pending".to_string()]
        );
    }

    #[test]
    fn wipe_only_when_the_applied_runtime_differs() {
        let cl = Some("com.coreos.cl".to_string());
        let same = Some("17.03".to_string());
        assert!(runtime_changes(Some(&cl), Some("17.03")));
        assert!(runtime_changes(Some(&None), Some("17.03")));
        // An OS update with the same runtime: reboot, but keep /var/lib/docker.
        assert!(!runtime_changes(Some(&same), Some("17.03")));
        assert!(!runtime_changes(None, Some("17.03")));
        assert!(!runtime_changes(Some(&cl), None));
    }

    #[test]
    fn only_the_host_root_gets_the_real_rebooter() {
        let tmp = Root::open(&std::env::temp_dir()).unwrap();
        let host = Root::open(std::path::Path::new("/")).unwrap();
        // Constructing is harmless; none of these is ever asked to reboot here.
        assert!(!crate::reboot::for_run(&tmp, true, false).is_real());
        assert!(
            !crate::reboot::for_run(&host, true, true).is_real(),
            "--dry-run"
        );
        assert!(
            !crate::reboot::for_run(&host, false, false).is_real(),
            "--reboot=never"
        );
        assert!(crate::reboot::for_run(&host, true, false).is_real());
    }
}
