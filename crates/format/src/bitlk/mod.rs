//! BitLocker (BITLK) volumes, read-only as cryptsetup handles them: the boot sector, the FVE
//! metadata block, its protectors (VMKs) and the encrypted full-volume key (FVEK), and the
//! layout dm-crypt maps (metadata areas hidden, the relocated volume header put back).
//!
//! Facts from the public BitLocker format documentation (libbde's "BitLocker Drive
//! Encryption (BDE) format") and from cryptsetup 2.6's `bitlkDump` output on its test images:
//! little-endian fields; the boot sector carries `-FVE-FS-` at offset 3 (or `MSWIN4.1` for
//! BitLocker To Go) and the BitLocker GUID at 160 (To Go: 424) followed by the three metadata
//! block offsets; each metadata block is a 64-byte block header (version 2 holds the
//! encrypted volume size at 16), a 48-byte metadata header (size at 0, volume GUID at 16,
//! encryption method at 36, creation FILETIME at 40) and entries of
//! `{size u16, type u16, value type u16, version u16, data}`.

mod keys;

pub use keys::{recovery_key, BitlkKey};

use crate::error::{FormatError, Result};
use crate::hdrio::HeaderIo;

/// The BitLocker identifier of a normal or To Go volume.
const GUID_NORMAL: [u8; 16] = guid_bytes("4967d63b-2e29-4ad8-8399-f6a339e3d001");
/// The identifier of a volume that is being encrypted on write (encrypt-on-write, also
/// what a partially encrypted volume carries), which cryptsetup does not activate.
const GUID_EOW: [u8; 16] = guid_bytes("92a84d3b-dd80-4d0e-9e4e-b1e3284eaed8");

/// The size cryptsetup reports (and hides) for each FVE metadata area.
pub const METADATA_AREA_SIZE: u64 = 65536;
/// Largest metadata block this reader accepts (Windows writes a few KiB).
const MAX_METADATA: usize = 65536;

/// What kind of BitLocker volume the boot sector announces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BitlkKind {
    /// A fixed-disk volume (`-FVE-FS-` boot sector).
    Normal,
    /// BitLocker To Go (FAT boot sector).
    ToGo,
    /// Being encrypted on write (or partially encrypted): not activatable.
    EncryptOnWrite,
}

/// How a VMK is protected (the protection type of a VMK entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protection {
    /// Unprotected: the key that decrypts the VMK is stored beside it.
    ClearKey,
    /// The TPM.
    Tpm,
    /// A startup key (`.BEK` file).
    StartupKey,
    /// The TPM and a PIN.
    TpmPin,
    /// The 48-digit recovery password.
    RecoveryPassphrase,
    /// A smart card.
    SmartCard,
    /// A user passphrase.
    Passphrase,
    /// A protection type this reader does not know.
    Unknown(u16),
}

impl Protection {
    fn from_u16(v: u16) -> Self {
        match v {
            0x0000 => Self::ClearKey,
            0x0100 => Self::Tpm,
            0x0200 => Self::StartupKey,
            0x0500 => Self::TpmPin,
            0x0800 => Self::RecoveryPassphrase,
            0x1000 => Self::SmartCard,
            0x2000 => Self::Passphrase,
            v => Self::Unknown(v),
        }
    }

    /// cryptsetup's dump text.
    pub fn describe(self) -> &'static str {
        match self {
            Self::ClearKey => "VMK protected with clear key",
            Self::Tpm => "VMK protected with TPM",
            Self::StartupKey => "VMK protected with startup key",
            Self::TpmPin => "VMK protected with TPM and PIN",
            Self::RecoveryPassphrase => "VMK protected with recovery passphrase",
            Self::SmartCard => "VMK protected with smart card",
            Self::Passphrase => "VMK protected with passphrase",
            Self::Unknown(_) => "VMK protected with unknown method",
        }
    }
}

/// An AES-CCM encrypted key as stored: nonce, then the MAC and the encrypted key entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncryptedKey {
    /// The 12-byte nonce (FILETIME and counter).
    pub nonce: [u8; 12],
    /// MAC (16 bytes) followed by the ciphertext.
    pub data: Vec<u8>,
}

impl EncryptedKey {
    /// Size of the decrypted key entry (what the dump calls "Key data size").
    pub fn key_data_size(&self) -> usize {
        self.data.len().saturating_sub(16)
    }
}

/// One volume master key protector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vmk {
    /// Its GUID (a startup key file names the VMK it opens by this).
    pub guid: String,
    /// Its name property (`ExternalKey`, ...), if any.
    pub name: Option<String>,
    /// How it is protected.
    pub protection: Protection,
    /// The key-stretching salt (zero when there is no stretch key).
    pub salt: [u8; 16],
    /// The encrypted VMK, if present.
    pub key: Option<EncryptedKey>,
    /// The stored key that decrypts the VMK of a clear-key protector.
    pub clear_key: Option<Vec<u8>>,
}

/// The data encryption, from the metadata's encryption method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encryption {
    /// AES-CBC with the Elephant diffuser (key bits of the AES key).
    CbcElephant(u32),
    /// AES-CBC with byte-offset IVs.
    Cbc(u32),
    /// AES-XTS (bits of one of its two AES keys).
    Xts(u32),
}

impl Encryption {
    fn from_method(m: u16) -> Option<Self> {
        Some(match m {
            0x8000 => Self::CbcElephant(128),
            0x8001 => Self::CbcElephant(256),
            0x8002 => Self::Cbc(128),
            0x8003 => Self::Cbc(256),
            0x8004 => Self::Xts(128),
            0x8005 => Self::Xts(256),
            _ => return None,
        })
    }

    /// dm-crypt's mode (`cbc-elephant`, `cbc-eboiv`, `xts-plain64`).
    pub fn mode(self) -> &'static str {
        match self {
            Self::CbcElephant(_) => "cbc-elephant",
            Self::Cbc(_) => "cbc-eboiv",
            Self::Xts(_) => "xts-plain64",
        }
    }

    /// The whole dm-crypt cipher specification.
    pub fn spec(self) -> String {
        format!("aes-{}", self.mode())
    }

    /// The volume key size dm-crypt takes, in bytes (two keys for XTS and Elephant).
    pub fn key_bytes(self) -> usize {
        match self {
            Self::Cbc(b) => b as usize / 8,
            Self::CbcElephant(b) | Self::Xts(b) => 2 * b as usize / 8,
        }
    }
}

/// A parsed BitLocker volume header.
#[derive(Clone, Debug)]
pub struct BitlkHeader {
    /// Normal, To Go or encrypt-on-write.
    pub kind: BitlkKind,
    /// Metadata block version (2 since Windows 7).
    pub version: u16,
    /// Volume GUID.
    pub guid: String,
    /// Bytes per sector from the boot sector.
    pub sector_size: u32,
    /// Volume size in bytes (the encrypted size of the block header).
    pub volume_size: u64,
    /// Creation time (FILETIME, 100 ns since 1601).
    pub created: u64,
    /// The description entry (computer, drive, date).
    pub description: String,
    /// The data encryption.
    pub encryption: Encryption,
    /// The protectors, in metadata order.
    pub vmks: Vec<Vmk>,
    /// The encrypted FVEK.
    pub fvek: EncryptedKey,
    /// Offsets of the three FVE metadata blocks.
    pub metadata_offsets: [u64; 3],
    /// Where the encrypted copy of the original first sectors is.
    pub volume_header_offset: u64,
    /// How many bytes of the start it holds.
    pub volume_header_size: u64,
}

/// Parses a GUID text into its on-disk byte order (first three groups little-endian).
const fn guid_bytes(s: &str) -> [u8; 16] {
    let b = s.as_bytes();
    let mut hex = [0u8; 16];
    let mut i = 0;
    let mut n = 0;
    while i < b.len() {
        let c = b[i];
        if c != b'-' {
            let v = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                _ => 0,
            };
            if n % 2 == 0 {
                hex[n / 2] = v << 4;
            } else {
                hex[n / 2] |= v;
            }
            n += 1;
        }
        i += 1;
    }
    let order = [3, 2, 1, 0, 5, 4, 7, 6, 8, 9, 10, 11, 12, 13, 14, 15];
    let mut out = [0u8; 16];
    let mut j = 0;
    while j < 16 {
        out[j] = hex[order[j]];
        j += 1;
    }
    out
}

/// The text form of an on-disk GUID.
pub fn guid_text(b: &[u8]) -> String {
    format!(
        "{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{}",
        b[3],
        b[2],
        b[1],
        b[0],
        b[5],
        b[4],
        b[7],
        b[6],
        b[8],
        b[9],
        hex::encode(&b[10..16])
    )
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
    FormatError::Corrupt(format!("BITLK {what}"))
}

/// One metadata entry: its type, value type and data (after the 8-byte entry header).
pub(crate) struct Entry<'a> {
    pub(crate) kind: u16,
    pub(crate) value_type: u16,
    pub(crate) data: &'a [u8],
}

/// Splits `buf` into entries; a size below the header or past the end is corruption, a zero
/// size ends the list (Windows pads with zeros).
pub(crate) fn entries(buf: &[u8]) -> Result<Vec<Entry<'_>>> {
    let mut out = Vec::new();
    let mut p = 0;
    while p + 8 <= buf.len() {
        let size = le16(buf, p) as usize;
        if size == 0 {
            break;
        }
        if size < 8 || p + size > buf.len() {
            return Err(corrupt("metadata entry has an invalid size"));
        }
        out.push(Entry {
            kind: le16(buf, p + 2),
            value_type: le16(buf, p + 4),
            data: &buf[p + 8..p + size],
        });
        p += size;
    }
    Ok(out)
}

/// Value types of entries and properties.
pub(crate) mod value {
    pub const KEY: u16 = 0x0001;
    pub const STRING: u16 = 0x0002;
    pub const STRETCH_KEY: u16 = 0x0003;
    pub const AES_CCM: u16 = 0x0005;
    pub const VMK: u16 = 0x0008;
    pub const EXTERNAL_KEY: u16 = 0x0009;
    pub const OFFSET_SIZE: u16 = 0x000f;
}

/// Entry types.
mod entry {
    pub const VMK: u16 = 0x0002;
    pub const FVEK: u16 = 0x0003;
    pub const DESCRIPTION: u16 = 0x0007;
    pub const VOLUME_HEADER: u16 = 0x000f;
}

pub(crate) fn utf16_string(data: &[u8]) -> String {
    let units: Vec<u16> = data
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .take_while(|&u| u != 0)
        .collect();
    String::from_utf16_lossy(&units)
}

pub(crate) fn encrypted_key(data: &[u8]) -> Result<EncryptedKey> {
    if data.len() < 12 + 16 {
        return Err(corrupt("encrypted key is too short"));
    }
    let mut nonce = [0u8; 12];
    nonce.copy_from_slice(&data[..12]);
    Ok(EncryptedKey {
        nonce,
        data: data[12..].to_vec(),
    })
}

fn parse_vmk(data: &[u8]) -> Result<Vmk> {
    if data.len() < 28 {
        return Err(corrupt("VMK entry is too short"));
    }
    let mut vmk = Vmk {
        guid: guid_text(&data[..16]),
        name: None,
        protection: Protection::from_u16(le16(data, 26)),
        salt: [0; 16],
        key: None,
        clear_key: None,
    };
    for p in entries(&data[28..])? {
        match p.value_type {
            value::STRING => vmk.name = Some(utf16_string(p.data)),
            value::STRETCH_KEY if p.data.len() >= 20 => vmk.salt.copy_from_slice(&p.data[4..20]),
            value::AES_CCM => vmk.key = Some(encrypted_key(p.data)?),
            value::KEY if p.data.len() > 4 => vmk.clear_key = Some(p.data[4..].to_vec()),
            _ => {}
        }
    }
    Ok(vmk)
}

/// The 112-byte head of the FVE metadata block at `offset` when the block is sound: its
/// `-FVE-FS-` signature, version 2, a size (in 16-byte units) within 64 KiB, and a validation
/// block right after it (size >= 8, version <= 2) whose CRC-32 matches the block's bytes.
fn valid_block(io: &dyn HeaderIo, offset: u64, device_size: u64) -> Option<[u8; 112]> {
    if offset == 0 || offset.checked_add(112).is_none_or(|end| end > device_size) {
        return None;
    }
    let mut head = [0u8; 112];
    io.read_at(offset, &mut head).ok()?;
    let size = usize::from(le16(&head, 8)) << 4;
    if &head[..8] != b"-FVE-FS-" || le16(&head, 10) != 2 || !(112..=64 * 1024).contains(&size) {
        return None;
    }
    let mut validation = [0u8; 8];
    io.read_at(offset + size as u64, &mut validation).ok()?;
    if le16(&validation, 0) < 8 || le16(&validation, 2) > 2 {
        return None;
    }
    let mut block = vec![0u8; size];
    io.read_at(offset, &mut block).ok()?;
    (crc32fast::hash(&block) == le32(&validation, 4) && block[..112] == head).then_some(head)
}

impl BitlkHeader {
    /// True when the device starts with a BitLocker boot sector (signature and identifier).
    pub fn probe(io: &dyn HeaderIo) -> bool {
        let mut bs = [0u8; 512];
        io.read_at(0, &mut bs).is_ok() && boot_sector(&bs).is_ok()
    }

    /// Reads and parses the header of `io`.
    pub fn read(io: &dyn HeaderIo) -> Result<Self> {
        let mut bs = [0u8; 512];
        io.read_at(0, &mut bs)
            .map_err(|e| FormatError::io("reading BITLK boot sector", e))?;
        let (kind, sector_size, offsets) = boot_sector(&bs)?;
        let device_size = io
            .size()
            .map_err(|e| FormatError::io("getting device size", e))?;
        // The three metadata blocks are copies; as cryptsetup 2.8, the first whose CRC-32
        // (in the validation block after it) matches is used, so one damaged copy is
        // survived. Blocks without a valid validation block are not taken.
        let (i, head) = (0..3)
            .find_map(|i| valid_block(io, offsets[i], device_size).map(|h| (i, h)))
            .ok_or_else(|| corrupt("no FVE metadata copy has a valid signature and CRC-32"))?;
        let first = offsets[i];
        let block_offsets = [le64(&head, 32), le64(&head, 40), le64(&head, 48)];
        if block_offsets[i] != first {
            return Err(corrupt(
                "the valid FVE metadata copy is not where it says it is",
            ));
        }
        let version = le16(&head, 10);
        let volume_size = le64(&head, 16);
        let meta = &head[64..];
        let meta_size = le32(meta, 0) as usize;
        if !(48..=MAX_METADATA).contains(&meta_size) || first + 64 + meta_size as u64 > device_size
        {
            return Err(corrupt("metadata size is invalid"));
        }
        let guid = guid_text(&meta[16..32]);
        let method = le16(meta, 36);
        let created = le64(meta, 40);
        let mut buf = vec![0u8; meta_size];
        io.read_at(first + 64, &mut buf)
            .map_err(|e| FormatError::io("reading BITLK metadata entries", e))?;
        let mut description = String::new();
        let mut vmks = Vec::new();
        let mut fvek = None;
        let mut vh = None;
        for e in entries(&buf[48..])? {
            match (e.kind, e.value_type) {
                (entry::DESCRIPTION, value::STRING) => description = utf16_string(e.data),
                (entry::VMK, value::VMK) => vmks.push(parse_vmk(e.data)?),
                (entry::FVEK, value::AES_CCM) => fvek = Some(encrypted_key(e.data)?),
                (entry::VOLUME_HEADER, value::OFFSET_SIZE) if e.data.len() >= 16 => {
                    vh = Some((le64(e.data, 0), le64(e.data, 8)))
                }
                _ => {}
            }
        }
        let encryption = Encryption::from_method(method).ok_or_else(|| {
            FormatError::Unsupported(format!("BITLK encryption method {method:#06x}"))
        })?;
        let fvek = fvek.ok_or_else(|| corrupt("metadata has no FVEK entry"))?;
        let (volume_header_offset, volume_header_size) =
            vh.ok_or_else(|| corrupt("metadata has no volume header entry"))?;
        let h = BitlkHeader {
            kind,
            version,
            guid,
            sector_size,
            volume_size,
            created,
            description,
            encryption,
            vmks,
            fvek,
            metadata_offsets: block_offsets,
            volume_header_offset,
            volume_header_size,
        };
        h.check_layout(device_size)?;
        Ok(h)
    }

    /// Refuses layouts that do not fit the device or overlap: the mapping is built from them.
    fn check_layout(&self, device_size: u64) -> Result<()> {
        let ss = u64::from(self.sector_size);
        let aligned = |v: u64| v.is_multiple_of(512);
        if self.volume_size == 0 || !aligned(self.volume_size) || self.volume_size > device_size {
            return Err(corrupt("volume size does not fit the device"));
        }
        let mut areas: Vec<(u64, u64)> = self
            .metadata_offsets
            .iter()
            .map(|&o| (o, METADATA_AREA_SIZE))
            .collect();
        areas.push((self.volume_header_offset, self.volume_header_size));
        for &(o, s) in &areas {
            if !aligned(o)
                || !aligned(s)
                || s == 0
                || o.checked_add(s).is_none_or(|e| e > self.volume_size)
            {
                return Err(corrupt("metadata area lies outside the volume"));
            }
        }
        if self.volume_header_size > self.volume_header_offset {
            return Err(corrupt("volume header overlaps its relocated copy"));
        }
        areas.sort_unstable();
        if areas.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
            return Err(corrupt("metadata areas overlap"));
        }
        if !ss.is_power_of_two() || !(512..=4096).contains(&ss) {
            return Err(corrupt("sector size is invalid"));
        }
        Ok(())
    }

    /// The key size of the data cipher in bits, as the dump shows it.
    pub fn key_bits(&self) -> usize {
        self.encryption.key_bytes() * 8
    }

    /// `bitlkDump` text for `device` (identical to cryptsetup 2.6's; the creation time in the
    /// local time zone, as `ctime` prints it).
    pub fn dump(&self, device: &str) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let togo = if self.kind == BitlkKind::ToGo {
            " To Go"
        } else {
            ""
        };
        let _ = writeln!(s, "Info for BITLK{togo} device {device}.");
        let _ = writeln!(s, "Version:      \t{}", self.version);
        let _ = writeln!(s, "GUID:         \t{}", self.guid);
        let _ = writeln!(s, "Sector size:  \t{} [bytes]", self.sector_size);
        let _ = writeln!(s, "Volume size:  \t{} [bytes]", self.volume_size);
        let _ = writeln!(s, "Created:      \t{}", ctime(self.created));
        let _ = writeln!(s, "Description:  \t{}", self.description);
        let _ = writeln!(s, "Cipher name:  \taes");
        let _ = writeln!(s, "Cipher mode:  \t{}", self.encryption.mode());
        let _ = writeln!(s, "Cipher key:   \t{} bits", self.key_bits());
        let _ = writeln!(s);
        let _ = writeln!(s, "Keyslots:");
        for (i, v) in self.vmks.iter().enumerate() {
            let _ = writeln!(s, " {i}: VMK");
            if let Some(n) = &v.name {
                let _ = writeln!(s, "\tName:       \t{n}");
            }
            let _ = writeln!(s, "\tGUID:       \t{}", v.guid);
            let _ = writeln!(s, "\tProtection: \t{}", v.protection.describe());
            let _ = writeln!(s, "\tSalt:       \t{}", hex::encode(v.salt));
            let size = v.key.as_ref().map_or(0, EncryptedKey::key_data_size);
            let _ = writeln!(s, "\tKey data size:\t{size} [bytes]");
        }
        let _ = writeln!(s, " {}: FVEK", self.vmks.len());
        let _ = writeln!(s, "\tKey data size:\t{} [bytes]", self.fvek.key_data_size());
        let _ = writeln!(s);
        let _ = writeln!(s, "Metadata segments:");
        for (i, o) in self.metadata_offsets.iter().enumerate() {
            let _ = writeln!(s, " {i}: FVE metadata area");
            let _ = writeln!(s, "\tOffset: \t{o} [bytes]");
            let _ = writeln!(s, "\tSize:   \t{METADATA_AREA_SIZE} [bytes]");
        }
        let _ = writeln!(s, " 3: Volume header");
        let _ = writeln!(s, "\tOffset: \t{} [bytes]", self.volume_header_offset);
        let _ = writeln!(s, "\tSize:   \t{} [bytes]", self.volume_header_size);
        let _ = writeln!(s, "\tCipher: \t{}", self.encryption.spec());
        s
    }

    /// `bitlkDump --dump-volume-key` text.
    pub fn dump_volume_key(&self, device: &str, vk: &[u8]) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "BITLK header information for {device}");
        let _ = writeln!(s, "Cipher name:   \taes");
        let _ = writeln!(s, "Cipher mode:   \t{}", self.encryption.mode());
        let _ = writeln!(s, "UUID:          \t{}", self.guid);
        let _ = writeln!(s, "MK bits:       \t{}", vk.len() * 8);
        s.push_str("MK dump:\t");
        for (i, line) in vk.chunks(16).enumerate() {
            if i > 0 {
                s.push_str("\t\t");
            }
            for b in line {
                let _ = write!(s, "{b:02x} ");
            }
            s.push('\n');
        }
        s
    }
}

/// Checks the boot sector: kind, bytes per sector and the three metadata offsets.
fn boot_sector(bs: &[u8; 512]) -> Result<(BitlkKind, u32, [u64; 3])> {
    let (ident_at, kind_normal) = match &bs[3..11] {
        b"-FVE-FS-" => (160, BitlkKind::Normal),
        b"MSWIN4.1" => (424, BitlkKind::ToGo),
        _ => return Err(FormatError::NotLuks),
    };
    let ident = &bs[ident_at..ident_at + 16];
    let kind = if ident == GUID_EOW {
        BitlkKind::EncryptOnWrite
    } else if ident == GUID_NORMAL {
        kind_normal
    } else {
        return Err(FormatError::NotLuks);
    };
    let offsets = [
        le64(bs, ident_at + 16),
        le64(bs, ident_at + 24),
        le64(bs, ident_at + 32),
    ];
    Ok((kind, u32::from(le16(bs, 11)), offsets))
}

/// A FILETIME as C's `ctime` prints it, in the local time zone.
fn ctime(filetime: u64) -> String {
    const EPOCH_DIFF: i64 = 11_644_473_600;
    let secs = (filetime / 10_000_000) as i64 - EPOCH_DIFF;
    let t = secs as libc::time_t;
    // SAFETY: localtime_r writes only the given tm; a zeroed tm is a valid output buffer.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call.
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return String::new();
    }
    const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{} {} {:2} {:02}:{:02}:{:02} {}",
        DAYS[tm.tm_wday.rem_euclid(7) as usize],
        MONTHS[tm.tm_mon.rem_euclid(12) as usize],
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        i64::from(tm.tm_year) + 1900
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_round_trip() {
        let g = "4967d63b-2e29-4ad8-8399-f6a339e3d001";
        assert_eq!(guid_text(&guid_bytes(g)), g);
        assert_eq!(
            GUID_NORMAL[..4],
            [0x3b, 0xd6, 0x67, 0x49],
            "first group little-endian on disk"
        );
    }
}
