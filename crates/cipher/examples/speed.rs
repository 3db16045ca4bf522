//! Prints in-process sector-cipher throughput per implementation, for comparing with
//! `openssl speed -evp aes-256-xts -bytes 4096` (both divide by CPU time).
//!
//! usage: cargo run --release -p cryptblk-cipher --example speed [SPEC] [KEY_BYTES] [SECTOR] [SECONDS]

use std::time::Duration;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let spec = a.get(1).map_or("aes-xts-plain64", |s| s.as_str());
    let key_len: usize = a.get(2).map_or(64, |s| s.parse().expect("key bytes"));
    let sector: usize = a.get(3).map_or(4096, |s| s.parse().expect("sector size"));
    let secs: f64 = a.get(4).map_or(3.0, |s| s.parse().expect("seconds"));
    for imp in cryptblk_cipher::implementations() {
        match cryptblk_cipher::measure(spec, key_len, sector, Some(&imp.name), Duration::from_secs_f64(secs)) {
            Ok(t) => println!(
                "{spec} {key_len}B key {sector}B sectors {:>10}: encrypt {:8.0} MiB/s ({:7.0} kB/s x1000)  decrypt {:8.0} MiB/s",
                imp.name,
                t.encrypt_mb_s,
                t.encrypt_mb_s * 1048.576,
                t.decrypt_mb_s
            ),
            Err(e) => println!("{spec} {:>10}: {e}", imp.name),
        }
    }
}
