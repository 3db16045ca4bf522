//! In-memory cipher speed: the "cipher" term of the reference's bound, measured like
//! `cryptsetup benchmark` (no storage I/O) by the cipher crate, on the implementation the
//! crypt target uses.

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
    /// Bytes per call (`cryptblk_cipher::measure` uses one 4 KiB page, 512-byte sectors).
    pub block_size: u64,
    /// Encryption, MB/s (10^6 bytes/s, converted from the cipher crate's MiB/s).
    pub encrypt_mb_s: f64,
    /// Decryption, MB/s.
    pub decrypt_mb_s: f64,
    /// The implementation measured (the one a crypt target opens by default).
    pub implementation: String,
}

/// Bytes per call of `cryptblk_cipher::measure`.
const MEASURE_BUFFER: u64 = 4096;

/// Measures `cipher` with a random key of `key_bytes` for about `budget` per direction, with
/// `cryptblk_cipher::measure` (the `cryptblk benchmark` figure) on the default implementation,
/// which is what the crypt targets open.
pub fn measure(
    cipher: &str,
    key_bytes: usize,
    budget: Duration,
) -> Result<CipherSpeed, BenchError> {
    let fail = |e: cryptblk_cipher::CipherError| BenchError::Dm(format!("measuring {cipher}: {e}"));
    let implementation =
        cryptblk_cipher::default_implementation(cipher, key_bytes).map_err(fail)?;
    let t = cryptblk_cipher::measure(cipher, key_bytes, 512, None, budget).map_err(fail)?;
    let mib = (1u64 << 20) as f64 / MB;
    Ok(CipherSpeed {
        cipher: cipher.into(),
        key_bytes,
        block_size: MEASURE_BUFFER,
        encrypt_mb_s: t.encrypt_mb_s * mib,
        decrypt_mb_s: t.decrypt_mb_s * mib,
        implementation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_xts_and_null() {
        let s = measure("aes-xts-plain64", 64, Duration::from_millis(20)).unwrap();
        assert!(s.encrypt_mb_s > 0.0 && s.decrypt_mb_s > 0.0);
        assert!(!s.implementation.is_empty());
        let n = measure("capi:ecb(cipher_null)", 0, Duration::from_millis(20)).unwrap();
        assert!(n.encrypt_mb_s > 0.0);
        assert!(measure("nonsense-cipher", 64, Duration::from_millis(5)).is_err());
    }
}
