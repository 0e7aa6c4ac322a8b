//! The join service's ticket record (JSON): what reads in is written back as `save` writes it
//! and reads the same, so no entry (no node's "already issued") is ever lost on a rewrite.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::fuzz::ticket_record;

fuzz_target!(|text: &str| {
    let Ok(saved) = ticket_record(text, "tickets.json") else {
        return;
    };
    let again = ticket_record(&saved, "saved").expect("a saved record reads back");
    assert_eq!(again, saved);
});
