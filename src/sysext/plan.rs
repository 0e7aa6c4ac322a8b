//! Steps 3 to 5 and 11 of `nodestrap bootstrap --payload sysext` (sysext::bootstrap): what
//! each extension gets (Kubernetes by the cluster's version, the runtime by the mappings, or the
//! node's own left alone), the rollout hold, the dry run's plan, and the done marker.

use crate::cli::Bootstrap;
use crate::error::{Error, Result};
use crate::net::cluster;
use crate::node::mappings::Mappings;
use crate::node::marker;
use crate::node::root::Root;
use crate::node::status;
use crate::node::undo::Undo;
use crate::sysext::apply::{Applied, Step};
use crate::sysext::choose;
use crate::sysext::itself;
use crate::sysext::lists::Lists;
use crate::sysext::rollout::Rollout;
use crate::sysext::source::Source;
use crate::sysext::stage::{self, Link};
use crate::sysext::sums::Image;

const KUBERNETES: &str = "kubernetes";
/// Flatcar's own runtimes: while one is active, a second containerd is not merged over it.
const FLATCAR_RUNTIMES: [&str; 2] = ["containerd-flatcar", "docker-flatcar"];

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

/// Steps 3 and 4: what each extension gets, and the images to stage for it.
pub(crate) struct Plan {
    pub(crate) steps: Vec<Step>,
    /// nodestrap's own next release, with --self-update.
    pub(crate) itself: Option<itself::Update>,
    kubernetes: Outcome,
    runtime_name: &'static str,
    runtime: Outcome,
}

impl Plan {
    pub(crate) fn choose(
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
    pub(crate) fn staged(&self) -> Vec<&Image> {
        let own = self.itself.iter().map(|u| &u.img);
        self.steps.iter().map(|s| &s.img).chain(own).collect()
    }

    /// The chosen set, into the status record: what the boot check compares with what runs.
    pub(crate) fn record(&self) {
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
    pub(crate) fn held(&self, root: &Root, rollout: &Rollout) -> Result<Option<String>> {
        if self.changes(root)?.is_empty() {
            return Ok(None);
        }
        Ok(rollout.stops(crate::sysext::rollout::share_point(root)))
    }

    /// A held run: nothing changes, the record keeps the set that runs, exit 0.
    pub(crate) fn hold(&self, root: &Root, version: &cluster::Version, why: &str) -> Result<()> {
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
    pub(crate) fn print(
        &self,
        root: &Root,
        a: &Bootstrap,
        version: &cluster::Version,
    ) -> Result<()> {
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
    pub(crate) fn finish(
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
