//! The system D-Bus: update_engine (`com.coreos.update1`) and systemd's manager, through
//! rustbus's synchronous connection: each operation is a few blocking calls on the calling
//! thread, every wait bounded.

use std::time::{Duration, Instant};

use rustbus::connection::{Error as BusError, Timeout};
use rustbus::message_builder::{MarshalledMessage, MessageType};
use rustbus::{MessageBuilder, RpcConn};

use crate::error::{Error, Result};

const UE_SERVICE: &str = "com.coreos.update1";
const UE_PATH: &str = "/com/coreos/update1";
const UE_IFACE: &str = "com.coreos.update1.Manager";
const SD_SERVICE: &str = "org.freedesktop.systemd1";
const SD_PATH: &str = "/org/freedesktop/systemd1";
const SD_IFACE: &str = "org.freedesktop.systemd1.Manager";
/// The bus's own default for a method call's answer (dbus-daemon's reply timeout is 25 s).
const CALL_TIMEOUT: Duration = Duration::from_secs(25);
/// One attempt of a question to systemd (a unit's state, a property): asked again on a new
/// connection when it goes unanswered. In a systemd 262 initramfs, on its private socket, one
/// `LoadUnit` of a few hundred was never answered; the same question on a new connection is.
const QUERY_TIMEOUT: Duration = Duration::from_secs(8);
const QUERY_ATTEMPTS: u32 = 3;
/// Where the system bus listens when `DBUS_SYSTEM_BUS_ADDRESS` does not say (the D-Bus
/// specification's well-known address).
const SYSTEM_BUS: &str = "unix:path=/run/dbus/system_bus_socket";
/// systemd's own D-Bus socket, for root, peer to peer (no bus daemon).
const SYSTEMD_PRIVATE: &str = "/run/systemd/private";

/// Why a bus operation failed: the bus or the peer is not there (update_engine may be absent), or
/// anything else.
enum BusFailure {
    /// No bus to connect to, or nobody owns the name: the reason.
    Absent(String),
    /// The peer did not answer in time.
    Silent(String),
    Other(String),
}

impl BusFailure {
    fn io(what: &str, e: BusError) -> BusFailure {
        match e {
            BusError::IoError(_)
            | BusError::NixError(_)
            | BusError::PathDoesNotExist(_)
            | BusError::AddressTypeNotSupported(_)
            | BusError::NoAddressFound
            | BusError::AuthFailed
            | BusError::ConnectionClosed => BusFailure::Absent(format!("{what}: {e}")),
            BusError::TimedOut => BusFailure::Silent(format!("{what}: no answer: {e}")),
            e => BusFailure::Other(format!("{what}: {e}")),
        }
    }

    fn text(self) -> String {
        match self {
            BusFailure::Absent(s) | BusFailure::Silent(s) | BusFailure::Other(s) => s,
        }
    }
}

type BusResult<T> = std::result::Result<T, BusFailure>;

/// The system bus's address: `DBUS_SYSTEM_BUS_ADDRESS` (its first `unix:path=` or
/// `unix:abstract=` entry), else the well-known socket.
fn system_address() -> BusResult<nix::sys::socket::UnixAddr> {
    let env = std::env::var("DBUS_SYSTEM_BUS_ADDRESS").ok();
    let addr = env.as_deref().unwrap_or(SYSTEM_BUS);
    for entry in addr.split(';') {
        let Some(pairs) = entry.strip_prefix("unix:") else {
            continue;
        };
        for (k, v) in pairs.split(',').filter_map(|p| p.split_once('=')) {
            let a = match k {
                "path" => nix::sys::socket::UnixAddr::new(v),
                "abstract" => nix::sys::socket::UnixAddr::new_abstract(v.as_bytes()),
                _ => continue,
            };
            return a.map_err(|e| BusFailure::Absent(format!("system bus address {addr:?}: {e}")));
        }
    }
    Err(BusFailure::Absent(format!(
        "system bus address {addr:?}: no unix:path= or unix:abstract= entry"
    )))
}

fn connect() -> BusResult<RpcConn> {
    let addr = system_address()?;
    RpcConn::connect_to_path(addr, Timeout::Duration(CALL_TIMEOUT))
        .map_err(|e| BusFailure::io("connecting to the system bus", e))
}

/// systemd's manager: on the system bus, or, where there is none (an initramfs without a bus
/// daemon), on systemd's own socket, as systemctl does.
fn connect_systemd() -> BusResult<RpcConn> {
    match connect() {
        Err(BusFailure::Absent(bus)) => {
            let addr = nix::sys::socket::UnixAddr::new(SYSTEMD_PRIVATE)
                .map_err(|e| BusFailure::Absent(format!("{SYSTEMD_PRIVATE}: {e}")))?;
            // Peer to peer: no bus daemon, so no Hello (the D-Bus specification's rule).
            rustbus::DuplexConn::connect_to_bus(addr, true)
                .map(RpcConn::new)
                .map_err(|e| {
                    BusFailure::io(&format!("{bus}; and connecting to {SYSTEMD_PRIVATE}"), e)
                })
        }
        other => other,
    }
}

/// Writes `msg` whole (within `timeout`); its serial.
fn send(
    conn: &mut RpcConn,
    msg: &mut MarshalledMessage,
    what: &str,
    timeout: Duration,
) -> BusResult<u32> {
    conn.send_message(msg)
        .map_err(|e| BusFailure::io(what, e))?
        .write(Timeout::Duration(timeout))
        .map_err(|(ctx, e)| {
            ctx.force_finish();
            BusFailure::io(what, e)
        })
}

/// How long a call to systemd waits before it nudges (below).
const NUDGE_AFTER: Duration = Duration::from_secs(1);

/// The answer to `serial`. A call to systemd not answered within NUDGE_AFTER is followed by a
/// `Peer.Ping` on the same connection: sd-bus on systemd's private socket can keep a call that
/// came in one read with the end of the authentication until more bytes arrive (systemd 262
/// in an initramfs, one call in a few: never answered, or only on the next call), and the Ping
/// is such bytes. Harmless when the peer is only slow.
fn wait_or_nudge(
    conn: &mut RpcConn,
    serial: u32,
    msg: &MarshalledMessage,
    what: &str,
    timeout: Duration,
) -> BusResult<MarshalledMessage> {
    let to_systemd = msg.dynheader.destination.as_deref() == Some(SD_SERVICE);
    let first = if to_systemd {
        timeout.min(NUDGE_AFTER)
    } else {
        timeout
    };
    match conn.wait_response(serial, Timeout::Duration(first)) {
        Err(BusError::TimedOut) if first < timeout => {
            crate::info!(
                "{what}: no answer within {} s; a Ping follows on the same connection",
                first.as_secs()
            );
            let path = msg
                .dynheader
                .object
                .clone()
                .unwrap_or_else(|| SD_PATH.into());
            let mut ping = method(SD_SERVICE, &path, "org.freedesktop.DBus.Peer", "Ping");
            send(conn, &mut ping, what, first)?;
            conn.wait_response(serial, Timeout::Duration(timeout - first))
        }
        other => other,
    }
    .map_err(|e| BusFailure::io(what, e))
}

/// Sends `msg` and waits for its answer; an error answer names the D-Bus error.
fn call(
    conn: &mut RpcConn,
    mut msg: MarshalledMessage,
    what: &str,
    timeout: Duration,
) -> BusResult<MarshalledMessage> {
    let serial = send(conn, &mut msg, what, timeout)?;
    let answer = wait_or_nudge(conn, serial, &msg, what, timeout)?;
    if answer.typ != MessageType::Error {
        return Ok(answer);
    }
    let name = answer.dynheader.error_name.clone().unwrap_or_default();
    let text: String = answer.body.parser().get().unwrap_or_default();
    let msg = format!("{what}: {name}: {}", crate::error::excerpt(&text, 200));
    Err(match name.as_str() {
        "org.freedesktop.DBus.Error.ServiceUnknown"
        | "org.freedesktop.DBus.Error.NameHasNoOwner"
        | "org.freedesktop.DBus.Error.UnknownObject" => BusFailure::Absent(msg),
        _ => BusFailure::Other(msg),
    })
}

fn method(service: &str, path: &str, iface: &str, member: &str) -> MarshalledMessage {
    MessageBuilder::new()
        .call(member)
        .with_interface(iface)
        .on(path)
        .at(service)
        .build()
}

/// `GetStatus` and the `StatusUpdate` signal: (last checked time, progress, current
/// operation, new version, new size).
fn raw_status(m: &MarshalledMessage, what: &str) -> BusResult<Status> {
    use rustbus::params::{Base, Param};
    let bad =
        |e: String| BusFailure::Other(format!("{what}: an answer not of signature xdssx: {e}"));
    let mut p = m.body.parser();
    if p.get_next_sig() != Some("x") {
        return Err(bad(format!("{:?}", m.get_sig())));
    }
    let _checked: i64 = p.get().map_err(|e| bad(format!("{e:?}")))?;
    // rustbus reads a double only as its bits, through the dynamic parameter type.
    let progress = match p.get_param().map_err(|e| bad(format!("{e:?}")))? {
        Param::Base(Base::Double(bits)) => f64::from_bits(bits),
        _ => return Err(bad(format!("{:?}", m.get_sig()))),
    };
    let (operation, new_version, _size) = p
        .get3::<String, String, i64>()
        .map_err(|e| bad(format!("{e:?}")))?;
    Ok(Status {
        operation,
        new_version,
        progress,
    })
}

fn get_status(conn: &mut RpcConn) -> BusResult<Status> {
    let what = "update_engine GetStatus";
    let answer = call(
        conn,
        method(UE_SERVICE, UE_PATH, UE_IFACE, "GetStatus"),
        what,
        CALL_TIMEOUT,
    )?;
    raw_status(&answer, what)
}

/// One call to systemd's manager with string arguments; the job's object path when it
/// answers with one.
fn call_systemd(member: &str, args: &[&str]) -> Result<String> {
    let what = match args.first() {
        Some(unit) => format!("systemd {member}({unit}) over D-Bus"),
        None => format!("systemd {member} over D-Bus"),
    };
    let run = || -> BusResult<String> {
        let mut conn = connect_systemd()?;
        let mut msg = method(SD_SERVICE, SD_PATH, SD_IFACE, member);
        for a in args {
            msg.body
                .push_param(*a)
                .map_err(|e| BusFailure::Other(format!("{what}: {e:?}")))?;
        }
        let answer = call(&mut conn, msg, &what, CALL_TIMEOUT)?;
        Ok(answer
            .body
            .parser()
            .get::<rustbus::wire::ObjectPath<String>>()
            .map(|p| p.as_ref().to_string())
            .unwrap_or_default())
    };
    run().map_err(|e| Error::failed(e.text()))
}

pub(crate) const NEED_REBOOT: &str = "UPDATE_STATUS_UPDATED_NEED_REBOOT";
pub(crate) const IDLE: &str = "UPDATE_STATUS_IDLE";

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Status {
    pub(crate) operation: String,
    pub(crate) new_version: String,
    pub(crate) progress: f64,
}

/// What update_engine says about the next OS version.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Update {
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

fn classify(e: BusFailure) -> Result<Update> {
    match e {
        BusFailure::Absent(why) => Ok(Update::Unavailable(why)),
        BusFailure::Silent(why) | BusFailure::Other(why) => Err(Error::failed(format!(
            "update_engine (com.coreos.update1 on the system bus): {why}"
        ))),
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
pub(crate) fn update_status() -> Result<Update> {
    match connect().and_then(|mut conn| get_status(&mut conn)) {
        Ok(s) => Ok(verdict(&s)?.unwrap_or(Update::None(s.operation))),
        Err(e) => classify(e),
    }
}

/// `AttemptUpdate` and wait until update_engine settles (reboot needed, or idle), at most
/// `deadline`. Signals are subscribed to before the call so no transition is missed, and
/// `GetStatus` is polled every `poll` in case a signal is lost.
pub(crate) fn attempt_update(deadline: Duration, poll: Duration) -> Result<Update> {
    let last = match watch_update(deadline, poll) {
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

fn watch_update(deadline: Duration, poll: Duration) -> BusResult<Status> {
    let mut conn = connect()?;
    let rule = format!(
        "type='signal',sender='{UE_SERVICE}',path='{UE_PATH}',interface='{UE_IFACE}',member='StatusUpdate'"
    );
    call(
        &mut conn,
        rustbus::standard_messages::add_match(&rule),
        "subscribing to update_engine's StatusUpdate",
        CALL_TIMEOUT,
    )?;
    // Only update_engine's status signals are kept; nothing else is asked of this connection.
    conn.set_filter(Box::new(|m| {
        m.typ != MessageType::Signal || m.dynheader.member.as_deref() == Some("StatusUpdate")
    }));
    call(
        &mut conn,
        method(UE_SERVICE, UE_PATH, UE_IFACE, "AttemptUpdate"),
        "update_engine AttemptUpdate",
        CALL_TIMEOUT,
    )?;
    // Signals emitted before our call was answered describe the old state: drop them and
    // take a fresh GetStatus as the starting point.
    while conn.try_get_signal().is_some() {}
    let end = Instant::now() + deadline;
    let mut status = get_status(&mut conn)?;
    let mut last_logged = String::new();
    loop {
        if status.operation != last_logged {
            let pct = status.progress * 100.0;
            crate::info!(
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
        status = match conn.wait_signal(Timeout::Duration(poll.min(end - now))) {
            Ok(sig) => raw_status(&sig, "update_engine StatusUpdate")?,
            Err(BusError::TimedOut) => get_status(&mut conn)?,
            Err(e) => {
                return Err(BusFailure::io(
                    "waiting for update_engine's StatusUpdate",
                    e,
                ))
            }
        };
    }
}

/// `daemon-reload` through systemd on the system bus.
pub(crate) fn systemd_reload() -> Result<()> {
    call_systemd("Reload", &[]).map(drop)
}

/// Queue `reboot.target`; the job cannot be cancelled by later jobs.
pub(crate) fn systemd_reboot() -> Result<String> {
    call_systemd("StartUnit", &["reboot.target", "replace-irreversibly"])
}

/// Restart `unit` if it runs (systemctl try-restart); a unit that does not run stays stopped.
pub(crate) fn systemd_try_restart(unit: &str) -> Result<String> {
    call_systemd("TryRestartUnit", &[unit, "replace"])
}

/// Start (or keep running) `unit` through systemd on the system bus.
pub(crate) fn systemd_start(unit: &str) -> Result<String> {
    call_systemd("StartUnit", &[unit, "replace"])
}

/// What systemd says of a unit: whether it exists and is enabled, how its last run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnitState {
    /// `loaded`, `not-found`, `masked`, ...
    pub(crate) load: String,
    /// `enabled`, `disabled`, `static`, ... (empty when systemd does not know)
    pub(crate) file: String,
    /// `active`, `inactive`, `failed`, ...
    pub(crate) active: String,
    /// A service's `Result`: `success`, or why it failed.
    pub(crate) result: String,
    /// Whether its conditions held at its last start (false: it was skipped).
    pub(crate) condition: bool,
}

/// One property of a systemd object, as `T`.
fn property<T>(conn: &mut RpcConn, path: &str, iface: &str, name: &str) -> BusResult<T>
where
    T: for<'a, 'b> rustbus::wire::unmarshal::traits::Unmarshal<'a, 'b>,
{
    let what = format!("systemd {iface}.{name} of {path} over D-Bus");
    let mut msg = method(SD_SERVICE, path, "org.freedesktop.DBus.Properties", "Get");
    msg.body
        .push_param2(iface, name)
        .map_err(|e| BusFailure::Other(format!("{what}: {e:?}")))?;
    let answer = call(conn, msg, &what, QUERY_TIMEOUT)?;
    let bad = |e| BusFailure::Other(format!("{what}: an answer of another type: {e:?}"));
    let v: rustbus::wire::unmarshal::traits::Variant = answer.body.parser().get().map_err(bad)?;
    v.get::<T>().map_err(bad)
}

/// When the running system's systemd started (`UserspaceTimestamp`: after switch-root, the real
/// root's), in microseconds since the epoch.
pub(crate) fn systemd_userspace_start() -> Result<u64> {
    ask_systemd(|conn| property(conn, SD_PATH, SD_IFACE, "UserspaceTimestamp"))
        .map_err(|e| Error::failed(e.text()))
}

/// A question to systemd that changes nothing, asked on a new connection each time it goes
/// unanswered (QUERY_ATTEMPTS at most).
fn ask_systemd<T>(ask: impl Fn(&mut RpcConn) -> BusResult<T>) -> BusResult<T> {
    let mut attempt = 1;
    loop {
        match connect_systemd().and_then(|mut conn| ask(&mut conn)) {
            Err(BusFailure::Silent(why)) if attempt < QUERY_ATTEMPTS => {
                crate::warn!(
                    "{why}; asking again on a new connection (attempt {} of {QUERY_ATTEMPTS})",
                    attempt + 1
                );
                attempt += 1;
            }
            Err(BusFailure::Silent(why)) => {
                return Err(BusFailure::Silent(format!(
                    "{why} ({QUERY_ATTEMPTS} attempts, {} s each)",
                    QUERY_TIMEOUT.as_secs()
                )))
            }
            other => return other,
        }
    }
}

fn unit_state(conn: &mut RpcConn, unit: &str) -> BusResult<UnitState> {
    let what = format!("systemd LoadUnit({unit}) over D-Bus");
    let mut msg = method(SD_SERVICE, SD_PATH, SD_IFACE, "LoadUnit");
    msg.body
        .push_param(unit)
        .map_err(|e| BusFailure::Other(format!("{what}: {e:?}")))?;
    let answer = call(conn, msg, &what, QUERY_TIMEOUT)?;
    let path = answer
        .body
        .parser()
        .get::<rustbus::wire::ObjectPath<String>>()
        .map_err(|e| BusFailure::Other(format!("{what}: no object path: {e:?}")))?;
    let path = path.as_ref().to_string();
    const UNIT: &str = "org.freedesktop.systemd1.Unit";
    let load: String = property(conn, &path, UNIT, "LoadState")?;
    if load != "loaded" {
        return Ok(UnitState {
            load,
            file: String::new(),
            active: "inactive".into(),
            result: String::new(),
            condition: true,
        });
    }
    Ok(UnitState {
        file: property(conn, &path, UNIT, "UnitFileState")?,
        active: property(conn, &path, UNIT, "ActiveState")?,
        result: property(conn, &path, "org.freedesktop.systemd1.Service", "Result")
            .unwrap_or_default(),
        condition: property(conn, &path, UNIT, "ConditionResult")?,
        load,
    })
}

/// What systemd says of `unit` now.
pub(crate) fn systemd_unit(unit: &str) -> Result<UnitState> {
    ask_systemd(|conn| unit_state(conn, unit)).map_err(|e| Error::failed(e.text()))
}

/// `systemctl restart unit`: queue the restart, wait (at most `deadline`) until its job is
/// done, and say how the unit ended.
pub(crate) fn systemd_restart_wait(unit: &str, deadline: Duration) -> Result<UnitState> {
    let job = call_systemd("RestartUnit", &[unit, "replace"])?;
    let run = || -> BusResult<UnitState> {
        let end = Instant::now() + deadline;
        // The job object exists until the job is done.
        let state = |conn: &mut RpcConn| {
            property::<String>(conn, &job, "org.freedesktop.systemd1.Job", "State")
        };
        loop {
            match ask_systemd(state) {
                Err(BusFailure::Absent(_)) => break,
                Err(e) => return Err(e),
                Ok(_) if Instant::now() >= end => return Err(cancel(unit, &job, deadline)),
                Ok(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
        ask_systemd(|conn| unit_state(conn, unit))
    };
    run().map_err(|e| Error::failed(e.text()))
}

/// A restart's job not done by its deadline: cancelled, not left to run on while the caller
/// goes on (or puts things back).
fn cancel(unit: &str, job: &str, deadline: Duration) -> BusFailure {
    let cancel = method(SD_SERVICE, job, "org.freedesktop.systemd1.Job", "Cancel");
    let cancelled = connect_systemd()
        .and_then(|mut conn| call(&mut conn, cancel, "cancelling it", CALL_TIMEOUT))
        .map(drop);
    BusFailure::Other(format!(
        "systemd RestartUnit({unit}): its job {job} not done within {} s{}",
        deadline.as_secs(),
        match cancelled {
            Ok(()) => "; cancelled".to_string(),
            Err(e) => format!("; {}", e.text()),
        }
    ))
}
