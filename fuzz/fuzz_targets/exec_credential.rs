//! The output of a kubeconfig `exec` credential plugin (an `ExecCredential`, JSON): refused or
//! read, never a panic; a credential read is never empty.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::fuzz::exec_credential;

fuzz_target!(|data: &[u8]| {
    if let Ok(n) = exec_credential(data, 1_800_000_000) {
        assert!(n > 0, "an empty credential was accepted");
    }
});
