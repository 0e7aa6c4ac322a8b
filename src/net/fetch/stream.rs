//! A body handed to a sink as it arrives: resumed with `Range`, bounded by the limit and the
//! room its directory has.

use std::time::Duration;

use super::answer::{
    capped, classify_transport, over_limit, read_failure, status_failure, verdict,
};
use super::reader::{Progress, RateFloor};
use super::{Attempt, FetchError, Http, Request};
use crate::error::{Error, Result};
use crate::node::dir::{Dir, SPACE_MARGIN};
use crate::node::verified::{BodySink, Staging, Written};

impl Http {
    /// Stream `url` into `sink`, the verified write of file `name` of `dir` that the store
    /// owning it made: the file becomes `name` only if its digest matches. A broken transfer is
    /// tried again (resumed where the sink kept its bytes). The body is bounded as `stream`
    /// bounds one for `dir`.
    pub(crate) fn download(
        &self,
        url: &str,
        cap: u64,
        target: (&Dir, &str),
        sink: &mut dyn BodySink<Written>,
    ) -> std::result::Result<u64, FetchError> {
        let w = self.stream(&Request::get(url), cap, Some(target), sink)?;
        Ok(w.bytes)
    }

    /// A request whose body is handed to `sink` as it arrives (with progress lines):
    /// transport errors and reading failures are tried again, a digest mismatch or a write
    /// failure is final. A sink that kept the bytes of a broken attempt is sent only the rest:
    /// the next attempt asks for them with `Range`, and a server that answers with the whole
    /// body (200) or another range has the sink start over. A body is at most `cap` bytes;
    /// one bound for a file in a directory (`target`) must also leave `SPACE_MARGIN` free
    /// there: a declared length that would not is refused before a byte is read, and a body
    /// without one is stopped once it passes what is free less the margin, with an error
    /// naming both numbers.
    pub(crate) fn stream<T>(
        &self,
        req: &Request,
        cap: u64,
        target: Option<(&Dir, &str)>,
        sink: &mut dyn BodySink<T>,
    ) -> std::result::Result<T, FetchError> {
        let what = format!("{} {}", req.method, req.url);
        self.retrying(&what, req.url, |deadline| {
            self.stream_attempt(req, &what, (cap, target), sink, deadline)
        })
    }

    /// One attempt of `stream`.
    fn stream_attempt<T>(
        &self,
        req: &Request,
        what: &str,
        (cap, target): (u64, Option<(&Dir, &str)>),
        sink: &mut dyn BodySink<T>,
        deadline: Duration,
    ) -> Attempt<T> {
        let asked = sink.kept();
        let mut resp = match self.call(req, deadline, asked) {
            Ok(r) => r,
            Err(e) => return classify_transport(what, e, deadline, &self.tls),
        };
        let status = resp.status().as_u16();
        if asked > 0 && status == 416 {
            sink.restart();
            return Attempt::Retry(Error::failed(format!(
                "{what}: HTTP 416 for the bytes from {asked} on; starting over"
            )));
        }
        if let Some(r) = status_failure(what, &mut resp) {
            return verdict(r);
        }
        let length = resp.body().content_length();
        let from = match resumed_at(what, asked, &resp, sink) {
            Ok(from) => from,
            Err(e) => return Attempt::Retry(e),
        };
        let total = length.map(|l| l.saturating_add(from));
        if let Some(t) = total.filter(|t| *t > cap) {
            return Attempt::Final(Error::failed(format!(
                "{what}: {t} bytes is over the {cap}-byte limit"
            )));
        }
        let (limit, over) = match room(what, cap.saturating_sub(from), from, target, length) {
            Ok(r) => r,
            Err(e) => return Attempt::Final(e),
        };
        let body = capped(&mut resp, limit);
        let mut progress = Progress::new(RateFloor::new(body, self.limits), req.url, total, from);
        match sink.take(&mut progress) {
            Ok(n) => Attempt::Done(n),
            Err(Staging::Read(e)) if over_limit(&e) => Attempt::Final(Error::failed(
                over.unwrap_or_else(|| format!("{what}: body over the {cap}-byte limit")),
            )),
            Err(Staging::Read(e)) => Attempt::Retry(Error::failed(format!(
                "{what}: reading body: {}",
                read_failure(&e, deadline)
            ))),
            Err(Staging::Write(e)) => Attempt::Final(e),
            // The bytes arrived intact over TLS, so trying again would fetch the same ones.
            Err(Staging::Mismatch { got, want }) => Attempt::Final(Error::failed(format!(
                "{what}: hash mismatch: computed {got} but {want}"
            ))),
        }
    }
}

/// Where the body `resp` brings starts: 0 for a first attempt, the bytes the sink kept for a
/// resumed one the server answered with their range; any other answer has the sink start over
/// (a wrong range as an error, to try again).
fn resumed_at<T>(
    what: &str,
    asked: u64,
    resp: &ureq::http::Response<ureq::Body>,
    sink: &mut dyn BodySink<T>,
) -> Result<u64> {
    let status = resp.status().as_u16();
    match (asked, status) {
        (0, _) => Ok(0),
        (_, 206) => {
            let range = resp
                .headers()
                .get("content-range")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if content_range(range) != Some(asked) {
                sink.restart();
                return Err(Error::failed(format!(
                    "{what}: asked for the bytes from {asked} on, got Content-Range {range:?}; starting over"
                )));
            }
            crate::info!("{what}: resuming at byte {asked}");
            Ok(asked)
        }
        _ => {
            crate::info!(
                "{what}: HTTP {status} with the whole body, not the bytes from {asked} on; starting over"
            );
            sink.restart();
            Ok(0)
        }
    }
}

/// How many more bytes the body may bring (`rest` under the limit, and for a file in a
/// directory what leaves `SPACE_MARGIN` free there), with the error to give when a body without
/// a declared length passes that.
fn room(
    what: &str,
    rest: u64,
    from: u64,
    target: Option<(&Dir, &str)>,
    length: Option<u64>,
) -> Result<(u64, Option<String>)> {
    match (target, length) {
        (Some((dir, name)), Some(t)) => {
            dir.check_room(name, t)?;
            Ok((rest, None))
        }
        (Some((dir, name)), None) => {
            // No length declared: the body may take what the limit and the disk allow,
            // and is stopped there.
            let free = dir.free_bytes()?;
            let room = free.saturating_sub(SPACE_MARGIN);
            let why = format!(
                "{} may take at most {rest}{} bytes, and {} has {free} bytes free, {SPACE_MARGIN} of which are kept free",
                dir.show(name),
                if from > 0 { " more" } else { "" },
                dir.show("")
            );
            if room == 0 {
                return Err(Error::failed(format!(
                    "{what}: not enough space, and no declared length: {why}"
                )));
            }
            let limit = rest.min(room);
            let over =
                format!("{what}: no declared length, and the body passed {limit} bytes: {why}");
            Ok((limit, Some(over)))
        }
        (None, _) => Ok((rest, None)),
    }
}

/// The first byte of `Content-Range: bytes FIRST-LAST/TOTAL` (TOTAL may be `*`), if the
/// header is one.
pub fn content_range(v: &str) -> Option<u64> {
    let (span, total) = v.strip_prefix("bytes ")?.split_once('/')?;
    let (first, last) = span.split_once('-')?;
    let (first, last) = (first.parse::<u64>().ok()?, last.parse::<u64>().ok()?);
    let whole = total == "*" || total.parse::<u64>().is_ok_and(|t| t > last);
    (first <= last && whole).then_some(first)
}
