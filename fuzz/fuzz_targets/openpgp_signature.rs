//! A detached OpenPGP signature over a manifest (`crypto::openpgp::Keyring::verify_detached`,
//! what every signed SHA256SUMS and torcx manifest carries), and a keyring
//! (`Keyring::parse`): any bytes are a good signature by a key of the keyring or a reason,
//! never a panic. The seeds are GnuPG's own signatures over the fixture manifest, armoured and
//! binary, so mutations reach the packet reader, the issuer match and the digest check.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::crypto::openpgp::Keyring;

const KEYRING: &[u8] = include_bytes!("../../tests/fixtures/gnupg/keyring.asc");
const MANIFEST: &[u8] = include_bytes!("../../tests/fixtures/gnupg/manifest.json");

fuzz_target!(|data: &[u8]| {
    let k = Keyring::parse(KEYRING, "fixture").expect("the fixture keyring reads");
    if let Ok(by) = k.verify_detached(MANIFEST, data, "manifest.json") {
        assert_eq!(by.len(), 40, "a v4 fingerprint: {by}");
    }
    let _ = Keyring::parse(data, "input");
});
