//! Keyslot key derivation: PBKDF2 (LUKS1 and LUKS2) and Argon2i/Argon2id (LUKS2), plus the
//! calibration cryptsetup performs for `--iter-time`.

use crate::error::{FormatError, Result};
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;
use std::time::{Duration, Instant};

/// Smallest PBKDF2 iteration count cryptsetup accepts for a LUKS keyslot or digest.
pub const PBKDF2_MIN_ITERATIONS: u32 = 1000;
/// Smallest Argon2 time cost cryptsetup uses.
pub const ARGON2_MIN_TIME: u32 = 4;
/// Smallest Argon2 memory cost (KiB) cryptsetup uses.
pub const ARGON2_MIN_MEMORY_KIB: u32 = 32;
/// cryptsetup's default maximum Argon2 memory cost (KiB): 1 GiB.
pub const ARGON2_DEFAULT_MEMORY_KIB: u32 = 1024 * 1024;
/// cryptsetup's default Argon2 parallelism (capped by the CPU count).
pub const ARGON2_DEFAULT_PARALLEL: u32 = 4;
/// cryptsetup's default `--iter-time` in milliseconds.
pub const DEFAULT_ITER_TIME_MS: u32 = 2000;

/// A fully parameterised password-based key derivation function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pbkdf {
    /// PBKDF2-HMAC with `hash`, `iterations` rounds.
    Pbkdf2 {
        /// The HMAC hash.
        hash: HashAlgorithm,
        /// Iteration count.
        iterations: u32,
    },
    /// Argon2i (version 0x13).
    Argon2i {
        /// Time cost (passes).
        time: u32,
        /// Memory cost in KiB.
        memory_kib: u32,
        /// Lanes / threads.
        parallel: u32,
    },
    /// Argon2id (version 0x13).
    Argon2id {
        /// Time cost (passes).
        time: u32,
        /// Memory cost in KiB.
        memory_kib: u32,
        /// Lanes / threads.
        parallel: u32,
    },
}

/// The KDF family, before its cost parameters are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PbkdfKind {
    /// PBKDF2.
    Pbkdf2,
    /// Argon2i.
    Argon2i,
    /// Argon2id.
    Argon2id,
}

impl PbkdfKind {
    /// Parses the `--pbkdf` / LUKS2 JSON `"type"` name (`pbkdf2`, `argon2i`, `argon2id`).
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "pbkdf2" => Ok(Self::Pbkdf2),
            "argon2i" => Ok(Self::Argon2i),
            "argon2id" => Ok(Self::Argon2id),
            other => Err(FormatError::Kdf(format!("unknown PBKDF '{other}'"))),
        }
    }

    /// The name as cryptsetup spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pbkdf2 => "pbkdf2",
            Self::Argon2i => "argon2i",
            Self::Argon2id => "argon2id",
        }
    }
}

impl Pbkdf {
    /// The family of this KDF.
    pub fn kind(&self) -> PbkdfKind {
        match self {
            Pbkdf::Pbkdf2 { .. } => PbkdfKind::Pbkdf2,
            Pbkdf::Argon2i { .. } => PbkdfKind::Argon2i,
            Pbkdf::Argon2id { .. } => PbkdfKind::Argon2id,
        }
    }

    /// The name as cryptsetup and LUKS2 JSON spell it.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// Derives `out_len` bytes from `passphrase` and `salt`.
    pub fn derive(&self, passphrase: &[u8], salt: &[u8], out_len: usize) -> Result<SecretBytes> {
        let mut out = SecretBytes::zeroed(out_len);
        match *self {
            Pbkdf::Pbkdf2 { hash, iterations } => {
                if iterations == 0 {
                    return Err(FormatError::Kdf("PBKDF2 iteration count is 0".into()));
                }
                hash.pbkdf2(passphrase, salt, iterations, out.as_mut_bytes());
            }
            Pbkdf::Argon2i {
                time,
                memory_kib,
                parallel,
            } => argon2(
                argon2::Algorithm::Argon2i,
                time,
                memory_kib,
                parallel,
                passphrase,
                salt,
                out.as_mut_bytes(),
            )?,
            Pbkdf::Argon2id {
                time,
                memory_kib,
                parallel,
            } => argon2(
                argon2::Algorithm::Argon2id,
                time,
                memory_kib,
                parallel,
                passphrase,
                salt,
                out.as_mut_bytes(),
            )?,
        }
        Ok(out)
    }
}

fn argon2(
    algorithm: argon2::Algorithm,
    time: u32,
    memory_kib: u32,
    parallel: u32,
    passphrase: &[u8],
    salt: &[u8],
    out: &mut [u8],
) -> Result<()> {
    let params = argon2::Params::new(memory_kib, time, parallel, Some(out.len())).map_err(|e| {
        FormatError::Kdf(format!(
            "Argon2 parameters time={time} memory={memory_kib} KiB parallel={parallel}: {e}"
        ))
    })?;
    argon2::Argon2::new(algorithm, argon2::Version::V0x13, params)
        .hash_password_into(passphrase, salt, out)
        .map_err(|e| FormatError::Kdf(format!("Argon2: {e}")))
}

/// What the user asked for (`--pbkdf`, `--hash`, `--iter-time`, `--pbkdf-force-iterations`,
/// `--pbkdf-memory`, `--pbkdf-parallel`); [`calibrate`] turns it into a [`Pbkdf`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PbkdfRequest {
    /// KDF family.
    pub kind: PbkdfKind,
    /// Hash for PBKDF2 (ignored by Argon2).
    pub hash: HashAlgorithm,
    /// Target unlock time in milliseconds (cryptsetup default 2000).
    pub iter_time_ms: u32,
    /// Skip benchmarking: PBKDF2 iterations or Argon2 time cost to use as is.
    pub force_iterations: Option<u32>,
    /// Maximum (Argon2) memory cost in KiB.
    pub max_memory_kib: u32,
    /// Argon2 parallelism.
    pub parallel: u32,
}

impl PbkdfRequest {
    /// cryptsetup's LUKS1 default: PBKDF2 with `hash`, 2 s.
    pub fn pbkdf2(hash: HashAlgorithm) -> Self {
        PbkdfRequest {
            kind: PbkdfKind::Pbkdf2,
            hash,
            iter_time_ms: DEFAULT_ITER_TIME_MS,
            force_iterations: None,
            max_memory_kib: ARGON2_DEFAULT_MEMORY_KIB,
            parallel: ARGON2_DEFAULT_PARALLEL,
        }
    }

    /// cryptsetup's LUKS2 default: Argon2id, 2 s, up to 1 GiB, 4 lanes (capped by CPUs).
    pub fn argon2id() -> Self {
        PbkdfRequest {
            kind: PbkdfKind::Argon2id,
            hash: HashAlgorithm::Sha256,
            iter_time_ms: DEFAULT_ITER_TIME_MS,
            force_iterations: None,
            max_memory_kib: ARGON2_DEFAULT_MEMORY_KIB,
            parallel: ARGON2_DEFAULT_PARALLEL.min(cpu_count()),
        }
    }

    /// Fixed cost: `iterations` PBKDF2 rounds or Argon2 passes, no benchmark.
    pub fn with_forced_iterations(mut self, iterations: u32) -> Self {
        self.force_iterations = Some(iterations);
        self
    }

    /// Refuses a forced cost below cryptsetup's minimum (PBKDF2: 1000 iterations, Argon2:
    /// 4 passes) with its two lines, instead of raising it silently.
    pub fn check_minimums(&self) -> Result<()> {
        let min = match self.kind {
            PbkdfKind::Pbkdf2 => PBKDF2_MIN_ITERATIONS,
            PbkdfKind::Argon2i | PbkdfKind::Argon2id => ARGON2_MIN_TIME,
        };
        match self.force_iterations {
            Some(n) if n < min => Err(FormatError::PbkdfRefused(format!(
                "Forced iteration count is too low for {} (minimum is {min}).\n\
                 Failed to set pbkdf parameters.",
                self.kind.name()
            ))),
            _ => Ok(()),
        }
    }

    /// Sets the target unlock time.
    pub fn with_iter_time(mut self, ms: u32) -> Self {
        self.iter_time_ms = ms;
        self
    }
}

fn cpu_count() -> u32 {
    std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1)
}

/// Half the physical memory in KiB: cryptsetup never lets Argon2 take more.
fn half_physical_memory_kib() -> u64 {
    // SAFETY: sysconf only reads system configuration.
    let (pages, page_size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages <= 0 || page_size <= 0 {
        return u64::MAX;
    }
    (pages as u64 * page_size as u64) / 1024 / 2
}

/// Chooses cost parameters for `request` so that deriving `out_len` bytes takes about
/// `iter_time_ms` on this machine (or uses the forced cost), applying cryptsetup's minimums
/// (PBKDF2 >= 1000 iterations; Argon2 time >= 4, memory >= 32 KiB).
pub fn calibrate(request: &PbkdfRequest, out_len: usize) -> Result<Pbkdf> {
    match request.kind {
        PbkdfKind::Pbkdf2 => {
            let iterations = match request.force_iterations {
                Some(n) => n.max(PBKDF2_MIN_ITERATIONS),
                None => {
                    let per_ms = pbkdf2_iterations_per_ms(request.hash, out_len)?;
                    let n = per_ms * request.iter_time_ms.max(1) as f64;
                    (n.min(u32::MAX as f64) as u32).max(PBKDF2_MIN_ITERATIONS)
                }
            };
            Ok(Pbkdf::Pbkdf2 {
                hash: request.hash,
                iterations,
            })
        }
        PbkdfKind::Argon2i | PbkdfKind::Argon2id => {
            let parallel = request.parallel.max(1);
            let cap = half_physical_memory_kib().min(request.max_memory_kib as u64) as u32;
            let floor = ARGON2_MIN_MEMORY_KIB.max(8 * parallel);
            let mut memory = cap.max(floor);
            let time = match request.force_iterations {
                Some(t) => t.max(1),
                None => {
                    let target = request.iter_time_ms.max(1) as f64;
                    let make =
                        |time, memory_kib| argon_of(request.kind, time, memory_kib, parallel);
                    let ms = time_ms(&make(ARGON2_MIN_TIME, memory), out_len)?;
                    if ms > target {
                        // Too slow even at the minimum time cost: shrink memory instead.
                        let scaled = (memory as f64 * target / ms) as u32;
                        memory = scaled.max(floor);
                        ARGON2_MIN_TIME
                    } else {
                        let t = ARGON2_MIN_TIME as f64 * target / ms.max(0.001);
                        (t.min(u32::MAX as f64) as u32).max(ARGON2_MIN_TIME)
                    }
                }
            };
            Ok(argon_of(request.kind, time, memory, parallel))
        }
    }
}

fn argon_of(kind: PbkdfKind, time: u32, memory_kib: u32, parallel: u32) -> Pbkdf {
    match kind {
        PbkdfKind::Argon2i => Pbkdf::Argon2i {
            time,
            memory_kib,
            parallel,
        },
        _ => Pbkdf::Argon2id {
            time,
            memory_kib,
            parallel,
        },
    }
}

fn time_ms(kdf: &Pbkdf, out_len: usize) -> Result<f64> {
    let start = Instant::now();
    kdf.derive(b"benchmark passphrase", &[0x5a; 32], out_len)?;
    Ok(start.elapsed().as_secs_f64() * 1000.0)
}

/// Measures PBKDF2 speed with `hash` for `out_len`-byte outputs, in iterations per
/// millisecond (the unit cryptsetup's calibration and `cryptsetup benchmark` use).
pub fn pbkdf2_iterations_per_ms(hash: HashAlgorithm, out_len: usize) -> Result<f64> {
    let mut iterations: u32 = 1000;
    loop {
        let kdf = Pbkdf::Pbkdf2 { hash, iterations };
        let start = Instant::now();
        kdf.derive(b"benchmark passphrase", &[0x5a; 32], out_len.max(1))?;
        let elapsed = start.elapsed();
        // 50 ms of work gives a stable rate without slowing short --iter-time runs much.
        if elapsed >= Duration::from_millis(50) || iterations >= u32::MAX / 2 {
            return Ok(iterations as f64 / (elapsed.as_secs_f64() * 1000.0).max(1e-6));
        }
        iterations = iterations.saturating_mul(2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &SecretBytes) -> String {
        s.to_hex().as_str().to_owned()
    }

    #[test]
    fn pbkdf2_sha256_known_answer() {
        // RFC 7914 section 11 (PBKDF2-HMAC-SHA256, "passwd"/"salt", c=1, 64 bytes).
        let k = Pbkdf::Pbkdf2 {
            hash: HashAlgorithm::Sha256,
            iterations: 1,
        }
        .derive(b"passwd", b"salt", 64)
        .unwrap();
        assert_eq!(
            hex(&k),
            "55ac046e56e3089fec1691c22544b605f94185216dde0465e68b9d57c20dacbc\
             49ca9cccf179b645991664b39d77ef317c71b845b1e30bd509112041d3a19783"
        );
    }

    #[test]
    fn argon2id_known_answer() {
        // RFC 9106 section 5.3 is keyed and has associated data, which LUKS never uses; this
        // vector comes from the reference implementation's CLI:
        // `echo -n password | argon2 somesalt -id -t 2 -k 65536 -p 1 -l 32 -r`.
        let k = Pbkdf::Argon2id {
            time: 2,
            memory_kib: 65536,
            parallel: 1,
        }
        .derive(b"password", b"somesalt", 32)
        .unwrap();
        assert_eq!(
            hex(&k),
            "09316115d5cf24ed5a15a31a3ba326e5cf32edc24702987c02b6566f61913cf7"
        );
    }

    #[test]
    fn argon2i_known_answer() {
        // Reference CLI: `echo -n password | argon2 somesalt -i -t 2 -k 65536 -p 1 -l 32 -r`.
        let k = Pbkdf::Argon2i {
            time: 2,
            memory_kib: 65536,
            parallel: 1,
        }
        .derive(b"password", b"somesalt", 32)
        .unwrap();
        assert_eq!(
            hex(&k),
            "c1628832147d9720c5bd1cfd61367078729f6dfb6f8fea9ff98158e0d7816ed0"
        );
    }

    #[test]
    fn forced_iterations_are_used_but_floored() {
        let r = PbkdfRequest::pbkdf2(HashAlgorithm::Sha1).with_forced_iterations(5);
        assert_eq!(
            calibrate(&r, 32).unwrap(),
            Pbkdf::Pbkdf2 {
                hash: HashAlgorithm::Sha1,
                iterations: 1000
            }
        );
    }

    #[test]
    fn calibration_scales_with_target_time() {
        let short = calibrate(
            &PbkdfRequest::pbkdf2(HashAlgorithm::Sha256).with_iter_time(20),
            32,
        )
        .unwrap();
        let Pbkdf::Pbkdf2 { iterations, .. } = short else {
            panic!("wrong kind")
        };
        assert!(iterations >= PBKDF2_MIN_ITERATIONS);
    }

    #[test]
    fn argon2_calibration_respects_minimums() {
        let mut r = PbkdfRequest::argon2id().with_iter_time(30);
        r.max_memory_kib = 4096;
        match calibrate(&r, 32).unwrap() {
            Pbkdf::Argon2id {
                time, memory_kib, ..
            } => {
                assert!(time >= ARGON2_MIN_TIME);
                assert!((ARGON2_MIN_MEMORY_KIB..=4096).contains(&memory_kib));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
