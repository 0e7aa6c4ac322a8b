//! `nodestrap status` reading a status record (`node::status::from_json`): any bytes are a
//! record or an error, never a panic; a record read is written back as the same record, and
//! its lines for a person come out whatever its strings hold.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::node::status::{from_json, human_lines, to_json_text};

fuzz_target!(|data: &[u8]| {
    let Ok(r) = from_json(data, "status.json") else {
        return;
    };
    let text = to_json_text(&r).expect("a record read can be written");
    let again = from_json(text.as_bytes(), "again").expect("a record written can be read");
    // Floats go through text: compare the text of both.
    assert_eq!(to_json_text(&again).unwrap(), text);
    let lines = human_lines(&r, "status.json");
    assert!(lines.len() >= 4 + r.decisions.len() + r.files.len());
});
