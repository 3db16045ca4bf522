//! Sector encryption throughput per implementation (criterion).
//!
//! Main case: AES-256-XTS (`aes-xts-plain64`, 64-byte key) over 4 KiB sectors, encrypt and
//! decrypt, for every implementation that supports it. Also 512-byte sectors in 4 KiB
//! requests, AES-256-CBC-ESSIV, a baseline that re-keys AWS-LC for every sector to show
//! what the pooled contexts save, and the raw bulk figure (one AWS-LC call per 4 KiB, no
//! engine around it) that the engine's path is compared with in both sector-size groups.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use cryptblk_cipher::{open_cipher, RawBulkXts, SectorOptions};
use std::hint::black_box;

const BUF: usize = 4096;

fn key(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(37).wrapping_add(11))
        .collect()
}

fn bench_spec(
    c: &mut Criterion,
    group: &str,
    spec: &str,
    key_len: usize,
    sector_size: usize,
    imps: &[&str],
) {
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Bytes(BUF as u64));
    for imp in imps {
        let opts = SectorOptions {
            sector_size,
            implementation: Some(imp.to_string()),
            ..Default::default()
        };
        let cipher = open_cipher(spec, &key(key_len), &opts).expect("open cipher");
        let mut buf = vec![0xa5u8; BUF];
        let step = (BUF / 512) as u64;
        let mut sector = 0u64;
        g.bench_function(BenchmarkId::new("encrypt", imp), |b| {
            b.iter(|| {
                cipher.encrypt(sector, black_box(&mut buf)).unwrap();
                sector += step;
            })
        });
        g.bench_function(BenchmarkId::new("decrypt", imp), |b| {
            b.iter(|| {
                cipher.decrypt(sector, black_box(&mut buf)).unwrap();
                sector += step;
            })
        });
    }
    g.finish();
}

/// What a naive binding does: a fresh EVP context and key schedule for every sector.
fn bench_rekey_baseline(c: &mut Criterion) {
    use aws_lc_sys as sys;
    // The crate routes AWS-LC's allocations to locked memory; the switch must come first.
    cryptblk_cipher::lock_backend_memory();
    let mut g = c.benchmark_group("aes-256-xts-4096");
    g.throughput(Throughput::Bytes(BUF as u64));
    let k = key(64);
    let mut buf = vec![0xa5u8; BUF];
    let mut sector = 0u64;
    g.bench_function(
        BenchmarkId::new("encrypt", "aws-lc-rekey-per-sector"),
        |b| {
            b.iter(|| {
                let mut iv = [0u8; 16];
                iv[..8].copy_from_slice(&sector.to_le_bytes());
                let mut out_len = 0;
                // SAFETY: fresh context, 64-byte key, in-place XTS over one 4096-byte unit.
                unsafe {
                    let ctx = sys::EVP_CIPHER_CTX_new();
                    assert_eq!(
                        sys::EVP_CipherInit_ex(
                            ctx,
                            sys::EVP_aes_256_xts(),
                            std::ptr::null_mut(),
                            k.as_ptr(),
                            iv.as_ptr(),
                            1
                        ),
                        1
                    );
                    let p = buf.as_mut_ptr();
                    assert_eq!(
                        sys::EVP_CipherUpdate(ctx, p, &mut out_len, p, BUF as i32),
                        1
                    );
                    sys::EVP_CIPHER_CTX_free(ctx);
                }
                sector += 8;
            })
        },
    );
    g.finish();
}

/// The raw bulk figure the engine is held to ([`RawBulkXts`]: one keyed AWS-LC context
/// reused, a new IV and one `EVP_CipherUpdate` over the whole 4 KiB buffer as one XTS data
/// unit, as `openssl speed -evp aes-256-xts -bytes 4096` runs it). No sector loop, no
/// request checks, no context slots. `benches/xts_cost.rs` in crates/dm counts its
/// instructions against the engine's.
fn bench_raw_bulk(c: &mut Criterion, group: &str) {
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Bytes(BUF as u64));
    let mut raw = RawBulkXts::new(&key(64), true).expect("raw key");
    let mut buf = vec![0xa5u8; BUF];
    let mut sector = 0u64;
    g.bench_function(BenchmarkId::new("encrypt", "aws-lc-raw-bulk"), |b| {
        b.iter(|| {
            raw.crypt(sector, black_box(&mut buf)).unwrap();
            sector += 8;
        })
    });
    g.finish();
}

fn benches(c: &mut Criterion) {
    let aes256_xts: &[&str] = &["aws-lc", "rustcrypto"];
    bench_spec(
        c,
        "aes-256-xts-4096",
        "aes-xts-plain64",
        64,
        4096,
        aes256_xts,
    );
    bench_rekey_baseline(c);
    bench_raw_bulk(c, "aes-256-xts-4096");
    bench_spec(c, "aes-256-xts-512", "aes-xts-plain64", 64, 512, aes256_xts);
    bench_raw_bulk(c, "aes-256-xts-512");
    bench_spec(
        c,
        "aes-128-xts-4096",
        "aes-xts-plain64",
        32,
        4096,
        &["rustcrypto"],
    );
    bench_spec(
        c,
        "serpent-256-xts-4096",
        "serpent-xts-plain64",
        64,
        4096,
        &["rustcrypto"],
    );
    bench_spec(
        c,
        "twofish-256-xts-4096",
        "twofish-xts-plain64",
        64,
        4096,
        &["rustcrypto"],
    );
    let cbc: &[&str] = &["aws-lc", "rustcrypto"];
    bench_spec(
        c,
        "aes-256-cbc-essiv-512",
        "aes-cbc-essiv:sha256",
        32,
        512,
        cbc,
    );
}

criterion_group! {
    name = sector;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = benches
}
criterion_main!(sector);
