//! Feeds arbitrary bytes to the dm-integrity superblock parsers (the format crate's, which
//! `integritysetup dump` uses, and the target's own) and opens an `integrity` target over
//! the input as a device image: an existing superblock is checked against the device, the
//! journal is read, its MACs and commit ids checked and its committed sections replayed
//! onto the (in-memory) device. Garbage must be an error, never a panic, a hang or an
//! unbounded allocation.
//!
//! The input is the start of the device; the rest of a 1 MiB RAM disk reads as zeros, so a
//! seed is a real image with its trailing zeros cut off.
#![no_main]

use std::sync::Arc;

use cryptblk_dm::targets::integrity::{superblock, IntegrityConfig, IntegrityMode};
use cryptblk_dm::targets::integrity::IntegrityTarget;
use cryptblk_dm::{BlockDevice, RamDisk, WriteFlags};
use cryptblk_format::integrity::IntegritySuperblock;
use libfuzzer_sys::fuzz_target;

/// Smallest device the image is laid on.
const MIN_DEVICE: u64 = 1 << 20;
/// Largest device, so an input cannot make the target allocate much.
const MAX_DEVICE: u64 = 8 << 20;

fuzz_target!(|data: &[u8]| {
    if let Ok(sb) = IntegritySuperblock::parse(data) {
        // Whatever is accepted must serialise and re-parse to the same superblock.
        assert_eq!(IntegritySuperblock::parse(&sb.to_bytes()).expect("re-parse"), sb);
        let _ = sb.dump("fuzz");
    }
    let _ = superblock::parse(data);
    // Only images with a superblock: an all-zero area would be formatted, which is the
    // target's write path, not parsing.
    if !IntegritySuperblock::has_magic(data) || data.len() < 64 {
        return;
    }
    let size = (data.len() as u64).next_multiple_of(512).max(MIN_DEVICE);
    if size > MAX_DEVICE {
        return;
    }
    let disk = RamDisk::new(size).expect("RAM disk");
    // Writes are whole sectors: the image is zero-padded to one.
    let mut image = data.to_vec();
    image.resize(image.len().next_multiple_of(512), 0);
    disk.write_at(0, &image, WriteFlags::default()).expect("image fits");
    let dev: Arc<dyn BlockDevice> = Arc::new(disk);
    // The geometry comes from the superblock itself, so the parsers and the journal get
    // past the checks that a mismatched table line would fail.
    let tag_size = u32::from(u16::from_le_bytes([data[10], data[11]]));
    let flags = u32::from_le_bytes([data[24], data[25], data[26], data[27]]);
    let block_size = 512u32 << (data[28] & 3);
    let mode = if flags & 0x4 != 0 {
        IntegrityMode::Bitmap
    } else {
        IntegrityMode::Journal
    };
    let mut cfg = match tag_size {
        4 => IntegrityConfig::new(mode, "crc32c"),
        32 => IntegrityConfig::new(mode, "sha256"),
        _ => {
            let mut c = IntegrityConfig::new(mode, "crc32c");
            c.internal_hash = None;
            c
        }
    };
    cfg.tag_size = Some(tag_size);
    cfg.block_size = block_size;
    if let Ok(target) = IntegrityTarget::open(dev, "fuzz", None, cfg, None) {
        let mut buf = vec![0u8; block_size as usize];
        let _ = target.read_at(0, &mut buf);
        let _ = target.close();
    }
});
