//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// Deterministic xorshift64* generator (tests must be reproducible).
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// A fresh temporary directory for one test.
pub fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cryptblk-dm-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The independent pyca/cryptography dm-crypt model shipped with the repository.
pub fn dmcrypt_py() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/independent/dmcrypt.py"
    ))
}

/// Fails loudly unless python3 with `cryptography` is present or CRYPTBLK_SKIP_PYCA=1.
pub fn require_pyca() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import cryptography.hazmat.primitives.ciphers"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        if std::env::var("CRYPTBLK_SKIP_PYCA").as_deref() == Ok("1") {
            eprintln!("SKIPPED: python3 cryptography missing and CRYPTBLK_SKIP_PYCA=1");
            return false;
        }
        panic!("python3 with pyca/cryptography is required (set CRYPTBLK_SKIP_PYCA=1 to skip)");
    }
    true
}

pub fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

pub const KEY64: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";
