//! What an OCI registry and its operator hand nodestrap (`net::oci`): a Docker config.json, a
//! `WWW-Authenticate` challenge, an artifact manifest, an `oci://` location. Credentials read
//! are well-formed, a Bearer realm is unquoted, a layer found carries the title asked for, and a
//! location written back reads the same.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nodestrap::fuzz::oci_registry(data));
