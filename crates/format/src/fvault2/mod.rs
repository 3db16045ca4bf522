//! FileVault2 (Apple CoreStorage) volumes, as cryptsetup 2.6's FVAULT2 support reads them:
//! the physical volume header, the disk label and its volume groups descriptor, the
//! encrypted metadata, and from its XML property lists the passphrase-wrapped keys, the
//! logical volume's place and size.
//!
//! Facts from the public CoreStorage documentation (libfvde's "FileVault Drive Encryption
//! (FVDE)" format description) and from cryptsetup 2.6.1's behaviour on its test image:
//! little-endian fields; every block starts with a CRC-32C (Castagnoli) of the rest of the
//! block seeded with 0xffffffff and stored without the final inversion, then the seed, a
//! version (1) and a block type. The 512-byte physical volume header holds `CS` (big-endian)
//! at 88, the block size at 96, the disk label's block number at 104, the size of the key
//! at 168 (16: AES-128), the first half of the metadata key at 176 and the physical volume
//! UUID at 304 (the second half of that key). The disk label (8 KiB block at its block
//! number) points at 220 to the volume groups descriptor, which gives the number of
//! encrypted metadata blocks (at 8) and the first one's block number (at 32). Those 8 KiB
//! blocks are AES-XTS encrypted, the tweak being the block's index in the metadata; the
//! first all-zero block ends them. Block type 0x0019 holds the encryption context plist
//! (`PassphraseWrappedKEKStruct`, `KEKWrappedVolumeKeyStruct`), 0x001a the logical volume's
//! plist (size, family UUID) and 0x0305 the logical volume's first block (at 104).
//!
//! The volume key is AES-XTS-128: the key unwrapped (RFC 3394) with the key-encrypting key,
//! itself unwrapped with PBKDF2-SHA256 of the passphrase, and as the second half the first
//! 16 bytes of SHA-256 over that key and the family UUID. dm-crypt maps it as
//! `aes-xts-plain64`, sector numbers counted from the logical volume's start.

mod plist;

pub use plist::uuid_text;

use crate::error::{FormatError, Result};
use crate::hdrio::HeaderIo;
use aes::cipher::generic_array::GenericArray;
use aes::cipher::KeyInit;
use base64::Engine;
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

/// The dm-crypt cipher of every FVAULT2 volume.
pub const CIPHER: &str = "aes";
/// The dm-crypt mode of every FVAULT2 volume.
pub const CIPHER_MODE: &str = "xts-plain64";
/// Volume key size in bytes (two AES-128 keys).
pub const VOLUME_KEY_SIZE: usize = 32;

/// Size of the physical volume header.
const PV_HEADER_SIZE: usize = 512;
/// Size of a metadata block (the disk label and each encrypted metadata block).
const MD_BLOCK_SIZE: usize = 8192;
/// cryptsetup reads metadata only from the first GiB of the device.
const MAX_OFFSET: u64 = 1 << 30;
/// Size of a wrapped 128-bit key.
const WRAPPED_KEY_SIZE: usize = 24;
/// Decoded sizes of the two key structures cryptsetup accepts.
const PWK_SIZE: usize = 284;
const KWVK_SIZE: usize = 256;

/// A parsed FVAULT2 volume: what the dump shows and what unlocking needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fvault2Header {
    /// The physical volume UUID (libuuid's lower-case text).
    pub pv_uuid: String,
    /// The logical volume family UUID, binary (it salts the second half of the key).
    pub family_uuid: [u8; 16],
    /// CoreStorage block size in bytes.
    pub block_size: u32,
    /// Byte offset of the encrypted logical volume on the device.
    pub lv_offset: u64,
    /// Size of the logical volume in bytes.
    pub lv_size: u64,
    /// PBKDF2-SHA256 iterations of the passphrase.
    pub pbkdf2_iterations: u32,
    /// PBKDF2 salt.
    pub pbkdf2_salt: [u8; 16],
    /// The key-encrypting key, wrapped with the passphrase's key.
    pub wrapped_kek: [u8; WRAPPED_KEY_SIZE],
    /// The volume key's first half, wrapped with the key-encrypting key.
    pub wrapped_vk: [u8; WRAPPED_KEY_SIZE],
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

fn corrupt(what: &str) -> FormatError {
    FormatError::Corrupt(format!("FVAULT2 {what}"))
}

/// True when `block` starts with a valid CoreStorage checksum of the rest of it.
fn crc_ok(block: &[u8]) -> bool {
    let (value, seed) = (le32(block, 0), le32(block, 4));
    // The stored value is the raw CRC register (seeded with the stored seed, no final
    // inversion); the crate computes the inverted form.
    seed == 0xffff_ffff && !crc32c::crc32c_append(!seed, &block[8..]) == value
}

fn read(io: &dyn HeaderIo, offset: u64, buf: &mut [u8], what: &str) -> Result<()> {
    io.read_at(offset, buf)
        .map_err(|e| FormatError::io(format!("reading FVAULT2 {what}"), e))
}

/// `a * b` if it does not overflow and lies within the first GiB, where cryptsetup looks.
fn metadata_offset(a: u64, b: u64) -> Result<u64> {
    a.checked_mul(b)
        .filter(|&o| o <= MAX_OFFSET)
        .ok_or_else(|| corrupt("metadata offset is out of range"))
}

/// The physical volume header: block size, disk label block and the metadata key.
struct PvHeader {
    block_size: u32,
    disklabel_block: u64,
    uuid: [u8; 16],
    metadata_key: Zeroizing<[u8; 32]>,
}

fn pv_header(h: &[u8; PV_HEADER_SIZE]) -> Result<PvHeader> {
    if !crc_ok(h) || u16::from_be_bytes([h[88], h[89]]) != 0x4353 {
        return Err(FormatError::NotLuks);
    }
    let version = le16(h, 8);
    if version != 1 {
        return Err(FormatError::Unsupported(format!(
            "FVAULT2 version {version}"
        )));
    }
    if le32(h, 168) != 16 {
        return Err(FormatError::Unsupported(format!(
            "FVAULT2 AES key size {} bytes",
            le32(h, 168)
        )));
    }
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&h[304..320]);
    let mut metadata_key = Zeroizing::new([0u8; 32]);
    metadata_key[..16].copy_from_slice(&h[176..192]);
    metadata_key[16..].copy_from_slice(&uuid);
    Ok(PvHeader {
        block_size: le32(h, 96),
        disklabel_block: le64(h, 104),
        uuid,
        metadata_key,
    })
}

/// Salt, iterations, wrapped KEK and wrapped volume key, from block 0x0019.
type Keys = (
    [u8; 16],
    u32,
    [u8; WRAPPED_KEY_SIZE],
    [u8; WRAPPED_KEY_SIZE],
);

/// What the encrypted metadata blocks contribute, each found at most once or later ones
/// replacing earlier ones (as cryptsetup keeps the last of each type).
#[derive(Default)]
struct Found {
    keys: Option<Keys>,
    lv: Option<(u64, [u8; 16])>,
    lv_block: Option<u32>,
}

/// The XML of a metadata block: `size` bytes at `off`, up to the first NUL.
fn block_xml(block: &[u8], off: u32, size: u32) -> Result<&[u8]> {
    let end = u64::from(off) + u64::from(size);
    if end > MD_BLOCK_SIZE as u64 {
        return Err(corrupt("metadata XML lies outside its block"));
    }
    let xml = &block[off as usize..end as usize];
    Ok(xml.iter().position(|&b| b == 0).map_or(xml, |n| &xml[..n]))
}

fn base64_struct(xml: &[u8], key: &str, size: usize) -> Result<Zeroizing<Vec<u8>>> {
    let text = plist::search(xml, key, "data").ok_or_else(|| corrupt(&format!("has no {key}")))?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|_| corrupt(&format!("{key} is not base64")))?;
    if bytes.len() != size {
        return Err(corrupt(&format!("{key} has the wrong size")));
    }
    Ok(Zeroizing::new(bytes))
}

/// Block 0x0019: the encryption context (salt, iterations, wrapped KEK and volume key).
fn parse_0019(block: &[u8], found: &mut Found) -> Result<()> {
    let xml = block_xml(block, le32(block, 112), le32(block, 116))?;
    let pwk = base64_struct(xml, "PassphraseWrappedKEKStruct", PWK_SIZE)?;
    let kwvk = base64_struct(xml, "KEKWrappedVolumeKeyStruct", KWVK_SIZE)?;
    let mut salt = [0u8; 16];
    salt.copy_from_slice(&pwk[8..24]);
    let mut kek = [0u8; WRAPPED_KEY_SIZE];
    kek.copy_from_slice(&pwk[32..56]);
    let mut vk = [0u8; WRAPPED_KEY_SIZE];
    vk.copy_from_slice(&kwvk[8..32]);
    found.keys = Some((salt, le32(&pwk, 168), kek, vk));
    Ok(())
}

/// Block 0x001a: the logical volume's size and family UUID.
fn parse_001a(block: &[u8], found: &mut Found) -> Result<()> {
    let xml = block_xml(block, le32(block, 128), le32(block, 132))?;
    let size = plist::search(xml, "com.apple.corestorage.lv.size", "integer")
        .map(plist::strtoull_hex)
        .ok_or_else(|| corrupt("has no logical volume size"))?;
    if size == 0 || size == u64::MAX {
        return Err(corrupt("logical volume size is invalid"));
    }
    let family = plist::search(xml, "com.apple.corestorage.lv.familyUUID", "string")
        .and_then(plist::parse_uuid)
        .ok_or_else(|| corrupt("has no valid family UUID"))?;
    found.lv = Some((size, family));
    Ok(())
}

impl Fvault2Header {
    /// True when the device starts with a CoreStorage physical volume header.
    pub fn probe(io: &dyn HeaderIo) -> bool {
        let mut h = [0u8; PV_HEADER_SIZE];
        io.read_at(0, &mut h).is_ok() && pv_header(&h).is_ok()
    }

    /// Reads the physical volume header, the disk label and the encrypted metadata of `io`.
    pub fn read(io: &dyn HeaderIo) -> Result<Self> {
        let mut h = [0u8; PV_HEADER_SIZE];
        read(io, 0, &mut h, "volume header")?;
        let pv = pv_header(&h)?;
        let bs = u64::from(pv.block_size);

        let label_at = metadata_offset(pv.disklabel_block, bs)?;
        let mut block = Zeroizing::new(vec![0u8; MD_BLOCK_SIZE]);
        read(io, label_at, &mut block, "disk label")?;
        if !crc_ok(&block) {
            return Err(corrupt("disk label checksum mismatch"));
        }
        let vgd_at = label_at + u64::from(le32(&block, 220));
        if vgd_at > MAX_OFFSET {
            return Err(corrupt("volume groups descriptor offset is out of range"));
        }
        let mut vgd = [0u8; 40];
        read(io, vgd_at, &mut vgd, "volume groups descriptor")?;
        let blocks = le64(&vgd, 8);
        let start = metadata_offset(le64(&vgd, 32), bs)?;

        let found = Self::encrypted_metadata(io, &pv, start, blocks)?;
        let (Some((pbkdf2_salt, pbkdf2_iterations, wrapped_kek, wrapped_vk)), Some(lv), Some(b)) =
            (found.keys, found.lv, found.lv_block)
        else {
            return Err(corrupt("necessary metadata blocks not found"));
        };
        Ok(Fvault2Header {
            pv_uuid: uuid_text(&pv.uuid),
            family_uuid: lv.1,
            block_size: pv.block_size,
            lv_offset: u64::from(b) * bs,
            lv_size: lv.0,
            pbkdf2_iterations,
            pbkdf2_salt,
            wrapped_kek,
            wrapped_vk,
        })
    }

    /// Decrypts the metadata blocks from `start` until an all-zero one (or `blocks` of them)
    /// and collects what the three block types cryptsetup uses hold.
    fn encrypted_metadata(
        io: &dyn HeaderIo,
        pv: &PvHeader,
        start: u64,
        blocks: u64,
    ) -> Result<Found> {
        let xts = xts_mode::Xts128::new(
            aes::Aes128::new(GenericArray::from_slice(&pv.metadata_key[..16])),
            aes::Aes128::new(GenericArray::from_slice(&pv.metadata_key[16..])),
        );
        let mut found = Found::default();
        let mut block = Zeroizing::new(vec![0u8; MD_BLOCK_SIZE]);
        for i in 0..blocks {
            let at = i
                .checked_mul(MD_BLOCK_SIZE as u64)
                .and_then(|o| o.checked_add(start))
                .filter(|&o| o <= MAX_OFFSET)
                .ok_or_else(|| corrupt("metadata offset is out of range"))?;
            read(io, at, &mut block, "encrypted metadata")?;
            if block.iter().all(|&b| b == 0) {
                break;
            }
            xts.decrypt_sector(&mut block, u128::from(i).to_le_bytes());
            if !crc_ok(&block) {
                return Err(corrupt("encrypted metadata checksum mismatch"));
            }
            match le16(&block, 10) {
                0x0019 => parse_0019(&block, &mut found)?,
                0x001a => parse_001a(&block, &mut found)?,
                0x0305 => found.lv_block = Some(le32(&block, 104)),
                _ => {}
            }
        }
        Ok(found)
    }

    /// The family UUID's text form.
    pub fn family_uuid_text(&self) -> String {
        uuid_text(&self.family_uuid)
    }

    /// The volume key from `passphrase`. A passphrase that does not unwrap the keys is
    /// cryptsetup's "No key available with this passphrase." (exit 2).
    pub fn unlock(&self, passphrase: &[u8]) -> Result<SecretBytes> {
        if self.pbkdf2_iterations == 0 {
            return Err(FormatError::Kdf(
                "FVAULT2 PBKDF2 iteration count is zero".into(),
            ));
        }
        let mut pass_key = Zeroizing::new([0u8; 16]);
        HashAlgorithm::Sha256.pbkdf2(
            passphrase,
            &self.pbkdf2_salt,
            self.pbkdf2_iterations,
            &mut pass_key[..],
        );
        let kek = unwrap_key(&pass_key, &self.wrapped_kek)?;
        let vk_half = unwrap_key(&kek, &self.wrapped_vk)?;
        let mut h = Sha256::new();
        h.update(&vk_half[..]);
        h.update(self.family_uuid);
        let mut tweak_key = Zeroizing::new([0u8; 32]);
        h.finalize_into((&mut tweak_key[..]).into());
        let mut vk = SecretBytes::zeroed(VOLUME_KEY_SIZE);
        vk.as_mut_bytes()[..16].copy_from_slice(&vk_half[..]);
        vk.as_mut_bytes()[16..].copy_from_slice(&tweak_key[..16]);
        Ok(vk)
    }

    /// `fvault2Dump` text for `device`, as cryptsetup 2.6 prints it.
    pub fn dump(&self, device: &str) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "Header information for FVAULT2 device {device}.");
        let _ = writeln!(s, "Physical volume UUID: \t{}", self.pv_uuid);
        let _ = writeln!(s, "Family UUID:          \t{}", self.family_uuid_text());
        let _ = writeln!(s, "Logical volume offset:\t{} [bytes]", self.lv_offset);
        let _ = writeln!(s, "Logical volume size:  \t{} [bytes]", self.lv_size);
        let _ = writeln!(s, "Cipher:               \t{CIPHER}");
        let _ = writeln!(s, "Cipher mode:          \t{CIPHER_MODE}");
        let _ = writeln!(s, "PBKDF2 iterations:    \t{}", self.pbkdf2_iterations);
        let _ = writeln!(
            s,
            "PBKDF2 salt:          \t{}",
            hex_spaced(&self.pbkdf2_salt)
        );
        s
    }

    /// `fvault2Dump --dump-volume-key` text: the dump, then the key.
    pub fn dump_volume_key(&self, device: &str, vk: &[u8]) -> String {
        let mut s = self.dump(device);
        s.push_str("Volume key:       \t");
        s.push_str(&hex_spaced(vk));
        s.push('\n');
        s
    }
}

/// Bytes as cryptsetup's `crypt_log_hex` with a space separator prints them (each followed
/// by the separator).
fn hex_spaced(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x} ")).collect()
}

/// RFC 3394 unwrap of a 128-bit key with a 128-bit key; a failed integrity check means the
/// wrapping key was wrong.
fn unwrap_key(kek: &[u8; 16], wrapped: &[u8; WRAPPED_KEY_SIZE]) -> Result<Zeroizing<[u8; 16]>> {
    let kek = aes_kw::KekAes128::new(GenericArray::from_slice(kek));
    let mut out = Zeroizing::new([0u8; 16]);
    kek.unwrap(wrapped, &mut out[..])
        .map_err(|_| FormatError::WrongPassphrase)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_is_the_uninverted_crc32c_register() {
        // CRC-32C of "123456789" is 0xe3069283; the register before the final inversion is
        // its complement.
        let mut block = vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
        block.extend_from_slice(b"123456789");
        block[..4].copy_from_slice(&(!0xe306_9283u32).to_le_bytes());
        assert!(crc_ok(&block));
        block[9] ^= 1;
        assert!(!crc_ok(&block));
    }

    #[test]
    fn rfc3394_unwrap_vector() {
        // RFC 3394 section 4.1: 128-bit key data with a 128-bit KEK.
        let kek: [u8; 16] = hex::decode("000102030405060708090A0B0C0D0E0F")
            .unwrap()
            .try_into()
            .unwrap();
        let wrapped: [u8; 24] = hex::decode("1FA68B0A8112B447AEF34BD8FB5A7B829D3E862371D2CFE5")
            .unwrap()
            .try_into()
            .unwrap();
        let k = unwrap_key(&kek, &wrapped).unwrap();
        assert_eq!(hex::encode(&k[..]), "00112233445566778899aabbccddeeff");
        let mut bad = wrapped;
        bad[0] ^= 1;
        assert!(matches!(
            unwrap_key(&kek, &bad),
            Err(FormatError::WrongPassphrase)
        ));
    }
}
