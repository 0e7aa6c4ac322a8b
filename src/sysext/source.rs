//! Where a release directory is read from: an http(s) directory, or an OCI repository that
//! stands for one (`--sysext-url oci://…`, docs/oci.md). The same signed SHA256SUMS serves both:
//! over https its files are URLs, in a registry each is an artifact tagged with its name, and
//! an image is fetched as the blob the signed list names.

use crate::net::fetch::{FetchError, Http, Request};
use crate::net::oci::{self, Location};
use crate::node::dir::Dir;
use crate::node::verified::BodySink;
use crate::sysext::sums::Image;

pub(crate) struct Source<'a> {
    http: &'a Http,
    oci: oci::Client<'a>,
}

impl<'a> Source<'a> {
    pub(crate) fn new(http: &'a Http, oci: oci::Client<'a>) -> Self {
        Source { http, oci }
    }

    /// File `file` of directory `dir` (`SysextUrl::dir`), whole, at most `cap` bytes; an absent
    /// one is `Failure::Passed(404)`.
    pub(crate) fn get(
        &self,
        dir: &str,
        file: &str,
        cap: u64,
    ) -> std::result::Result<Vec<u8>, FetchError> {
        match registry(dir)? {
            Some(loc) => self.oci.get(&loc, file, cap),
            None => self
                .http
                .fetch_passing(&Request::get(&format!("{dir}{file}")), cap, &[404]),
        }
    }

    /// What file `file` of `dir` is called in logs, errors and the node's records: its URL, or
    /// `oci://HOST/REPOSITORY:FILE`.
    pub(crate) fn shown(dir: &str, file: &str) -> String {
        match Location::parse_dir(dir) {
            Ok(Some(loc)) => loc.show(file),
            _ => format!("{dir}{file}"),
        }
    }

    /// Image `img` of `dir` streamed to `consume` (`Http::stream`'s bounds), and where it came
    /// from, for the log.
    pub(crate) fn image<T>(
        &self,
        dir: &str,
        img: &Image,
        cap: u64,
        target: (&Dir, &str),
        sink: &mut dyn BodySink<T>,
    ) -> std::result::Result<(T, String), FetchError> {
        match registry(dir)? {
            Some(loc) => {
                let shown = format!("{} (blob {})", loc.show(&img.file), img.digest);
                let t = self
                    .oci
                    .stream(&loc, &img.digest, cap, Some(target), sink)?;
                Ok((t, shown))
            }
            None => {
                let url = format!("{dir}{}", img.file);
                let t = self
                    .http
                    .stream(&Request::get(&url), cap, Some(target), sink)?;
                Ok((t, url))
            }
        }
    }
}

fn registry(dir: &str) -> std::result::Result<Option<Location>, FetchError> {
    Location::parse_dir(dir).map_err(|e| FetchError::new(crate::net::fetch::Failure::Final, e))
}
