//! What a monitoring system reads (issue 29): typed counters in `status --json` that keep
//! counting across `refresh`, latency quantiles, `status --format prometheus` accepted by
//! Prometheus' own parser (the Python `prometheus_client`), `ls`, every I/O error logged
//! with its sector and errno, and no key or passphrase in any log or report.

mod common;
use common::*;

use std::process::Command;

/// `status --json NAME`'s `io` object.
fn io(name: &str) -> serde_json::Value {
    status(name)["io"].clone()
}

/// A counter of `io`, which must be a JSON number.
fn counter(io: &serde_json::Value, dir: &str, field: &str) -> u64 {
    io[dir][field]
        .as_u64()
        .unwrap_or_else(|| panic!("io.{dir}.{field} is not a number: {io}"))
}

/// Parses `text` with prometheus_client's text parser and prints `name labels value` per
/// sample; fails the test if the parser refuses the exposition.
fn parse_with_prometheus_client(text: &str) -> String {
    let script = r#"
import sys
from prometheus_client.parser import text_string_to_metric_families
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        print(f"{family.type} {s.name} {labels} {s.value}")
"#;
    run_ok(
        Command::new("python3").args(["-c", script]),
        text.as_bytes(),
    )
}

#[test]
fn counters_are_numbers_survive_refresh_and_prometheus_parses_them() {
    let dir = tempdir();
    let passphrase = b"metrics passphrase 7f3a";
    let key = write_file(dir.path(), "key", passphrase);
    let img = dir.path().join("vol.img");
    cryptsetup_luks2(&img, &key, 32 << 20).expect("cryptsetup is installed by install-deps");
    let vk = cryptsetup_volume_key(&img, &key, &[]).expect("cryptsetup dumps the volume key");
    let sock = dir.path().join("m.sock");
    let _served = open_nbd(&img, &key, "metrics-vol", &sock, &[]);

    let (ok, out) = qemu_io_nbd(&sock, "write -P 0x5a 0 1M");
    assert!(ok, "{out}");
    let (ok, out) = qemu_io_nbd(&sock, "read -P 0x5a 0 1M");
    assert!(ok, "{out}");
    let before = io("metrics-vol");
    assert!(counter(&before, "write", "requests") >= 1, "{before}");
    assert!(counter(&before, "write", "bytes") >= 1 << 20, "{before}");
    assert!(counter(&before, "read", "bytes") >= 1 << 20, "{before}");
    assert_eq!(counter(&before, "read", "errors"), 0, "{before}");
    let lat = &before["read"]["latency_us"];
    let (p50, p99, max) = (
        lat["p50"].as_u64().expect("p50"),
        lat["p99"].as_u64().expect("p99"),
        lat["max"].as_u64().expect("max"),
    );
    assert!(p50 >= 1 && p50 <= p99 && p99 <= max, "{lat}");

    // refresh swaps the table; the mapping's counters go on.
    run_ok(
        cryptblk().args(["refresh", "metrics-vol", "--perf-no_read_workqueue"]),
        b"",
    );
    let (ok, out) = qemu_io_nbd(&sock, "read 0 64k");
    assert!(ok, "{out}");
    let after = io("metrics-vol");
    assert!(
        counter(&after, "read", "requests") > counter(&before, "read", "requests"),
        "read requests went back after refresh: {before} then {after}"
    );
    assert!(counter(&after, "write", "bytes") >= counter(&before, "write", "bytes"));

    // Prometheus' parser takes the exposition, and it carries the same figures.
    let text = run_ok(
        cryptblk().args(["status", "--format", "prometheus", "metrics-vol"]),
        b"",
    );
    let parsed = parse_with_prometheus_client(&text);
    let reads = counter(&io("metrics-vol"), "read", "requests");
    assert!(
        parsed
            .lines()
            .any(|l| l.starts_with("counter cryptblk_requests_total ")
                && l.contains("direction=read,volume=metrics-vol")),
        "{parsed}"
    );
    assert!(
        parsed.lines().any(
            |l| l.starts_with("summary cryptblk_request_duration_seconds ")
                && l.contains("quantile=0.99")
        ),
        "{parsed}"
    );
    // The exposition was taken before the last status query, which itself reads nothing.
    let parsed_reads = parsed
        .lines()
        .find_map(|l| {
            l.strip_prefix("counter cryptblk_requests_total direction=read,volume=metrics-vol ")
        })
        .and_then(|v| v.parse::<f64>().ok());
    assert_eq!(parsed_reads, Some(reads as f64), "{parsed}");
    // Every served volume with no name given.
    let all = run_ok(cryptblk().args(["status", "--format", "prometheus"]), b"");
    assert!(all.contains("volume=\"metrics-vol\""), "{all}");
    parse_with_prometheus_client(&all);

    // ls names it with its socket.
    let ls = run_ok(cryptblk().arg("ls"), b"");
    let row = ls
        .lines()
        .find(|l| l.starts_with("metrics-vol "))
        .unwrap_or_else(|| panic!("ls lists the volume: {ls}"));
    assert!(row.contains(&sock.display().to_string()), "{row}");
    assert!(row.contains("active") && row.contains("nbd"), "{row}");
    let ls_json: serde_json::Value =
        serde_json::from_str(&run_ok(cryptblk().args(["ls", "--json"]), b"")).unwrap();
    let me = ls_json["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "metrics-vol"))
        .unwrap_or_else(|| panic!("{ls_json}"));
    assert_eq!(me["state"], "active");
    assert!(me["pid"].as_u64().is_some(), "{me}");

    // Neither the passphrase nor the volume key appears in any report or log.
    let reports = [
        run_ok(cryptblk().args(["status", "metrics-vol"]), b""),
        run_ok(cryptblk().args(["status", "--json", "metrics-vol"]), b""),
        text,
        ls,
        std::fs::read_to_string(runtime_dir().join("metrics-vol.log")).unwrap_or_default(),
    ];
    let passphrase = String::from_utf8_lossy(passphrase);
    for r in &reports {
        assert!(!r.contains(passphrase.as_ref()), "passphrase in {r}");
        assert!(!r.to_lowercase().contains(&vk), "volume key in {r}");
    }
}

/// A mapping whose second half is an `error` target: reads there fail, and the daemon's log
/// names the mapping, the sector and the errno of each.
#[test]
fn io_errors_are_counted_and_logged_with_sector_and_errno() {
    let dir = tempdir();
    let img = dir.path().join("lin.img");
    sparse_file(&img, 8 << 20);
    let table = write_file(
        dir.path(),
        "table",
        format!("0 8192 linear {} 0\n8192 8192 error\n", img.display()).as_bytes(),
    );
    let sock = dir.path().join("e.sock");
    run_ok(
        cryptblk()
            .args(["dm", "create", "metrics-err", "--table-file"])
            .arg(&table)
            .arg("--nbd")
            .arg(&sock),
        b"",
    );
    let _served = Served::volume("metrics-err");
    let (ok, out) = qemu_io_nbd(&sock, "read 0 4k");
    assert!(ok, "{out}");
    let (ok, out) = qemu_io_nbd(&sock, "read 4M 4k");
    assert!(!ok, "a read of the error target fails: {out}");
    let io = io("metrics-err");
    assert!(counter(&io, "read", "errors") >= 1, "{io}");
    assert_eq!(counter(&io, "read", "bytes") % 4096, 0, "{io}");
    let log_path = runtime_dir().join("metrics-err.log");
    let log = std::fs::read_to_string(&log_path)
        .unwrap_or_else(|e| panic!("{}: {e}", log_path.display()));
    // 4 MiB = sector 8192, the first sector of the error target.
    assert!(
        log.lines().any(
            |l| l.contains("metrics-err: I/O error, read at sector 8192")
                && l.contains("EIO, errno 5")
        ),
        "the log names the failed read's sector and errno:\n{log}"
    );
}

/// `metrics --listen 127.0.0.1:0` serves the exposition over HTTP (a real GET with curl,
/// parsed by prometheus_client); other paths are 404; a non-loopback address is refused.
#[test]
fn metrics_endpoint_serves_prometheus_on_loopback_only() {
    let out = run(cryptblk().args(["metrics", "--listen", "0.0.0.0:0"]), b"");
    assert_eq!(exit_code(&out), 1, "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("not a loopback address"), "{err}");

    let dir = tempdir();
    let img = dir.path().join("lin.img");
    sparse_file(&img, 4 << 20);
    let table = write_file(
        dir.path(),
        "table",
        format!("0 8192 linear {} 0\n", img.display()).as_bytes(),
    );
    let sock = dir.path().join("h.sock");
    run_ok(
        cryptblk()
            .args(["dm", "create", "metrics-http", "--table-file"])
            .arg(&table)
            .arg("--nbd")
            .arg(&sock),
        b"",
    );
    let _served = Served::volume("metrics-http");
    let (ok, out) = qemu_io_nbd(&sock, "read 0 64k");
    assert!(ok, "{out}");

    let mut server = cryptblk()
        .args(["metrics", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    let _server = Kill(server);
    let url = first
        .trim()
        .strip_prefix("Serving metrics on ")
        .unwrap_or_else(|| panic!("{first}"))
        .to_string();
    let body = run_ok(
        Command::new("curl").args(["-sS", "--fail", "--max-time", "20", &url]),
        b"",
    );
    let parsed = parse_with_prometheus_client(&body);
    assert!(
        parsed
            .lines()
            .any(|l| l
                .starts_with("counter cryptblk_bytes_total direction=read,volume=metrics-http ")),
        "{parsed}"
    );
    let other = url.replace("/metrics", "/other");
    let code = run_ok(
        Command::new("curl").args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "20",
            &other,
        ]),
        b"",
    );
    assert_eq!(code, "404");
}
