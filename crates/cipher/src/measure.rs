//! In-process throughput measurement for `cryptblk benchmark`.

use crate::spec::SectorOptions;
use crate::{open_cipher, CipherError, SecretBytes};
use std::time::{Duration, Instant};

/// Measured throughput in MiB/s (2^20 bytes per second), as `cryptsetup benchmark` reports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Throughput {
    /// Encryption speed.
    pub encrypt_mb_s: f64,
    /// Decryption speed.
    pub decrypt_mb_s: f64,
}

/// Bytes handed to the cipher per call: one 4 KiB page, i.e. several sectors at 512 bytes.
const BUFFER: usize = 4096;

/// Measures `spec` with a random `key_len`-byte key, spending about `duration` on each
/// direction. `implementation` names one from [`crate::implementations`]; `None` measures
/// the default choice.
pub fn measure(
    spec: &str,
    key_len: usize,
    sector_size: usize,
    implementation: Option<&str>,
    duration: Duration,
) -> Result<Throughput, CipherError> {
    let opts = SectorOptions {
        sector_size,
        implementation: implementation.map(str::to_string),
        ..SectorOptions::default()
    };
    let key = SecretBytes::random(key_len);
    let cipher = open_cipher(spec, key.as_bytes(), &opts)?;
    let len = BUFFER.max(sector_size);
    let mut buf = vec![0x5au8; len];
    let per_call = (len / 512) as u64;
    let mut run = |decrypt: bool| -> Result<f64, CipherError> {
        let start = Instant::now();
        let mut bytes = 0u64;
        let mut sector = 0u64;
        loop {
            for _ in 0..16 {
                if decrypt {
                    cipher.decrypt(sector, &mut buf)?;
                } else {
                    cipher.encrypt(sector, &mut buf)?;
                }
                sector += per_call;
                bytes += len as u64;
            }
            let elapsed = start.elapsed();
            if elapsed >= duration {
                return Ok(bytes as f64 / (1u64 << 20) as f64 / elapsed.as_secs_f64());
            }
        }
    };
    let encrypt_mb_s = run(false)?;
    let decrypt_mb_s = run(true)?;
    Ok(Throughput {
        encrypt_mb_s,
        decrypt_mb_s,
    })
}
