//! End to end: `cryptblk bench --quick` and `--live`, checked through the files they write.
//!
//! The fio transports need fio with its nbd engine (set CRYPTBLK_SKIP_FIO=1 to accept their
//! absence) and, for `loop`, root + FUSE + the loop driver (CRYPTBLK_SKIP_LOOP=1). Without
//! those variables a missing transport fails the test. No test asserts a speed.

use std::path::Path;
use std::time::Duration;

use cryptblk_bench::{run, BenchOptions};
use serde_json::Value;

fn skip(what: &str) -> bool {
    std::env::var(format!("CRYPTBLK_SKIP_{what}")).is_ok_and(|v| v == "1")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("JSON report written");
    serde_json::from_str(&text).expect("JSON report parses")
}

const CONFIGS: [&str; 8] = [
    "plain",
    "null",
    "xts",
    "xts-same-cpu",
    "xts-submit-crypt-cpus",
    "xts-inline-read",
    "xts-inline-write",
    "xts-inline",
];

#[test]
fn quick_run_moves_verified_data_through_every_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let opts = BenchOptions {
        json: Some(dir.path().join("report.json")),
        svg: Some(dir.path().join("bench.svg")),
        markdown: Some(dir.path().join("bench.md")),
        progress: Some(false),
        ..BenchOptions::quick()
    };
    let report = run(&opts).expect("quick bench runs");
    let table = report.render_table();
    println!("{table}");
    assert!(report.failures().is_empty(), "failed rows:\n{table}");

    let json = read_json(opts.json.as_ref().unwrap());
    for key in [
        "tool",
        "version",
        "started_utc",
        "host",
        "settings",
        "transports",
        "configurations",
        "workloads",
        "cipher_speeds",
        "results",
    ] {
        assert!(json.get(key).is_some(), "report has no '{key}'");
    }
    assert_eq!(json["settings"]["quick"], true);
    assert_eq!(json["settings"]["fio_verify"], true);

    // Which transports ran, and that a missing one was allowed to be missing.
    let transports = json["transports"].as_array().unwrap();
    let ran = |name: &str| {
        transports
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no status for transport {name}"))["ran"]
            == true
    };
    assert!(ran("inproc"));
    let mut expected = vec!["inproc"];
    if ran("nbd") {
        expected.push("nbd");
    } else {
        assert!(skip("FIO"), "nbd transport did not run: {transports:?}");
    }
    if ran("loop") {
        expected.push("loop");
    } else {
        assert!(skip("LOOP"), "loop transport did not run: {transports:?}");
    }
    for t in transports.iter().filter(|t| t["ran"] == false) {
        assert!(
            !t["detail"].as_str().unwrap().is_empty(),
            "a skipped transport says why"
        );
    }

    // Every (configuration, workload, transport) moved data in both directions, verified.
    let results = json["results"].as_array().unwrap();
    let workloads = ["rw4k", "randrw4k-4j-qd16"];
    assert_eq!(
        results.len(),
        CONFIGS.len() * workloads.len() * expected.len()
    );
    for c in CONFIGS {
        for w in workloads {
            for t in &expected {
                let row = results
                    .iter()
                    .find(|r| r["config"] == c && r["workload"] == w && r["transport"] == *t)
                    .unwrap_or_else(|| panic!("no row for {c}/{w}/{t}"));
                assert!(row["error"].is_null(), "{c}/{w}/{t}: {}", row["error"]);
                let m = &row["median"];
                for dir in ["read", "write"] {
                    assert!(
                        m[dir]["bytes"].as_u64().unwrap() > 0,
                        "{c}/{w}/{t} moved no {dir} data"
                    );
                    assert!(
                        m[dir]["lat_p99_us"].as_f64().unwrap()
                            >= m[dir]["lat_p50_us"].as_f64().unwrap()
                    );
                    assert!(
                        m[dir]["lat_p999_us"].as_f64().unwrap()
                            >= m[dir]["lat_p99_us"].as_f64().unwrap()
                    );
                }
                assert_eq!(
                    m["verify"]["enabled"], true,
                    "{c}/{w}/{t} ran without verification"
                );
                assert_eq!(m["verify"]["errors"], 0);
                if *t == "inproc" {
                    assert_eq!(m["verify"]["method"], "pattern");
                    // Every read was checked against the pattern of its last write.
                    assert_eq!(m["verify"]["checked_reads"], m["read"]["ops"]);
                } else {
                    assert_eq!(m["verify"]["method"], "fio-crc32c");
                    assert!(
                        m["client_cpu_s"].as_f64().unwrap() > 0.0,
                        "fio's CPU time is counted"
                    );
                }
                assert!(m["cpu_s_per_gb"].as_f64().unwrap() > 0.0);
                // CPU time per request and per GB, server and client (fio; none in process).
                assert!(m["server_cpu_us_per_req"].as_f64().unwrap() > 0.0);
                assert!(m["server_cpu_s_per_gb"].as_f64().unwrap() > 0.0);
                let ops = m["read"]["ops"].as_f64().unwrap() + m["write"]["ops"].as_f64().unwrap();
                let client_us = m["client_cpu_us_per_req"].as_f64().unwrap();
                if *t == "inproc" {
                    assert_eq!(client_us, 0.0, "{c}/{w}/{t}: no client in process");
                }
                // The per-request figure is the run's own client CPU over its requests (the
                // median row of one quick repeat is that run).
                let client_s = m["client_cpu_s"].as_f64().unwrap();
                assert!(
                    (client_us * ops / 1e6 - client_s).abs() <= 1e-9 * client_s.max(1.0),
                    "{c}/{w}/{t}: client {client_us} µs/req x {ops} != {client_s} s"
                );
                if c == "plain" {
                    assert!(row["bound"].is_null());
                    assert!(row["excess"].is_null());
                } else {
                    let e = &row["excess"];
                    assert!(
                        e["cipher_us_per_req"].as_f64().unwrap() > 0.0,
                        "{c}/{w}/{t} has no cipher cost"
                    );
                    let (srv, plain, excess) = (
                        e["server_us_per_req"].as_f64().unwrap(),
                        e["plain_server_us_per_req"].as_f64().unwrap(),
                        e["excess_us_per_req"].as_f64().unwrap(),
                    );
                    assert!((srv - plain - excess).abs() < 1e-9);
                    let b = &row["bound"];
                    assert!(
                        b["bound_read_mb_s"].as_f64().unwrap() > 0.0,
                        "{c}/{w}/{t} has no bound"
                    );
                    assert!(b["fraction"].as_f64().unwrap() > 0.0);
                }
            }
        }
    }

    // The flags took effect: the crypt targets report the pipelines they run.
    let configs = json["configurations"].as_array().unwrap();
    let pipelines = |name: &str| {
        configs.iter().find(|c| c["name"] == name).unwrap()["pipelines"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(pipelines("xts"), "queued/queued-sorted");
    assert_eq!(
        pipelines("xts-submit-crypt-cpus"),
        "queued/queued-submit-from-crypt"
    );
    assert_eq!(pipelines("xts-inline-read"), "inline/queued-sorted");
    assert_eq!(pipelines("xts-inline-write"), "queued/inline");
    assert_eq!(pipelines("xts-inline"), "inline/inline");
    for c in configs {
        let table = c["table"].as_str().unwrap();
        if table.contains("aes-xts-plain64") {
            // `dmsetup table` form: the key is masked, never printed.
            assert!(
                table.contains(&"0".repeat(128)),
                "key not masked in {table}"
            );
        }
    }
    assert!(json["cipher_speeds"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["cipher"] == "aes-xts-plain64"));

    let svg = std::fs::read_to_string(opts.svg.as_ref().unwrap()).unwrap();
    assert!(svg.starts_with("<svg"));
    for c in CONFIGS {
        assert!(svg.contains(c), "chart does not name {c}");
    }
    // The CPU-time check covers xts-inline on each 4 KiB workload and transport that ran
    // (the verdict is a figure, not asserted: no test asserts a speed).
    let checks = json["cpu_check"].as_array().unwrap();
    for w in ["rw4k", "randrw4k-4j-qd16"] {
        for t in &expected {
            assert!(
                checks
                    .iter()
                    .any(|c| c["workload"] == w && c["transport"] == *t && c["block_size"] == 4096),
                "no CPU check for {w}/{t}"
            );
        }
    }
    assert!(table.contains("CPU-time check (issue 26)"));
    let md = std::fs::read_to_string(opts.markdown.as_ref().unwrap()).unwrap();
    assert!(md.contains("| config | workload | transport |"));
    assert!(md.contains("CPU µs/req srv/cli") && md.contains("| verdict | workload | size |"));
    assert!(md.contains("(bench.svg)"));
}

#[test]
fn live_flip_switches_pipelines_under_load() {
    let dir = tempfile::tempdir().unwrap();
    let opts = BenchOptions {
        live: Some(Duration::from_secs(2)),
        json: Some(dir.path().join("live.json")),
        svg: Some(dir.path().join("live.svg")),
        progress: Some(false),
        ..BenchOptions::quick()
    };
    let report = run(&opts).expect("live run");
    let live = report.live.as_ref().expect("live report");
    println!("{}", live.summary());
    assert_eq!(live.config, "xts");
    assert_eq!(
        live.pipelines_before.as_deref(),
        Some("queued/queued-sorted")
    );
    assert_eq!(live.pipelines_after.as_deref(), Some("inline/inline"));
    assert!(
        live.table_after
            .trim_end()
            .ends_with("3 no_read_workqueue no_write_workqueue sector_size:4096"),
        "{}",
        live.table_after
    );
    assert!(live.samples.len() >= 6, "{} samples", live.samples.len());
    assert!(
        live.flip_at_s >= 0.9 && live.flip_at_s <= 1.5,
        "flip at {}",
        live.flip_at_s
    );
    // I/O went on before and after the flip (the engine verified every read throughout).
    assert!(live.before.samples > 0 && live.after.samples > 0);
    assert!(live.before.total_mb_s > 0.0 && live.after.total_mb_s > 0.0);
    let json = read_json(opts.json.as_ref().unwrap());
    assert!(json["live"]["samples"].as_array().unwrap().len() >= 6);
    let svg = std::fs::read_to_string(opts.svg.as_ref().unwrap()).unwrap();
    assert!(svg.contains("flip to inline"));
}
