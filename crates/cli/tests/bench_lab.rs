//! `cryptblk bench --transport ublk` and `--transport vhost-user` in the kernel lab
//! (/work/shared/lab, a Debian kernel under QEMU): a quick run of each (2 s per fio job, one
//! repeat, rw4k / randrw64k / randrw1m) must give every row nonzero read and write MB/s and
//! p50 latencies, and every ratio of cryptblk's rows to the guest kernel's dm-crypt (default
//! and no_*_workqueue), to the brd RAM disk and to the transport without encryption.
//!
//! Ignored by default: each boots the lab VM and runs 18-21 fio jobs under emulation (about
//! 3-4 minutes each on the 2-core build machine). Run them with
//!
//!     LAB_DIR=/work/shared/lab cargo test -p cryptblk --test bench_lab -- --ignored --nocapture
//!
//! CRYPTBLK_SKIP_LAB=1 skips them as it does the other lab tests.

mod common;
use common::*;
use serde_json::Value;

const WORKLOADS: [&str; 3] = ["rw4k", "randrw64k", "randrw1m"];

fn lab_dir() -> String {
    std::env::var("LAB_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/lab").into())
}

/// Runs the quick lab bench over `transport` and checks its table and JSON.
fn quick_lab_bench(transport: &str, rows: &[&str]) {
    if std::env::var("CRYPTBLK_SKIP_LAB").as_deref() == Ok("1") {
        eprintln!("skipping the kernel lab bench: CRYPTBLK_SKIP_LAB=1 is set");
        return;
    }
    let dir = tempdir();
    let json_file = dir.path().join("lab.json");
    let out = cryptblk()
        .args(["bench", "--transport", transport, "--quick", "--json-file"])
        .arg(&json_file)
        .env("LAB_DIR", lab_dir())
        .output()
        .expect("run cryptblk bench");
    let table = String::from_utf8_lossy(&out.stdout);
    eprintln!("{table}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "cryptblk bench failed: {}",
        out.status
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_file).unwrap()).unwrap();
    let results = report["results"].as_array().expect("results");
    for config in rows {
        for wl in WORKLOADS {
            let row = results
                .iter()
                .find(|r| r["config"] == *config && r["workload"] == wl)
                .unwrap_or_else(|| panic!("no {config}/{wl} row in {transport}'s report"));
            assert_eq!(row["transport"], transport);
            assert!(row["error"].is_null(), "{config}/{wl}: {}", row["error"]);
            let m = &row["median"];
            for dir in ["read", "write"] {
                for field in ["mb_s", "iops", "lat_p50_us"] {
                    let v = m[dir][field].as_f64().unwrap_or(0.0);
                    assert!(v > 0.0, "{config}/{wl}: {dir}.{field} = {v}");
                }
            }
        }
    }
    let ratios = report["lab"]["ratios"].as_array().expect("lab.ratios");
    for config in ["cryptblk-inline", "cryptblk-queued"] {
        for wl in WORKLOADS {
            let r = ratios
                .iter()
                .find(|r| r["config"] == config && r["workload"] == wl)
                .unwrap_or_else(|| panic!("no ratio row for {config}/{wl}"));
            for k in [
                "vs_kernel_crypt",
                "vs_kernel_crypt_nowq",
                "vs_plain",
                "vs_transport_plain",
            ] {
                let v = r[k].as_f64().unwrap_or(0.0);
                assert!(v > 0.0, "{config}/{wl}: {k} = {v}");
            }
        }
    }
    if report["lab"]["emulated"] == true {
        assert!(table.starts_with("EMULATED CPU"), "caveat first:\n{table}");
    }
    assert!(
        table.contains("/ kernel-crypt-nowq"),
        "ratio table:\n{table}"
    );
}

#[test]
#[ignore = "boots the kernel lab VM (minutes under emulation)"]
fn lab_bench_ublk_quick() {
    quick_lab_bench(
        "ublk",
        &[
            "plain",
            "kernel-crypt",
            "kernel-crypt-nowq",
            "cryptblk-inline",
            "cryptblk-queued",
            "cryptblk-linear",
        ],
    );
}

#[test]
#[ignore = "boots the kernel lab VM (minutes under emulation)"]
fn lab_bench_vhost_user_quick() {
    quick_lab_bench(
        "vhost-user",
        &[
            "plain",
            "kernel-crypt",
            "kernel-crypt-nowq",
            "cryptblk-inline",
            "cryptblk-queued",
            "cryptblk-linear",
            "qsd-raw",
        ],
    );
}
