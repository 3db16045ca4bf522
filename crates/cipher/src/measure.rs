//! In-process throughput measurement for `cryptblk benchmark`.

use crate::spec::SectorOptions;
use crate::{open_cipher, CipherError, SecretBytes};
use std::time::Duration;

/// The calling thread's consumed CPU time.
struct CpuTime(Duration);

impl CpuTime {
    fn now() -> Self {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec; CLOCK_THREAD_CPUTIME_ID always exists
        // on Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        CpuTime(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }

    fn elapsed(&self) -> Duration {
        Self::now().0.saturating_sub(self.0)
    }
}

/// Measured throughput in MiB/s (2^20 bytes per second of the measuring thread's CPU time).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Throughput {
    /// Encryption speed.
    pub encrypt_mb_s: f64,
    /// Decryption speed.
    pub decrypt_mb_s: f64,
}

/// Bytes handed to the cipher per call: one 4 KiB page, i.e. several sectors at 512 bytes.
const BUFFER: usize = 4096;

/// Measures `spec` with a random `key_len`-byte key, spending about `duration` of CPU time on
/// each direction. `implementation` names one from [`crate::implementations`]; `None`
/// measures the default choice.
///
/// The divisor is the thread's CPU time, as `openssl speed` uses user CPU time: on a shared
/// machine wall-clock time would charge other processes' time slices to the cipher.
pub fn measure(
    spec: &str,
    key_len: usize,
    sector_size: usize,
    implementation: Option<&str>,
    duration: Duration,
) -> Result<Throughput, CipherError> {
    measure_requests(
        spec,
        key_len,
        sector_size,
        BUFFER.max(sector_size),
        implementation,
        duration,
    )
}

/// Like [`measure`] with `request` bytes (whole sectors) per call, as one dm-crypt request
/// of several sectors.
pub fn measure_requests(
    spec: &str,
    key_len: usize,
    sector_size: usize,
    request: usize,
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
    let len = request.max(sector_size) / sector_size * sector_size;
    let mut buf = vec![0x5au8; len];
    let per_call = (len / 512) as u64;
    let mut run = |decrypt: bool| -> Result<f64, CipherError> {
        let start = CpuTime::now();
        let mut bytes = 0u64;
        let mut sector = 0u64;
        loop {
            // Reading thread CPU time is a system call (no vDSO): amortise it over many calls.
            for _ in 0..256 {
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
