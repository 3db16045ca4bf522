//! `ciphers` and `benchmark`: what this machine offers and how fast it is, measured in
//! process like `cryptsetup benchmark` (memory only, no storage I/O).

use crate::args::Opts;
use crate::exit::{ActionResult, Failure};
use cryptblk_cipher::hash::HashAlgorithm;
use serde_json::json;
use std::time::Duration;

/// `ciphers`: the implementation registry, like the kernel's /proc/crypto.
pub fn ciphers(opts: &Opts) -> ActionResult {
    let list = cryptblk_cipher::implementations();
    if opts.json {
        let v: Vec<_> = list
            .iter()
            .map(|i| {
                json!({
                    "name": i.name, "description": i.description, "algorithms": i.algorithms,
                    "priority": i.priority, "available": i.available, "default": i.selected_by_default,
                })
            })
            .collect();
        println!("{}", json!(v));
        return Ok(());
    }
    for i in list {
        println!("name         : {}", i.name);
        println!("description  : {}", i.description);
        println!("priority     : {}", i.priority);
        println!(
            "available    : {}",
            if i.available {
                "yes"
            } else {
                "no (CPU lacks the instructions)"
            }
        );
        println!(
            "default      : {}",
            if i.selected_by_default { "yes" } else { "no" }
        );
        println!("algorithms   : {}", i.algorithms.join(", "));
        println!();
    }
    Ok(())
}

/// The ciphers `cryptsetup benchmark` lists: (spec, key bits).
const CIPHERS: &[(&str, usize)] = &[
    ("aes-cbc-plain64", 128),
    ("serpent-cbc-plain64", 128),
    ("twofish-cbc-plain64", 128),
    ("aes-cbc-plain64", 256),
    ("serpent-cbc-plain64", 256),
    ("twofish-cbc-plain64", 256),
    ("aes-xts-plain64", 256),
    ("serpent-xts-plain64", 256),
    ("twofish-xts-plain64", 256),
    ("aes-xts-plain64", 512),
    ("serpent-xts-plain64", 512),
    ("twofish-xts-plain64", 512),
];

/// `benchmark [--cipher C --key-size N]`: PBKDF2 iterations per second per hash, Argon2
/// cost, and cipher MB/s per implementation on 4 KiB buffers of `--sector-size`-byte
/// encryption sectors (default 4096, a default LUKS2 volume's; `bench` measures its bound the
/// same way at its configurations' sector size).
pub fn benchmark(opts: &Opts) -> ActionResult {
    let duration = Duration::from_millis(300);
    let sector = opts.sector_size.unwrap_or(4096) as usize;
    if !(512..=4096).contains(&sector) || !sector.is_power_of_two() {
        return Err(Failure::usage("Unsupported encryption sector size."));
    }
    let mut rows = Vec::new();
    if !opts.json {
        println!("# Tests are approximate using memory only (no storage IO).");
        println!("# Ciphers: {sector}-byte encryption sectors, 4 KiB per call.");
        println!(
            "# CPU features: {}",
            cryptblk_cipher::cpu_features_summary()
        );
    }
    rows.push(json!({ "kind": "cpu", "features": cryptblk_cipher::cpu_features_summary() }));
    if opts.cipher.is_none() {
        for h in ["sha1", "sha256", "sha512", "ripemd160", "whirlpool"] {
            let alg = HashAlgorithm::from_name(h)?;
            let per_ms = cryptblk_format::kdf::pbkdf2_iterations_per_ms(alg, 32)?;
            let per_s = (per_ms * 1000.0) as u64;
            if !opts.json {
                println!("PBKDF2-{h:<10} {per_s:>8} iterations per second for 256-bit key");
            }
            rows.push(json!({ "kind": "pbkdf2", "hash": h, "iterations_per_second": per_s }));
        }
        argon2_rows(opts, &mut rows)?;
    }
    let wanted: Vec<(String, usize)> = match &opts.cipher {
        Some(c) => vec![(
            c.clone(),
            opts.key_size
                .unwrap_or(if c.contains("xts") { 512 } else { 256 }) as usize,
        )],
        None => CIPHERS.iter().map(|(c, k)| (c.to_string(), *k)).collect(),
    };
    if !opts.json {
        println!(
            "#     Algorithm |       Key |  Implementation |      Encryption |      Decryption"
        );
    }
    let impls = cryptblk_cipher::implementations();
    for (spec, bits) in wanted {
        let mut any = false;
        // The registry's own choice for this spec and key size, marked `*`.
        let picked = cryptblk_cipher::default_implementation(&spec, bits / 8).ok();
        for imp in impls.iter().filter(|i| i.available) {
            let Ok(t) =
                cryptblk_cipher::measure(&spec, bits / 8, sector, Some(&imp.name), duration)
            else {
                continue;
            };
            any = true;
            let algo = spec.rsplit_once('-').map(|x| x.0).unwrap_or(&spec);
            let is_picked = picked.as_deref() == Some(imp.name.as_str());
            if !opts.json {
                let name = if is_picked {
                    format!("*{}", imp.name)
                } else {
                    imp.name.clone()
                };
                println!(
                    "{algo:>15} {bits:>8}b {name:>17} {:>11.1} MiB/s {:>11.1} MiB/s",
                    t.encrypt_mb_s, t.decrypt_mb_s
                );
            }
            rows.push(json!({
                "kind": "cipher", "cipher": spec, "key_bits": bits, "implementation": imp.name,
                "default": is_picked,
                "sector_size": sector,
                "encrypt_mb_s": t.encrypt_mb_s, "decrypt_mb_s": t.decrypt_mb_s,
            }));
        }
        if !any && !opts.json {
            println!(
                "{spec:>15} {bits:>8}b {:>17}             N/A             N/A",
                "-"
            );
        }
    }
    if opts.cipher.is_none() {
        // The openssl figure comes in MB/s (10^6 bytes/s); report MiB/s like the rows above.
        let mib = |mb_s: f64| mb_s * 1e6 / f64::from(1u32 << 20);
        if let Some((enc, dec)) = cryptblk_bench::cipher_speed::openssl_xts_speed() {
            let (enc, dec) = (mib(enc), mib(dec));
            if !opts.json {
                println!(
                    "{:>15} {:>8}b {:>17} {enc:>11.1} MiB/s {dec:>11.1} MiB/s   (openssl speed -evp aes-256-xts, same run)",
                    "aes-xts", 512, "openssl"
                );
            }
            rows.push(json!({
                "kind": "cipher", "cipher": "aes-xts-plain64", "key_bits": 512, "implementation": "openssl-speed",
                "encrypt_mb_s": enc, "decrypt_mb_s": dec,
            }));
        }
    }
    if opts.json {
        println!("{}", json!(rows));
    } else {
        println!("# * = the implementation cryptblk picks for that cipher and key size.");
    }
    Ok(())
}

/// The Argon2 rows as `cryptsetup benchmark` prints them: the cost a LUKS2 keyslot would
/// get (`--iter-time`, `--pbkdf-memory`, `--pbkdf-parallel` or cryptsetup's defaults: 2 s,
/// 1 GiB, 4 threads) for a 256-bit key:
/// `argon2id      4 iterations, 1048576 memory, 4 parallel threads (CPUs) for 256-bit key (requested 2000 ms time)`.
fn argon2_rows(opts: &Opts, rows: &mut Vec<serde_json::Value>) -> Result<(), Failure> {
    use cryptblk_format::kdf::{calibrate, Pbkdf, PbkdfKind, PbkdfRequest};
    for kind in [PbkdfKind::Argon2i, PbkdfKind::Argon2id] {
        let mut r = PbkdfRequest {
            kind,
            ..PbkdfRequest::argon2id()
        };
        if let Some(t) = opts.iter_time {
            r = r.with_iter_time(t);
        }
        if let Some(m) = opts.pbkdf_memory {
            r.max_memory_kib = m;
        }
        // cryptsetup's benchmark asks for 4 threads without capping them by the CPUs
        // (cryptsetup 2.6.1 prints "4 parallel threads" on a 2-CPU machine).
        r.parallel = opts.pbkdf_parallel.unwrap_or(4);
        let kdf = calibrate(&r, 32)?;
        let (Pbkdf::Argon2i {
            time,
            memory_kib,
            parallel,
        }
        | Pbkdf::Argon2id {
            time,
            memory_kib,
            parallel,
        }) = kdf
        else {
            continue;
        };
        if !opts.json {
            println!(
                "{:<10} {time:>4} iterations, {memory_kib:>5} memory, {parallel:>1} parallel threads (CPUs) for 256-bit key (requested {} ms time)",
                kind.name(),
                r.iter_time_ms
            );
        }
        rows.push(json!({
            "kind": kind.name(), "iterations": time, "memory_kib": memory_kib,
            "parallel": parallel, "key_bits": 256, "requested_ms": r.iter_time_ms,
        }));
    }
    Ok(())
}
