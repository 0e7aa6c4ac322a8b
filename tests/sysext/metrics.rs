//! Issue 51's metrics: `--metrics-dir` gets `nodestrap_<command>.prom` with the last run's
//! figures, read by Prometheus's own `promtool check metrics` (Debian's prometheus package,
//! .ci/setup) after a success, a failure and a run that met a busy server; a folder that cannot
//! be written never fails the run, and the record says so.

use super::*;

const DIR: &str = "/var/lib/node_exporter/textfile_collector";
const PROMTOOL: &str = "/usr/local/lib/nodestrap-ci/promtool";

/// The file after a run, checked by promtool: its text.
fn checked(w: &World, command: &str) -> String {
    checked_file(&w.path(&format!("{DIR}/nodestrap_{command}.prom")))
}

fn checked_file(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut p = Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    p.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let o = p.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    text
}

/// The value of the series that starts with `series` (name and labels).
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

#[test]
fn the_last_run_is_in_the_textfile_collectors_folder_as_promtool_reads_it() {
    // A success.
    let mut w = World::new();
    w.extra.push(format!("--metrics-dir={DIR}"));
    w.run().assert_ok();
    let t = checked(&w, "bootstrap");
    let c = "{command=\"bootstrap\"}";
    assert_eq!(value(&t, &format!("nodestrap_last_run_exit_code{c}")), 0.0);
    assert_eq!(value(&t, &format!("nodestrap_last_run_success{c}")), 1.0);
    assert!(
        value(&t, &format!("nodestrap_last_run_fetched_bytes{c}")) > 1000.0,
        "{t}"
    );
    assert!(
        value(&t, &format!("nodestrap_last_run_requests{c}")) >= 6.0,
        "{t}"
    );
    assert!(t.contains("nodestrap_last_run_chosen_info{command=\"bootstrap\",name=\"kubernetes\",version=\"v1.32.3\"} 1\n"), "{t}");
    let start = value(
        &t,
        &format!("nodestrap_last_run_start_timestamp_seconds{c}"),
    );
    let end = value(&t, &format!("nodestrap_last_run_end_timestamp_seconds{c}"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(start <= end && end <= now && now - start < 600.0, "{t}");
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    assert!(
        rec["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["what"] == "metrics"
                && d["value"] == "written"
                && d["source"]
                    .as_str()
                    .unwrap()
                    .ends_with("nodestrap_bootstrap.prom")),
        "{rec:#}"
    );

    // A failure: the list signed by no key of the keyring.
    let mut w = World::new();
    w.extra.push(format!("--metrics-dir={DIR}"));
    w.files.set(
        "/ext/kubernetes/SHA256SUMS.gpg",
        Reply::ok(w.signer.sign_binary(b"another list")),
    );
    w.run().assert_fails(1, "signature");
    let t = checked(&w, "bootstrap");
    assert_eq!(value(&t, &format!("nodestrap_last_run_exit_code{c}")), 1.0);
    assert_eq!(value(&t, &format!("nodestrap_last_run_success{c}")), 0.0);

    // A busy server: two 503s with Retry-After 1 before the list.
    let mut w = World::new();
    w.extra.push(format!("--metrics-dir={DIR}"));
    for _ in 0..2 {
        w.files
            .queue("/ext/kubernetes/SHA256SUMS", Reply::busy(503, "1"));
    }
    w.run().assert_ok();
    let t = checked(&w, "bootstrap");
    assert_eq!(
        value(&t, &format!("nodestrap_last_run_busy_answers{c}")),
        2.0,
        "{t}"
    );
    assert!(
        value(&t, &format!("nodestrap_last_run_waited_seconds{c}")) >= 2.0,
        "{t}"
    );
}

/// A folder that cannot be written (a file stands where it should be) never fails the run:
/// a warning, and the record says what became of the metrics.
#[test]
fn a_metrics_folder_that_cannot_be_written_never_fails_the_run() {
    let mut w = World::new();
    w.write("/var/lib/node_exporter", "a file, not a folder");
    w.extra.push(format!("--metrics-dir={DIR}"));
    let r = w.run();
    r.assert_ok();
    assert!(r.stderr.contains("metrics not written:"), "{}", r.stderr);
    let rec: serde_json::Value =
        serde_json::from_str(&w.read("/var/lib/nodestrap/status.json").unwrap()).unwrap();
    assert!(
        rec["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["what"] == "metrics" && d["value"] == "not written"),
        "{rec:#}"
    );
    // Not a folder on the node: refused at the option check.
    let mut w = World::new();
    w.extra.push("--metrics-dir=textfile".into());
    w.run().assert_fails(
        2,
        "--metrics-dir \"textfile\": expected an absolute folder on the node",
    );
}

/// The boot check's verdict in its own file (`nodestrap_verify.prom`): 0 after a boot that runs
/// another kubelet than chosen, with exit code 1, as promtool reads it.
#[test]
fn the_boot_checks_verdict_is_in_its_own_file() {
    let w = World::new();
    let mut bus = Bus::start();
    let calls = unique_dir("systemd").join("calls");
    bus.systemd(&["--record", calls.to_str().unwrap()]);
    super::verify::lying_boot(&w, &bus);
    let out = super::verify::boot(
        &w,
        &bus,
        &format!(
            "if {} verify --kubeconfig=/nonexistent/kubelet.conf --api-wait=0 --metrics-dir=/var/lib/nodestrap-metrics-test >/dev/null 2>&1; then echo 'VERIFY exit=0'; else echo \"VERIFY exit=$?\"; fi\necho '--- metrics'\ncat /var/lib/nodestrap-metrics-test/nodestrap_verify.prom\necho '--- end'\n",
            bin()
        ),
    );
    assert!(out.contains("VERIFY exit=1"), "{out}");
    let text = out
        .split_once("--- metrics\n")
        .and_then(|(_, t)| t.split_once("--- end"))
        .map_or("", |(t, _)| t);
    let dir = unique_dir("verify-metrics");
    std::fs::create_dir_all(dir.join("var/lib/node_exporter/textfile_collector")).unwrap();
    std::fs::write(
        dir.join("var/lib/node_exporter/textfile_collector/nodestrap_verify.prom"),
        text,
    )
    .unwrap();
    let t =
        checked_file(&dir.join("var/lib/node_exporter/textfile_collector/nodestrap_verify.prom"));
    let c = "{command=\"verify\"}";
    assert_eq!(
        value(&t, &format!("nodestrap_last_check_verified{c}")),
        0.0,
        "{t}"
    );
    assert_eq!(
        value(&t, &format!("nodestrap_last_run_exit_code{c}")),
        1.0,
        "{t}"
    );
}
