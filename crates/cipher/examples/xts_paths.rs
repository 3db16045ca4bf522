//! AES-XTS per path and key size against `openssl speed` in the same sitting: 4 KiB
//! sectors, alternating rounds, medians (docs/bench/xts-paths.md was made with it).
//!
//! usage (one CPU, OpenSSL's children pinned too):
//!   taskset -c 1 target/debug/examples/xts_paths [ROUNDS] [SECONDS_PER_FIGURE] [REQUEST [SECTOR]]
//! REQUEST (default 4096) is the bytes per call, SECTOR (default 4096) the sector size: 65536
//! measures a 64 KiB dm-crypt request of 16 sectors (openssl's row stays at 4096 bytes).
//! With CRYPTBLK_CPU_MASK=avx512 or =vaes the masked paths are left out and the registry's
//! pick changes; every figure is MB/s (10^6 bytes per second of CPU time, openssl's unit).

use std::time::Duration;

fn openssl(alg: &str, decrypt: bool, secs: u32) -> Option<f64> {
    let mut c = std::process::Command::new("openssl");
    c.args(["speed", "-evp", alg, "-bytes", "4096", "-seconds"])
        .arg(secs.to_string());
    if decrypt {
        c.arg("-decrypt");
    }
    let out = c.stderr(std::process::Stdio::null()).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.to_ascii_lowercase().starts_with(alg))?;
    let kb: f64 = line
        .split_whitespace()
        .last()?
        .trim_end_matches('k')
        .parse()
        .ok()?;
    Some(kb * 1000.0 / 1e6)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let rounds: usize = a.get(1).map_or(5, |s| s.parse().expect("rounds"));
    let secs: f64 = a.get(2).map_or(0.5, |s| s.parse().expect("seconds"));
    let request: usize = a.get(3).map_or(4096, |s| s.parse().expect("request bytes"));
    let sector: usize = a.get(4).map_or(4096, |s| s.parse().expect("sector bytes"));
    let dur = Duration::from_secs_f64(secs);
    let mib = (1u64 << 20) as f64 / 1e6;
    println!(
        "# CPU features: {}",
        cryptblk_cipher::cpu_features_summary()
    );
    let imps: Vec<String> = cryptblk_cipher::implementations()
        .into_iter()
        .filter(|i| i.available && i.algorithms.iter().any(|a| a.starts_with("xts(aes)")))
        .map(|i| i.name)
        .collect();
    // (label, key bytes) -> samples (enc, dec)
    let mut rows: Vec<(String, usize, Vec<f64>, Vec<f64>)> = Vec::new();
    for key in [32usize, 64] {
        for imp in &imps {
            rows.push((imp.clone(), key, vec![], vec![]));
        }
        rows.push(("openssl".into(), key, vec![], vec![]));
    }
    for r in 0..rounds {
        eprintln!("round {}/{rounds}", r + 1);
        // Alternate the order each round so drift hits every row alike.
        let order: Vec<usize> = if r % 2 == 0 {
            (0..rows.len()).collect()
        } else {
            (0..rows.len()).rev().collect()
        };
        for i in order {
            let (name, key, enc, dec) = &mut rows[i];
            if name == "openssl" {
                let alg = if *key == 32 {
                    "aes-128-xts"
                } else {
                    "aes-256-xts"
                };
                let s = secs.ceil().max(1.0) as u32;
                if let (Some(e), Some(d)) = (openssl(alg, false, s), openssl(alg, true, s)) {
                    enc.push(e);
                    dec.push(d);
                }
                continue;
            }
            if let Ok(t) = cryptblk_cipher::measure_requests(
                "aes-xts-plain64",
                *key,
                sector,
                request,
                Some(name),
                dur,
            ) {
                enc.push(t.encrypt_mb_s * mib);
                dec.push(t.decrypt_mb_s * mib);
            }
        }
    }
    println!(
        "| key | implementation | encrypt MB/s | decrypt MB/s | enc / openssl | dec / openssl |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    for key in [32usize, 64] {
        let alg = if key == 32 {
            "AES-128-XTS"
        } else {
            "AES-256-XTS"
        };
        let pick =
            cryptblk_cipher::default_implementation("aes-xts-plain64", key).unwrap_or_default();
        let mut o = rows
            .iter()
            .find(|r| r.0 == "openssl" && r.1 == key)
            .map(|r| (r.2.clone(), r.3.clone()))
            .unwrap_or_default();
        let (oe, od) = if o.0.is_empty() {
            (f64::NAN, f64::NAN)
        } else {
            (median(&mut o.0), median(&mut o.1))
        };
        for (name, k, enc, dec) in rows.iter_mut().filter(|r| r.1 == key) {
            if enc.is_empty() {
                continue;
            }
            let (e, d) = (median(enc), median(dec));
            let mark = if *name == pick { " (picked)" } else { "" };
            let shown = if name == "openssl" {
                format!("openssl speed -evp {}", alg.to_lowercase())
            } else {
                format!("{name}{mark}")
            };
            println!(
                "| {alg} ({} bits) | {shown} | {e:.0} | {d:.0} | {:.2}x | {:.2}x |",
                *k * 8,
                e / oe,
                d / od
            );
        }
    }
    println!(
        "# {rounds} rounds, {secs} s per cryptblk figure, {request}-byte requests of \
         {sector}-byte sectors, medians"
    );
}
