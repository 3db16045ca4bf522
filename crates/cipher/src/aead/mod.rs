//! Authenticated sector encryption as kernel dm-crypt does it over dm-integrity
//! (`integrity:<bytes>:aead`, what LUKS2 `--integrity` sets up).
//!
//! Facts from the kernel's dm-crypt (`crypt_convert_block_aead`, `crypt_integrity_ctr`):
//! - Each encryption sector has a metadata tuple of `<bytes>` (the table's integrity size)
//!   stored by dm-integrity: `[auth tag][stored IV][zero padding]`. The IV is stored only
//!   for `-random` IVs; the tag size is `<bytes>` minus the stored IV size.
//! - The associated data is the sector number as little-endian u64 (in 512-byte units,
//!   relative to the start of the mapping, without `iv_offset`) followed by the IV.
//! - With 4096-byte sectors, one tuple and one AEAD operation cover the whole sector.
//! - `authenc(hmac(H),mode(cipher))` takes the table key as `enc key || auth key`, the auth
//!   key being as long as H's digest unless the table sets `integrity_key_size:<bytes>`; the tag is HMAC(auth key, AD || ciphertext),
//!   truncated to the tag size. The kernel hands the crypto API an rtattr-framed blob built
//!   from those two parts, which is an in-kernel detail: the table carries the plain
//!   concatenation.
//! - `essiv:H` with AEAD is the crypto API's `essiv(...)` template: the IV (plain64 of the
//!   sector) is encrypted with the block cipher keyed by H(enc key || auth key), and the
//!   encrypted IV is what the associated data carries.
//! - `integrity:<bytes>:none` keeps only the IV (for `-random`) in the tuple and
//!   authenticates nothing.
//!
//! AES-GCM and ChaCha20-Poly1305 run on AWS-LC; authenc on RustCrypto (HMAC, AES-XTS,
//! AES-CBC with an explicit IV, which the IV-deriving [`crate::SectorCipher`] cannot take);
//! `rfc4309(ccm(aes))` on RustCrypto's `ccm`; `rfc4106(gcm(aes))` on AWS-LC; `aegis128` is
//! written here (see the `aegis` submodule).

mod aegis;
mod authenc;
mod awslc_aead;
mod ccm;

use crate::hash::HashAlgorithm;
use crate::CipherError;

/// Errors of authenticated sector processing.
#[derive(Debug, thiserror::Error)]
pub enum AeadError {
    /// A sector's tag did not match its data, IV and sector number (the kernel's
    /// `-EBADMSG`, which dm-crypt reports as `EILSEQ`).
    #[error("authentication failed at sector {sector}")]
    Auth {
        /// The failing sector, in 512-byte units relative to the mapping start.
        sector: u64,
    },
    /// Any other failure (misaligned buffer, backend error).
    #[error(transparent)]
    Cipher(#[from] CipherError),
}

/// Parameters of an authenticated sector cipher, from the crypt table line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AeadOptions {
    /// Encryption sector size in bytes (512..=4096, power of two).
    pub sector_size: usize,
    /// IV offset in 512-byte sectors (the table's `<iv_offset>`).
    pub iv_offset: u64,
    /// IVs count in `sector_size` units (`iv_large_sectors`).
    pub iv_large_sectors: bool,
    /// Metadata bytes per sector (the `<bytes>` of `integrity:<bytes>:<type>`).
    pub tuple_size: usize,
    /// `aead` (true) or `none` (false: the tuple only stores IVs).
    pub authenticated: bool,
    /// HMAC key length for `authenc` (the table's `integrity_key_size:<bytes>`); `None` =
    /// the digest size, the kernel's default.
    pub integrity_key_size: Option<usize>,
}

/// Encryption of whole sectors with a per-sector authentication tag and (for random IVs) a
/// stored IV, byte-compatible with kernel dm-crypt over dm-integrity.
///
/// `sector` is the position of `buf[0]` in 512-byte units relative to the mapping start;
/// `meta` holds [`AeadSectorCipher::tuple_size`] bytes per encryption sector of `buf`.
pub trait AeadSectorCipher: Send + Sync {
    /// Encryption sector size in bytes.
    fn sector_size(&self) -> usize;
    /// Metadata bytes per sector (tag, stored IV, padding).
    fn tuple_size(&self) -> usize;
    /// Authentication tag bytes at the start of each tuple.
    fn tag_size(&self) -> usize;
    /// IV bytes stored after the tag (0 unless the IV mode is `random`).
    fn stored_iv_size(&self) -> usize;
    /// Encrypts `buf` in place and fills `meta` with each sector's tuple.
    fn encrypt(&self, sector: u64, buf: &mut [u8], meta: &mut [u8]) -> Result<(), AeadError>;
    /// Verifies and decrypts `buf` in place using `meta`; fails with
    /// [`AeadError::Auth`] naming the first sector whose tag does not match.
    fn decrypt(&self, sector: u64, buf: &mut [u8], meta: &[u8]) -> Result<(), AeadError>;
    /// Name of the implementation in use.
    fn implementation(&self) -> &str;
}

/// An AEAD primitive with explicit IV and associated data.
pub(crate) trait AeadPrimitive: Send + Sync {
    /// IV (nonce) length the primitive takes.
    fn iv_size(&self) -> usize;
    /// Largest tag the primitive produces.
    fn max_tag_size(&self) -> usize;
    /// Whether the kernel accepts `n` as this algorithm's tag (authsize).
    fn tag_size_ok(&self, n: usize) -> bool;
    /// Encrypts `data` in place and writes the tag (`tag.len()` bytes).
    fn seal(
        &self,
        iv: &[u8],
        ad: &[u8],
        data: &mut [u8],
        tag: &mut [u8],
    ) -> Result<(), CipherError>;
    /// Verifies `tag` and decrypts `data` in place; `Ok(false)` on a tag mismatch.
    fn open(&self, iv: &[u8], ad: &[u8], data: &mut [u8], tag: &[u8]) -> Result<bool, CipherError>;
    /// The block cipher's key for ESSIV salts and the digest input, when ESSIV applies.
    fn essiv_parts(&self) -> Option<EssivInput<'_>> {
        None
    }
    /// Implementation name.
    fn implementation(&self) -> &'static str;
}

/// What an `essiv:H` IV generator needs from the primitive: the bytes H is computed over
/// (enc key || auth key).
pub(crate) struct EssivInput<'a> {
    pub(crate) enc_key: &'a [u8],
    pub(crate) auth_key: &'a [u8],
}

/// How each sector's IV is obtained.
enum IvSource {
    /// Fresh random bytes on every write, stored in the tuple.
    Random,
    Null,
    Plain,
    Plain64,
    Plain64Be,
    /// plain64 encrypted with AES keyed by the ESSIV salt.
    Essiv(Box<EssivAes>),
}

enum EssivAes {
    Aes128(aes::Aes128),
    Aes192(aes::Aes192),
    Aes256(aes::Aes256),
}

impl EssivAes {
    fn new(salt: &[u8]) -> Result<Self, CipherError> {
        use cipher::KeyInit;
        let bad = || {
            CipherError::Unsupported(format!(
                "an ESSIV salt of {} bytes is no AES key",
                salt.len()
            ))
        };
        Ok(match salt.len() {
            16 => Self::Aes128(aes::Aes128::new_from_slice(salt).map_err(|_| bad())?),
            24 => Self::Aes192(aes::Aes192::new_from_slice(salt).map_err(|_| bad())?),
            32 => Self::Aes256(aes::Aes256::new_from_slice(salt).map_err(|_| bad())?),
            _ => return Err(bad()),
        })
    }

    fn encrypt(&self, block: &mut [u8]) {
        use cipher::generic_array::GenericArray;
        use cipher::BlockEncrypt;
        let b = GenericArray::from_mut_slice(block);
        match self {
            Self::Aes128(c) => c.encrypt_block(b),
            Self::Aes192(c) => c.encrypt_block(b),
            Self::Aes256(c) => c.encrypt_block(b),
        }
    }
}

impl IvSource {
    fn fill(&self, iv_sector: u64, iv: &mut [u8]) {
        iv.fill(0);
        match self {
            Self::Random | Self::Null => {}
            Self::Plain => iv[..4].copy_from_slice(&(iv_sector as u32).to_le_bytes()),
            Self::Plain64 => iv[..8].copy_from_slice(&iv_sector.to_le_bytes()),
            Self::Plain64Be => {
                let n = iv.len();
                iv[n - 8..].copy_from_slice(&iv_sector.to_be_bytes());
            }
            Self::Essiv(c) => {
                iv[..8].copy_from_slice(&iv_sector.to_le_bytes());
                c.encrypt(iv);
            }
        }
    }
}

/// The kernel algorithm a `capi:` name stands for.
enum Algorithm {
    Gcm,
    Rfc4106,
    ChaCha20Poly1305,
    Ccm,
    Aegis128,
    Authenc {
        mac: Option<HashAlgorithm>,
        mode: authenc::Mode,
    },
}

/// Splits `capi:<alg>-<ivmode>` and recognises the algorithm.
fn parse_spec(spec: &str, authenticated: bool) -> Result<(Algorithm, String), CipherError> {
    let unknown = || CipherError::UnknownSpec(spec.to_string());
    let rest = spec.strip_prefix("capi:").ok_or_else(unknown)?;
    // The IV mode follows the last '-' outside parentheses (names contain none).
    let (alg, ivmode) = rest.rsplit_once('-').ok_or_else(unknown)?;
    if alg.contains('-') {
        return Err(unknown());
    }
    let inner = |s: &str, prefix: &str| -> Option<String> {
        s.strip_prefix(prefix)
            .and_then(|r| r.strip_suffix(')'))
            .map(str::to_string)
    };
    let algorithm = if alg == "gcm(aes)" {
        Algorithm::Gcm
    } else if alg == "rfc4106(gcm(aes))" {
        Algorithm::Rfc4106
    } else if alg == "rfc7539(chacha20,poly1305)" {
        Algorithm::ChaCha20Poly1305
    } else if alg == "rfc4309(ccm(aes))" {
        Algorithm::Ccm
    } else if alg == "aegis128" {
        Algorithm::Aegis128
    } else if let Some(args) = inner(alg, "authenc(") {
        // authenc(hmac(<hash>),<mode>(aes))
        let (mac, enc) = args.split_once("),").ok_or_else(unknown)?;
        let hash = mac.strip_prefix("hmac(").ok_or_else(unknown)?;
        let hash = HashAlgorithm::from_name(hash)?;
        let mode = authenc::Mode::parse(enc).ok_or_else(unknown)?;
        Algorithm::Authenc {
            mac: Some(hash),
            mode,
        }
    } else if let Some(mode) = authenc::Mode::parse(alg).filter(|_| !authenticated) {
        Algorithm::Authenc { mac: None, mode }
    } else {
        return Err(unknown());
    };
    let ok = match algorithm {
        Algorithm::Authenc { mac: None, .. } => !authenticated,
        _ => authenticated,
    };
    if !ok {
        return Err(CipherError::Unsupported(format!(
            "'{spec}' needs integrity type {}",
            if authenticated { "none" } else { "aead" }
        )));
    }
    Ok((algorithm, ivmode.to_string()))
}

/// Opens an authenticated sector cipher for a dm-crypt `capi:` specification
/// (`capi:gcm(aes)-random`, `capi:rfc7539(chacha20,poly1305)-plain64`,
/// `capi:authenc(hmac(sha256),xts(aes))-random`, ...) and the table's key.
pub fn open_aead_cipher(
    spec: &str,
    key: &[u8],
    opts: &AeadOptions,
) -> Result<Box<dyn AeadSectorCipher>, CipherError> {
    let ss = opts.sector_size;
    if !ss.is_power_of_two() || !(512..=4096).contains(&ss) {
        return Err(CipherError::SectorSize(ss));
    }
    let (algorithm, ivmode) = parse_spec(spec, opts.authenticated)?;
    let key_error = || CipherError::KeySize {
        spec: spec.to_string(),
        got: key.len(),
    };
    let prim: Box<dyn AeadPrimitive> = match algorithm {
        Algorithm::Gcm => Box::new(awslc_aead::AwsLcAead::gcm(key).ok_or_else(key_error)?),
        Algorithm::Rfc4106 => Box::new(awslc_aead::AwsLcAead::rfc4106(key).ok_or_else(key_error)?),
        Algorithm::ChaCha20Poly1305 => {
            Box::new(awslc_aead::AwsLcAead::chacha20_poly1305(key).ok_or_else(key_error)?)
        }
        Algorithm::Ccm => Box::new(ccm::Rfc4309Ccm::new(key).ok_or_else(key_error)?),
        Algorithm::Aegis128 => Box::new(aegis::Aegis128::new(key).ok_or_else(key_error)?),
        Algorithm::Authenc { mac, mode } => Box::new(
            authenc::Authenc::new(mac, mode, key, opts.integrity_key_size).ok_or_else(key_error)?,
        ),
    };
    let iv_size = prim.iv_size();
    let iv = match ivmode.split_once(':') {
        None => match ivmode.as_str() {
            "random" => IvSource::Random,
            "null" => IvSource::Null,
            "plain" => IvSource::Plain,
            "plain64" => IvSource::Plain64,
            "plain64be" => IvSource::Plain64Be,
            _ => return Err(CipherError::UnknownSpec(spec.to_string())),
        },
        Some(("essiv", h)) => {
            let hash = HashAlgorithm::from_name(h)?;
            let parts = prim.essiv_parts().ok_or_else(|| {
                CipherError::Unsupported(format!("essiv with '{spec}' (no block cipher IV)"))
            })?;
            let salt = crate::SecretBytes::from_vec(hash.digest(&[parts.enc_key, parts.auth_key]));
            IvSource::Essiv(Box::new(EssivAes::new(salt.as_bytes())?))
        }
        _ => return Err(CipherError::UnknownSpec(spec.to_string())),
    };
    let stored_iv = if matches!(iv, IvSource::Random) {
        iv_size
    } else {
        0
    };
    let tag_size = if opts.authenticated {
        opts.tuple_size.saturating_sub(stored_iv)
    } else {
        0
    };
    if tag_size + stored_iv > opts.tuple_size || (opts.authenticated && tag_size == 0) {
        return Err(CipherError::Unsupported(format!(
            "integrity:{} leaves no room for a tag and a {stored_iv}-byte IV",
            opts.tuple_size
        )));
    }
    if opts.authenticated && (tag_size > prim.max_tag_size() || !prim.tag_size_ok(tag_size)) {
        return Err(CipherError::Unsupported(format!(
            "a {tag_size}-byte tag (integrity:{} minus a {stored_iv}-byte stored IV) is not valid for {spec}",
            opts.tuple_size
        )));
    }
    Ok(Box::new(AeadCipher {
        prim,
        iv,
        iv_size,
        tag_size,
        stored_iv,
        opts: opts.clone(),
    }))
}

/// dm-crypt's per-sector AEAD loop over a primitive.
struct AeadCipher {
    prim: Box<dyn AeadPrimitive>,
    iv: IvSource,
    iv_size: usize,
    tag_size: usize,
    stored_iv: usize,
    opts: AeadOptions,
}

/// Largest IV any primitive takes.
const MAX_IV: usize = 16;

impl AeadCipher {
    fn check(&self, sector: u64, buf: &[u8], meta: &[u8]) -> Result<usize, CipherError> {
        let ss = self.opts.sector_size;
        if !buf.len().is_multiple_of(ss) {
            return Err(CipherError::Misaligned {
                len: buf.len(),
                sector_size: ss,
            });
        }
        if !sector.is_multiple_of((ss / 512) as u64) {
            return Err(CipherError::MisalignedSector {
                sector,
                sector_size: ss,
            });
        }
        let n = buf.len() / ss;
        if meta.len() != n * self.opts.tuple_size {
            return Err(CipherError::Backend(format!(
                "metadata of {} bytes for {n} sectors of {} bytes each",
                meta.len(),
                self.opts.tuple_size
            )));
        }
        Ok(n)
    }

    /// The IV sector of the `k`-th sector of a request starting at `sector`.
    fn iv_sector(&self, sector512: u64) -> u64 {
        let cc = sector512.wrapping_add(self.opts.iv_offset);
        if self.opts.iv_large_sectors {
            cc >> (self.opts.sector_size / 512).trailing_zeros()
        } else {
            cc
        }
    }

    /// Associated data: sector (le64, 512-byte units, no iv_offset) || IV.
    fn ad(&self, sector512: u64, iv: &[u8], out: &mut [u8; 8 + MAX_IV]) -> usize {
        out[..8].copy_from_slice(&sector512.to_le_bytes());
        out[8..8 + iv.len()].copy_from_slice(iv);
        8 + iv.len()
    }
}

impl AeadSectorCipher for AeadCipher {
    fn sector_size(&self) -> usize {
        self.opts.sector_size
    }
    fn tuple_size(&self) -> usize {
        self.opts.tuple_size
    }
    fn tag_size(&self) -> usize {
        self.tag_size
    }
    fn stored_iv_size(&self) -> usize {
        self.stored_iv
    }

    fn encrypt(&self, sector: u64, buf: &mut [u8], meta: &mut [u8]) -> Result<(), AeadError> {
        let n = self.check(sector, buf, meta)?;
        let ss = self.opts.sector_size;
        let ts = self.opts.tuple_size;
        let step = (ss / 512) as u64;
        let mut iv = [0u8; MAX_IV];
        let iv = &mut iv[..self.iv_size];
        let mut ad = [0u8; 8 + MAX_IV];
        // Random IVs for the whole request from one call to the OS source.
        let mut random = Vec::new();
        if matches!(self.iv, IvSource::Random) {
            random.resize(n * self.iv_size, 0);
            getrandom::getrandom(&mut random)
                .map_err(|e| CipherError::Backend(format!("random IV: {e}")))?;
        }
        for (k, (data, tuple)) in buf
            .chunks_exact_mut(ss)
            .zip(meta.chunks_exact_mut(ts))
            .enumerate()
        {
            let s = sector + k as u64 * step;
            if matches!(self.iv, IvSource::Random) {
                iv.copy_from_slice(&random[k * self.iv_size..(k + 1) * self.iv_size]);
            } else {
                self.iv.fill(self.iv_sector(s), iv);
            }
            let adl = self.ad(s, iv, &mut ad);
            let (tag, rest) = tuple.split_at_mut(self.tag_size);
            self.prim.seal(iv, &ad[..adl], data, tag)?;
            rest[..self.stored_iv].copy_from_slice(&iv[..self.stored_iv]);
            rest[self.stored_iv..].fill(0);
        }
        Ok(())
    }

    fn decrypt(&self, sector: u64, buf: &mut [u8], meta: &[u8]) -> Result<(), AeadError> {
        self.check(sector, buf, meta)?;
        let ss = self.opts.sector_size;
        let ts = self.opts.tuple_size;
        let step = (ss / 512) as u64;
        let mut iv = [0u8; MAX_IV];
        let iv = &mut iv[..self.iv_size];
        let mut ad = [0u8; 8 + MAX_IV];
        for (k, (data, tuple)) in buf
            .chunks_exact_mut(ss)
            .zip(meta.chunks_exact(ts))
            .enumerate()
        {
            let s = sector + k as u64 * step;
            let (tag, rest) = tuple.split_at(self.tag_size);
            if matches!(self.iv, IvSource::Random) {
                iv.copy_from_slice(&rest[..self.iv_size]);
            } else {
                self.iv.fill(self.iv_sector(s), iv);
            }
            let adl = self.ad(s, iv, &mut ad);
            if !self.prim.open(iv, &ad[..adl], data, tag)? {
                return Err(AeadError::Auth { sector: s });
            }
        }
        Ok(())
    }

    fn implementation(&self) -> &str {
        self.prim.implementation()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(tuple: usize) -> AeadOptions {
        AeadOptions {
            sector_size: 512,
            iv_offset: 0,
            iv_large_sectors: false,
            tuple_size: tuple,
            authenticated: true,
            integrity_key_size: None,
        }
    }

    #[test]
    fn specs_and_tuple_sizes() {
        let c = open_aead_cipher("capi:gcm(aes)-random", &[7; 32], &opts(28)).unwrap();
        assert_eq!((c.tag_size(), c.stored_iv_size()), (16, 12));
        let c = open_aead_cipher(
            "capi:authenc(hmac(sha256),xts(aes))-random",
            &[7; 96],
            &opts(48),
        )
        .unwrap();
        assert_eq!((c.tag_size(), c.stored_iv_size()), (32, 16));
        let c = open_aead_cipher(
            "capi:authenc(hmac(sha256),xts(aes))-plain64",
            &[7; 96],
            &opts(32),
        )
        .unwrap();
        assert_eq!((c.tag_size(), c.stored_iv_size()), (32, 0));
        // A 33-byte HMAC-SHA256 tag does not exist.
        assert!(open_aead_cipher(
            "capi:authenc(hmac(sha256),xts(aes))-plain64",
            &[7; 96],
            &opts(33)
        )
        .is_err());
        assert!(open_aead_cipher("aes-gcm-random", &[7; 32], &opts(28)).is_err());
        assert!(open_aead_cipher("capi:gcm(aes)-random", &[7; 31], &opts(28)).is_err());
    }

    #[test]
    fn random_ivs_are_fresh_per_sector_and_per_write() {
        let c = open_aead_cipher("capi:gcm(aes)-random", &[9; 32], &opts(28)).unwrap();
        let mut a = vec![0u8; 2048];
        let mut b = a.clone();
        let (mut ma, mut mb) = (vec![0u8; 4 * 28], vec![0u8; 4 * 28]);
        c.encrypt(0, &mut a, &mut ma).unwrap();
        c.encrypt(0, &mut b, &mut mb).unwrap();
        assert_ne!(a, b, "rewriting a sector must not reuse its IV");
        let ivs: Vec<&[u8]> = ma.chunks(28).map(|t| &t[16..]).collect();
        for i in 0..ivs.len() {
            for j in i + 1..ivs.len() {
                assert_ne!(ivs[i], ivs[j]);
            }
        }
    }

    #[test]
    fn every_bit_of_data_tag_iv_and_sector_is_authenticated() {
        for (spec, klen, tuple) in [
            ("capi:gcm(aes)-random", 32, 28),
            ("capi:rfc7539(chacha20,poly1305)-random", 32, 28),
            ("capi:rfc7539(chacha20,poly1305)-plain64", 32, 16),
            ("capi:authenc(hmac(sha256),xts(aes))-random", 96, 48),
            ("capi:authenc(hmac(sha512),cbc(aes))-essiv:sha256", 96, 64),
        ] {
            let c = open_aead_cipher(spec, &vec![3u8; klen], &opts(tuple)).unwrap();
            let plain: Vec<u8> = (0..1024).map(|i| i as u8).collect();
            let mut buf = plain.clone();
            let mut meta = vec![0u8; 2 * tuple];
            c.encrypt(8, &mut buf, &mut meta).unwrap();
            assert_ne!(buf, plain, "{spec}");
            let mut ok = buf.clone();
            c.decrypt(8, &mut ok, &meta).unwrap();
            assert_eq!(ok, plain, "{spec}");
            let mut bad = buf.clone();
            bad[600] ^= 1;
            assert!(matches!(
                c.decrypt(8, &mut bad, &meta),
                Err(AeadError::Auth { sector: 9 })
            ));
            let mut m = meta.clone();
            m[tuple - 1] ^= 0x80;
            assert!(matches!(
                c.decrypt(8, &mut buf.clone(), &m),
                Err(AeadError::Auth { sector: 8 })
            ));
            // The same bytes at another sector fail: the sector is in the AD.
            assert!(c.decrypt(16, &mut buf.clone(), &meta).is_err(), "{spec}");
        }
    }
}
