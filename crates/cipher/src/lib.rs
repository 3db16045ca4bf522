//! Sector ciphers with Linux dm-crypt semantics.
//!
//! A [`SectorCipher`] encrypts whole sectors in place, deriving each sector's IV exactly as the
//! kernel's dm-crypt does for the same cipher specification (`aes-xts-plain64`,
//! `aes-cbc-essiv:sha256`, `capi:ecb(cipher_null)`, ...). Bytes written through one are
//! readable through kernel dm-crypt with the same table, and the reverse.
//!
//! The crate also holds the pieces every higher layer shares: hash functions by name
//! ([`hash`]) and locked, zeroized key buffers ([`secret`]).

#![warn(missing_docs)]

mod adiantum_mode;
pub mod aead;
mod awslc;
mod block;
mod cpu;
mod dmcipher;
mod elephant;
pub mod hash;
mod hctr2;
mod iv;
mod lmk;
mod locked;
mod lrw;
mod measure;
mod multikey;
pub mod raw;
mod registry;
mod rustcrypto;
pub mod secret;
mod serpent_fast;
pub mod spec;
pub mod tcrypt_cbc;
mod twofish_fast;
pub mod xts_x86;

pub use awslc::RawBulkXts;
pub use cpu::{cpu_features, cpu_features_summary, CpuFeatures, CPU_MASK_ENV};
pub use locked::lock_backend_memory;
pub use measure::{measure, measure_requests, Throughput};
pub use registry::{
    default_implementation, implementations, open_cipher, open_cipher_spec, ImplementationInfo,
};
pub use secret::{SecretBytes, SecretText};
pub use spec::{BlockCipherName, ChainMode, CipherSpec, IvMode, SectorOptions};

/// Errors from cipher setup and sector processing.
#[derive(Debug, thiserror::Error)]
pub enum CipherError {
    /// The cipher specification could not be parsed or names something unsupported.
    #[error("no known cipher specification pattern for '{0}'")]
    UnknownSpec(String),
    /// The hash name is not one cryptblk implements.
    #[error("unknown hash '{0}'")]
    UnknownHash(String),
    /// The key length does not fit the cipher.
    #[error("invalid key size {got} bytes for {spec}")]
    KeySize {
        /// The cipher specification.
        spec: String,
        /// The key length given, in bytes.
        got: usize,
    },
    /// Sector size not a power of two in 512..=4096.
    #[error("invalid sector size {0} (must be a power of two from 512 to 4096)")]
    SectorSize(usize),
    /// A buffer that is not a whole number of sectors.
    #[error("buffer of {len} bytes is not a multiple of the {sector_size}-byte sector")]
    Misaligned {
        /// Buffer length.
        len: usize,
        /// Sector size.
        sector_size: usize,
    },
    /// An explicitly requested implementation does not exist or cannot run on this CPU.
    #[error("cipher implementation '{0}' is not available")]
    NoImplementation(String),
    /// The underlying crypto library reported a failure.
    #[error("crypto backend failure: {0}")]
    Backend(String),
    /// A request's start sector is not aligned to the encryption sector size (the kernel
    /// fails such bios with an I/O error).
    #[error("sector {sector} is not aligned to the {sector_size}-byte encryption sector")]
    MisalignedSector {
        /// The requested start, in 512-byte units.
        sector: u64,
        /// Encryption sector size in bytes.
        sector_size: usize,
    },
    /// A well-formed specification whose combination cryptblk (or the kernel) cannot run,
    /// e.g. an ESSIV hash whose digest is no valid key size for the cipher.
    #[error("unsupported cipher configuration: {0}")]
    Unsupported(String),
}

fn copy_same_len(src: &[u8], dst: &mut [u8]) -> Result<(), CipherError> {
    if src.len() != dst.len() {
        return Err(CipherError::Backend(
            "source and destination lengths differ".into(),
        ));
    }
    dst.copy_from_slice(src);
    Ok(())
}

/// Encryption of whole sectors with per-sector IVs, as dm-crypt does it.
///
/// Invariants every implementation keeps:
/// - `buf.len()` must be a multiple of [`SectorCipher::sector_size`]; otherwise the call fails
///   with [`CipherError::Misaligned`] and `buf` is untouched.
/// - `sector` is the position of `buf[0]` in 512-byte units relative to the start of the
///   mapping (dm's `bi_sector - ti->begin`), before `iv_offset` is added. The IV of each
///   encryption sector is derived from it exactly as the kernel does, including the rule that
///   with sector sizes above 512 the IV still counts 512-byte units unless `iv_large_sectors`.
/// - Many sectors are processed per call; no per-sector allocation.
pub trait SectorCipher: Send + Sync {
    /// Encryption sector size in bytes (512..=4096, power of two).
    fn sector_size(&self) -> usize;
    /// Encrypts `buf` in place.
    fn encrypt(&self, sector: u64, buf: &mut [u8]) -> Result<(), CipherError>;
    /// Decrypts `buf` in place.
    fn decrypt(&self, sector: u64, buf: &mut [u8]) -> Result<(), CipherError>;
    /// Encrypts `src` into `dst` (same length), leaving `src` unchanged. Lets a caller whose
    /// data sits in one buffer and must land in another (a RAM disk) do one pass over memory.
    fn encrypt_to(&self, sector: u64, src: &[u8], dst: &mut [u8]) -> Result<(), CipherError> {
        copy_same_len(src, dst)?;
        self.encrypt(sector, dst)
    }
    /// Decrypts `src` into `dst` (same length); see [`SectorCipher::encrypt_to`].
    fn decrypt_to(&self, sector: u64, src: &[u8], dst: &mut [u8]) -> Result<(), CipherError> {
        copy_same_len(src, dst)?;
        self.decrypt(sector, dst)
    }
    /// Name of the implementation in use (as listed by `cryptblk ciphers`).
    fn implementation(&self) -> &str;
}
