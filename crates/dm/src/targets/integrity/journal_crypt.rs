//! Journal encryption (`journal_crypt:<alg>[:<hexkey>]`) and journal MACs
//! (`journal_mac:<alg>[:<hexkey>]`) of dm-integrity, as the kernel does them.
//!
//! Encryption keeps the in-memory journal in plain text and transforms sections only on
//! their way to and from the disk:
//! - a stream cipher (`ctr(aes)`, `chacha20`: block size 1) is turned into one keystream
//!   at load time: the kernel encrypts zeros the size of the journal rounded up to 4 KiB
//!   pages, followed by the four commit id bases, under an all-zero IV. Journal byte `x` on
//!   disk is plain byte `x` XOR keystream byte `x`; the commit id bases become the
//!   encrypted ones (so on-disk commit ids depend on the key);
//! - a block cipher in CBC (`cbc(aes)`) encrypts each section as one message whose IV is
//!   the encryption (zero IV) of the section number as a little-endian u32 padded with
//!   zeros to one block. The commit id bases stay the constants.
//!
//! The journal MAC is, per section, `H([salt || section_le64 ||] sector_le64 of every
//! entry)` (the salt part only with `fix_hmac`), zero-padded or cut to 64 bytes and stored
//! 8 bytes per entry sector in the last 8 bytes before the commit id (the space
//! [`super::layout`] keeps free when the superblock has `have_journal_mac`). It is computed
//! over plain text before encryption. With `fix_hmac` the superblock also carries
//! `H(first 512 - digest bytes)` in the last digest bytes of its first sector.
//!
//! The AES and ChaCha20 primitives are AWS-LC's, from [`cryptblk_cipher::raw`]: the
//! cipher crate's [`cryptblk_cipher::SectorCipher`] works per dm-crypt sector with dm-crypt
//! IVs, which is not what the journal needs (one keystream across the journal, or CBC per
//! section).

use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::raw::{chacha20_zero_nonce, RawAes};
use cryptblk_cipher::SecretBytes;
use zeroize::Zeroizing;

use super::journal::COMMIT_ID_BASES;

/// Bytes of MAC material per section (`JOURNAL_MAC_SIZE`: 8 bytes in each of the 8 entry
/// sectors).
pub const JOURNAL_MAC_SIZE: usize = 64;

enum Mode {
    /// Stream cipher: the keystream over the page-rounded journal.
    Xor(Zeroizing<Vec<u8>>),
    /// AES-CBC per section with per-section IVs (the expanded keys are large: boxed).
    Cbc {
        enc: Box<RawAes>,
        dec: Box<RawAes>,
        ivs: Vec<[u8; 16]>,
    },
}

/// The journal cipher of one mapping, ready for its journal geometry.
pub struct JournalCrypt {
    mode: Mode,
    section_bytes: usize,
    /// Commit id bases to use with this cipher (the kernel's `commit_ids`).
    pub commit_ids: [u64; 4],
}

impl JournalCrypt {
    /// Sets up `alg` (kernel crypto API name: `ctr(aes)`, `chacha20`, `cbc(aes)`) with
    /// `key` for a journal of `sections` sections of `section_sectors` sectors.
    pub fn new(
        alg: &str,
        key: Option<&SecretBytes>,
        sections: u32,
        section_sectors: u32,
    ) -> Result<Self, String> {
        let key = key.ok_or_else(|| format!("journal cipher '{alg}' needs a key"))?;
        let key = key.as_bytes();
        let section_bytes = section_sectors as usize * 512;
        let journal_bytes = sections as usize * section_bytes;
        // The kernel's journal is a list of 4 KiB pages.
        let pages_bytes = journal_bytes.div_ceil(4096) * 4096;
        let mut commit_ids = COMMIT_ID_BASES;
        let mode = match alg {
            "ctr(aes)" => {
                let k = RawAes::new(key, true)?;
                stream_mode(pages_bytes, &mut commit_ids, |b| k.ctr_zero_iv(b))
            }
            "chacha20" => {
                if key.len() != 32 {
                    return Err(format!(
                        "invalid key size {} for journal cipher chacha20 (32 bytes)",
                        key.len()
                    ));
                }
                stream_mode(pages_bytes, &mut commit_ids, |b| {
                    chacha20_zero_nonce(key, b).expect("32-byte key checked above")
                })
            }
            "cbc(aes)" => {
                let enc = RawAes::new(key, true)?;
                let dec = RawAes::new(key, false)?;
                let ivs = (0..sections)
                    .map(|i| {
                        let mut b = [0u8; 16];
                        b[..4].copy_from_slice(&i.to_le_bytes());
                        enc.cbc(&mut b, &[0u8; 16], true);
                        b
                    })
                    .collect();
                Mode::Cbc {
                    enc: Box::new(enc),
                    dec: Box::new(dec),
                    ivs,
                }
            }
            other => {
                return Err(format!(
                    "unsupported journal cipher '{other}' (supported: ctr(aes), chacha20, cbc(aes))"
                ))
            }
        };
        // Equal bases would make commit sequences indistinguishable: the kernel bumps
        // later duplicates until they differ.
        for i in 1..commit_ids.len() {
            while commit_ids[..i].contains(&commit_ids[i]) {
                commit_ids[i] = commit_ids[i].wrapping_add(1);
            }
        }
        Ok(JournalCrypt {
            mode,
            section_bytes,
            commit_ids,
        })
    }

    /// Encrypts (or decrypts) `buf`, which holds whole sections starting at section
    /// `first` (no wrap-around), in place.
    pub fn apply(&self, first: u32, buf: &mut [u8], encrypt: bool) {
        match &self.mode {
            Mode::Xor(ks) => {
                let base = first as usize * self.section_bytes;
                let ks = &ks[base..base + buf.len()];
                for (b, k) in buf.iter_mut().zip(ks) {
                    *b ^= k;
                }
            }
            Mode::Cbc { enc, dec, ivs } => {
                for (n, section) in buf.chunks_exact_mut(self.section_bytes).enumerate() {
                    let iv = &ivs[first as usize + n];
                    if encrypt {
                        enc.cbc(section, iv, true);
                    } else {
                        dec.cbc(section, iv, false);
                    }
                }
            }
        }
    }
}

/// The kernel's `journal_xor`: the stream cipher (`fill`, XORing its keystream in place)
/// over `pages_bytes` zeros followed by the commit id bases, which it encrypts in
/// `commit_ids`.
fn stream_mode(pages_bytes: usize, commit_ids: &mut [u64; 4], fill: impl Fn(&mut [u8])) -> Mode {
    let mut ks = Zeroizing::new(vec![0u8; pages_bytes + 32]);
    for (k, id) in COMMIT_ID_BASES.iter().enumerate() {
        ks[pages_bytes + 8 * k..pages_bytes + 8 * k + 8].copy_from_slice(&id.to_le_bytes());
    }
    fill(&mut ks);
    for (k, id) in commit_ids.iter_mut().enumerate() {
        let o = pages_bytes + 8 * k;
        *id = u64::from_le_bytes(ks[o..o + 8].try_into().expect("8 bytes"));
    }
    ks.truncate(pages_bytes);
    Mode::Xor(ks)
}

/// The journal MAC algorithm of one mapping: `hmac(<hash>)` with a key, or a plain hash.
pub struct JournalMac {
    alg: HashAlgorithm,
    key: Option<SecretBytes>,
}

impl JournalMac {
    /// Parses the kernel crypto API name (`hmac(sha256)`, `sha256`, ...) and key.
    pub fn new(name: &str, key: Option<SecretBytes>) -> Result<Self, String> {
        let unsupported = || format!("unsupported journal mac '{name}'");
        match name.strip_prefix("hmac(").and_then(|s| s.strip_suffix(')')) {
            Some(inner) => {
                let alg = HashAlgorithm::from_name(inner).map_err(|_| unsupported())?;
                let key = key.ok_or_else(|| format!("journal mac '{name}' needs a key"))?;
                Ok(JournalMac {
                    alg,
                    key: Some(key),
                })
            }
            None => {
                let alg = HashAlgorithm::from_name(name).map_err(|_| unsupported())?;
                if key.is_some() {
                    return Err(format!("journal mac '{name}' takes no key"));
                }
                Ok(JournalMac { alg, key: None })
            }
        }
    }

    /// Digest size in bytes.
    pub fn digest_size(&self) -> usize {
        self.alg.output_len()
    }

    fn digest(&self, parts: &[&[u8]]) -> Vec<u8> {
        match &self.key {
            Some(k) => self.alg.hmac(k.as_bytes(), &parts.concat()),
            None => self.alg.digest(parts),
        }
    }

    /// The 64 bytes of MAC material of a section whose entries' sector fields are
    /// `sectors` (8 bytes each, in entry order); `salt` with `fix_hmac`.
    pub fn section_mac(
        &self,
        salt: Option<&[u8; 16]>,
        section: u32,
        sectors: &[u8],
    ) -> [u8; JOURNAL_MAC_SIZE] {
        let section_le = u64::from(section).to_le_bytes();
        let d = match salt {
            Some(s) => self.digest(&[&s[..], &section_le[..], sectors]),
            None => self.digest(&[sectors]),
        };
        let mut out = [0u8; JOURNAL_MAC_SIZE];
        let n = d.len().min(JOURNAL_MAC_SIZE);
        out[..n].copy_from_slice(&d[..n]);
        out
    }

    /// Superblock MAC (`fix_hmac`): writes (`write`) or checks the digest of the first
    /// sector's leading bytes into / against its last `digest_size` bytes.
    pub fn superblock_mac(&self, sector: &mut [u8], write: bool) -> Result<(), String> {
        let size = self.digest_size();
        // The superblock structure (64 bytes) and the MAC must fit in one sector.
        if 64 + size > 512 || sector.len() < 512 {
            return Err("digest is too long".into());
        }
        let d = self.digest(&[&sector[..512 - size]]);
        if write {
            sector[512 - size..512].copy_from_slice(&d);
            Ok(())
        } else if cryptblk_cipher::secret::ct_eq(&sector[512 - size..512], &d) {
            Ok(())
        } else {
            Err("superblock mac mismatch".into())
        }
    }
}
