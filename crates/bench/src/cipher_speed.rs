//! In-memory cipher speed: the "cipher" term of the reference's bound, measured like
//! `cryptsetup benchmark` (no storage I/O) by the cipher crate, on the implementation the
//! crypt target uses, at the encryption sector size of the configuration it bounds.
//! `cryptblk benchmark` measures through the same `cryptblk_cipher::measure`, so the two agree
//! at equal sector sizes; [`openssl_xts_speed`] is the yardstick both print beside it.

use std::time::Duration;

use serde::Serialize;

use crate::metrics::MB;
use crate::BenchError;

/// Measured speed of one cipher.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CipherSpeed {
    /// dm-crypt cipher specification.
    pub cipher: String,
    /// Key length in bytes.
    pub key_bytes: usize,
    /// Encryption sector size in bytes (one IV per sector).
    pub sector_size: u32,
    /// Bytes per call (`cryptblk_cipher::measure` uses one 4 KiB page or one sector when
    /// larger).
    pub block_size: u64,
    /// Encryption, MB/s (10^6 bytes/s, converted from the cipher crate's MiB/s).
    pub encrypt_mb_s: f64,
    /// Decryption, MB/s.
    pub decrypt_mb_s: f64,
    /// The implementation measured (the one a crypt target opens by default).
    pub implementation: String,
}

impl CipherSpeed {
    /// True when this is the speed of `cipher` with `key_bytes` at `sector_size`.
    pub fn is(&self, cipher: &str, key_bytes: usize, sector_size: u32) -> bool {
        self.cipher == cipher && self.key_bytes == key_bytes && self.sector_size == sector_size
    }
}

/// Bytes per call of `cryptblk_cipher::measure` (at least one sector).
const MEASURE_BUFFER: u64 = 4096;

/// Measures `cipher` with a random key of `key_bytes` at `sector_size`-byte encryption
/// sectors for about `budget` per direction, with `cryptblk_cipher::measure` (the
/// `cryptblk benchmark` figure) on the default implementation, which is what the crypt
/// targets open.
pub fn measure(
    cipher: &str,
    key_bytes: usize,
    sector_size: u32,
    budget: Duration,
) -> Result<CipherSpeed, BenchError> {
    let fail = |e: cryptblk_cipher::CipherError| BenchError::Dm(format!("measuring {cipher}: {e}"));
    let implementation =
        cryptblk_cipher::default_implementation(cipher, key_bytes).map_err(fail)?;
    let t = cryptblk_cipher::measure(cipher, key_bytes, sector_size as usize, None, budget)
        .map_err(fail)?;
    let mib = (1u64 << 20) as f64 / MB;
    Ok(CipherSpeed {
        cipher: cipher.into(),
        key_bytes,
        sector_size,
        block_size: MEASURE_BUFFER.max(u64::from(sector_size)),
        encrypt_mb_s: t.encrypt_mb_s * mib,
        decrypt_mb_s: t.decrypt_mb_s * mib,
        implementation,
    })
}

/// OpenSSL's own AES-256-XTS speed on 4 KiB buffers (`openssl speed -evp aes-256-xts`,
/// encrypt then decrypt, about a second each), in MB/s (10^6 bytes/s, as openssl prints);
/// `None` when the openssl program is missing or prints no figure.
pub fn openssl_xts_speed() -> Option<(f64, f64)> {
    let run = |decrypt: bool| -> Option<f64> {
        let mut c = std::process::Command::new("openssl");
        c.args([
            "speed",
            "-evp",
            "aes-256-xts",
            "-bytes",
            "4096",
            "-seconds",
            "1",
        ]);
        if decrypt {
            c.arg("-decrypt");
        }
        let out = c.stderr(std::process::Stdio::null()).output().ok()?;
        parse_openssl_speed(&String::from_utf8_lossy(&out.stdout))
    };
    Some((run(false)?, run(true)?))
}

/// The AES-256-XTS figure of `openssl speed` output (its last column, 1000s of bytes per
/// second) in MB/s.
fn parse_openssl_speed(text: &str) -> Option<f64> {
    let line = text
        .lines()
        .rev()
        .find(|l| l.to_ascii_uppercase().starts_with("AES-256-XTS"))?;
    let kb: f64 = line
        .split_whitespace()
        .last()?
        .trim_end_matches('k')
        .parse()
        .ok()?;
    Some(kb * 1000.0 / MB)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_xts_and_null() {
        let s = measure("aes-xts-plain64", 64, 4096, Duration::from_millis(20)).unwrap();
        assert!(s.encrypt_mb_s > 0.0 && s.decrypt_mb_s > 0.0);
        assert!(!s.implementation.is_empty());
        assert!(s.is("aes-xts-plain64", 64, 4096) && !s.is("aes-xts-plain64", 64, 512));
        let n = measure("capi:ecb(cipher_null)", 0, 512, Duration::from_millis(20)).unwrap();
        assert!(n.encrypt_mb_s > 0.0);
        assert!(measure("nonsense-cipher", 64, 512, Duration::from_millis(5)).is_err());
        assert!(measure("aes-xts-plain64", 64, 1000, Duration::from_millis(5)).is_err());
    }

    #[test]
    fn openssl_speed_lines_parse() {
        let out = "version: 3.0.17\n\
                   type             4096 bytes\n\
                   AES-256-XTS    2563325.95k\n";
        let mb = parse_openssl_speed(out).unwrap();
        assert!((mb - 2563.32595).abs() < 1e-6, "{mb}");
        assert_eq!(parse_openssl_speed("no figure here"), None);
    }
}
