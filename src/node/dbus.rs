//! The system D-Bus: update_engine (`com.coreos.update1`) and systemd's manager. zbus 6 has no
//! blocking API, so each operation is one `zbus::block_on` on the calling thread (no threads).

use std::time::{Duration, Instant};

use zbus::Connection;

use crate::error::{Error, Result};

#[zbus::proxy(
    interface = "com.coreos.update1.Manager",
    default_service = "com.coreos.update1",
    default_path = "/com/coreos/update1"
)]
trait UpdateEngine {
    fn attempt_update(&self) -> zbus::Result<()>;
    fn get_status(&self) -> zbus::Result<(i64, f64, String, String, i64)>;
    #[zbus(signal)]
    fn status_update(
        &self,
        last_checked_time: i64,
        progress: f64,
        current_operation: String,
        new_version: String,
        new_size: i64,
    ) -> zbus::Result<()>;
}

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1"
)]
trait Systemd {
    fn start_unit(&self, name: &str, mode: &str) -> zbus::Result<zbus::OwnedObjectPath>;
    fn reload(&self) -> zbus::Result<()>;
}

pub const NEED_REBOOT: &str = "UPDATE_STATUS_UPDATED_NEED_REBOOT";
pub const IDLE: &str = "UPDATE_STATUS_IDLE";

#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    pub operation: String,
    pub new_version: String,
    pub progress: f64,
}

impl From<(i64, f64, String, String, i64)> for Status {
    fn from(t: (i64, f64, String, String, i64)) -> Self {
        Status {
            progress: t.1,
            operation: t.2,
            new_version: t.3,
        }
    }
}

/// What update_engine says about the next OS version.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// No update_engine to ask (no system bus, or nobody owns the name): the reason.
    Unavailable(String),
    /// An update is installed and waits for a reboot.
    Pending(String),
    /// An update waits for a reboot, but update_engine does not know its version (it reports
    /// "0.0.0" after a restart).
    PendingUnknown,
    /// No update pending; the status it was in.
    None(String),
}

fn unavailable(e: &zbus::Error) -> bool {
    match e {
        zbus::Error::InputOutput(_) | zbus::Error::Address(_) | zbus::Error::Connection(..) => true,
        zbus::Error::MethodError(name, _, _) => matches!(
            name.as_str(),
            "org.freedesktop.DBus.Error.ServiceUnknown"
                | "org.freedesktop.DBus.Error.NameHasNoOwner"
                | "org.freedesktop.DBus.Error.UnknownObject"
        ),
        zbus::Error::FDO(f) => matches!(
            **f,
            zbus::fdo::Error::ServiceUnknown(_)
                | zbus::fdo::Error::NameHasNoOwner(_)
                | zbus::fdo::Error::UnknownObject(_)
        ),
        _ => false,
    }
}

fn classify(e: zbus::Error) -> Result<Update> {
    if unavailable(&e) {
        Ok(Update::Unavailable(e.to_string()))
    } else {
        Err(Error::failed(format!(
            "update_engine (com.coreos.update1 on the system bus): {e}"
        )))
    }
}

/// What a status says: `Ok(None)` while update_engine is still busy. A reboot-needed status
/// must name the version it installed: stores are staged for it.
fn verdict(s: &Status) -> Result<Option<Update>> {
    match s.operation.as_str() {
        NEED_REBOOT if s.new_version.is_empty() || s.new_version == "0.0.0" => Ok(Some(Update::PendingUnknown)),
        NEED_REBOOT if crate::node::root::plain_name(&s.new_version) => Ok(Some(Update::Pending(s.new_version.clone()))),
        NEED_REBOOT => Err(Error::failed(format!(
            "update_engine reports {NEED_REBOOT} with new_version {:?}, which is not a plain version",
            s.new_version
        ))),
        IDLE => Ok(Some(Update::None(s.operation.clone()))),
        _ => Ok(None),
    }
}

/// One `GetStatus`: the next version if an update waits for a reboot.
pub fn update_status() -> Result<Update> {
    let s = zbus::block_on(async {
        let conn = Connection::system().await?;
        let ue = UpdateEngineProxy::new(&conn).await?;
        Ok(Status::from(ue.get_status().await?))
    });
    match s {
        Ok(s) => Ok(verdict(&s)?.unwrap_or(Update::None(s.operation))),
        Err(e) => classify(e),
    }
}

/// `AttemptUpdate` and wait until update_engine settles (reboot needed, or idle), at most
/// `deadline`. Signals are subscribed to before the call so no transition is missed, and
/// `GetStatus` is polled every `poll` in case a signal is lost.
pub fn attempt_update(deadline: Duration, poll: Duration) -> Result<Update> {
    let r = zbus::block_on(async {
        let rt =
            zruntime::SharedRuntime::current().map_err(|e| zbus::Error::InputOutput(e.into()))?;
        let conn = Connection::system().await?;
        let ue = UpdateEngineProxy::new(&conn).await?;
        let mut signals = ue.receive_status_update().await?;
        ue.attempt_update().await?;
        // Signals emitted before our call was answered describe the old state: drop them and
        // take a fresh GetStatus as the starting point.
        while let Ok(Some(_)) = rt.timeout(Duration::ZERO, next(&mut signals)).await {}
        let end = Instant::now() + deadline;
        let mut status = Status::from(ue.get_status().await?);
        let mut last_logged = String::new();
        loop {
            if status.operation != last_logged {
                let pct = status.progress * 100.0;
                log::info!(
                    "update_engine: {} {} ({pct:.0}%)",
                    status.operation,
                    status.new_version
                );
                last_logged = status.operation.clone();
            }
            let now = Instant::now();
            if status.operation == NEED_REBOOT || status.operation == IDLE || now >= end {
                return Ok(status);
            }
            match rt.timeout(poll.min(end - now), next(&mut signals)).await {
                Ok(Some(sig)) => {
                    let a = sig.args()?;
                    status = Status {
                        operation: a.current_operation,
                        new_version: a.new_version,
                        progress: a.progress,
                    };
                }
                Ok(None) | Err(_) => status = Status::from(ue.get_status().await?),
            }
        }
    });
    let last = match r {
        Ok(s) => s,
        Err(e) => return classify(e),
    };
    verdict(&last)?.ok_or_else(|| {
        Error::failed(format!(
            "update_engine did not settle within {}s (last status {})",
            deadline.as_secs(),
            last.operation
        ))
    })
}

/// The next item of a stream (futures-util's `StreamExt::next`, which is not in our tree).
fn next<S: futures_core::Stream + Unpin>(
    s: &mut S,
) -> impl std::future::Future<Output = Option<S::Item>> + '_ {
    std::future::poll_fn(move |cx| std::pin::Pin::new(&mut *s).poll_next(cx))
}

/// `daemon-reload` through systemd on the system bus.
pub fn systemd_reload() -> Result<()> {
    zbus::block_on(async {
        let conn = Connection::system().await?;
        SystemdProxy::new(&conn).await?.reload().await
    })
    .map_err(|e| Error::failed(format!("systemd Reload over D-Bus: {e}")))
}

/// Queue `reboot.target`; the job cannot be cancelled by later jobs.
pub fn systemd_reboot() -> Result<String> {
    start_unit("reboot.target", "replace-irreversibly")
}

/// Start (or keep running) `unit` through systemd on the system bus.
pub fn systemd_start(unit: &str) -> Result<String> {
    start_unit(unit, "replace")
}

fn start_unit(unit: &str, mode: &str) -> Result<String> {
    zbus::block_on(async {
        let conn = Connection::system().await?;
        let job = SystemdProxy::new(&conn)
            .await?
            .start_unit(unit, mode)
            .await?;
        Ok::<_, zbus::Error>(job.to_string())
    })
    .map_err(|e| Error::failed(format!("systemd StartUnit({unit}) over D-Bus: {e}")))
}
