//! The system D-Bus: update_engine (`com.coreos.update1`) and systemd's manager. zbus 6 has no
//! blocking API, so each operation is one `zbus::block_on` on the calling thread (no threads).

use std::time::{Duration, Instant};

use zbus::Connection;

use crate::error::{Error, Result};

// Plain method calls and one match rule rather than zbus' generated proxies: the same wire
// messages for less code in a size-capped binary.
const UE_SERVICE: &str = "com.coreos.update1";
const UE_PATH: &str = "/com/coreos/update1";
const UE_IFACE: &str = "com.coreos.update1.Manager";
const SD_SERVICE: &str = "org.freedesktop.systemd1";
const SD_PATH: &str = "/org/freedesktop/systemd1";
const SD_IFACE: &str = "org.freedesktop.systemd1.Manager";

/// `GetStatus` and the `StatusUpdate` signal: (last checked time, progress, current
/// operation, new version, new size).
type RawStatus = (i64, f64, String, String, i64);

async fn get_status(conn: &Connection) -> zbus::Result<RawStatus> {
    conn.call_method(Some(UE_SERVICE), UE_PATH, Some(UE_IFACE), "GetStatus", &())
        .await?
        .body()
        .deserialize()
}

async fn call_systemd<B, R>(method: &str, body: &B) -> zbus::Result<R>
where
    B: serde::Serialize + zbus::zvariant::DynamicType,
    R: for<'d> zbus::zvariant::DynamicDeserialize<'d>,
{
    let conn = Connection::system().await?;
    conn.call_method(Some(SD_SERVICE), SD_PATH, Some(SD_IFACE), method, body)
        .await?
        .body()
        .deserialize()
}

pub const NEED_REBOOT: &str = "UPDATE_STATUS_UPDATED_NEED_REBOOT";
pub const IDLE: &str = "UPDATE_STATUS_IDLE";

#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    pub operation: String,
    pub new_version: String,
    pub progress: f64,
}

impl From<RawStatus> for Status {
    fn from(t: RawStatus) -> Self {
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
        Ok(Status::from(get_status(&conn).await?))
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
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender(UE_SERVICE)
            .path(UE_PATH)
            .interface(UE_IFACE)
            .member("StatusUpdate")
            .build()?;
        let mut signals = zbus::MessageStream::for_match_rule(rule, &conn, None).await?;
        conn.call_method(
            Some(UE_SERVICE),
            UE_PATH,
            Some(UE_IFACE),
            "AttemptUpdate",
            &(),
        )
        .await?;
        // Signals emitted before our call was answered describe the old state: drop them and
        // take a fresh GetStatus as the starting point.
        while let Ok(Some(_)) = rt.timeout(Duration::ZERO, next(&mut signals)).await {}
        let end = Instant::now() + deadline;
        let mut status = Status::from(get_status(&conn).await?);
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
                Ok(Some(sig)) => status = Status::from(sig?.body().deserialize::<RawStatus>()?),
                Ok(None) | Err(_) => status = Status::from(get_status(&conn).await?),
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
    zbus::block_on(call_systemd::<_, ()>("Reload", &()))
        .map_err(|e| Error::failed(format!("systemd Reload over D-Bus: {e}")))
}

/// Queue `reboot.target`; the job cannot be cancelled by later jobs.
pub fn systemd_reboot() -> Result<String> {
    start_unit("reboot.target", "replace-irreversibly")
}

/// Restart `unit` if it runs (systemctl try-restart); a unit that does not run stays stopped.
pub fn systemd_try_restart(unit: &str) -> Result<String> {
    zbus::block_on(call_systemd::<_, zbus::OwnedObjectPath>(
        "TryRestartUnit",
        &(unit, "replace"),
    ))
    .map(|job| job.to_string())
    .map_err(|e| Error::failed(format!("systemd TryRestartUnit({unit}) over D-Bus: {e}")))
}

/// Start (or keep running) `unit` through systemd on the system bus.
pub fn systemd_start(unit: &str) -> Result<String> {
    start_unit(unit, "replace")
}

fn start_unit(unit: &str, mode: &str) -> Result<String> {
    zbus::block_on(call_systemd::<_, zbus::OwnedObjectPath>(
        "StartUnit",
        &(unit, mode),
    ))
    .map(|job| job.to_string())
    .map_err(|e| Error::failed(format!("systemd StartUnit({unit}) over D-Bus: {e}")))
}
