//! A run that sends events reading the spool an earlier run of the boot left
//! (`node::events::parse_spool`): any bytes are events or an error naming the line, never a
//! panic; at most the bound is kept, each a JSON object within its size, the newest last.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodestrap::node::events::{parse_spool, MAX_EVENTS, MAX_EVENT_BYTES};

fuzz_target!(|data: &[u8]| {
    let Ok(events) = parse_spool(data, "events.jsonl") else {
        return;
    };
    assert!(events.len() <= MAX_EVENTS);
    for e in &events {
        assert!(!e.is_empty() && e.len() <= MAX_EVENT_BYTES && !e.contains(&b'\n'));
        let v: serde_json::Value = serde_json::from_slice(e).expect("kept events are JSON");
        assert!(v.is_object());
    }
    // The newest are kept: the last line read is the last event.
    if let Some(last) = events.last() {
        let tail = data
            .split(|b| *b == b'\n')
            .rfind(|l| !l.is_empty())
            .expect("a kept event is a line");
        assert_eq!(last.as_slice(), tail);
    }
});
