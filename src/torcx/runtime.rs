//! What bootstrap and the hook share: the node's OS (os-release), the versions wanted, signed
//! manifests, and staging the runtime image under the profile (docs/bootstrap.md, steps 5-8).

use crate::cli::check::ManifestUrl;
use crate::crypto::openpgp::Keyring;
use crate::error::{Error, Result};
use crate::net::fetch::{Http, Request};
use crate::node::envfile::EnvFile;
use crate::node::mappings::Mappings;
use crate::node::root::{plain_name, Root};
use crate::node::status;
use crate::torcx::store::{self, PackageList, Source, Staged};

pub const OS_RELEASE: &str = "/usr/lib/os-release";

pub const RUNTIME: &str = "docker";

const MANIFEST_CAP: u64 = 1 << 20;

const SIGNATURE_CAP: u64 = 64 << 10;

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
        if !plain_name(&version) {
            return Err(Error::failed(format!(
                "{name}: VERSION_ID {version:?} is not a plain version"
            )));
        }
        // torcx's generator takes the first `VERSION_ID=` line's value raw (parseOsVersionID:
        // no unquoting, no trimming) to name the store it searches. Staged under any other
        // name, the runtime would not be found at boot; staged under the quoted one, the next
        // OS's store would be a guess. Container Linux never quotes it, so refuse and say why.
        let raw = text
            .split('\n')
            .map(|l| l.strip_suffix('\r').unwrap_or(l))
            .find_map(|l| l.strip_prefix("VERSION_ID="));
        if let Some(raw) = raw.filter(|r| *r != version) {
            return Err(Error::failed(format!(
                "{name}: VERSION_ID is written {raw:?}: torcx reads it without removing quotes or \
                 blanks and would search the store /var/lib/torcx/store/{raw}, not .../{version}; \
                 write it unquoted (VERSION_ID={version}) as Container Linux does"
            )));
        }
        let (board, board_from_arch) = match env.get("COREOS_BOARD").filter(|b| !b.is_empty()) {
            Some(b) if plain_name(b) => (b.to_string(), false),
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

/// The runtime versions the mappings give for a Kubernetes version, most preferred first, and
/// where they come from (for the error when the manifest offers none of them).
pub struct Wanted {
    pub versions: Vec<String>,
    pub source: String,
}

/// At most this many items of a list go into an error message.
const LIST_IN_ERRORS: usize = 20;

/// `a, b, c` of at most LIST_IN_ERRORS items, each cut to 64 characters, and how many more.
pub fn bounded_list<'a>(items: impl ExactSizeIterator<Item = &'a str>) -> String {
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
pub fn pick_versions(mappings: &Mappings, k8s: &str) -> Result<Wanted> {
    let wanted = mappings.runtime_for(k8s, RUNTIME)?;
    for v in &wanted {
        if !plain_name(v) {
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
    status::decide("runtime-mappings", wanted.join(", "), &mappings.source);
    Ok(Wanted {
        versions: wanted,
        source: mappings.source.clone(),
    })
}

/// Fetches and authenticates package lists.
pub struct Manifests<'a> {
    pub http: &'a Http,
    pub template: &'a ManifestUrl,
    pub board: &'a str,
    pub keyring: Option<&'a Keyring>,
}

impl Manifests<'_> {
    fn url(&self, os_version: &str) -> Result<String> {
        self.template.render(self.board, os_version)
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
pub fn stage_runtime(
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
    if !store::supports_remote(primary) {
        log::warn!(
            "OS {primary} is older than {}: it has no torcx manifests; runtime left as shipped",
            store::MIN_REMOTE_OS
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
    status::decide(
        RUNTIME,
        &version,
        format_args!(
            "torcx manifest {} for OS {primary}, first of the mapped versions it offers",
            m.url(primary).unwrap_or_default()
        ),
    );
    status::phase(status::Phase::Chosen);
    let mut targets = vec![(primary.to_string(), source)];
    if let Some(cur) = next.map(|_| current).filter(|c| store::supports_remote(c)) {
        match m.get(cur)?.source_for(RUNTIME, &version) {
            Some(s) => targets.push((cur.to_string(), s)),
            None => log::info!(
                "OS {cur} does not offer {RUNTIME} {version}: staging only for {primary}"
            ),
        }
    }

    // 6-7. Stage each image, verified, atomically.
    for (os, source) in &targets {
        let file = store::image_file(RUNTIME, &version);
        let at = format!("{}/{os}/{file}", store::USER_STORE);
        match source {
            Source::Vendored(p) => {
                log::info!("{file} for OS {os}: shipped in its /usr ({p}), nothing to download")
            }
            Source::Remote { url, digest } if dry_run => {
                crate::outln!("plan: fetch {url} ({digest}) into {}", root.show(&at))?
            }
            Source::Remote { url, digest } => {
                let staged = store::stage_image(root, m.http, os, RUNTIME, &version, url, digest)?;
                status::staged(&at, digest);
                match staged {
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
    let (profile, why) = store::choose_profile(root, profile_default)?;
    if dry_run {
        crate::outln!(
            "plan: profile {profile} ({why}) gets {RUNTIME}:{version}, selected as next-profile"
        )?;
    } else {
        store::set_profile_image(root, &profile, RUNTIME, &version)?;
        log::info!("profile {profile} ({why}) now names {RUNTIME}:{version}; next-profile set");
        status::decide("torcx-profile", &profile, why);
    }
    Ok(Some(version))
}
