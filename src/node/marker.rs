//! kubelet.env, the done marker: written last, from the installer's kubelet.env as a template,
//! through the run's undo log, so that a run failing after writing it puts the earlier one back
//! (or none): the bootstrap unit runs again rather than letting the kubelet start on a
//! half-done node.

use crate::error::Result;
use crate::node::envfile::EnvFile;
use crate::node::root::Root;
use crate::node::undo::Undo;

/// Whether the template must exist: torcx nodes always had one from the installer; a sysext
/// node (Flatcar) may have none, and then the marker holds only what this run sets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Template {
    Required,
    IfPresent,
}

/// What to write: `path` from `template`, with `set` applied.
pub(crate) struct Plan<'a> {
    pub(crate) path: &'a str,
    pub(crate) template: &'a str,
    pub(crate) need: Template,
    pub(crate) set: &'a [(&'a str, &'a str)],
}

/// Write the marker (not in a dry run, which prints it as a plan, nor with an empty path).
pub(crate) fn write(root: &Root, p: &Plan, dry_run: bool, undo: &mut Undo) -> Result<()> {
    if p.path.is_empty() {
        crate::info!("--kubelet-env-path is empty: not writing kubelet.env");
        return Ok(());
    }
    let name = root.show(p.template);
    let (mut env, from) = match (root.read_text(p.template)?, p.need) {
        (Some(text), _) => (EnvFile::parse(&text, &name)?, format!("from {name}")),
        // Without a template the file holds only what this run sets: new, or written anew.
        (None, Template::IfPresent) => (
            EnvFile::parse("", &name)?,
            match root.exists(p.path) {
                true => format!("written anew, no template: there is no {name}"),
                false => format!("a new file: there is no {name}"),
            },
        ),
        (None, Template::Required) => {
            return Err(crate::error::Error::failed(format!(
                "{name} does not exist: it is the template for kubelet.env"
            )))
        }
    };
    for (k, v) in p.set {
        env.set(k, v);
    }
    let out = root.show(p.path);
    if dry_run {
        crate::outln!("plan: write {out} ({from}):\n{}", env.render().trim_end())?;
        return Ok(());
    }
    // Visible but perhaps not durable when only the directory's fsync failed: a done marker
    // that may vanish or survive a crash at random is no marker at all, so that is undone too.
    undo.write_noted(
        p.path,
        env.render().as_bytes(),
        0o644,
        Some("so bootstrap runs again"),
    )?;
    let keys: Vec<&str> = p.set.iter().map(|(k, _)| *k).collect();
    let boot = crate::node::run::since_boot();
    crate::info!(
        "wrote {out} ({from}, setting {}) {:.1} s after boot",
        keys.join(", "),
        boot.as_secs_f64()
    );
    crate::node::status::marker(p.path, boot);
    crate::node::status::phase(crate::node::status::Phase::Marker);
    Ok(())
}
