//! The decrypted TCRYPT header fields (TrueCrypt/VeraCrypt volume format specification).

use cryptblk_cipher::SecretBytes;

/// Size of a header on disk: 64 bytes of salt and 448 encrypted bytes.
pub const HEADER_LEN: usize = 512;
/// Length of the salt at the start of the header.
pub const SALT_LEN: usize = 64;

/// A decrypted header. Offsets below are in the 512-byte header, big-endian fields.
pub struct TcryptHeader {
    /// `TRUE` (TrueCrypt) or `VERA` (VeraCrypt).
    pub magic: [u8; 4],
    /// Header format version (offset 68).
    pub version: u16,
    /// Minimum program version needed to open the volume, BCD (offset 70).
    pub tc_version: u16,
    /// Size of the hidden volume inside this one, or 0 (offset 92).
    pub hidden_volume_size: u64,
    /// Size of the volume (offset 100).
    pub volume_size: u64,
    /// Byte offset of the encrypted area (offset 108).
    pub mk_offset: u64,
    /// Byte size of the encrypted area (offset 116).
    pub mk_size: u64,
    /// Flags (offset 124): bit 0 system encryption, bit 1 in-place encryption.
    pub flags: u32,
    /// Encryption sector size, 0 in formats older than version 5 (offset 128).
    pub raw_sector_size: u32,
    /// The 256-byte key area (offset 256).
    pub keys: SecretBytes,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl TcryptHeader {
    /// Checks and reads a decrypted header (`plain` is the whole 512 bytes, salt included).
    /// `None` unless the magic matches (`VERA` only when `veracrypt`) and the CRC32s of the
    /// key area and (from version 4) of the fields agree: a wrong key gives random bytes.
    pub fn parse(plain: &[u8; HEADER_LEN], veracrypt: bool) -> Option<Self> {
        let magic: [u8; 4] = plain[64..68].try_into().ok()?;
        if &magic != b"TRUE" && !(veracrypt && &magic == b"VERA") {
            return None;
        }
        let version = be16(plain, 68);
        // Every version protects the key area with a CRC32 (cryptsetup checks it for all);
        // version 4 and later also the fields before it.
        if crc32fast::hash(&plain[256..512]) != be32(plain, 72) {
            return None;
        }
        if version >= 4 && crc32fast::hash(&plain[64..252]) != be32(plain, 252) {
            return None;
        }
        Some(TcryptHeader {
            magic,
            version,
            tc_version: be16(plain, 70),
            hidden_volume_size: be64(plain, 92),
            volume_size: be64(plain, 100),
            mk_offset: be64(plain, 108),
            mk_size: be64(plain, 116),
            flags: be32(plain, 124),
            raw_sector_size: be32(plain, 128),
            keys: SecretBytes::from_slice(&plain[256..512]),
        })
    }

    /// The encryption sector size (512 for formats that do not record one).
    pub fn sector_size(&self) -> u32 {
        if self.raw_sector_size == 0 {
            512
        } else {
            self.raw_sector_size
        }
    }

    /// Whether this is a VeraCrypt header.
    pub fn is_veracrypt(&self) -> bool {
        &self.magic == b"VERA"
    }

    /// Byte offset of the encrypted data. Formats before version 3 record none: the data
    /// follows the header, or for a hidden volume ends where its old-style header begins.
    pub fn data_offset_bytes(&self, device_size: u64, header_offset: u64) -> u64 {
        if self.mk_offset != 0 {
            return self.mk_offset;
        }
        if header_offset == 0 {
            super::HEADER_LEN as u64
        } else {
            device_size
                .saturating_sub(self.hidden_volume_size)
                .saturating_sub(super::HIDDEN_HEADER_OFFSET_OLD)
        }
    }

    /// Byte length of the encrypted data, never past the end of the device (a system
    /// volume's header describes the whole drive, of which an image may hold a part).
    pub fn data_size_bytes(&self, device_size: u64, header_offset: u64) -> u64 {
        let room = device_size.saturating_sub(self.data_offset_bytes(device_size, header_offset));
        self.recorded_size(device_size, header_offset).min(room)
    }

    fn recorded_size(&self, device_size: u64, header_offset: u64) -> u64 {
        if self.version >= 3 && self.mk_size != 0 {
            return self.mk_size;
        }
        if header_offset != 0 && self.hidden_volume_size != 0 {
            return self.hidden_volume_size;
        }
        if self.volume_size != 0 {
            return self.volume_size;
        }
        device_size.saturating_sub(self.data_offset_bytes(device_size, header_offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plaintext version-5 header with valid CRCs.
    fn header(magic: &[u8; 4]) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[64..68].copy_from_slice(magic);
        h[68..70].copy_from_slice(&5u16.to_be_bytes());
        h[108..116].copy_from_slice(&131072u64.to_be_bytes());
        h[116..124].copy_from_slice(&4096u64.to_be_bytes());
        h[128..132].copy_from_slice(&512u32.to_be_bytes());
        h[256..512].fill(0x5a);
        let keys = crc32fast::hash(&h[256..512]);
        h[72..76].copy_from_slice(&keys.to_be_bytes());
        let fields = crc32fast::hash(&h[64..252]);
        h[252..256].copy_from_slice(&fields.to_be_bytes());
        h
    }

    #[test]
    fn parse_checks_magic_and_both_crcs() {
        let h = TcryptHeader::parse(&header(b"TRUE"), false).expect("valid header");
        assert_eq!((h.version, h.mk_offset, h.mk_size), (5, 131072, 4096));
        assert_eq!(h.data_size_bytes(1 << 20, 0), 4096);
        assert!(TcryptHeader::parse(&header(b"VERA"), true).is_some_and(|h| h.is_veracrypt()));
        // VeraCrypt headers only when VeraCrypt is on; other magics never.
        assert!(TcryptHeader::parse(&header(b"VERA"), false).is_none());
        assert!(TcryptHeader::parse(&header(b"TRUF"), true).is_none());
        let mut bad_keys = header(b"TRUE");
        bad_keys[300] ^= 1;
        assert!(TcryptHeader::parse(&bad_keys, true).is_none());
        let mut bad_fields = header(b"TRUE");
        bad_fields[100] ^= 1;
        assert!(TcryptHeader::parse(&bad_fields, true).is_none());
    }

    #[test]
    fn legacy_offsets_follow_the_header_and_stay_on_the_device() {
        let mut raw = header(b"TRUE");
        raw[108..124].fill(0);
        raw[92..100].copy_from_slice(&8192u64.to_be_bytes());
        let keys = crc32fast::hash(&raw[256..512]);
        raw[72..76].copy_from_slice(&keys.to_be_bytes());
        let fields = crc32fast::hash(&raw[64..252]);
        raw[252..256].copy_from_slice(&fields.to_be_bytes());
        let h = TcryptHeader::parse(&raw, false).unwrap();
        // Normal volume: data right after the header, to the end of the device.
        assert_eq!(h.data_offset_bytes(65536, 0), 512);
        assert_eq!(h.data_size_bytes(65536, 0), 65536 - 512);
        // Hidden volume with an old-style header: it ends where that header begins.
        assert_eq!(
            h.data_offset_bytes(65536, 65536 - 1536),
            65536 - 8192 - 1536
        );
        assert_eq!(h.data_size_bytes(65536, 65536 - 1536), 8192);
        // A device smaller than the header claims maps nothing beyond its end.
        assert_eq!(h.data_size_bytes(100, 0), 0);
    }
}
