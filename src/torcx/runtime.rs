//! What bootstrap and the hook share: the node's OS (os-release), the versions wanted, signed
//! manifests, and staging the runtime image under the profile (docs/bootstrap.md, steps 5-8).

use crate::cli::check::ManifestUrl;
use crate::crypto::openpgp::Keyring;
use crate::error::{Error, Result};
use crate::net::fetch::{Failure, Request};
use crate::net::oci;
use crate::node::envfile::EnvFile;
use crate::node::floor::Version;
use crate::node::mappings::Mappings;
use crate::node::root::{plain_name, Root};
use crate::node::state_file::StateFile;
use crate::node::status;
use crate::node::undo::Undo;
use crate::torcx::floor::TorcxFloor;
use crate::torcx::layout::Layout;
use crate::torcx::store::{self, PackageList, Source, Staged};

pub(crate) const OS_RELEASE: &str = "/usr/lib/os-release";

pub(crate) const RUNTIME: &str = "docker";

const MANIFEST_CAP: u64 = 1 << 20;

const SIGNATURE_CAP: u64 = 64 << 10;

pub(crate) struct OsInfo {
    pub(crate) version: String,
    pub(crate) board: String,
    pub(crate) board_from_arch: bool,
}

impl OsInfo {
    pub(crate) fn read(root: &Root) -> Result<OsInfo> {
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
pub(crate) struct Wanted {
    pub(crate) versions: Vec<String>,
    pub(crate) source: String,
}

/// At most this many items of a list go into an error message.
const LIST_IN_ERRORS: usize = 20;

/// `a, b, c` of at most LIST_IN_ERRORS items, each cut to 64 characters, and how many more.
pub(crate) fn bounded_list<'a>(items: impl ExactSizeIterator<Item = &'a str>) -> String {
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
        if !plain_name(v) {
            return Err(Error::failed(format!(
                "{}: {RUNTIME} version {v:?} is not a plain version",
                mappings.source
            )));
        }
    }
    crate::info!(
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
pub(crate) struct Manifests<'a> {
    /// Manifests over https; images over https or from an OCI registry (`oci://` locations).
    pub(crate) registry: &'a oci::Client<'a>,
    pub(crate) template: &'a ManifestUrl,
    pub(crate) board: &'a str,
    pub(crate) keyring: Option<&'a Keyring>,
}

impl Manifests<'_> {
    fn url(&self, os_version: &str) -> Result<String> {
        self.template.render(self.board, os_version)
    }

    fn get(&self, os_version: &str) -> Result<PackageList> {
        let url = self.url(os_version)?;
        let body = match self
            .registry
            .http()
            .fetch_passing(&Request::get(&url), MANIFEST_CAP, &[404])
        {
            Ok(b) => b,
            Err(e) if e.class == Failure::Passed(404) => {
                return Err(e.error.hint(format!(
                    "no torcx manifest for OS {os_version} board {} there: check --torcx-manifest-url ({})",
                    self.board,
                    self.template.as_str()
                )))
            }
            Err(e) => return Err(e.into()),
        };
        match self.keyring {
            Some(k) => {
                let sig_url = format!("{url}.asc");
                let sig = self
                    .registry
                    .http()
                    .fetch(&Request::get(&sig_url), SIGNATURE_CAP)?;
                let by = k.verify_detached(&body, &sig, &url)?;
                crate::info!("manifest {url}: good signature by {by}");
            }
            None => crate::warn!("manifest {url}: signature NOT checked (--no-verify-signatures)"),
        }
        PackageList::parse(&body, &url)
    }
}

/// Where and how to stage (steps 5-8, shared by bootstrap and the hook).
pub(crate) struct Stage<'a> {
    pub(crate) layout: &'a Layout,
    pub(crate) current: &'a str,
    pub(crate) next: Option<&'a str>,
    pub(crate) profile_default: &'a str,
    /// Largest image taken, in bytes (`--image-max-mib`).
    pub(crate) cap: u64,
    /// `--allow-downgrade`: exact versions let through the version floor.
    pub(crate) downgrades: &'a [(String, String)],
    pub(crate) dry_run: bool,
}

/// Steps 5-8 (the hook's too), every change recorded in `undo`. Returns the runtime version the
/// profile now names, if torcx was set up.
pub(crate) fn stage_runtime(
    root: &Root,
    m: &Manifests,
    st: &Stage,
    wanted: &Wanted,
    undo: &mut Undo,
) -> Result<Option<String>> {
    let (current, next) = (st.current, st.next);
    // 5. The upcoming OS decides (we bet it will not roll back); the current one is staged
    //    too when it offers the same version.
    let primary = next.unwrap_or(current);
    if !store::supports_remote(primary) {
        crate::warn!(
            "OS {primary} is older than {}: it has no torcx manifests; runtime left as shipped",
            store::MIN_REMOTE_OS
        );
        return Ok(None);
    }
    let (version, source, floors) = choose(root, m, st, wanted, primary)?;
    let mut targets = vec![(primary.to_string(), source)];
    if let Some(cur) = next.map(|_| current).filter(|c| store::supports_remote(c)) {
        match m.get(cur)?.source_for(RUNTIME, &version) {
            Some(s) => targets.push((cur.to_string(), s)),
            None => crate::info!(
                "OS {cur} does not offer {RUNTIME} {version}: staging only for {primary}"
            ),
        }
    }
    // 6-7. Stage each image, verified, atomically, where torcx will take it from.
    for (os, source) in &targets {
        stage_one(root, m, st, &version, os, source, undo)?;
    }
    // 8. Profile and next-profile.
    set_profile(root, st, &version, floors, undo)?;
    Ok(Some(version))
}

/// Step 5: the first mapped version above the floor that `primary`'s manifest offers, where it
/// comes from, and the floors (raised in step 8).
fn choose(
    root: &Root,
    m: &Manifests,
    st: &Stage,
    wanted: &Wanted,
    primary: &str,
) -> Result<(String, Source, TorcxFloor)> {
    let list = m.get(primary)?;
    let floors = TorcxFloor::load(root)?;
    let candidates = above_floor(&floors, wanted, st.downgrades)?;
    let (version, source) = candidates
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
    crate::info!("{RUNTIME} {version} chosen for OS {primary} (first of the mapped versions the manifest offers)");
    status::decide(
        RUNTIME,
        &version,
        format_args!(
            "torcx manifest {} for OS {primary}, first of the mapped versions it offers",
            m.url(primary).unwrap_or_default()
        ),
    );
    status::phase(status::Phase::Chosen);
    Ok((version, source, floors))
}

/// Steps 6-7 for one OS: its image staged, verified, atomically, where torcx will take it from
/// (a plan line in a dry run; nothing when its /usr ships it or torcx takes another).
fn stage_one(
    root: &Root,
    m: &Manifests,
    st: &Stage,
    version: &str,
    os: &str,
    source: &Source,
    undo: &mut Undo,
) -> Result<()> {
    let file = store::image_file(RUNTIME, version);
    let at = format!("{}/{file}", st.layout.user_store(os));
    match source {
        Source::Vendored(p) => {
            crate::info!("{file} for OS {os}: shipped in its /usr ({p}), nothing to download")
        }
        Source::Remote { digest, .. }
            if torcx_takes_another(root, st, os, version, &at, digest)? => {}
        Source::Remote { url, digest } if st.dry_run => {
            crate::outln!("plan: fetch {url} ({digest}) into {}", root.show(&at))?
        }
        Source::Remote { url, digest } => {
            let w = store::Wanted {
                os_version: os,
                name: RUNTIME,
                version,
                url,
                digest,
                cap: st.cap,
            };
            let staged = store::stage_image(root, m.registry, st.layout, &w, undo)?;
            status::staged(&at, digest);
            match staged {
                Staged::Kept => {
                    crate::info!("{file} for OS {os}: already in the store with the right hash")
                }
                Staged::Copied(from) => {
                    crate::info!("{file} for OS {os}: copied from {from} (hash verified)")
                }
                Staged::Downloaded(n) => {
                    crate::info!(
                        "{file} for OS {os}: downloaded {n} bytes from {url}, hash verified"
                    )
                }
            }
        }
    }
    Ok(())
}

/// Step 8: the profile names `version` and is next-profile; the floor rises.
fn set_profile(
    root: &Root,
    st: &Stage,
    version: &str,
    floors: TorcxFloor,
    undo: &mut Undo,
) -> Result<()> {
    let (profile, why) = store::choose_profile(root, st.layout, st.profile_default)?;
    if st.dry_run {
        crate::outln!(
            "plan: profile {profile} ({why}) gets {RUNTIME}:{version}, selected as next-profile"
        )?;
    } else {
        store::keep_known_good(root, st.layout, undo)?;
        store::set_profile_image(root, st.layout, &profile, RUNTIME, version, undo)?;
        crate::info!(
            "profile {profile} ({why}) now names {RUNTIME}:{version}; next-profile set (torcx paths from {})",
            st.layout.source
        );
        status::decide("torcx-profile", &profile, why);
        raise_floor(root, floors, version, st.downgrades, undo)?;
    }
    Ok(())
}

/// The mapped versions not below the floor of the runtime's image, most preferred first: below
/// it only the exact version `--allow-downgrade` names. None left: an error naming the floor.
fn above_floor(
    floors: &TorcxFloor,
    wanted: &Wanted,
    downgrades: &[(String, String)],
) -> Result<Vec<String>> {
    let Some((floor, f)) = floors.floor.of(RUNTIME) else {
        return Ok(wanted.versions.clone());
    };
    let allowed = crate::node::floor::allowed(downgrades, RUNTIME);
    let (keep, below): (Vec<String>, Vec<String>) =
        wanted.versions.iter().cloned().partition(|v| {
            Version::parse(v).is_some_and(|x| x >= floor || allowed.as_ref() == Some(&x))
        });
    if below.is_empty() {
        return Ok(keep);
    }
    let why = format!(
        "{RUNTIME} {} below the version floor {} (staged at {}; {}) not considered; --allow-downgrade {RUNTIME}=VERSION lets one exact version through",
        bounded_list(below.iter().map(String::as_str)),
        f.version,
        f.at,
        crate::torcx::floor::PATH
    );
    if keep.is_empty() {
        return Err(Error::failed(format!(
            "{RUNTIME}: every version {} maps to is below the version floor: {why}",
            wanted.source
        )));
    }
    crate::info!("{why}");
    Ok(keep)
}

/// The staged version raises the floor, or, named by `--allow-downgrade` below it, lowers it
/// (logged and recorded). Through `undo`: a run that fails later leaves the file as it was.
fn raise_floor(
    root: &Root,
    mut floors: TorcxFloor,
    version: &str,
    downgrades: &[(String, String)],
    undo: &mut Undo,
) -> Result<()> {
    let Some(v) = Version::parse(version) else {
        return Ok(());
    };
    let before = floors.clone();
    let old = floors
        .floor
        .of(RUNTIME)
        .map(|(f, r)| (f, r.version.clone()));
    let lowered = old.as_ref().is_some_and(|(f, _)| v < *f)
        && crate::node::floor::allowed(downgrades, RUNTIME).as_ref() == Some(&v);
    if let Some((_, from)) = old.as_ref().filter(|_| lowered) {
        crate::warn!(
            "{RUNTIME} downgraded to {version} below its floor {from} (--allow-downgrade): the floor is lowered"
        );
        status::decide(
            "downgrade",
            format_args!("{RUNTIME} {version}"),
            format_args!("--allow-downgrade, below the floor {from}"),
        );
    }
    let at = status::rfc3339(std::time::SystemTime::now());
    floors.floor.staged(RUNTIME, &v, version, &at, lowered);
    if floors != before {
        undo.write(crate::torcx::floor::PATH, &floors.to_json()?, 0o644)?;
        crate::debug!("{} updated", root.show(crate::torcx::floor::PATH));
    }
    Ok(())
}

/// Whether torcx, booting OS `os`, would take `docker:<version>` from another archive than the
/// one nodestrap stages at `at` (a squashfs anywhere, or a tgz in a store it searches first).
/// Such an archive that matches the signed digest is as good as ours: nothing to stage. One
/// that does not is refused, naming it: staging ours would change nothing at boot.
fn torcx_takes_another(
    root: &Root,
    st: &Stage,
    os: &str,
    version: &str,
    at: &str,
    digest: &crate::crypto::digest::Digest,
) -> Result<bool> {
    let stores = st.layout.stores(os, os == st.current);
    let Some(found) = Layout::archive_for(root, &stores, RUNTIME, version, Some(at))? else {
        return Ok(false);
    };
    if found == at {
        return Ok(false);
    }
    let shown = root.show(&found);
    let matches = match root.open_file(&found)? {
        Some(f) => digest
            .matches(f)
            .map_err(|e| Error::from(e).context(shown.clone()))?,
        None => false,
    };
    if matches {
        crate::info!(
            "{RUNTIME}:{version} for OS {os}: torcx takes {shown}, which matches {} ({digest}): nothing to stage",
            crate::node::status::signed(crate::node::status::List::Manifest)
        );
        return Ok(true);
    }
    Err(Error::failed(format!(
        "torcx would take {RUNTIME}:{version} for OS {os} from {shown}, not from {} where nodestrap stages it \
         (torcx searches {} in this order, a squashfs before any tgz; paths from {}), and {shown} does not match \
         {} ({digest}); remove it, or change torcx's store_paths",
        root.show(at),
        stores.join(", "),
        st.layout.source,
        crate::node::status::signed(crate::node::status::List::Manifest)
    )))
}
