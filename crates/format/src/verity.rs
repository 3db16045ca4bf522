//! dm-verity volumes as `veritysetup` builds them: the on-disk superblock, the hash tree
//! (format), the whole-device check (verify) and the kernel table line that maps them.
//!
//! Layout facts (kernel `Documentation/admin-guide/device-mapper/verity.rst`, cryptsetup's
//! `lib/verity`): the optional 512-byte superblock sits at the hash offset and occupies one
//! hash block; the tree follows, top level first, level 0 (digests of data blocks) last.
//! Each hash block holds `2^k` digests, `k = floor(log2(hash_block_size / digest_size))`.
//! Format 1 hashes `salt || block` and stores each digest in a slot padded to a power of two;
//! format 0 (Chrome OS) hashes `block || salt` and packs the digests. The root hash is the
//! digest of the single top-level block (of the only data block when there is just one).
//!
//! Written from those facts; no cryptsetup code is used.

use crate::error::{FormatError, Result};
use crate::hdrio::HeaderIo;
use cryptblk_cipher::hash::HashAlgorithm;
use std::fmt::Write as _;

/// Size of the on-disk superblock (`struct verity_sb`).
pub const VERITY_SUPERBLOCK_SIZE: usize = 512;
/// Superblock signature.
pub const VERITY_SIGNATURE: &[u8; 8] = b"verity\0\0";
/// The only superblock version defined.
pub const VERITY_SUPERBLOCK_VERSION: u32 = 1;
/// Largest salt the superblock can hold.
pub const VERITY_MAX_SALT: usize = 256;
/// Deepest tree the kernel accepts (`DM_VERITY_MAX_LEVELS`).
pub const VERITY_MAX_LEVELS: u32 = 63;

/// The `veritysetup` superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VeritySuperblock {
    /// Hash format: 0 (Chrome OS, `block || salt`) or 1 (`salt || block`).
    pub hash_type: u32,
    /// Volume UUID.
    pub uuid: [u8; 16],
    /// Hash algorithm name as written (`sha256`).
    pub algorithm: String,
    /// Data block size in bytes.
    pub data_block_size: u32,
    /// Hash block size in bytes.
    pub hash_block_size: u32,
    /// Number of data blocks covered by the tree.
    pub data_blocks: u64,
    /// Salt (up to 256 bytes).
    pub salt: Vec<u8>,
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4-byte slice"))
}

impl VeritySuperblock {
    /// Parses and validates a superblock (the first 512 bytes of `bytes`).
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        if bytes.len() < VERITY_SUPERBLOCK_SIZE {
            return Err(FormatError::TooSmall(
                "verity superblock needs 512 bytes".into(),
            ));
        }
        if &bytes[0..8] != VERITY_SIGNATURE {
            return Err(FormatError::Corrupt(
                "no verity superblock signature".into(),
            ));
        }
        let version = le_u32(bytes, 8);
        if version != VERITY_SUPERBLOCK_VERSION {
            return Err(FormatError::Unsupported(format!(
                "verity superblock version {version}"
            )));
        }
        let hash_type = le_u32(bytes, 12);
        if hash_type > 1 {
            return Err(FormatError::Unsupported(format!(
                "verity hash type {hash_type}"
            )));
        }
        let uuid: [u8; 16] = bytes[16..32].try_into().expect("16-byte slice");
        let alg_raw = &bytes[32..64];
        let alg_len = alg_raw.iter().position(|&c| c == 0).unwrap_or(32);
        let algorithm = std::str::from_utf8(&alg_raw[..alg_len])
            .map_err(|_| FormatError::Corrupt("verity algorithm name is not text".into()))?
            .to_string();
        let data_block_size = le_u32(bytes, 64);
        let hash_block_size = le_u32(bytes, 68);
        let data_blocks = u64::from_le_bytes(bytes[72..80].try_into().expect("8-byte slice"));
        let salt_size = u16::from_le_bytes([bytes[80], bytes[81]]) as usize;
        if salt_size > VERITY_MAX_SALT {
            return Err(FormatError::Corrupt(format!(
                "verity salt size {salt_size} > 256"
            )));
        }
        let salt = bytes[88..88 + salt_size].to_vec();
        let sb = VeritySuperblock {
            hash_type,
            uuid,
            algorithm,
            data_block_size,
            hash_block_size,
            data_blocks,
            salt,
        };
        check_block_size("data", data_block_size)?;
        check_block_size("hash", hash_block_size)?;
        Ok(sb)
    }

    /// Serialises the superblock (reserved fields zero).
    pub fn to_bytes(&self) -> Result<[u8; VERITY_SUPERBLOCK_SIZE]> {
        if self.salt.len() > VERITY_MAX_SALT {
            return Err(FormatError::InvalidParameter(
                "salt longer than 256 bytes".into(),
            ));
        }
        if self.algorithm.len() >= 32 {
            return Err(FormatError::InvalidParameter("hash name too long".into()));
        }
        let mut b = [0u8; VERITY_SUPERBLOCK_SIZE];
        b[0..8].copy_from_slice(VERITY_SIGNATURE);
        b[8..12].copy_from_slice(&VERITY_SUPERBLOCK_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.hash_type.to_le_bytes());
        b[16..32].copy_from_slice(&self.uuid);
        b[32..32 + self.algorithm.len()].copy_from_slice(self.algorithm.as_bytes());
        b[64..68].copy_from_slice(&self.data_block_size.to_le_bytes());
        b[68..72].copy_from_slice(&self.hash_block_size.to_le_bytes());
        b[72..80].copy_from_slice(&self.data_blocks.to_le_bytes());
        b[80..82].copy_from_slice(&(self.salt.len() as u16).to_le_bytes());
        b[88..88 + self.salt.len()].copy_from_slice(&self.salt);
        Ok(b)
    }

    /// Reads the superblock at byte `offset` of `io`.
    pub fn read(io: &dyn HeaderIo, offset: u64) -> Result<Self> {
        let mut b = [0u8; VERITY_SUPERBLOCK_SIZE];
        io.read_at(offset, &mut b)
            .map_err(|e| FormatError::io("reading verity superblock", e))?;
        Self::parse(&b)
    }

    /// The UUID in its canonical text form.
    pub fn uuid_string(&self) -> String {
        uuid::Uuid::from_bytes(self.uuid).hyphenated().to_string()
    }

    /// The tree parameters this superblock describes (hash offset and superblock presence
    /// are the caller's).
    pub fn params(&self, hash_offset: u64) -> Result<VerityParams> {
        Ok(VerityParams {
            hash_type: self.hash_type,
            algorithm: HashAlgorithm::from_name(&self.algorithm)?,
            data_block_size: self.data_block_size,
            hash_block_size: self.hash_block_size,
            data_blocks: self.data_blocks,
            salt: self.salt.clone(),
            hash_offset,
            superblock: true,
            uuid: Some(self.uuid),
        })
    }
}

/// Smallest data or hash block the kernel's `verity_ctr` accepts (a sector).
pub const VERITY_MIN_BLOCK_SIZE: u32 = 512;
/// Largest data or hash block: the kernel accepts up to its page size, and 64 KiB is the
/// largest page size Linux runs with, so a tree with bigger blocks maps on no kernel.
pub const VERITY_MAX_BLOCK_SIZE: u32 = 65_536;

/// Checks a data or hash block size against the kernel's limits (a power of two from
/// [`VERITY_MIN_BLOCK_SIZE`] to [`VERITY_MAX_BLOCK_SIZE`]); `what` names it in the error.
pub fn check_block_size(what: &str, size: u32) -> Result<()> {
    if !size.is_power_of_two() || !(VERITY_MIN_BLOCK_SIZE..=VERITY_MAX_BLOCK_SIZE).contains(&size) {
        return Err(FormatError::InvalidParameter(format!(
            "invalid {what} block size {size} (power of two, \
             {VERITY_MIN_BLOCK_SIZE}..={VERITY_MAX_BLOCK_SIZE})"
        )));
    }
    Ok(())
}

/// Everything that determines a verity hash tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerityParams {
    /// Hash format 0 or 1.
    pub hash_type: u32,
    /// Digest algorithm.
    pub algorithm: HashAlgorithm,
    /// Data block size in bytes.
    pub data_block_size: u32,
    /// Hash block size in bytes.
    pub hash_block_size: u32,
    /// Data blocks covered.
    pub data_blocks: u64,
    /// Salt (empty for none).
    pub salt: Vec<u8>,
    /// Byte offset of the hash area (superblock, if any, then tree) on the hash device.
    pub hash_offset: u64,
    /// Whether a superblock precedes the tree (`--no-superblock` clears it).
    pub superblock: bool,
    /// UUID for the superblock; random when `None`.
    pub uuid: Option<[u8; 16]>,
}

impl VerityParams {
    /// `veritysetup format` defaults for `data_blocks` blocks: format 1, sha256, 4096-byte
    /// blocks, 32 random salt bytes, superblock at offset 0.
    pub fn defaults(data_blocks: u64) -> Self {
        let mut salt = vec![0u8; 32];
        getrandom::getrandom(&mut salt).expect("the OS random source failed");
        VerityParams {
            hash_type: 1,
            algorithm: HashAlgorithm::Sha256,
            data_block_size: 4096,
            hash_block_size: 4096,
            data_blocks,
            salt,
            hash_offset: 0,
            superblock: true,
            uuid: None,
        }
    }

    /// Checks the parameters and computes the tree's shape.
    pub fn geometry(&self) -> Result<VerityGeometry> {
        check_block_size("data", self.data_block_size)?;
        check_block_size("hash", self.hash_block_size)?;
        if self.hash_type > 1 {
            return Err(FormatError::InvalidParameter(format!(
                "unsupported verity hash type {}",
                self.hash_type
            )));
        }
        if self.salt.len() > VERITY_MAX_SALT {
            return Err(FormatError::InvalidParameter(
                "salt longer than 256 bytes".into(),
            ));
        }
        if self.data_blocks == 0 {
            return Err(FormatError::InvalidParameter(
                "no data blocks to protect".into(),
            ));
        }
        if !self.hash_offset.is_multiple_of(self.hash_block_size as u64) {
            return Err(FormatError::InvalidParameter(format!(
                "hash offset {} is not a multiple of the hash block size {}",
                self.hash_offset, self.hash_block_size
            )));
        }
        VerityGeometry::new(
            self.algorithm.output_len(),
            self.hash_type,
            self.hash_block_size,
            self.data_blocks,
            self.hash_offset / self.hash_block_size as u64 + u64::from(self.superblock),
        )
    }

    /// Digest of one block with this volume's salt rule.
    pub fn block_digest(&self, block: &[u8]) -> Vec<u8> {
        if self.hash_type == 0 {
            self.algorithm.digest(&[block, &self.salt])
        } else {
            self.algorithm.digest(&[&self.salt, block])
        }
    }

    /// The superblock for these parameters (UUID must be set).
    pub fn superblock(&self) -> VeritySuperblock {
        VeritySuperblock {
            hash_type: self.hash_type,
            uuid: self.uuid.unwrap_or([0; 16]),
            algorithm: self.algorithm.name().to_string(),
            data_block_size: self.data_block_size,
            hash_block_size: self.hash_block_size,
            data_blocks: self.data_blocks,
            salt: self.salt.clone(),
        }
    }
}

/// Shape of a hash tree: where each level lives on the hash device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerityGeometry {
    /// Digest length of the algorithm.
    pub digest_size: usize,
    /// Bytes between consecutive digests in a hash block (padded for format 1).
    pub digest_stride: usize,
    /// log2 of the digests per hash block.
    pub hash_per_block_bits: u32,
    /// Number of hash levels (0 when a single data block is hashed straight into the root).
    pub levels: u32,
    /// Hash block size in bytes.
    pub hash_block_size: u32,
    /// Hash-device block (in hash blocks) where the tree starts (after the superblock).
    pub hash_start_block: u64,
    /// First hash block of each level, index 0 = level 0 (digests of data blocks).
    pub level_start: Vec<u64>,
    /// Number of hash blocks at each level.
    pub level_blocks: Vec<u64>,
}

impl VerityGeometry {
    /// Computes the tree shape as the kernel does in `verity_ctr`: the one computation the
    /// format code and the dm target both use. `hash_block_size` must have passed
    /// [`check_block_size`].
    pub fn new(
        digest_size: usize,
        hash_type: u32,
        hash_block_size: u32,
        data_blocks: u64,
        hash_start_block: u64,
    ) -> Result<Self> {
        let per_block = hash_block_size as usize / digest_size;
        if per_block < 2 {
            return Err(FormatError::InvalidParameter(
                "hash block too small for two digests".into(),
            ));
        }
        let bits = usize::BITS - 1 - per_block.leading_zeros();
        let digest_stride = if hash_type == 0 {
            digest_size
        } else {
            hash_block_size as usize >> bits
        };
        let mut levels = 0u32;
        while bits * levels < 64 && (data_blocks - 1) >> (bits * levels) != 0 {
            levels += 1;
        }
        if levels > VERITY_MAX_LEVELS {
            return Err(FormatError::InvalidParameter("verity tree too deep".into()));
        }
        let mut level_start = vec![0u64; levels as usize];
        let mut level_blocks = vec![0u64; levels as usize];
        let mut position = hash_start_block;
        for i in (0..levels as usize).rev() {
            let shift = (i as u32 + 1) * bits;
            let blocks = if shift >= 64 {
                1
            } else {
                (data_blocks >> shift) + u64::from(data_blocks & ((1u64 << shift) - 1) != 0)
            };
            level_start[i] = position;
            level_blocks[i] = blocks;
            position = position
                .checked_add(blocks)
                .ok_or_else(|| FormatError::InvalidParameter("hash area overflows".into()))?;
        }
        Ok(VerityGeometry {
            digest_size,
            digest_stride,
            hash_per_block_bits: bits,
            levels,
            hash_block_size,
            hash_start_block,
            level_start,
            level_blocks,
        })
    }

    /// Total hash blocks in the tree (what `veritysetup` prints as "Hash blocks").
    pub fn hash_blocks(&self) -> u64 {
        // Saturating: a superblock may claim up to 2^64 data blocks.
        self.level_blocks
            .iter()
            .fold(0u64, |sum, &b| sum.saturating_add(b))
    }

    /// Bytes the hash device needs: up to the end of the last tree block.
    pub fn hash_device_end(&self) -> u64 {
        // Saturating, so an absurd geometry reads as "larger than any device" instead of
        // wrapping to a small size (found by the verity_superblock fuzz target).
        self.hash_start_block
            .saturating_add(self.hash_blocks())
            .saturating_mul(u64::from(self.hash_block_size))
    }
}

/// Result of [`format`].
#[derive(Clone, Debug)]
pub struct VerityFormatted {
    /// Root hash to pass to `open`.
    pub root_hash: Vec<u8>,
    /// The superblock written (or that would have been, with `superblock: false`).
    pub superblock: VeritySuperblock,
    /// Tree shape.
    pub geometry: VerityGeometry,
}

/// Reads the data blocks `first..first+count` in large chunks and calls `f(index, block)`.
fn for_each_data_block(
    data: &dyn HeaderIo,
    params: &VerityParams,
    mut f: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    let bs = params.data_block_size as usize;
    let per_chunk = (1usize << 20).div_ceil(bs).max(1);
    let mut buf = vec![0u8; per_chunk * bs];
    let mut block = 0u64;
    while block < params.data_blocks {
        let n = ((params.data_blocks - block) as usize).min(per_chunk);
        let chunk = &mut buf[..n * bs];
        data.read_at(block * bs as u64, chunk)
            .map_err(|e| FormatError::io(format!("reading data block {block}"), e))?;
        for (i, b) in chunk.chunks_exact(bs).enumerate() {
            f(block + i as u64, b)?;
        }
        block += n as u64;
    }
    Ok(())
}

/// Computes every level of the tree in memory, level 0 first, plus the root hash.
fn compute_tree(
    data: &dyn HeaderIo,
    params: &VerityParams,
    g: &VerityGeometry,
) -> Result<(Vec<Vec<u8>>, Vec<u8>)> {
    if g.levels == 0 {
        let mut root = Vec::new();
        for_each_data_block(data, params, |_, b| {
            root = params.block_digest(b);
            Ok(())
        })?;
        return Ok((Vec::new(), root));
    }
    let hbs = g.hash_block_size as usize;
    let per_block = 1usize << g.hash_per_block_bits;
    let mut levels: Vec<Vec<u8>> = Vec::with_capacity(g.levels as usize);
    let mut level0 = vec![0u8; g.level_blocks[0] as usize * hbs];
    for_each_data_block(data, params, |i, b| {
        let i = i as usize;
        let at = (i / per_block) * hbs + (i % per_block) * g.digest_stride;
        level0[at..at + g.digest_size].copy_from_slice(&params.block_digest(b));
        Ok(())
    })?;
    levels.push(level0);
    for lvl in 1..g.levels as usize {
        let below = &levels[lvl - 1];
        let mut cur = vec![0u8; g.level_blocks[lvl] as usize * hbs];
        for (i, b) in below.chunks_exact(hbs).enumerate() {
            let at = (i / per_block) * hbs + (i % per_block) * g.digest_stride;
            cur[at..at + g.digest_size].copy_from_slice(&params.block_digest(b));
        }
        levels.push(cur);
    }
    let top = levels.last().expect("levels > 0");
    let root = params.block_digest(&top[..hbs]);
    Ok((levels, root))
}

/// Builds the hash tree of `data` on `hash` (which may be the same device, with the hash
/// area at `params.hash_offset` past the data), writes the superblock unless disabled, and
/// returns the root hash. `params.uuid = None` picks a random UUID.
pub fn format(
    data: &dyn HeaderIo,
    hash: &dyn HeaderIo,
    params: &VerityParams,
) -> Result<VerityFormatted> {
    let mut params = params.clone();
    if params.uuid.is_none() {
        params.uuid = Some(*uuid::Uuid::new_v4().as_bytes());
    }
    let g = params.geometry()?;
    let data_size = data
        .size()
        .map_err(|e| FormatError::io("sizing data device", e))?;
    let need = params.data_blocks * params.data_block_size as u64;
    if data_size < need {
        return Err(FormatError::TooSmall(format!(
            "data device has {data_size} bytes, {} data blocks need {need}",
            params.data_blocks
        )));
    }
    let (levels, root) = compute_tree(data, &params, &g)?;
    let hbs = g.hash_block_size as u64;
    for (i, lvl) in levels.iter().enumerate() {
        hash.write_at(g.level_start[i] * hbs, lvl)
            .map_err(|e| FormatError::io(format!("writing hash level {i}"), e))?;
    }
    let sb = params.superblock();
    if params.superblock {
        // The superblock's hash block is zero-padded past its 512 bytes.
        let mut block = vec![0u8; hbs as usize];
        block[..VERITY_SUPERBLOCK_SIZE].copy_from_slice(&sb.to_bytes()?);
        hash.write_at(params.hash_offset, &block)
            .map_err(|e| FormatError::io("writing verity superblock", e))?;
    }
    hash.sync()
        .map_err(|e| FormatError::io("syncing hash device", e))?;
    Ok(VerityFormatted {
        root_hash: root,
        superblock: sb,
        geometry: g,
    })
}

/// What [`verify`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerityReport {
    /// Data blocks whose digest differs from the stored level-0 entry.
    pub bad_data_blocks: Vec<u64>,
    /// Hash-device blocks whose contents differ from the recomputed tree.
    pub bad_hash_blocks: Vec<u64>,
    /// Whether the recomputed root equals the expected root hash.
    pub root_ok: bool,
}

impl VerityReport {
    /// True when the device matches the root hash completely.
    pub fn is_ok(&self) -> bool {
        self.root_ok && self.bad_data_blocks.is_empty() && self.bad_hash_blocks.is_empty()
    }
}

/// Recomputes the tree from the data and checks every hash block on `hash` and the root
/// against `root_hash`, like `veritysetup verify`. Returns the findings; `Err` only for
/// I/O failures or bad parameters.
pub fn verify(
    data: &dyn HeaderIo,
    hash: &dyn HeaderIo,
    params: &VerityParams,
    root_hash: &[u8],
) -> Result<VerityReport> {
    let g = params.geometry()?;
    let (levels, root) = compute_tree(data, params, &g)?;
    let mut report = VerityReport {
        root_ok: cryptblk_cipher::secret::ct_eq(&root, root_hash),
        ..Default::default()
    };
    if g.levels == 0 && !report.root_ok {
        // The root is the digest of the only data block.
        report.bad_data_blocks.push(0);
    }
    let hbs = g.hash_block_size as usize;
    let per_block = 1usize << g.hash_per_block_bits;
    let mut stored = vec![0u8; hbs];
    for (lvl, computed) in levels.iter().enumerate() {
        for (i, want) in computed.chunks_exact(hbs).enumerate() {
            let block = g.level_start[lvl] + i as u64;
            hash.read_at(block * hbs as u64, &mut stored)
                .map_err(|e| FormatError::io(format!("reading hash block {block}"), e))?;
            if stored != want {
                report.bad_hash_blocks.push(block);
                // A level-0 block that still matches its stored parent entry is intact, so
                // the data blocks it disagrees with are the corrupt ones.
                if lvl == 0
                    && stored_parent_matches(hash, params, &g, &stored, i as u64, root_hash)?
                {
                    // Name the data blocks whose stored digest disagrees.
                    for slot in 0..per_block {
                        let idx = (i * per_block + slot) as u64;
                        if idx >= params.data_blocks {
                            break;
                        }
                        let at = slot * g.digest_stride;
                        if stored[at..at + g.digest_size] != want[at..at + g.digest_size] {
                            report.bad_data_blocks.push(idx);
                        }
                    }
                }
            }
        }
    }
    Ok(report)
}

/// Whether level-0 block `index` (contents `block`) hashes to the entry its stored parent
/// (or the root hash, for a one-level tree) holds for it.
fn stored_parent_matches(
    hash: &dyn HeaderIo,
    params: &VerityParams,
    g: &VerityGeometry,
    block: &[u8],
    index: u64,
    root_hash: &[u8],
) -> Result<bool> {
    let digest = params.block_digest(block);
    if g.levels == 1 {
        return Ok(digest == root_hash);
    }
    let per_block = 1u64 << g.hash_per_block_bits;
    let parent = g.level_start[1] + index / per_block;
    let at = (index % per_block) as usize * g.digest_stride;
    let mut buf = vec![0u8; g.hash_block_size as usize];
    hash.read_at(parent * g.hash_block_size as u64, &mut buf)
        .map_err(|e| FormatError::io(format!("reading hash block {parent}"), e))?;
    Ok(buf[at..at + g.digest_size] == digest[..])
}

/// Like [`verify`] but fails with [`FormatError::Corrupt`] naming the first problem.
pub fn verify_strict(
    data: &dyn HeaderIo,
    hash: &dyn HeaderIo,
    params: &VerityParams,
    root_hash: &[u8],
) -> Result<()> {
    let r = verify(data, hash, params, root_hash)?;
    if let Some(b) = r.bad_data_blocks.first() {
        return Err(FormatError::Corrupt(format!(
            "verification failed at data block {b}"
        )));
    }
    if let Some(b) = r.bad_hash_blocks.first() {
        return Err(FormatError::Corrupt(format!(
            "verification failed at hash block {b}"
        )));
    }
    if !r.root_ok {
        return Err(FormatError::Corrupt("root hash does not match".into()));
    }
    Ok(())
}

/// `veritysetup dump`-style text for a superblock read from `hash_offset` of a hash
/// device called `device`.
pub fn dump(sb: &VeritySuperblock, device: &str, hash_offset: u64) -> Result<String> {
    dump_with_fec(sb, device, hash_offset, None, false)
}

/// [`dump`] with veritysetup's FEC lines (roots, parity blocks, parity bytes) when the
/// volume has a FEC area described by `fec`; `fec_on_hash` tells that the parity shares
/// the hash device. As veritysetup, the device sizes are only printed where no offset
/// makes them ambiguous: the hash device's with hash offset 0 (the parity counted in when
/// it follows the tree), the FEC device's with FEC offset 0 on a device of its own.
pub fn dump_with_fec(
    sb: &VeritySuperblock,
    device: &str,
    hash_offset: u64,
    fec: Option<&crate::verity_fec::FecLayout>,
    fec_on_hash: bool,
) -> Result<String> {
    let params = sb.params(hash_offset)?;
    let g = params.geometry()?;
    let mut s = String::new();
    let _ = writeln!(s, "VERITY header information for {device}");
    let _ = writeln!(s, "UUID:            \t{}", sb.uuid_string());
    let _ = writeln!(s, "Hash type:       \t{}", sb.hash_type);
    let _ = writeln!(s, "Data blocks:     \t{}", sb.data_blocks);
    let _ = writeln!(s, "Data block size: \t{}", sb.data_block_size);
    let _ = writeln!(s, "Hash blocks:     \t{}", g.hash_blocks());
    let _ = writeln!(s, "Hash block size: \t{}", sb.hash_block_size);
    let _ = writeln!(s, "Hash algorithm:  \t{}", sb.algorithm);
    if let Some(f) = fec {
        let _ = writeln!(s, "FEC RS roots:   \t{}", f.roots);
        let _ = writeln!(s, "FEC blocks:     \t{}", f.parity_blocks());
    }
    let salt = if sb.salt.is_empty() {
        "-".to_string()
    } else {
        hex::encode(&sb.salt)
    };
    let _ = writeln!(s, "Salt:            \t{salt}");
    if hash_offset == 0 {
        let parity = match fec {
            Some(f) if fec_on_hash => f.parity_bytes(),
            _ => 0,
        };
        let _ = writeln!(
            s,
            "Hash device size: \t{} [bytes]",
            g.hash_device_end().saturating_add(parity)
        );
    }
    if let Some(f) = fec.filter(|f| f.fec_offset == 0 && !fec_on_hash) {
        let _ = writeln!(s, "FEC device size: \t{} [bytes]", f.parity_bytes());
    }
    Ok(s)
}

/// Parses a hex salt as given on the command line (`-` = none).
pub fn parse_salt(text: &str) -> Result<Vec<u8>> {
    if text == "-" {
        return Ok(Vec::new());
    }
    let salt = hex::decode(text)
        .map_err(|_| FormatError::InvalidParameter(format!("salt '{text}' is not hex")))?;
    if salt.len() > VERITY_MAX_SALT {
        return Err(FormatError::InvalidParameter(
            "salt longer than 256 bytes".into(),
        ));
    }
    Ok(salt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_round_trip_and_layout() {
        let sb = VeritySuperblock {
            hash_type: 1,
            uuid: [7; 16],
            algorithm: "sha256".into(),
            data_block_size: 4096,
            hash_block_size: 4096,
            data_blocks: 2048,
            salt: vec![0xab; 32],
        };
        let b = sb.to_bytes().unwrap();
        assert_eq!(&b[80..82], &32u16.to_le_bytes());
        assert_eq!(&b[88..90], &[0xab, 0xab]);
        assert_eq!(b[88 + 32], 0);
        assert_eq!(VeritySuperblock::parse(&b).unwrap(), sb);
    }

    #[test]
    fn geometry_matches_veritysetup_block_counts() {
        // Hash block counts for 8 MiB of data printed by veritysetup 2.6.1 / vectors.md.
        for (bs, hash, blocks) in [
            (4096u32, 32usize, 17u64),
            (1024, 32, 265),
            (512, 32, 1093),
            (1024, 20, 265),
        ] {
            let g = VerityGeometry::new(hash, 1, bs, (8 << 20) / bs as u64, 1).unwrap();
            assert_eq!(g.hash_blocks(), blocks, "bs {bs}");
        }
    }
}
