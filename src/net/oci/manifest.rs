//! Manifests and blobs: a file's artifact manifest, its one layer, and the blob read by its
//! digest.

use serde::Deserialize;

use super::reference::{oci_digest, oci_name, tag};
use super::{
    Client, Location, Op, Reference, ARTIFACT_TYPE, INDEX_TYPE, MANIFEST_CAP, MANIFEST_TYPE, TITLE,
};
use crate::crypto::digest::{sha256, Algo, Digest};
use crate::error::{Error, Result};
use crate::net::fetch::{Failure, FetchError, Http, Request};
use crate::node::dir::Dir;
use crate::node::verified::{BodySink, Written};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    schema_version: u32,
    media_type: Option<String>,
    artifact_type: Option<String>,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
pub(crate) struct Descriptor {
    pub(crate) digest: String,
    pub(crate) size: u64,
    #[serde(default)]
    pub(crate) annotations: std::collections::BTreeMap<String, String>,
}

impl Descriptor {
    /// Its digest, if it is at most `cap` bytes and a `sha256:<hex>` digest; `shown` names the
    /// file in the error.
    fn checked(&self, cap: u64, shown: &str) -> std::result::Result<Digest, FetchError> {
        let final_ = |why: String| FetchError::new(Failure::Final, Error::failed(why));
        if self.size > cap {
            return Err(final_(format!(
                "{shown}: {} bytes is over the {cap}-byte limit",
                self.size
            )));
        }
        oci_digest(&self.digest).ok_or_else(|| {
            final_(format!(
                "{shown}: layer digest {:?} is not sha256:<64 hex>",
                self.digest
            ))
        })
    }
}

impl Client<'_> {
    /// The whole of file `file` of `loc` (at most `cap` bytes): its artifact's manifest by tag
    /// from a host that may resolve, then the layer titled `file` by digest from a host that
    /// may pull, checked against that digest and size. A tag no host has is
    /// `Failure::Passed(404)`.
    pub(crate) fn get(
        &self,
        loc: &Location,
        file: &str,
        cap: u64,
    ) -> std::result::Result<Vec<u8>, FetchError> {
        let final_ = |e: Error| FetchError::new(Failure::Final, e);
        let tag = tag(file).map_err(final_)?;
        let shown = loc.show(file);
        let accept = format!("{MANIFEST_TYPE}, {INDEX_TYPE}");
        let layer = self.first_host(loc, Op::Resolve, &mut |r| {
            let body = self.authorized(
                r,
                loc,
                &format!("manifests/{tag}"),
                Some(&accept),
                &mut |h: &Http, req: &Request| h.fetch_passing(req, MANIFEST_CAP, &[404]),
            )?;
            file_layer(&body, file, &shown).map_err(final_)
        })?;
        let digest = layer.checked(cap, &shown)?;
        self.first_host(loc, Op::Pull, &mut |r| {
            let rest = format!("blobs/{}", layer.digest);
            let data = self.authorized(r, loc, &rest, None, &mut |h: &Http, req: &Request| h.fetch(req, layer.size))?;
            let got = crate::crypto::digest::hex(&sha256(&data));
            if data.len() as u64 != layer.size || got != digest.hex {
                return Err(final_(Error::failed(format!(
                    "{}: the blob is not the one {shown} names: {} bytes with sha256:{got}, want {} bytes with {}",
                    r.ep.url(&loc.host, &loc.repo, &rest),
                    data.len(),
                    layer.size,
                    layer.digest
                ))));
            }
            Ok(data)
        })
    }

    /// `url` into `sink`, the store's verified write of file `name` of `dir`, as `Http::download`
    /// does; an `oci://` reference (`Reference`)
    /// is read from its registry or a mirror that may pull: the manifest by its digest (checked),
    /// then its one layer, titled `name`, as a blob.
    pub(crate) fn download(
        &self,
        url: &str,
        cap: u64,
        target: (&Dir, &str),
        sink: &mut dyn BodySink<Written>,
    ) -> std::result::Result<u64, FetchError> {
        let final_ = |e: Error| FetchError::new(Failure::Final, e);
        let Some(r) = Reference::parse(url).map_err(final_)? else {
            return self.http.download(url, cap, target, sink);
        };
        let name = target.1;
        let want = oci_name(&r.manifest);
        let accept = format!("{MANIFEST_TYPE}, {INDEX_TYPE}");
        let layer = self.first_host(&r.loc, Op::Pull, &mut |h| {
            let body = self.authorized(
                h,
                &r.loc,
                &format!("manifests/{want}"),
                Some(&accept),
                &mut |http: &Http, req: &Request| http.fetch(req, MANIFEST_CAP),
            )?;
            let got = crate::crypto::digest::hex(&sha256(&body));
            if got != r.manifest.hex {
                return Err(final_(Error::failed(format!(
                    "{}: the manifest {} served has sha256:{got}, not the pinned {want}",
                    url,
                    h.ep.shown()
                ))));
            }
            file_layer(&body, name, url).map_err(final_)
        })?;
        let blob = layer.checked(cap, url)?;
        let w = self.stream(&r.loc, &blob, cap, Some(target), sink)?;
        Ok(w.bytes)
    }

    /// Blob `digest` of `loc` streamed to `consume`, as `Http::stream` streams a download, from
    /// the first host that may pull and serves it: the digest is the signed list's, so no tag
    /// and no manifest is asked for.
    pub(crate) fn stream<T>(
        &self,
        loc: &Location,
        digest: &Digest,
        cap: u64,
        target: Option<(&Dir, &str)>,
        sink: &mut dyn BodySink<T>,
    ) -> std::result::Result<T, FetchError> {
        if digest.algo != Algo::Sha256 {
            return Err(FetchError::new(
                Failure::Final,
                Error::failed(format!(
                    "{}: registries address blobs by sha256; the list names {}",
                    loc.show(""),
                    digest
                )),
            ));
        }
        let rest = format!("blobs/{}", oci_name(digest));
        self.first_host(loc, Op::Pull, &mut |r| {
            self.authorized(r, loc, &rest, None, &mut |h: &Http, req: &Request| {
                h.stream(req, cap, target, &mut *sink)
            })
        })
    }
}

/// The one layer of an artifact manifest titled `file`.
pub(crate) fn file_layer(body: &[u8], file: &str, shown: &str) -> Result<Descriptor> {
    let m: Manifest = serde_json::from_slice(body)
        .map_err(|e| Error::failed(format!("{shown}: not an OCI image manifest: {e}")))?;
    if m.schema_version != 2 || m.media_type.as_deref().is_some_and(|t| t != MANIFEST_TYPE) {
        return Err(Error::failed(format!(
            "{shown}: a {} manifest (schema {}), not an OCI image manifest ({MANIFEST_TYPE})",
            m.media_type.as_deref().unwrap_or("untyped"),
            m.schema_version
        )));
    }
    if m.artifact_type.as_deref() != Some(ARTIFACT_TYPE) {
        return Err(Error::failed(format!(
            "{shown}: artifactType {:?}, not {ARTIFACT_TYPE} (publish it with deploy/publish-oci)",
            m.artifact_type.as_deref().unwrap_or("(none)")
        )));
    }
    let mut titled = m
        .layers
        .into_iter()
        .filter(|l| l.annotations.get(TITLE).map(String::as_str) == Some(file));
    match (titled.next(), titled.next()) {
        (Some(l), None) => Ok(l),
        (None, _) => Err(Error::failed(format!(
            "{shown}: no layer titled {file} ({TITLE})"
        ))),
        (Some(_), Some(_)) => Err(Error::failed(format!(
            "{shown}: more than one layer titled {file}"
        ))),
    }
}
