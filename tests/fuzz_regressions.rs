//! Inputs that crashed, hung or blew up a parser (found with the fuzz targets in fuzz/, or by
//! working out what they could not yet reach), fed to the same entry points. Each stays after
//! its fix so the finding cannot come back.

use nodestrap::net::kubeconfig::Kubeconfig;
use nodestrap::node::mappings::Mappings;

/// `levels` anchors, each a list of ten aliases of the one before: yaml-rust2's loader copies
/// the whole anchored tree for every alias, so 10^(levels+1) nodes from ~60 bytes a level.
/// Five levels (347 bytes) make a million nodes and ~0.3 s; seven take gigabytes and minutes,
/// well inside the 4 MiB read cap of a kubeconfig or the 1 MiB of a manifest.
fn alias_bomb(levels: usize) -> String {
    let mut t = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..=levels {
        let refs = vec![format!("*a{}", i - 1); 10].join(", ");
        t.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
    }
    t
}

/// Alone it parses: only the bomb beside it can make it fail.
const KUBECONFIG: &str = "clusters:\n- name: a\n  cluster: {server: 'https://a'}\ncontexts:\n- name: x\n  context: {cluster: a}\ncurrent-context: x\n";
const MAPPINGS: &str =
    "kind: VersionManifestV1\nversions:\n  k8s:\n    1.9:\n      docker: ['17.03']\n";

#[test]
fn yaml_documents_without_the_bomb_parse() {
    // Keeps the tests below honest: their documents fail only because of the aliases.
    Kubeconfig::parse(KUBECONFIG, "kubeconfig").unwrap();
    Mappings::parse(MAPPINGS, "mappings").unwrap();
    // A bomb of one level is plain YAML that any budget lets through.
    Kubeconfig::parse(&format!("{KUBECONFIG}{}", alias_bomb(1)), "kubeconfig").unwrap();
}

#[test]
fn kubeconfig_alias_bomb_is_refused() {
    let text = format!("{KUBECONFIG}{}", alias_bomb(5));
    assert!(text.len() < 500);
    let r = Kubeconfig::parse(&text, "kubeconfig");
    assert!(
        r.as_ref().is_err_and(|e| e
            .to_string()
            .contains("YAML nodes once aliases are expanded")),
        "a few hundred bytes expanding to 10^6 nodes: {:?}",
        r.err().map(|e| e.to_string())
    );
}

#[test]
fn mappings_alias_bomb_is_refused() {
    let text = format!("{MAPPINGS}{}", alias_bomb(5));
    let r = Mappings::parse(&text, "mappings");
    assert!(
        r.as_ref().is_err_and(|e| e
            .to_string()
            .contains("YAML nodes once aliases are expanded")),
        "a few hundred bytes expanding to 10^6 nodes: {:?}",
        r.err().map(|e| e.to_string())
    );
}

/// The ledger's rule at the far ends of time (`--retry-window` of u64::MAX, a record claimed in
/// the year 9999): found by fuzz/ticket_object as an overflow of the claim's lease.
#[test]
fn ticket_object_at_the_end_of_time_is_judged_without_overflow() {
    let cm = br#"{"metadata":{"name":"ticket-ab","resourceVersion":"42"},"data":{"identity":"sha256:ab","node":"n1","role":"worker","state":"issuing","instance":"cp-1","claimed-at":"9999-12-31T23:59:59Z","attempt":"1"}}"#;
    assert_eq!(
        nodestrap::fuzz::ticket_object(cm).as_deref(),
        Some("sha256:ab")
    );
}

/// A status record whose `duration_s` has 17 significant digits (5.666666666666667e127): found
/// by fuzz/status_record. serde_json's default float reading is fast but not exact, so the
/// record written back read as another number (…666e127) and a record no longer survived its
/// own round trip; nodestrap now reads floats exactly (serde_json's `float_roundtrip`).
#[test]
fn a_status_record_survives_its_round_trip_whatever_its_floats() {
    use nodestrap::node::status::{from_json, to_json_text};
    let record = format!(
        "{{\"schema\": 1, \"command\": \"bootstrap\", \"version\": \"0.1.0\", \"root\": \"/sysroot\", \
         \"started\": \"2026-11-25T01:40:58Z\", \"ended\": \"2026-11-25T01:40:58Z\", \
         \"duration_s\": 5{}.3, \"state\": \"done\", \"exit_code\": 0, \"phase\": \"done\", \
         \"error\": null, \"decisions\": [], \"files\": [], \"reboot\": {{\"decision\": \"no\"}}, \
         \"kubelet_env\": null, \"process\": null}}",
        "6".repeat(127)
    );
    let r = from_json(record.as_bytes(), "status.json").unwrap();
    let text = to_json_text(&r).unwrap();
    let again = from_json(text.as_bytes(), "again").unwrap();
    assert_eq!(to_json_text(&again).unwrap(), text);
}

/// An `expirationTimestamp` whose offset holds a multi-byte character (`+ tÞi`): found by
/// fuzz/exec_credential as a panic, slicing the offset by bytes inside that character. The same
/// reader judges the API server's Node heartbeats in the boot check. Now not a time.
#[test]
fn a_time_offset_with_a_multibyte_character_is_no_time() {
    let out = br#"{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{"token":"t","expirationTimestamp":"2030-01-02T03:04:05.123+ t\xc3\x9ei"}}"#;
    let _ = nodestrap::fuzz::exec_credential(out, 1_800_000_000);
    assert_eq!(
        nodestrap::net::kubeconfig::rfc3339("2030-01-02T03:04:05.123+ tÞi"),
        None
    );
    assert_eq!(
        nodestrap::net::kubeconfig::rfc3339("2030-01-02T03:04:05+01:00"),
        Some(1_893_549_845)
    );
}

/// Found by `oci_registry`: a `WWW-Authenticate` whose unquoted realm or service ran on to a
/// quote or to control bytes was taken as a challenge; an unquoted value must be a token now.
#[test]
fn oci_challenges_with_quotes_in_tokens_are_refused() {
    nodestrap::fuzz::oci_registry(b"\x01Bearer realm=\xdd\xfe\x8c\x96\x9c\xdf\x8d\x9a\r\r\r\r\"x");
    nodestrap::fuzz::oci_registry(
        b"\x01Bearer realm=\"https:\x01\x00\x00ith.example/toke\",service=\x00\x0eegistry.exaa\x00\x00\x00e=\"reposito:yra:pull\"",
    );
}
