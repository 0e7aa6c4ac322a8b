//! A verity root hash's PKCS#7 signature (`crypto::pkcs7::verify_detached`, what a signed DDI's
//! signature partition carries): any bytes are a signer or a reason, never a panic. The seed is
//! a real signature by systemd-repart 257 whose signer is `fixtures/pkcs7-signer.crt`, so
//! mutations reach the signer match and the signature check.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::crypto::pkcs7::{verify_detached, Cert};

fuzz_target!(|data: &[u8]| {
    let certs = Cert::from_pem(include_bytes!("../fixtures/pkcs7-signer.crt"), "signer")
        .expect("the fixture certificate reads");
    let root_hash = b"d4a6b994bbec68c5e15b175ff0230671a1dd8467c7fa4a16c48c719bf1828a98";
    if let Ok(i) = verify_detached(data, root_hash, &certs) {
        assert_eq!(i, 0);
    }
    let _ = Cert::from_pem(data, "input");
});
