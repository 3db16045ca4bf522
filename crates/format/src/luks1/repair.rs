//! `repair` of a LUKS1 header: the known benign corruptions cryptsetup's LUKS1 repair
//! fixes, with its rules and messages (facts from its documented behaviour, not its code):
//! a cipher mode `ecb-*` becomes `ecb`, an upper-case hash name becomes lower case, and an
//! inactive keyslot whose offset or stripes differ from the standard layout (or keyslot 6
//! holding an MS-DOS partition signature) is reset to the layout and wiped. Active keyslots
//! are never touched; nothing is written unless the result loads as a valid header.
//!
//! The header is patched byte for byte (not re-serialised), so everything the repair does
//! not name stays as it was.

use super::header::{
    Luks1Header, KEYSLOT_DISABLED, KEYSLOT_ENABLED, LUKS1_HEADER_SIZE, LUKS1_MAGIC,
    LUKS1_NUM_KEYSLOTS,
};
use crate::af::{self, LUKS_STRIPES};
use crate::error::{FormatError, Result};
use crate::hdrio::HeaderIo;
use cryptblk_cipher::hash::HashAlgorithm;

const CIPHER_MODE: std::ops::Range<usize> = 40..72;
const HASH_SPEC: std::ops::Range<usize> = 72..104;
const KEYSLOTS_AT: usize = 208;
const KEYSLOT_LEN: usize = 48;

/// What [`repair`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Luks1Repair {
    /// cryptsetup's lines for each fix ("Keyslot 7: salt wiped.", ...), in its order; empty
    /// when the header had no known problem.
    pub fixes: Vec<String>,
    /// True when the header was rewritten.
    pub written: bool,
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Repairs the LUKS1 header on `io` as cryptsetup's `repair` does (see the module docs).
/// An error leaves the header as it was.
pub fn repair(io: &dyn HeaderIo) -> Result<Luks1Repair> {
    let mut b = [0u8; LUKS1_HEADER_SIZE];
    io.read_at(0, &mut b)
        .map_err(|e| FormatError::io("reading LUKS header", e))?;
    if b[..6] != LUKS1_MAGIC {
        return Err(FormatError::NotLuks);
    }
    let version = u16::from_be_bytes([b[6], b[7]]);
    if version != 1 {
        return Err(FormatError::UnsupportedVersion(version as u32));
    }
    let mode = cstr(&b[CIPHER_MODE]);
    let hash = cstr(&b[HASH_SPEC]);
    let ecb_iv = mode.starts_with("ecb-");
    let upper_hash = hash.bytes().any(|c| c.is_ascii_uppercase());
    if !ecb_iv && !upper_hash && Luks1Header::parse(&b).is_ok() {
        return Ok(Luks1Repair::default());
    }
    let key_bytes = be32(&b, 108);
    if ![16, 32, 64].contains(&key_bytes) {
        return Err(FormatError::Corrupt(
            "Non standard key size, manual repair required.".into(),
        ));
    }
    if be32(&b, KEYSLOTS_AT + 40) < 8 {
        return Err(FormatError::Corrupt(
            "Non standard keyslots alignment, manual repair required.".into(),
        ));
    }
    let mut fixes = Vec::new();
    let mut write = false;
    if ecb_iv {
        fixes.push(format!("Cipher mode repaired ({mode} -> ecb)."));
        b[CIPHER_MODE].fill(0);
        b[CIPHER_MODE.start..CIPHER_MODE.start + 3].copy_from_slice(b"ecb");
        write = true;
    }
    if upper_hash {
        let lower = hash.to_ascii_lowercase();
        b[HASH_SPEC.start..HASH_SPEC.start + lower.len()].copy_from_slice(lower.as_bytes());
        fixes.push(format!("Cipher hash repaired to lowercase ({lower})."));
        if HashAlgorithm::from_name(&lower).is_err() {
            return Err(FormatError::Corrupt(format!(
                "Requested LUKS hash {lower} is not supported."
            )));
        }
        write = true;
    }
    // The standard layout: keyslot 0 at 4 KiB, each area rounded up to 4 KiB.
    let area = af::split_sectors(key_bytes as usize, LUKS_STRIPES);
    // The MS-DOS signature is read from the header as loaded, before any fix.
    let msdos = b[0x1fe] == 0x55 && b[0x1ff] == 0xaa;
    let mut expected = 8u64;
    for i in 0..LUKS1_NUM_KEYSLOTS {
        let at = KEYSLOTS_AT + i * KEYSLOT_LEN;
        let want_offset = expected as u32;
        expected = (expected + area).div_ceil(8) * 8;
        if be32(&b, at) == KEYSLOT_ENABLED {
            continue;
        }
        let mut bad = false;
        let offset = be32(&b, at + 40);
        if offset != want_offset {
            fixes.push(format!(
                "Keyslot {i}: offset repaired ({offset} -> {want_offset})."
            ));
            b[at + 40..at + 44].copy_from_slice(&want_offset.to_be_bytes());
            bad = true;
        }
        let stripes = be32(&b, at + 44);
        if stripes != LUKS_STRIPES {
            fixes.push(format!(
                "Keyslot {i}: stripes repaired ({stripes} -> {LUKS_STRIPES})."
            ));
            b[at + 44..at + 48].copy_from_slice(&LUKS_STRIPES.to_be_bytes());
            bad = true;
        }
        if i == 6 && msdos {
            fixes.push(format!("Keyslot {i}: bogus partition signature."));
            bad = true;
        }
        if bad {
            fixes.push(format!("Keyslot {i}: salt wiped."));
            b[at..at + 4].copy_from_slice(&KEYSLOT_DISABLED.to_be_bytes());
            b[at + 4..at + 40].fill(0);
            write = true;
        }
    }
    // Out-of-order offsets cannot be fixed: writing would corrupt the header again.
    Luks1Header::parse(&b).map_err(|_| FormatError::Corrupt("Repair failed.".into()))?;
    if write {
        // cryptsetup's header structure ends in 432 bytes of padding it writes as zeros,
        // so garbage over the rest of the second sector goes too.
        let mut sector = [0u8; 1024];
        sector[..LUKS1_HEADER_SIZE].copy_from_slice(&b);
        io.write_at(0, &sector)
            .and_then(|()| io.sync())
            .map_err(|e| FormatError::io("writing LUKS header", e))?;
    }
    Ok(Luks1Repair {
        fixes,
        written: write,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hdrio::MemIo;

    #[test]
    fn nothing_to_repair_writes_nothing() {
        let io = MemIo::zeroed(4096);
        let mut b = [0u8; LUKS1_HEADER_SIZE];
        b[..6].copy_from_slice(&LUKS1_MAGIC);
        b[6..8].copy_from_slice(&1u16.to_be_bytes());
        io.write_at(0, &b).unwrap();
        // Not a loadable header (no cipher, key size 0): refused, nothing written.
        assert!(repair(&io).is_err());
        let mut back = [0u8; LUKS1_HEADER_SIZE];
        io.read_at(0, &mut back).unwrap();
        assert_eq!(back, b);
    }
}
