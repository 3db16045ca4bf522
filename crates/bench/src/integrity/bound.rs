//! The bound of the authenticated configuration (`crypt-int-hmac-sha256`): a write or read of
//! `authenc(hmac(sha256),xts(aes))` must at least run every byte once through HMAC-SHA256
//! and once through AES-XTS, so no such stack can beat `1 / (1 / hmac + 1 / xts)`. Both
//! speeds are measured here, in the same run as the table, on 4 KiB buffers (one request of
//! the workloads, and one sector of the 4096-byte-sector row; the 512-byte row needs eight
//! MACs, each over 24 bytes of associated data and 512 of data, so about 1.2x the
//! compressions: that row cannot reach more than about 0.83x of this bound): HMAC-SHA256 with its key states prepared once (the sha2 crate, SHA-NI
//! where the CPU has it), AES-XTS with the implementation a crypt target opens by default
//! (the registry's pick for a 64-byte `aes-xts-plain64` key), encrypt for the write bound and
//! decrypt for the read bound. `openssl speed -hmac sha256 -bytes 4096` is printed beside
//! the in-process HMAC when the openssl program is there, as an outside yardstick.
//!
//! The speeds are bytes per second of the measuring thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`), which a loaded machine barely moves; the median of five
//! rounds is kept.

use std::time::Duration;

use cryptblk_cipher::hash::{HashAlgorithm, KeyedHmac};
use cryptblk_cipher::{SecretBytes, SectorOptions};
use serde::Serialize;

use crate::metrics::MB;
use crate::BenchError;

/// Bytes per measured call: one 4 KiB request.
pub const BOUND_BLOCK: usize = 4096;

/// The measured terms of the bound and the bound itself.
#[derive(Clone, Debug, Serialize)]
pub struct AeadBound {
    /// Bytes per call.
    pub block_size: usize,
    /// HMAC-SHA256, MB per CPU second.
    pub hmac_mb_s: f64,
    /// `openssl speed -hmac sha256 -bytes 4096`, MB/s (wall clock), when openssl ran.
    pub openssl_hmac_mb_s: Option<f64>,
    /// AES-XTS encryption, MB per CPU second.
    pub xts_encrypt_mb_s: f64,
    /// AES-XTS decryption, MB per CPU second.
    pub xts_decrypt_mb_s: f64,
    /// The AES-XTS implementation measured.
    pub xts_implementation: String,
    /// One pass of HMAC plus XTS encryption: the most a write can reach, MB/s.
    pub write_mb_s: f64,
    /// One pass of HMAC plus XTS decryption: the most a read can reach, MB/s.
    pub read_mb_s: f64,
}

/// The CPU time the calling thread has used.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// MB per CPU second of `f` over `bytes`-byte calls: the median of five rounds of about
/// `round` of CPU time each.
fn rate(bytes: usize, round: Duration, mut f: impl FnMut()) -> f64 {
    let mut rates = Vec::new();
    for _ in 0..5 {
        let start = thread_cpu();
        let mut calls = 0u64;
        let mut used = Duration::ZERO;
        while used < round {
            for _ in 0..64 {
                f();
            }
            calls += 64;
            used = thread_cpu().saturating_sub(start);
        }
        rates.push(calls as f64 * bytes as f64 / used.as_secs_f64() / MB);
    }
    rates.sort_by(f64::total_cmp);
    rates[2]
}

/// Measures the bound, each term for about `5 * round` of CPU time.
pub fn measure(round: Duration) -> Result<AeadBound, BenchError> {
    let fail = |e: cryptblk_cipher::CipherError| BenchError::Dm(format!("bound: {e}"));
    let mut buf = vec![0x5au8; BOUND_BLOCK];
    let key = SecretBytes::random(32);
    let hmac = KeyedHmac::new(HashAlgorithm::Sha256, key.as_bytes());
    let mut tag = [0u8; 64];
    let hmac_mb_s = rate(BOUND_BLOCK, round, || {
        hmac.mac_into(&[&buf], &mut tag);
        std::hint::black_box(&tag);
    });
    let spec = "aes-xts-plain64";
    let xts_implementation = cryptblk_cipher::default_implementation(spec, 64).map_err(fail)?;
    let opts = SectorOptions {
        sector_size: BOUND_BLOCK,
        ..SectorOptions::default()
    };
    let xts = cryptblk_cipher::open_cipher(spec, SecretBytes::random(64).as_bytes(), &opts)
        .map_err(fail)?;
    let mut failed = None;
    let mut run = |decrypt: bool, buf: &mut [u8]| {
        rate(BOUND_BLOCK, round, || {
            let r = if decrypt {
                xts.decrypt(8, buf)
            } else {
                xts.encrypt(8, buf)
            };
            if let Err(e) = r {
                failed.get_or_insert(e);
            }
        })
    };
    let xts_encrypt_mb_s = run(false, &mut buf);
    let xts_decrypt_mb_s = run(true, &mut buf);
    if let Some(e) = failed {
        return Err(fail(e));
    }
    let one_pass = |a: f64, b: f64| 1.0 / (1.0 / a + 1.0 / b);
    Ok(AeadBound {
        block_size: BOUND_BLOCK,
        hmac_mb_s,
        openssl_hmac_mb_s: openssl_hmac_speed(),
        xts_encrypt_mb_s,
        xts_decrypt_mb_s,
        xts_implementation,
        write_mb_s: one_pass(hmac_mb_s, xts_encrypt_mb_s),
        read_mb_s: one_pass(hmac_mb_s, xts_decrypt_mb_s),
    })
}

/// `openssl speed -seconds 1 -bytes 4096 -hmac sha256` in MB/s (openssl prints kB/s of
/// 1000 bytes); `None` when the program is missing or prints no figure.
fn openssl_hmac_speed() -> Option<f64> {
    let out = std::process::Command::new("openssl")
        .args([
            "speed", "-seconds", "1", "-bytes", "4096", "-hmac", "sha256",
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().rev().find(|l| l.starts_with("hmac(sha256)"))?;
    let k = line.split_whitespace().last()?.strip_suffix('k')?;
    k.parse::<f64>().ok().map(|kb| kb * 1000.0 / MB)
}

impl AeadBound {
    /// The bound's lines for the report.
    pub fn render(&self) -> String {
        let openssl = match self.openssl_hmac_mb_s {
            Some(v) => format!(" (openssl speed -hmac sha256 -bytes 4096: {v:.1} MB/s)"),
            None => String::new(),
        };
        format!(
            "bound of crypt-int-hmac-sha256 at {} bytes, MB per CPU second: HMAC-SHA256 {:.1}{openssl}; \
             AES-256-XTS ({}) encrypt {:.1}, decrypt {:.1}; one pass of both: writes {:.1}, reads {:.1}\n",
            self.block_size,
            self.hmac_mb_s,
            self.xts_implementation,
            self.xts_encrypt_mb_s,
            self.xts_decrypt_mb_s,
            self.write_mb_s,
            self.read_mb_s
        )
    }
}
