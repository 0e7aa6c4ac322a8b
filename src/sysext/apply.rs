//! Steps 6 to 10 of `nodestrap bootstrap --payload sysext` (sysext::bootstrap): stage, link, drop
//! old sysupdate files, prune, and merge, every change through the undo log.

use crate::error::Result;
use crate::node::root::Root;
use crate::node::status;
use crate::node::undo::Undo;
use crate::sysext::boot_merge;
use crate::sysext::host::Host;
use crate::sysext::itself;
use crate::sysext::known_good::KnownGood;
use crate::sysext::merge::{self, Expect};
use crate::sysext::source::Source;
use crate::sysext::stage;
use crate::sysext::sums::Image;
use crate::sysext::trust::{Mode, Trust};

/// The unit that merges the staged images when the real root boots.
const SYSEXT_UNIT: &str = "systemd-sysext.service";

/// One image to stage, with the directory it comes from.
pub(crate) struct Step {
    pub(crate) img: Image,
    pub(crate) dir_url: String,
}

/// Steps 6 to 10.
pub(crate) struct Apply<'a> {
    pub(crate) root: &'a Root,
    pub(crate) a: &'a crate::cli::Bootstrap,
    pub(crate) source: &'a Source<'a>,
    pub(crate) host: &'a Host,
    pub(crate) steps: &'a [Step],
    pub(crate) itself: Option<&'a itself::Update>,
    pub(crate) known: &'a KnownGood,
    pub(crate) trust: &'a Trust,
    pub(crate) live: bool,
}

/// What steps 6 to 10 did: the activation word, and the services to restart once the run is
/// done (unit, the version now merged).
pub(crate) struct Applied {
    pub(crate) activation: &'static str,
    pub(crate) restart: Vec<(&'static str, String)>,
}

impl<'a> Apply<'a> {
    /// Stage, link, drop old sysupdate files, prune, and merge; the activation word.
    pub(crate) fn apply(&self, undo: &mut Undo<'a>) -> Result<Applied> {
        // One run at a time switches links; what killed runs left (temp links, temp images in
        // any extension's store, whichever version the next run picks) goes first.
        stage::lock_links(undo)?;
        crate::node::temps::sweep(self.root);
        // Who merges at this boot, said before anything is fetched (in an initramfs only).
        let boot = (!self.live && in_initramfs()).then(|| {
            let m = boot_merge::plan();
            boot_merge::record(&m);
            m
        });
        // 6a. nodestrap's own release (--self-update), first: what follows may fail and
        //     put the installed copy back.
        if let Some(u) = self.itself {
            itself::apply(self.root, self.source, u, undo)?;
        }
        if self.steps.is_empty() {
            status::phase(status::Phase::Staged);
            status::decide("activation", "unchanged", "nothing staged");
            status::reboot(status::Reboot::No);
            return Ok(Applied {
                activation: "unchanged",
                restart: Vec::new(),
            });
        }
        // 6. Fetch and check every image before any link changes.
        self.fetch(undo)?;
        // 7. Switch the links.
        let changed = self.switch_links(undo)?;
        // 8-9. The sysupdate files of earlier versions go; versions beyond the kept ones are
        //      set aside (deleted once the run is done).
        self.drop_old(undo)?;
        // 10. Merge (running system) or leave it to the boot (initramfs).
        let applied = if self.live {
            self.merge_live(&changed, undo)?
        } else if let Some(boot_merge::Merge::Initramfs) = boot {
            self.merge_in_initramfs(&changed, undo)?
        } else if let Some(boot_merge::Merge::Off(_)) = boot {
            staged()
        } else {
            self.left_to_the_real_root();
            staged()
        };
        self.record(applied.activation);
        Ok(applied)
    }

    /// Step 6: every image fetched and checked; then the certificates and the policy, before
    /// any link names a signed image.
    fn fetch(&self, undo: &mut Undo<'a>) -> Result<()> {
        for s in self.steps {
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
        self.trust.install(self.root, self.live, undo)?;
        if self.trust.mode == Mode::Signed {
            others_reported(self.root, self.steps, self.trust, self.host.arch)?;
        }
        Ok(())
    }

    /// Step 7: the links switched; the images whose link changed.
    fn switch_links(&self, undo: &mut Undo<'a>) -> Result<Vec<&'a Image>> {
        let mut changed = Vec::new();
        for s in self.steps {
            if stage::switch_link(self.root, &s.img, undo)? {
                changed.push(&s.img);
            }
        }
        Ok(changed)
    }

    /// Steps 8 and 9: each extension's old sysupdate files removed and its versions beyond the
    /// kept ones set aside.
    fn drop_old(&self, undo: &mut Undo<'a>) -> Result<()> {
        for s in self.steps {
            stage::remove_transfers(self.root, &s.img.name, undo)?;
            // The known-good image stays: a boot check that fails returns to it.
            let good = self
                .known
                .image_of(&s.img.name)
                .and_then(|c| c.image.rsplit('/').next());
            let keep: Vec<&str> = std::iter::once(s.img.file.as_str()).chain(good).collect();
            stage::prune(self.root, &s.img.name, self.host.arch, &keep, undo)?;
        }
        Ok(())
    }

    /// Step 10 on the running system: systemd-sysext refresh, unless what is merged already is
    /// the chosen set.
    fn merge_live(&self, changed: &[&Image], undo: &mut Undo<'a>) -> Result<Applied> {
        let expect: Vec<Expect> = self
            .steps
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
            return Ok(Applied {
                activation: "unchanged",
                restart: Vec::new(),
            });
        }
        // Registered before the first refresh: whatever fails from here on merges the
        // previous extensions again once their links are back.
        let policy = self.trust.policy();
        undo.then_on_undo("the previous extensions are merged again", move || {
            merge::refresh(policy)
        });
        merge::refresh(policy).and_then(|()| merge::prove(&expect))?;
        // What runs from the old images restarts once the run is done.
        let restart = changed
            .iter()
            .filter_map(|img| merge::service_of(&img.name).map(|u| (u, img.label())))
            .collect();
        Ok(Applied {
            activation: "merged",
            restart,
        })
    }

    /// Step 10 in an initramfs whose systemd-sysext-sysroot.service merges: restarted, unless
    /// its merge already holds the staged images.
    fn merge_in_initramfs(&self, changed: &[&Image], undo: &mut Undo<'a>) -> Result<Applied> {
        let names: Vec<&str> = self.steps.iter().map(|s| s.img.name.as_str()).collect();
        if changed.is_empty() && boot_merge::holds(&self.a.root, &names) {
            crate::info!("no link changed: the initramfs merge already holds the staged images");
        } else {
            // Registered before the restart: whatever fails from here on merges the
            // previous extensions again once their links are back.
            undo.then_on_undo(
                "the initramfs merges the previous extensions again",
                boot_merge::again,
            );
            boot_merge::run(&self.a.root, &names)?;
        }
        Ok(Applied {
            activation: "merged",
            restart: Vec::new(),
        })
    }

    /// Step 10's end: the activation into the status record.
    fn record(&self, activation: &str) {
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
    }

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

/// Staged, for the boot to merge: nothing restarts.
fn staged() -> Applied {
    Applied {
        activation: "staged",
        restart: Vec::new(),
    }
}

/// Whether this run is in an initramfs (systemd's own test: /etc/initrd-release).
fn in_initramfs() -> bool {
    std::path::Path::new("/etc/initrd-release").exists()
}

fn sysext_unit_enabled(root: &Root) -> bool {
    [
        "/etc/systemd/system/sysinit.target.wants/systemd-sysext.service",
        "/usr/lib/systemd/system/sysinit.target.wants/systemd-sysext.service",
    ]
    .iter()
    .any(|p| root.exists(p))
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
