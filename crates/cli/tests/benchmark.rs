//! `cryptblk benchmark`: the cipher rows are measured at `--sector-size` (default 4096, a
//! default LUKS2 volume's, which `bench` uses for its bound too), and say so.

mod common;
use common::*;

fn cipher_rows(extra: &[&str]) -> Vec<serde_json::Value> {
    let out = run_ok(
        cryptblk()
            .args(["benchmark", "--json", "--cipher", "aes-xts-plain64"])
            .args(extra),
        b"",
    );
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    rows.into_iter().filter(|r| r["kind"] == "cipher").collect()
}

#[test]
fn cipher_rows_carry_their_sector_size() {
    let default = cipher_rows(&[]);
    assert!(!default.is_empty());
    assert!(
        default.iter().all(|r| r["sector_size"] == 4096),
        "{default:?}"
    );
    let small = cipher_rows(&["--sector-size", "512"]);
    assert!(small.iter().all(|r| r["sector_size"] == 512), "{small:?}");
    assert!(small
        .iter()
        .all(|r| r["encrypt_mb_s"].as_f64().unwrap() > 0.0));

    let out = run(
        cryptblk().args([
            "benchmark",
            "--cipher",
            "aes-xts-plain64",
            "--sector-size",
            "1000",
        ]),
        b"",
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "Unsupported encryption sector size."
    );
}
