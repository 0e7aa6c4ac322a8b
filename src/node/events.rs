//! Events as they happen: each decision, phase and end of a run as one JSON object, handed to a
//! sink that never blocks the run (the network floor's HTTPS sender, `net::events`). What the
//! sink has not delivered when the run ends is spooled to the running system's
//! `/run/nodestrap/events.jsonl`, which switch-root carries over: the next run of this boot that
//! sends events (the real root's) sends those first. Schema: docs/status.md, "Events".

use std::sync::Mutex;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::error::{Error, Result};

pub(crate) const SCHEMA: u32 = 1;
/// The spool, in the running system's run folder.
pub(crate) const SPOOL: &str = "events.jsonl";
/// At most this many events wait anywhere (the sender's queue, the spool): the oldest go first.
pub const MAX_EVENTS: usize = 256;
/// One event's bound; a larger one is cut to its envelope.
pub const MAX_EVENT_BYTES: usize = 16 << 10;
const SPOOL_CAP: u64 = (MAX_EVENTS * MAX_EVENT_BYTES) as u64;

/// Where a run's events go. `push` must return at once whatever the network does.
pub(crate) trait Sink: Send {
    /// One event, a JSON object without its newline, oldest first.
    fn push(&mut self, event: Vec<u8>);
    /// The run ends: deliver within a short bound while the receiver answers, then give back
    /// what is still undelivered (oldest first) with the counts so far.
    fn close(self: Box<Self>) -> (Delivery, Vec<Vec<u8>>);
}

/// What became of a run's events, kept in its status record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Delivery {
    /// The receiver, without user information, query or fragment.
    pub(crate) url: String,
    /// Events the receiver accepted (2xx), those of an earlier run's spool included.
    pub(crate) sent: u64,
    /// Events given up: the queue was full, one waited longer than its bound, or the receiver
    /// refused it (4xx other than 408 and 429).
    pub(crate) dropped: u64,
    /// Taken from an earlier run's spool at the start (in the initramfs: none).
    pub(crate) from_spool: u64,
    /// Left in the spool for the next run of this boot.
    pub(crate) spooled: u64,
}

struct Open {
    sink: Box<dyn Sink>,
    command: String,
    run: String,
    stage: &'static str,
    host: String,
    boot_id: String,
    seq: u64,
    from_spool: u64,
}

static OPEN: Mutex<Option<Open>> = Mutex::new(None);

/// Send this run's events (`command`'s) to `sink`; an earlier run's spool is handed over first.
pub(crate) fn open(command: &str, mut sink: Box<dyn Sink>) {
    let spooled = take_spool();
    let from_spool = spooled.len() as u64;
    for e in spooled {
        sink.push(e);
    }
    let boot_id = crate::node::seams::boot_id().unwrap_or_default();
    let pid = std::process::id();
    // As the record names its process: boot, PID, and the PID's start (PIDs are reused).
    let run = format!(
        "{boot_id}:{pid}:{}",
        crate::node::run::start_ticks(pid).unwrap_or_default()
    );
    let stage = if std::path::Path::new("/etc/initrd-release").exists() {
        "initramfs"
    } else {
        "system"
    };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    if let Ok(mut g) = OPEN.lock() {
        *g = Some(Open {
            sink,
            command: command.to_string(),
            run,
            stage,
            host,
            boot_id,
            seq: 0,
            from_spool,
        });
    }
}

/// Whether this run sends events.
pub(crate) fn is_open() -> bool {
    OPEN.lock().is_ok_and(|g| g.is_some())
}

/// One event of `kind` with `fields` (a JSON object) under the common envelope. A no-op when
/// the run sends none.
pub(crate) fn emit(kind: &str, fields: Value) {
    let Ok(mut g) = OPEN.lock() else { return };
    let Some(o) = g.as_mut() else { return };
    o.seq += 1;
    let mut e = Map::new();
    e.insert("schema".into(), json!(SCHEMA));
    e.insert("run".into(), json!(o.run));
    e.insert("seq".into(), json!(o.seq));
    e.insert("command".into(), json!(o.command));
    e.insert("stage".into(), json!(o.stage));
    e.insert("host".into(), json!(o.host));
    e.insert("boot_id".into(), json!(o.boot_id));
    e.insert(
        "at".into(),
        json!(crate::node::run::rfc3339(SystemTime::now())),
    );
    let since = crate::node::run::since_boot().as_secs_f64();
    e.insert(
        "since_boot_s".into(),
        json!((since * 1000.0).round() / 1000.0),
    );
    e.insert("kind".into(), json!(kind));
    let envelope = Value::Object(e.clone());
    if let Value::Object(f) = fields {
        for (k, v) in f {
            e.entry(k).or_insert(v);
        }
    }
    let mut bytes = serde_json::to_vec(&Value::Object(e)).unwrap_or_default();
    if bytes.len() > MAX_EVENT_BYTES {
        // The envelope says that something happened, and that its fields were cut.
        let mut cut = envelope;
        cut["truncated"] = json!(true);
        bytes = serde_json::to_vec(&cut).unwrap_or_default();
    }
    o.sink.push(bytes);
}

/// End the run's events: what the sink could not deliver goes to the spool. `None` when the run
/// sent none.
pub(crate) fn close() -> Option<Delivery> {
    let o = OPEN.lock().ok().and_then(|mut g| g.take())?;
    let (mut d, left) = o.sink.close();
    d.from_spool = o.from_spool;
    if !left.is_empty() {
        match spool(&left) {
            Ok(()) => d.spooled = left.len() as u64,
            Err(e) => {
                crate::warn!("events: {} undelivered, not spooled: {e}", left.len());
                d.dropped += left.len() as u64;
            }
        }
    }
    crate::info!(
        "events to {}: {} sent, {} dropped, {} left for the next run of this boot",
        d.url,
        d.sent,
        d.dropped,
        d.spooled
    );
    Some(d)
}

/// The spool's events, oldest first, removed from it. A spool that is not ours (too large, not
/// JSON lines) is set aside with a warning.
fn take_spool() -> Vec<Vec<u8>> {
    let path = crate::node::run::run_file_named(SPOOL);
    let bytes = match std::fs::File::open(&path) {
        Ok(f) => crate::node::root::read_capped(f, SPOOL_CAP)
            .map_err(|e| Error::failed(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => Err(Error::failed(format!("{}: {e}", path.display()))),
    };
    if let Err(e) = std::fs::remove_file(&path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            crate::warn!("events: {}: {e}", path.display());
        }
    }
    match bytes.and_then(|b| parse_spool(&b, &path.display().to_string())) {
        Ok(v) => v,
        Err(e) => {
            crate::warn!("events: {e}; its events are dropped");
            Vec::new()
        }
    }
}

/// JSON lines, each an object, at most `MAX_EVENTS` (the newest kept).
pub fn parse_spool(bytes: &[u8], name: &str) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for (i, line) in bytes.split(|b| *b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        if line.len() > MAX_EVENT_BYTES {
            return Err(Error::failed(format!(
                "{name} line {}: longer than {MAX_EVENT_BYTES} bytes",
                i + 1
            )));
        }
        match serde_json::from_slice::<Value>(line) {
            Ok(Value::Object(_)) => out.push(line.to_vec()),
            Ok(_) => {
                return Err(Error::failed(format!(
                    "{name} line {}: not a JSON object",
                    i + 1
                )))
            }
            Err(e) => return Err(Error::failed(format!("{name} line {}: {e}", i + 1))),
        }
    }
    let over = out.len().saturating_sub(MAX_EVENTS);
    Ok(out.split_off(over))
}

fn spool(events: &[Vec<u8>]) -> Result<()> {
    let keep = &events[events.len().saturating_sub(MAX_EVENTS)..];
    let mut bytes = Vec::new();
    for e in keep {
        bytes.extend_from_slice(e);
        bytes.push(b'\n');
    }
    crate::node::run::save_run_file(SPOOL, &bytes)
}
