//! Kernel compatibility of sector encryption, checked against an independent implementation:
//! `tests/independent/dmcrypt.py`, a dm-crypt model on pyca/cryptography (OpenSSL) that
//! shares no code with cryptblk. Every case runs through every implementation that supports
//! it, so AWS-LC and RustCrypto are each compared with OpenSSL.
//!
//! python3 with `cryptography` is required; set CRYPTBLK_SKIP_PYTHON=1 to skip explicitly.

use cryptblk_cipher::{implementations, open_cipher, SectorOptions};
use std::io::Write;
use std::process::{Command, Stdio};

const MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/independent/dmcrypt.py"
);

fn python_available() -> bool {
    if std::env::var("CRYPTBLK_SKIP_PYTHON").as_deref() == Ok("1") {
        eprintln!("CRYPTBLK_SKIP_PYTHON=1: skipping the pyca cross-check");
        return false;
    }
    true
}

/// Deterministic test bytes (xorshift), so a failure reproduces.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

struct Case {
    spec: &'static str,
    key_len: usize,
    sector_size: usize,
    iv_offset: u64,
    large: bool,
    start: u64,
    sectors: usize,
}

const fn case(spec: &'static str, key_len: usize) -> Case {
    Case {
        spec,
        key_len,
        sector_size: 512,
        iv_offset: 0,
        large: false,
        start: 0,
        sectors: 8,
    }
}

fn model(direction: &str, c: &Case, key: &[u8], data: &[u8]) -> Vec<u8> {
    let key_hex = if key.is_empty() {
        "-".to_string()
    } else {
        hex::encode(key)
    };
    let mut cmd = Command::new("python3");
    cmd.arg(MODEL)
        .arg(direction)
        .args(["--cipher", c.spec, "--key", &key_hex])
        .args(["--sector-size", &c.sector_size.to_string()])
        .args(["--iv-offset", &c.iv_offset.to_string()])
        .args(["--start-sector", &c.start.to_string()]);
    if c.large {
        cmd.arg("--iv-large-sectors");
    }
    let mut child = cmd
        .args(["-", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect(
            "python3 is required for the kernel-compatibility tests (CRYPTBLK_SKIP_PYTHON=1 skips)",
        );
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "dmcrypt.py failed for {}", c.spec);
    out.stdout
}

fn implementations_for(spec: &str, key_len: usize) -> Vec<String> {
    let names: Vec<String> = implementations()
        .into_iter()
        .filter(|i| i.available)
        .map(|i| i.name)
        .filter(|n| {
            let opts = SectorOptions {
                implementation: Some(n.clone()),
                ..Default::default()
            };
            open_cipher(spec, &bytes(1, key_len), &opts).is_ok()
        })
        .collect();
    assert!(!names.is_empty(), "no implementation for {spec}");
    names
}

fn check(c: &Case, seed: u64) {
    let key = bytes(seed, c.key_len);
    let plain = bytes(seed + 1000, c.sector_size * c.sectors);
    let expected = model("encrypt", c, &key, &plain);
    assert_eq!(expected.len(), plain.len());
    for imp in implementations_for(c.spec, c.key_len) {
        let opts = SectorOptions {
            sector_size: c.sector_size,
            iv_offset: c.iv_offset,
            iv_large_sectors: c.large,
            implementation: Some(imp.clone()),
        };
        let cipher = open_cipher(c.spec, &key, &opts).unwrap();
        assert_eq!(cipher.implementation(), imp);
        let mut buf = plain.clone();
        cipher.encrypt(c.start, &mut buf).unwrap();
        assert!(
            buf == expected,
            "{} via {imp} (sector size {}, iv_offset {}, large {}, start {}) differs from pyca",
            c.spec,
            c.sector_size,
            c.iv_offset,
            c.large,
            c.start
        );
        if !c.spec.contains("cipher_null") {
            assert_ne!(buf, plain, "{} did not encrypt", c.spec);
        }
        // Sector by sector (one call each) must equal the batched call.
        let mut single = plain.clone();
        let per = (c.sector_size / 512) as u64;
        for (i, s) in single.chunks_exact_mut(c.sector_size).enumerate() {
            cipher.encrypt(c.start + i as u64 * per, s).unwrap();
        }
        assert!(
            single == expected,
            "{} via {imp}: per-sector calls differ",
            c.spec
        );
        cipher.decrypt(c.start, &mut buf).unwrap();
        assert!(buf == plain, "{} via {imp} does not decrypt", c.spec);
    }
    // And the model decrypts what we wrote.
    assert!(
        model("decrypt", c, &key, &expected) == plain,
        "{}: model round trip",
        c.spec
    );
}

#[test]
fn aes_xts_plain64_matches_pyca() {
    if !python_available() {
        return;
    }
    check(&case("aes-xts-plain64", 64), 1);
    check(&case("aes-xts-plain64", 32), 2);
    check(
        &Case {
            start: 1_000_003,
            ..case("aes-xts-plain64", 64)
        },
        3,
    );
    check(
        &Case {
            iv_offset: 12345,
            start: 40,
            ..case("aes-xts-plain64", 64)
        },
        4,
    );
    // The kernel's plain64 is a full 64-bit counter.
    check(
        &Case {
            start: 0x1_2345_6789_0000,
            ..case("aes-xts-plain64", 64)
        },
        5,
    );
    check(&case("capi:xts(aes)-plain64", 64), 6);
}

#[test]
fn aes_xts_4096_byte_sectors_match_pyca() {
    if !python_available() {
        return;
    }
    for (i, large) in [false, true].into_iter().enumerate() {
        let base = Case {
            sector_size: 4096,
            large,
            sectors: 4,
            ..case("aes-xts-plain64", 64)
        };
        check(&base, 10 + i as u64);
        check(
            &Case {
                start: 8 * 1000,
                iv_offset: 8 * 3,
                ..base
            },
            20 + i as u64,
        );
        // An iv_offset that is not a whole number of 4096-byte sectors.
        check(
            &Case {
                start: 16,
                iv_offset: 5,
                ..base
            },
            30 + i as u64,
        );
        check(
            &Case {
                ..Case {
                    key_len: 32,
                    ..base
                }
            },
            40 + i as u64,
        );
    }
    check(
        &Case {
            sector_size: 1024,
            large: true,
            start: 2 * 77,
            ..case("aes-cbc-essiv:sha256", 32)
        },
        50,
    );
}

#[test]
fn cbc_and_iv_modes_match_pyca() {
    if !python_available() {
        return;
    }
    check(&case("aes-cbc-essiv:sha256", 32), 60);
    check(
        &Case {
            start: 99_999,
            ..case("aes-cbc-essiv:sha256", 16)
        },
        61,
    );
    check(&case("capi:cbc(aes)-essiv:sha256", 24), 62);
    check(&case("aes-xts-essiv:sha256", 64), 63);
    check(&case("aes-cbc-plain", 16), 64);
    // plain is the low 32 bits of the sector number only.
    check(
        &Case {
            start: (1 << 32) + 8,
            ..case("aes-cbc-plain", 32)
        },
        65,
    );
    check(
        &Case {
            start: (1 << 32) + 8,
            ..case("aes-xts-plain", 64)
        },
        66,
    );
    check(
        &Case {
            start: 77,
            ..case("aes-cbc-plain64", 24)
        },
        67,
    );
    check(
        &Case {
            start: 300,
            ..case("aes-xts-plain64be", 64)
        },
        68,
    );
    check(
        &Case {
            start: 300,
            ..case("aes-cbc-plain64be", 32)
        },
        69,
    );
    check(
        &Case {
            start: 5,
            ..case("aes-cbc-benbi", 32)
        },
        70,
    );
    check(
        &Case {
            start: 40,
            sector_size: 4096,
            ..case("aes-xts-benbi", 64)
        },
        71,
    );
    check(&case("aes-cbc-null", 32), 72);
    check(&case("aes-xts-null", 64), 73);
    check(&case("aes-ecb", 16), 74);
    check(&case("cipher_null-ecb", 0), 75);
    check(&case("capi:ecb(cipher_null)", 0), 76);
}
