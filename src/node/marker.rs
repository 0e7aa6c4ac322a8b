//! kubelet.env, the done marker: written last, from the installer's kubelet.env as a template,
//! and taken back when the run fails after writing it, so the bootstrap unit runs again rather
//! than letting the kubelet start on a half-done node.

use std::io::Write as _;

use crate::error::{Error, Result};
use crate::node::envfile::EnvFile;
use crate::node::root::{Persist, Root};

/// Whether the template must exist: torcx nodes always had one from the installer; a sysext
/// node (Flatcar) may have none, and then the marker holds only what this run sets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Template {
    Required,
    IfPresent,
}

/// What to write: `path` from `template`, with `set` applied.
pub struct Plan<'a> {
    pub path: &'a str,
    pub template: &'a str,
    pub need: Template,
    pub set: &'a [(&'a str, &'a str)],
}

/// kubelet.env written by this run, taken back when the run fails after writing it.
pub struct Marker<'a> {
    root: &'a Root,
    path: String,
}

impl Marker<'_> {
    /// Remove the marker (and fsync its directory); the run's error says so.
    pub fn take_back(&self, e: Error) -> Error {
        match self.root.remove(&self.path) {
            Ok(()) => e.context(format!(
                "removed {} again so bootstrap runs again",
                self.root.show(&self.path)
            )),
            Err(r) => {
                log::error!("{r}");
                e.context(format!(
                    "could NOT remove {}; remove it before kubelet starts",
                    self.root.show(&self.path)
                ))
            }
        }
    }
}

/// Write the marker; `Some` once it is in place (not in a dry run, which prints it as a plan,
/// nor with an empty path).
pub fn write<'r>(root: &'r Root, p: &Plan, dry_run: bool) -> Result<Option<Marker<'r>>> {
    if p.path.is_empty() {
        log::info!("--kubelet-env-path is empty: not writing kubelet.env");
        return Ok(None);
    }
    let name = root.show(p.template);
    let mut env = match (root.read_text(p.template)?, p.need) {
        (Some(text), _) => EnvFile::parse(&text, &name)?,
        (None, Template::IfPresent) => EnvFile::parse("", &name)?,
        (None, Template::Required) => {
            return Err(Error::failed(format!(
                "{name} does not exist: it is the template for kubelet.env"
            )))
        }
    };
    for (k, v) in p.set {
        env.set(k, v);
    }
    let out = root.show(p.path);
    if dry_run {
        crate::outln!("plan: write {out}:\n{}", env.render().trim_end())?;
        return Ok(None);
    }
    let marker = Marker {
        root,
        path: p.path.to_string(),
    };
    let (dir, file) = root.parent_of(p.path)?;
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
    let keys: Vec<&str> = p.set.iter().map(|(k, _)| *k).collect();
    let boot = since_boot();
    log::info!(
        "wrote {out} (from {name}, setting {}) {:.1} s after boot",
        keys.join(", "),
        boot.as_secs_f64()
    );
    crate::node::status::marker(p.path, boot);
    crate::node::status::phase(crate::node::status::Phase::Marker);
    Ok(Some(marker))
}

/// Time since the kernel started (CLOCK_BOOTTIME: the same as now less /proc/stat's btime, but
/// immune to the wall clock being set meanwhile): how long the node waited for its kubelet.
pub fn since_boot() -> std::time::Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    std::time::Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}
