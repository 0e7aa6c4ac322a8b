//! The join service's reading of a node certificate (subject CN and O through its DER walk, the
//! SPKI hash through webpki): both entry points agree on the identity.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::activation::mtls::peer;
use nodestrap::crypto::x509::spki_sha256;

fuzz_target!(|der: &[u8]| {
    let spki = spki_sha256(der);
    if let Some(p) = peer(der) {
        assert_eq!(Some(p.spki), spki);
    }
});
