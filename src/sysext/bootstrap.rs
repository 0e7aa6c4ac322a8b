//! `nodestrap bootstrap --payload sysext`: the Kubernetes image for the cluster's version and a
//! container runtime image, verified, staged in Flatcar's layout, and merged (on the running
//! system) or left for the real root's systemd-sysext to merge at boot (from the initramfs).
//! kubelet.env, the done marker, comes last (docs/bootstrap.md, "sysext").

use crate::cli::check::{check_options, SysextUrl};
use crate::cli::Bootstrap;
use crate::crypto::pkcs7::Cert;
use crate::error::{Error, Result};
use crate::net::cluster;
use crate::node::mappings::Mappings;
use crate::node::marker;
use crate::node::root::Root;
use crate::node::state_file::StateFile;
use crate::node::status;
use crate::node::undo::Undo;
use crate::sysext::boot_merge;
use crate::sysext::choose;
use crate::sysext::host::Host;
use crate::sysext::itself;
use crate::sysext::known_good::KnownGood;
use crate::sysext::lists::Lists;
use crate::sysext::merge::{self, Expect};
use crate::sysext::rollout::Rollout;
use crate::sysext::source::Source;
use crate::sysext::stage::{self, Link};
use crate::sysext::sums::{Image, Version};
use crate::sysext::trust::{Mode, Trust};

const KUBERNETES: &str = "kubernetes";
/// Flatcar's own runtimes: while one is active, a second containerd is not merged over it.
const FLATCAR_RUNTIMES: [&str; 2] = ["containerd-flatcar", "docker-flatcar"];
/// The unit that merges the staged images when the real root boots.
const SYSEXT_UNIT: &str = "systemd-sysext.service";

/// What happens to one extension name.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Stage(Image),
    /// The user's opt-out, a foreign link, or the node's own runtime (Flatcar's, or its OS's):
    /// never overridden.
    Left {
        word: &'static str,
    },
}

impl Outcome {
    fn word(&self) -> String {
        match self {
            Outcome::Stage(i) => i.label(),
            Outcome::Left { word } => word.to_string(),
        }
    }
}

/// One image to stage, with the directory it comes from.
struct Step {
    img: Image,
    dir_url: String,
}

/// `nodestrap bootstrap` with `--sysext-url`: its numbered steps (docs/bootstrap.md), one function
/// each.
pub fn run(a: &Bootstrap) -> Result<()> {
    // 0. Everything that can be checked without the node or the network: exit 2 if wrong.
    let root = Root::open(&a.root)?;
    check_options(a)?;
    let url = SysextUrl::parse(&a.sysext_url)?;
    // Before anything is read: a run that cannot mount says so first (a dry run mounts nothing).
    if !a.dry_run {
        crate::node::privilege::require(
            crate::node::privilege::Cap::SysAdmin,
            "bootstrap --payload sysext",
            "to mount each image read-only and check it as systemd-sysext will",
        )?;
    }
    let common = a.common();
    let keyring = common.keyring(&root)?;
    let http = common.http(&root)?;
    let source = Source::new(&http, common.registry(&root, &http)?);
    // Before anything checks a certificate or a signature.
    crate::node::clock::check(&root, std::time::Duration::from_secs(a.clock_wait))?;
    // 1. The node as systemd-sysext sees it, what earlier boots proved, and who vouches.
    let node = NodeFacts::read(&root, a)?;
    // 2. The cluster's version, from the same sources as the torcx payload.
    let (version, want, rollout) = cluster_version(&root, a)?;
    //    The minor this node may take: the one it runs, unless --kube-minor moves it.
    let (k8s, want) = node_minor(&root, a, &version, want)?;
    // 3-4. Choose: Kubernetes by that version, the runtime by the mappings.
    let downgrades = crate::cli::check::downgrades(&a.allow_downgrade)?;
    let lists = Lists {
        source: &source,
        url: &url,
        keyring: keyring.as_ref(),
        arch: node.host.arch,
        known: &node.known,
        downgrades: &downgrades,
        read: Default::default(),
        seen: Default::default(),
    };
    let plan = Plan::choose(&root, a, &k8s, want, &lists)?;
    //    The fleet's rollout setting, before anything changes.
    if let Some(why) = plan.held(&root, &rollout)? {
        return plan.hold(&root, &version, &why);
    }
    plan.record();
    // 5. The plan, for --dry-run.
    if a.dry_run {
        return plan.print(&root, a, &version);
    }
    // 6-11 change the node: every change goes through the undo log, so that a failure puts the
    //    node back as it was (links, images added, old sysupdate files, versions pruned,
    //    kubelet.env, and the merge), and a success deletes only what it set aside.
    let mut undo = Undo::new(&root);
    let run = Apply {
        root: &root,
        a,
        source: &source,
        host: &node.host,
        steps: &plan.steps,
        itself: plan.itself.as_ref(),
        known: &node.known,
        trust: &node.trust,
        live: root.is_host(),
    };
    let applied = run.apply(&mut undo).and_then(|applied| {
        lists
            .remember(&root, &plan.staged(), &mut undo)
            .map(|()| applied)
    });
    let restart =
        match applied.and_then(|applied| plan.finish(&root, a, &version, applied, &mut undo)) {
            Ok(restart) => restart,
            Err(e) => return Err(undo.undo(e)),
        };
    undo.commit();
    merge::restart_changed(&restart)
}

/// Step 1: what the run knows of the node before it asks anyone.
struct NodeFacts {
    host: Host,
    /// What earlier boots proved: images never to stage again, and the set to keep.
    known: KnownGood,
    trust: Trust,
}

impl NodeFacts {
    fn read(root: &Root, a: &Bootstrap) -> Result<Self> {
        let host = Host::read(root)?;
        crate::info!(
            "node ID={} VERSION_ID={} SYSEXT_LEVEL={} architecture {} (from {})",
            host.id,
            host.version_id.as_deref().unwrap_or("(none)"),
            host.sysext_level.as_deref().unwrap_or("(none)"),
            host.arch,
            host.source
        );
        let known = KnownGood::load(root)?;
        // Who vouches for the images on the disk; a node that cannot merge signed images is
        // refused here, before anything is staged.
        let trust = load_trust(root, a)?;
        trust.check_node(root)?;
        Ok(NodeFacts { host, known, trust })
    }
}

/// Step 2: the cluster's version, and how exactly the Kubernetes image must match it.
fn cluster_version(
    root: &Root,
    a: &Bootstrap,
) -> Result<(cluster::Version, choose::Want, Rollout)> {
    let common = a.common();
    let kube = if a.force_kube_version.is_some() {
        None
    } else {
        cluster::joined(root, a.joined_kubeconfigs(), common.api_retry())?
    };
    let before_join = a.before_join();
    let joining = if kube.is_none() && a.force_kube_version.is_none() {
        cluster::before_join(root, &before_join, common.api_retry(), || common.tls(root))?
    } else {
        None
    };
    let version = cluster::version(
        root,
        &a.version_sources(kube.as_ref(), joining.as_ref(), &before_join),
    )?;
    let want = match version.source {
        cluster::Source::Forced if crate::node::mappings::is_minor_only(&version.value) => {
            choose::Want::Minor
        }
        cluster::Source::Forced => choose::Want::Patch,
        _ => choose::Want::Cluster,
    };
    // A node already bootstrapped reads the fleet's rollout setting with the same client; the
    // API server is not asked again: its idle connection goes as this returns (see the torcx
    // payload).
    let bootstrapped = !a.kubelet_env_path.is_empty() && root.exists(&a.kubelet_env_path);
    let rollout = match &kube {
        Some(k) if bootstrapped => Rollout::read(k)?,
        Some(_) => Rollout::Open("a first bootstrap".into()),
        None => Rollout::Open(format!(
            "not asked: the version came from {}",
            version.source.word()
        )),
    };
    if let Rollout::Unread(why) = &rollout {
        crate::warn!(
            "rollout setting unread, going on without it: {why} (apply deploy/rollout.yaml so that nodes may read it)"
        );
    }
    Ok((version, want, rollout))
}

/// Step 2, its end: a node that has been bootstrapped (kubelet.env names its kubelet) stays at
/// its minor, taking patches only, when the cluster has moved on: a new minor is the operator's
/// act, after draining the node, as kubeadm's own upgrade order has it (`--kube-minor`).
/// Returns the version to choose by and how exactly.
fn node_minor(
    root: &Root,
    a: &Bootstrap,
    version: &cluster::Version,
    want: choose::Want,
) -> Result<(String, choose::Want)> {
    let minor = |v: &str| crate::node::mappings::minor_of(v).and_then(|m| Version::parse(&m));
    if version.source == cluster::Source::Forced {
        return Ok((version.value.clone(), want));
    }
    let Some(cluster_minor) = minor(&version.value) else {
        return Ok((version.value.clone(), want));
    };
    let env = root.show(&a.kubelet_env_path);
    let running = match a.kubelet_env_path.is_empty() {
        true => None,
        false => match root.read_text(&a.kubelet_env_path)? {
            Some(text) => crate::node::envfile::EnvFile::parse(&text, &env)?
                .get("KUBELET_VERSION")
                .and_then(minor),
            None => None,
        },
    };
    // --kube-minor's form was checked with the other options (cli::check).
    let (target, from) = match (a.kube_minor.as_deref().and_then(minor), running.clone()) {
        (Some(m), _) => (m, "--kube-minor".to_string()),
        (None, Some(r)) => (r, format!("the minor it runs, KUBELET_VERSION in {env}")),
        // A first bootstrap joins at the cluster's minor.
        (None, None) => return Ok((version.value.clone(), want)),
    };
    if target > cluster_minor {
        if a.kube_minor.is_some() {
            return Err(Error::config(format!(
                "--kube-minor v{target} is newer than the cluster's {}: a kubelet is never newer than its API server",
                version.value
            )));
        }
        return Ok((version.value.clone(), want));
    }
    if let Some(r) = running.filter(|r| *r != target) {
        crate::info!("moving this node from v{r} to v{target} ({from})");
    }
    status::decide("kube-minor", format_args!("v{target}"), &from);
    if target == cluster_minor {
        return Ok((version.value.clone(), want));
    }
    // Minors of one major: how many the node is behind.
    let behind = cluster_minor.0[1].saturating_sub(target.0[1]);
    let line = format!(
        "staying at v{target} ({from}) while the cluster is at {}: patches of v{target} only; to move this node, drain it, then run with --kube-minor v{cluster_minor} (kubeadm's order: control plane first, then each node drained)",
        version.value
    );
    if behind > 3 {
        crate::warn!(
            "{line}; v{target} is {behind} minors behind, outside the version-skew policy (3)"
        );
    } else {
        crate::info!("{line}");
    }
    Ok((format!("v{target}"), choose::Want::Minor))
}

/// Steps 3 and 4: what each extension gets, and the images to stage for it.
struct Plan {
    steps: Vec<Step>,
    /// nodestrap's own next release, with --self-update.
    itself: Option<itself::Update>,
    kubernetes: Outcome,
    runtime_name: &'static str,
    runtime: Outcome,
}

impl Plan {
    fn choose(
        root: &Root,
        a: &Bootstrap,
        k8s: &str,
        want: choose::Want,
        lists: &Lists,
    ) -> Result<Self> {
        let mut steps = Vec::new();
        let kubernetes = match left_alone(root, KUBERNETES)? {
            Some(o) => o,
            None => {
                let (list, dir_url) = lists.get(KUBERNETES)?;
                let (img, why) =
                    choose::kubernetes(k8s, want, &lists.offered(&list, KUBERNETES)?, &dir_url)
                        .map_err(|e| lists.below_floor(&list, KUBERNETES, k8s).unwrap_or(e))?;
                crate::info!(
                    "{KUBERNETES} {} chosen for a {k8s} cluster ({why})",
                    img.label()
                );
                status::decide(
                    KUBERNETES,
                    img.label(),
                    format_args!("{} ({why})", Source::shown(&dir_url, "SHA256SUMS")),
                );
                steps.push(Step {
                    img: img.clone(),
                    dir_url,
                });
                Outcome::Stage(img)
            }
        };
        let (runtime_name, runtime) = choose_runtime(root, a, k8s, lists, &mut steps)?;
        let itself = match a.self_update {
            true => itself::choose(root, lists)?,
            false => None,
        };
        Ok(Plan {
            steps,
            itself,
            kubernetes,
            runtime_name,
            runtime,
        })
    }

    /// Every release this run stages: their floors rise once it succeeds.
    fn staged(&self) -> Vec<&Image> {
        let own = self.itself.iter().map(|u| &u.img);
        self.steps.iter().map(|s| &s.img).chain(own).collect()
    }

    /// The chosen set, into the status record: what the boot check compares with what runs.
    fn record(&self) {
        for s in &self.steps {
            status::chosen(status::Chosen {
                name: s.img.name.clone(),
                version: s.img.label(),
                image: stage::image_path(&s.img),
                digest: s.img.digest.to_string(),
            });
        }
        status::phase(status::Phase::Chosen);
    }

    /// What the plan would change: each release whose image is not the one linked now, and
    /// nodestrap's own.
    fn changes(&self, root: &Root) -> Result<Vec<&Image>> {
        let links = root.dir(stage::LINKS)?;
        let relinked = self.steps.iter().filter(|s| {
            let target = links
                .as_ref()
                .and_then(|d| d.link_target(&format!("{}.raw", s.img.name)));
            target.as_deref() != Some(stage::image_path(&s.img).as_str())
        });
        let own = self.itself.iter().map(|u| &u.img);
        Ok(relinked.map(|s| &s.img).chain(own).collect())
    }

    /// Why the fleet's rollout setting keeps this node as it is, when the plan would change
    /// what it runs; `None` when it may go on.
    fn held(&self, root: &Root, rollout: &Rollout) -> Result<Option<String>> {
        if self.changes(root)?.is_empty() {
            return Ok(None);
        }
        Ok(rollout.stops(crate::sysext::rollout::share_point(root)))
    }

    /// A held run: nothing changes, the record keeps the set that runs, exit 0.
    fn hold(&self, root: &Root, version: &cluster::Version, why: &str) -> Result<()> {
        let next: Vec<String> = self
            .changes(root)?
            .iter()
            .map(|i| format!("{} {}", i.name, i.label()))
            .collect();
        crate::warn!(
            "not changing this node: {why} (it would take {})",
            next.join(", ")
        );
        status::decide("rollout", "held", why);
        // What runs stays merged as it is: the boot check after a held patch run checks it.
        status::decide("activation", "unchanged", format_args!("held: {why}"));
        status::keep_running_set();
        crate::outln!("nodestrap: sysext held k8s={} ({why})", version.value)
    }

    /// Step 5: what a run would do, and the marker a dry run writes where `--root` points.
    fn print(&self, root: &Root, a: &Bootstrap, version: &cluster::Version) -> Result<()> {
        for s in &self.steps {
            crate::outln!(
                "plan: fetch {}{} -> {}, check it as systemd-sysext would, link {}/{}.raw to it",
                s.dir_url,
                s.img.file,
                stage::image_path(&s.img),
                stage::LINKS,
                s.img.name
            )?;
        }
        if let Some(u) = &self.itself {
            crate::outln!(
                "plan: fetch {}{} -> {}, run it (--version), then rename it over {}",
                u.dir_url,
                u.img.file,
                root.show(itself::INSTALLED),
                itself::INSTALLED
            )?;
        }
        if !self.steps.is_empty() {
            crate::outln!(
                "plan: {}",
                if root.is_host() {
                    "systemd-sysext refresh, daemon-reload, then prove the merge"
                } else {
                    "leave the merge to the real root's systemd-sysext at boot"
                }
            )?;
        }
        write_marker(
            root,
            a,
            &self.kubernetes,
            &version.value,
            &mut Undo::new(root),
        )?;
        self.summary(version, "planned", "planned")
    }

    /// Step 11: the done marker, last; the summary after it (undone too if even that fails).
    /// The services to restart once the run is committed.
    fn finish(
        &self,
        root: &Root,
        a: &Bootstrap,
        version: &cluster::Version,
        applied: Applied,
        undo: &mut Undo,
    ) -> Result<Vec<(&'static str, String)>> {
        write_marker(root, a, &self.kubernetes, &version.value, undo)?;
        self.summary(version, "done", applied.activation)?;
        Ok(applied.restart)
    }

    fn summary(&self, version: &cluster::Version, state: &str, activation: &str) -> Result<()> {
        summary(
            version,
            &self.kubernetes,
            self.runtime_name,
            &self.runtime,
            state,
            activation,
        )
    }
}

/// Steps 6 to 10.
struct Apply<'a> {
    root: &'a Root,
    a: &'a Bootstrap,
    source: &'a Source<'a>,
    host: &'a Host,
    steps: &'a [Step],
    itself: Option<&'a itself::Update>,
    known: &'a KnownGood,
    trust: &'a Trust,
    live: bool,
}

/// What steps 6 to 10 did: the activation word, and the services to restart once the run is
/// done (unit, the version now merged).
struct Applied {
    activation: &'static str,
    restart: Vec<(&'static str, String)>,
}

impl<'a> Apply<'a> {
    /// Stage, link, drop old sysupdate files, prune, and merge; the activation word.
    fn apply(&self, undo: &mut Undo<'a>) -> Result<Applied> {
        let (root, steps) = (self.root, self.steps);
        // One run at a time switches links; what killed runs left (temp links, temp images in
        // any extension's store, whichever version the next run picks) goes first.
        stage::lock_links(undo)?;
        crate::node::temps::sweep(root);
        // Who merges at this boot, said before anything is fetched (in an initramfs only).
        let boot = (!self.live && in_initramfs()).then(|| {
            let m = boot_merge::plan();
            boot_merge::record(&m);
            m
        });
        // 6a. nodestrap's own release (--self-update), first: what follows may fail and
        //     put the installed copy back.
        if let Some(u) = self.itself {
            itself::apply(root, self.source, u, undo)?;
        }
        if steps.is_empty() {
            status::phase(status::Phase::Staged);
            status::decide("activation", "unchanged", "nothing staged");
            status::reboot(status::Reboot::No);
            return Ok(Applied {
                activation: "unchanged",
                restart: Vec::new(),
            });
        }
        // 6. Fetch and check every image before any link changes.
        for s in steps {
            stage::fetch_image(
                self.source,
                &s.dir_url,
                &s.img,
                self.host,
                self.trust,
                self.a.image_max_bytes(),
                undo,
            )?;
        }
        // The certificates and the policy, before any link names a signed image.
        self.trust.install(root, self.live, undo)?;
        if self.trust.mode == Mode::Signed {
            others_reported(root, steps, self.trust, self.host.arch)?;
        }

        // 7. Switch the links.
        let mut changed = Vec::new();
        for s in steps {
            if stage::switch_link(root, &s.img, undo)? {
                changed.push(&s.img);
            }
        }

        // 8-9. The sysupdate files of earlier versions go; versions beyond the kept ones are
        //      set aside (deleted once the run is done).
        for s in steps {
            stage::remove_transfers(root, &s.img.name, undo)?;
            // The known-good image stays: a boot check that fails returns to it.
            let good = self
                .known
                .image_of(&s.img.name)
                .and_then(|c| c.image.rsplit('/').next());
            let keep: Vec<&str> = std::iter::once(s.img.file.as_str()).chain(good).collect();
            stage::prune(root, &s.img.name, self.host.arch, &keep, undo)?;
        }

        // 10. Merge (running system) or leave it to the boot (initramfs).
        let mut restart = Vec::new();
        let activation = if self.live {
            let expect: Vec<Expect> = steps
                .iter()
                .map(|s| Expect {
                    name: &s.img.name,
                    label: s.img.label(),
                    version: s.img.version.to_string(),
                })
                .collect();
            // Nothing relinked and already merged at the chosen versions (a patch run with no
            // new patch): /usr is left alone, nothing restarts.
            let unchanged = changed.is_empty()
                && merge::prove(&expect)
                    .inspect_err(|e| crate::info!("merging again: {e}"))
                    .is_ok();
            if unchanged {
                "unchanged"
            } else {
                // Registered before the first refresh: whatever fails from here on merges the
                // previous extensions again once their links are back.
                let policy = self.trust.policy();
                undo.then_on_undo("the previous extensions are merged again", move || {
                    merge::refresh(policy)
                });
                merge::refresh(policy).and_then(|()| merge::prove(&expect))?;
                // What runs from the old images restarts once the run is done.
                restart = changed
                    .iter()
                    .filter_map(|img| merge::service_of(&img.name).map(|u| (u, img.label())))
                    .collect();
                "merged"
            }
        } else if let Some(boot_merge::Merge::Initramfs) = boot {
            let names: Vec<&str> = steps.iter().map(|s| s.img.name.as_str()).collect();
            if changed.is_empty() && boot_merge::holds(&self.a.root, &names) {
                crate::info!(
                    "no link changed: the initramfs merge already holds the staged images"
                );
            } else {
                // Registered before the restart: whatever fails from here on merges the
                // previous extensions again once their links are back.
                undo.then_on_undo(
                    "the initramfs merges the previous extensions again",
                    boot_merge::again,
                );
                boot_merge::run(&self.a.root, &names)?;
            }
            "merged"
        } else if let Some(boot_merge::Merge::Off(_)) = boot {
            "staged"
        } else {
            self.left_to_the_real_root();
            "staged"
        };

        status::phase(status::Phase::Staged);
        status::decide(
            "activation",
            activation,
            if activation == "unchanged" {
                "already merged at the chosen versions on the running system"
            } else if self.live {
                "systemd-sysext refresh on the running system"
            } else if activation == "merged" {
                "the initramfs's systemd-sysext-sysroot.service, before switch-root"
            } else {
                "the real root's systemd-sysext at boot"
            },
        );
        // sysext never reboots: the extensions merge without one.
        status::reboot(status::Reboot::No);
        Ok(Applied {
            activation,
            restart,
        })
    }
}

impl Apply<'_> {
    /// The boot merges what this run staged: say so, and whether anything will.
    fn left_to_the_real_root(&self) {
        if !sysext_unit_enabled(self.root) {
            crate::warn!(
                "{SYSEXT_UNIT} is not enabled in {}: nothing will merge the staged images at boot (enable it, as Flatcar does)",
                self.root.show("/etc/systemd/system/sysinit.target.wants")
            );
        }
        crate::info!("staged for the real root: its {SYSEXT_UNIT} merges them at boot");
    }
}

/// Whether this run is in an initramfs (systemd's own test: /etc/initrd-release).
fn in_initramfs() -> bool {
    std::path::Path::new("/etc/initrd-release").exists()
}

fn summary(
    version: &cluster::Version,
    kubernetes: &Outcome,
    runtime_name: &str,
    runtime: &Outcome,
    state: &str,
    activation: &str,
) -> Result<()> {
    crate::outln!(
        "nodestrap: sysext {state} k8s={} {KUBERNETES}={} {runtime_name}={} activation={activation}",
        version.value,
        kubernetes.word(),
        runtime.word()
    )
}

/// The runtime step: its name (for the summary) and what happens to it.
fn choose_runtime(
    root: &Root,
    a: &Bootstrap,
    k8s: &str,
    lists: &Lists,
    steps: &mut Vec<Step>,
) -> Result<(&'static str, Outcome)> {
    let name = root.show(&a.version_manifest);
    let m = match root.read_text(&a.version_manifest)? {
        Some(text) => Some(Mappings::parse(&text, &name)?),
        None => None,
    };
    let chosen = match &m {
        Some(m) => choose::runtime(m, k8s)?,
        None => None,
    };
    let Some((runtime, wanted)) = chosen else {
        return node_runtime(root, k8s, &name, m.as_ref());
    };
    let rt: &'static str = if runtime == "docker" {
        "docker"
    } else {
        "containerd"
    };
    for f in FLATCAR_RUNTIMES {
        if Link::of(root, f)?.active() {
            crate::info!(
                "{rt} not staged: Flatcar's own {f} is active in {} and ships the same units; mask it (link {f}.raw to /dev/null) to use {rt} from {}",
                root.show(stage::LINKS),
                name
            );
            status::decide(
                rt,
                "not staged",
                format_args!("Flatcar's own {f} is active"),
            );
            return Ok((rt, Outcome::Left { word: "flatcar" }));
        }
    }
    if let Some(o) = left_alone(root, rt)? {
        return Ok((rt, o));
    }
    let (list, dir_url) = lists.get(rt)?;
    let img = choose::runtime_image(rt, &wanted, &lists.offered(&list, rt)?, &dir_url)?;
    crate::info!(
        "{rt} {} chosen (mapped for Kubernetes {k8s} by {name})",
        img.label()
    );
    status::decide(
        rt,
        img.label(),
        format_args!(
            "{}, mapped for {k8s} by {name}",
            Source::shown(&dir_url, "SHA256SUMS")
        ),
    );
    steps.push(Step {
        img: img.clone(),
        dir_url,
    });
    Ok((rt, Outcome::Stage(img)))
}

/// The mappings name no runtime for this minor: the node must have one of its own (Flatcar's
/// containerd or docker extension, or a runtime its OS ships in /usr), or nothing is done: a
/// kubelet started on a node without a runtime never becomes Ready.
fn node_runtime(
    root: &Root,
    k8s: &str,
    name: &str,
    m: Option<&Mappings>,
) -> Result<(&'static str, Outcome)> {
    for f in FLATCAR_RUNTIMES {
        if Link::of(root, f)?.active() {
            crate::info!(
                "no runtime extension staged: the node runs Flatcar's own {f} (active in {})",
                root.show(stage::LINKS)
            );
            status::decide("runtime", "the node's own", format_args!("Flatcar's {f}"));
            return Ok(("runtime", Outcome::Left { word: "flatcar" }));
        }
    }
    let mut staged = None;
    for r in ["containerd", "docker"] {
        if matches!(Link::of(root, r)?, Link::Ours) {
            staged = Some(r);
            break;
        }
    }
    let shipped = ["/usr/bin/containerd", "/usr/bin/dockerd"]
        .into_iter()
        .find(|p| root.exists(p));
    if let (None, Some(p)) = (staged, shipped) {
        crate::info!(
            "no runtime extension staged: the node's OS ships {}",
            root.show(p)
        );
        status::decide(
            "runtime",
            "the node's own",
            format_args!("{}", root.show(p)),
        );
        return Ok(("runtime", Outcome::Left { word: "os" }));
    }
    let minor = crate::node::mappings::minor_of(k8s).unwrap_or_else(|| k8s.to_string());
    let mapped = match m {
        None => format!("{name} does not exist"),
        Some(m) => format!(
            "{name} maps no containerd or docker for {minor} (it maps {})",
            match m.minors() {
                v if v.is_empty() => "no minor".to_string(),
                v => v.join(", "),
            }
        ),
    };
    let own = match staged {
        Some(r) => format!(
            "the {r} nodestrap staged was mapped for another minor"
        ),
        None => format!(
            "the node has none of its own (Flatcar's containerd-flatcar and docker-flatcar are not active in {}, and its /usr holds neither containerd nor dockerd)",
            root.show(stage::LINKS)
        ),
    };
    Err(Error::config(format!(
        "no container runtime for Kubernetes {k8s}: {mapped}, and {own}"
    ))
    .hint(format_args!(
        "add a \"{minor}\" entry naming containerd's streams to {name}, or unmask Flatcar's containerd"
    )))
}

/// `Some` when the user's link for `name` must be respected.
fn left_alone(root: &Root, name: &str) -> Result<Option<Outcome>> {
    let (word, why) = match Link::of(root, name)? {
        Link::Masked(why) => {
            crate::info!("{name} not staged: the user opted out ({why})");
            warn_lower_copies(root, name);
            ("masked", format!("the user opted out ({why})"))
        }
        Link::Foreign(why) => {
            crate::warn!("{name} not staged: {why}, which nodestrap did not make; left alone");
            ("foreign", format!("{why}, not made by nodestrap"))
        }
        _ => return Ok(None),
    };
    status::decide(name, "not staged", why);
    Ok(Some(Outcome::Left { word }))
}

/// A /dev/null link does not hide a copy in a lower search directory (systemd-sysext reads
/// every directory of its search path; as tried with systemd 252).
fn warn_lower_copies(root: &Root, name: &str) {
    for d in ["/run/extensions", "/var/lib/extensions"] {
        let p = format!("{d}/{name}.raw");
        if root.exists(&p) {
            crate::warn!(
                "{} exists: systemd-sysext merges it despite the opt-out in /etc/extensions",
                root.show(&p)
            );
        }
    }
}

fn sysext_unit_enabled(root: &Root) -> bool {
    [
        "/etc/systemd/system/sysinit.target.wants/systemd-sysext.service",
        "/usr/lib/systemd/system/sysinit.target.wants/systemd-sysext.service",
    ]
    .iter()
    .any(|p| root.exists(p))
}

/// kubelet.env, the done marker, last.
fn write_marker(
    root: &Root,
    a: &Bootstrap,
    kubernetes: &Outcome,
    k8s: &str,
    undo: &mut Undo,
) -> Result<()> {
    let version = match kubernetes {
        Outcome::Stage(i) => i.label(),
        _ => k8s.to_string(),
    };
    let set = [("KUBELET_VERSION", version.as_str())];
    marker::write(
        root,
        &marker::Plan {
            path: &a.kubelet_env_path,
            template: &a.installer_kubelet_env,
            need: marker::Template::IfPresent,
            set: &set,
        },
        a.dry_run,
        undo,
    )
}

/// `--sysext-trust` and `--sysext-verity-certs`, recorded as the `sysext-trust` decision.
fn load_trust(root: &Root, a: &Bootstrap) -> Result<Trust> {
    let (certs, from) = match &a.sysext_verity_certs {
        Some(input) => {
            let pem = input.read(root, 1 << 20, "sysext-verity-certs")?;
            let label = input.label(root);
            (
                Cert::from_pem(&pem, &label).map_err(Error::config)?,
                input.name(root, "sysext-verity-certs"),
            )
        }
        None => (Vec::new(), "no --sysext-verity-certs".to_string()),
    };
    let t = Trust {
        mode: a.sysext_trust,
        certs,
        from,
        systemd: crate::sysext::trust::systemd_version(root),
    };
    crate::info!(
        "sysext trust {}: {} certificate(s) from {}{}",
        t.mode,
        t.certs.len(),
        t.from,
        t.policy()
            .map(|p| format!(", image policy {p}"))
            .unwrap_or_default()
    );
    status::decide(
        "sysext-trust",
        format_args!("{} ({} certificate(s))", t.mode, t.certs.len()),
        &t.from,
    );
    Ok(t)
}

/// Signed mode: the extensions in /etc/extensions that nodestrap does not manage are judged as
/// the strict policy will judge them and reported, never touched: one that systemd refuses (a
/// plain image, a DDI whose signer is not a configured certificate) makes the boot merge nothing
/// at all.
fn others_reported(root: &Root, steps: &[Step], trust: &Trust, arch: &str) -> Result<()> {
    let Some(d) = root.dir(stage::LINKS)? else {
        return Ok(());
    };
    for n in d.entries()? {
        let ours = steps.iter().any(|s| n == format!("{}.raw", s.img.name));
        if ours || n.starts_with('.') {
            continue;
        }
        // Each image's trust root in the record, as for the extensions nodestrap manages.
        let what = format!("{}-trust", n.strip_suffix(".raw").unwrap_or(&n));
        let verdict = match root.open_file(&format!("{}/{n}", stage::LINKS)) {
            Ok(Some(f)) => crate::sysext::ddi::judge(&f, arch, &trust.certs, trust.systemd),
            Ok(None) => Err("it names no file".to_string()),
            Err(e) => Err(e.to_string()),
        };
        match verdict {
            Ok(signer) => {
                let root_of = trust.root_of(signer);
                crate::info!(
                    "{}: not an extension nodestrap manages, left alone: a signed DDI, {root_of}",
                    d.show(&n)
                );
                status::decide(&what, format_args!("not managed: {root_of}"), d.show(&n));
            }
            Err(why) => {
                crate::warn!(
                    "{}: not an extension nodestrap manages, left alone; under the strict policy ({}) systemd will refuse it, and with it the boot's whole merge: {why}",
                    d.show(&n),
                    crate::sysext::trust::POLICY
                );
                status::decide(
                    &what,
                    format_args!("not managed: refused by the strict policy: {why}"),
                    d.show(&n),
                );
            }
        }
    }
    Ok(())
}
