//! Running (and resuming) a forward LUKS2 re-key offline, step by step, with the on-disk
//! state cryptsetup 2.6 writes at every point, so either tool can take over after a crash.
//!
//! Invariants, per step over the hotzone `[offset, offset + len)`:
//!
//! 1. The resilience data is written and synced first (checksum: one hash of the hotzone's
//!    *old* ciphertext per checksum block, packed from the start of the keyslot area;
//!    journal: the old ciphertext itself). No header names this hotzone yet, so a crash
//!    here leaves the previous step's consistent state.
//! 2. The header naming the hotzone (`in-reencryption`, assigned to both digests) is
//!    written (both copies). From here a crash is recovered from the resilience data: each
//!    checksum block whose hash still matches is old, any other is new; a journal holds the
//!    old data whole.
//! 3. The hotzone is rewritten under the new key and synced.
//! 4. The header of the finished step is written: new data up to the hotzone's end, old
//!    data after it.
//!
//! With resilience `none` only step 3 happens (as cryptsetup: nothing records progress,
//! and a crash loses the data of an unfinished run).
//!
//! The last step differs from cryptsetup on purpose: instead of the finished-step header
//! (one new segment while the requirement is still set, which cryptsetup 2.6.1 resumes by
//! reencrypting the whole device again and so destroys it) and then one header write per
//! removed keyslot, one write of the final header follows step 3, and only then the old
//! keyslot areas and the resilience area are wiped. Resuming a header cryptsetup left in
//! that window finishes the metadata without touching the data.
//!
//! All I/O (header and data) goes through one [`HeaderIo`], so tests can cut it at any
//! write.

use super::keys::ReencryptKeys;
use super::recovery::{hotzone_plaintext, Ciphers};
use super::state::{ReencryptState, Side};
use crate::error::{Result, VolumeError};
use crate::progress::Progress;
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::luks2::{reencrypt_write::wipe_areas, Luks2Header, Resilience};

/// Bytes moved through memory at once; the hotzone itself may be larger.
const CHUNK: u64 = 4 << 20;
/// cryptsetup's hard cap on one hotzone (1 GiB).
pub const MAX_HOTZONE: u64 = 1 << 30;
/// cryptsetup's hotzone for resilience `none` without `--hotzone-size` (20 MiB).
pub const DEFAULT_NONE_HOTZONE: u64 = 20 << 20;

/// How to run the steps.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    /// Largest hotzone in bytes (`--hotzone-size`); `None` lets the resilience area decide.
    pub max_hotzone: Option<u64>,
    /// The data device's block size (cryptsetup aligns hotzones to the largest of it and
    /// both encryption sector sizes).
    pub device_block: u32,
}

/// What a run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunOutcome {
    /// Bytes of data rewritten under the new key by this run (recovered hotzones included).
    pub bytes: u64,
    /// Hotzones processed (recovered ones included).
    pub steps: u64,
    /// Bytes of the data area.
    pub data_size: u64,
    /// Hotzone length this run used.
    pub hotzone: u64,
}

fn io_err(what: &str) -> impl Fn(std::io::Error) -> VolumeError + '_ {
    move |e| VolumeError::device(format!("{what}: {e}"))
}

/// The hotzone length cryptsetup 2.6 uses for this reencryption (before the device end
/// shortens the last one).
pub fn hotzone_length(state: &ReencryptState, opts: &RunOptions) -> Result<u64> {
    let ks = &state.keyslot;
    let align = u64::from(
        opts.device_block
            .max(state.previous.sector_size)
            .max(state.fin.sector_size),
    );
    let mut len = match &ks.resilience {
        Resilience::None => opts.max_hotzone.unwrap_or(DEFAULT_NONE_HOTZONE),
        Resilience::Checksum { hash, sector_size } => {
            let h = HashAlgorithm::from_name(hash)?.output_len() as u64;
            ks.area_size / h * u64::from(*sector_size)
        }
        Resilience::Journal => ks.area_size,
        other => {
            return Err(VolumeError::usage(format!(
                "reencryption with {other:?} resilience is not supported yet"
            )))
        }
    };
    len = len.min(MAX_HOTZONE);
    if let Some(m) = opts.max_hotzone {
        len = len.min(m);
    }
    len -= len % align;
    if len == 0 {
        return Err(VolumeError::usage(
            "The reencryption hotzone is smaller than one encryption sector.",
        ));
    }
    Ok(len)
}

/// The end of the data area: the device size, which must hold whole encryption sectors.
pub(crate) fn data_end(state: &ReencryptState, io: &dyn HeaderIo) -> Result<u64> {
    let size = io.size().map_err(io_err("reading the device size"))?;
    let start = state.fin.offset.min(state.previous.offset);
    let ss = u64::from(state.previous.sector_size.max(state.fin.sector_size));
    if size <= start {
        return Err(VolumeError::device("The device has no data area."));
    }
    if !(size - start).is_multiple_of(ss) {
        return Err(VolumeError::usage(format!(
            "The data area ({} bytes) is not a multiple of the {ss}-byte encryption sector.",
            size - start
        )));
    }
    Ok(size)
}

/// Refuses (before anything is written) a checksum reencryption of a data area that is not
/// whole checksum blocks: its last hotzone could not be hashed block by block.
pub fn check_checksum_blocks(resilience: &Resilience, data_size: u64) -> Result<()> {
    if let Resilience::Checksum { sector_size, .. } = resilience {
        if !data_size.is_multiple_of(u64::from(*sector_size)) {
            return Err(VolumeError::usage(format!(
                "The data area ({data_size} bytes) is not a multiple of the {sector_size}-byte \
                 checksum block; use --resilience journal."
            )));
        }
    }
    Ok(())
}

/// Re-encrypts `[offset, offset + len)` from old to new in chunks (read, decrypt, encrypt,
/// write) and syncs.
pub(crate) fn rewrite(
    io: &dyn HeaderIo,
    ciphers: &Ciphers,
    offset: u64,
    len: u64,
    done: &mut u64,
    progress: &mut dyn Progress,
) -> Result<()> {
    let mut buf = vec![0u8; CHUNK.min(len) as usize];
    let mut pos = offset;
    while pos < offset + len {
        let n = (offset + len - pos).min(CHUNK) as usize;
        io.read_at(pos, &mut buf[..n])
            .map_err(io_err("reading the hotzone"))?;
        ciphers.old()?.decrypt_at(pos, &mut buf[..n])?;
        ciphers.new_side()?.encrypt_at(pos, &mut buf[..n])?;
        io.write_at(pos, &buf[..n])
            .map_err(io_err("writing the hotzone"))?;
        pos += n as u64;
        *done += n as u64;
        progress.update(*done);
    }
    io.sync().map_err(io_err("syncing the data"))
}

/// Writes the hotzone's resilience data (step 1) and syncs.
pub(crate) fn protect(
    state: &ReencryptState,
    io: &dyn HeaderIo,
    offset: u64,
    len: u64,
) -> Result<()> {
    let ks = &state.keyslot;
    match &ks.resilience {
        Resilience::None => return Ok(()),
        Resilience::Checksum { hash, sector_size } => {
            let alg = HashAlgorithm::from_name(hash)?;
            let bs = u64::from(*sector_size);
            if !len.is_multiple_of(bs) || (len / bs) * alg.output_len() as u64 > ks.area_size {
                return Err(VolumeError::device(
                    "the hotzone does not fit the checksum area",
                ));
            }
            let mut sums = Vec::with_capacity((len / bs) as usize * alg.output_len());
            let step = CHUNK - CHUNK % bs;
            let mut buf = vec![0u8; step.min(len) as usize];
            let mut pos = offset;
            while pos < offset + len {
                let n = (offset + len - pos).min(step) as usize;
                io.read_at(pos, &mut buf[..n])
                    .map_err(io_err("reading the hotzone"))?;
                for block in buf[..n].chunks(bs as usize) {
                    sums.extend_from_slice(&alg.digest(&[block]));
                }
                pos += n as u64;
            }
            io.write_at(ks.area_offset, &sums)
                .map_err(io_err("writing the hotzone checksums"))?;
        }
        Resilience::Journal => {
            if len > ks.area_size {
                return Err(VolumeError::device(
                    "the hotzone does not fit the journal area",
                ));
            }
            let mut buf = vec![0u8; CHUNK.min(len) as usize];
            let mut pos = 0u64;
            while pos < len {
                let n = (len - pos).min(CHUNK) as usize;
                io.read_at(offset + pos, &mut buf[..n])
                    .map_err(io_err("reading the hotzone"))?;
                io.write_at(ks.area_offset + pos, &buf[..n])
                    .map_err(io_err("writing the hotzone journal"))?;
                pos += n as u64;
            }
        }
        other => {
            return Err(VolumeError::usage(format!(
                "reencryption with {other:?} resilience is not supported yet"
            )))
        }
    }
    io.sync().map_err(io_err("syncing the resilience data"))
}

/// Writes the final header in one write, then wipes the removed keyslots' areas (the old
/// key's keyslots and the resilience area).
pub(crate) fn finish(h: &mut Luks2Header, io: &dyn HeaderIo) -> Result<()> {
    let areas = h.finish_reencryption()?;
    h.write_reencryption(io)?;
    wipe_areas(io, &areas)?;
    Ok(())
}

/// Checks the reencryption digest with the keys at hand. Without the old key (cryptsetup
/// was cut while removing the old key's keyslots, and the passphrase opens none of those
/// left) the digest cannot be computed; then only a reencryption whose data is all new may
/// go on (to its final header), which needs no old key.
pub(crate) fn verify_digest(
    h: &Luks2Header,
    state: &ReencryptState,
    keys: &ReencryptKeys,
) -> Result<()> {
    if keys.old.is_none() {
        if state.segments.iter().any(|s| s.side != Side::New) {
            return Err(VolumeError::device(
                "The passphrase does not open the old volume key of this reencryption.",
            ));
        }
        return Ok(());
    }
    h.verify_reencrypt_digest(
        keys.old.as_ref().map(|k| k.as_bytes()),
        keys.new.as_ref().map(|k| k.as_bytes()),
    )
    .map_err(|e| VolumeError::device(e.to_string()))
}

/// Recovers a hotzone a crash left (its data rewritten from the recovered plaintext under
/// the new key, synced) and writes the header of the finished step (or the final header
/// when it was the last one). Returns the hotzone's length, 0 when there was none.
pub fn recover(
    h: &mut Luks2Header,
    io: &dyn HeaderIo,
    state: &ReencryptState,
    keys: &ReencryptKeys,
) -> Result<u64> {
    let Some(hz) = state.hotzone() else {
        return Ok(0);
    };
    if state.keyslot.direction != cryptblk_format::luks2::ReencryptDirection::Forward {
        return Err(VolumeError::usage(
            "recovery of a backward reencryption is not supported yet",
        ));
    }
    verify_digest(h, state, keys)?;
    let len = hz
        .size
        .ok_or_else(|| VolumeError::device("hotzone segment without a size"))?;
    let ciphers = Ciphers::new(state, keys)?;
    let mut data = hotzone_plaintext(state, &ciphers, io, io, hz, len)?;
    ciphers.new_side()?.encrypt_at(hz.offset, &mut data)?;
    io.write_at(hz.offset, &data)
        .map_err(io_err("writing the hotzone"))?;
    io.sync().map_err(io_err("syncing the data"))?;
    let old_after = state
        .segments
        .iter()
        .any(|s| s.side == Side::Old && s.offset >= hz.offset + len);
    if old_after {
        h.finish_forward_hotzone()?;
        h.write_reencryption(io)?;
    } else {
        finish(h, io)?;
    }
    Ok(len)
}

/// Runs the reencryption `h` describes to its end (recovering a cut hotzone first), with
/// `keys` holding both volume keys. The header and data are both on `io`.
pub fn run(
    h: &mut Luks2Header,
    io: &dyn HeaderIo,
    keys: &ReencryptKeys,
    opts: &RunOptions,
    progress: &mut dyn Progress,
) -> Result<RunOutcome> {
    let mut out = RunOutcome::default();
    let Some(state) = ReencryptState::of(h)? else {
        return Err(VolumeError::usage("Device reencryption not in progress."));
    };
    if state.keyslot.direction != cryptblk_format::luks2::ReencryptDirection::Forward {
        return Err(VolumeError::usage(
            "backward reencryption is not supported yet",
        ));
    }
    verify_digest(h, &state, keys)?;
    let end = data_end(&state, io)?;
    let start = state.fin.offset;
    check_checksum_blocks(&state.keyslot.resilience, end - start)?;
    out.data_size = end - start;
    out.hotzone = hotzone_length(&state, opts)?;
    let none = state.keyslot.resilience == Resilience::None;
    let first_old = state
        .segments
        .iter()
        .find(|s| s.side != Side::New)
        .map_or(end, |s| s.offset);
    let mut done = first_old - start;
    progress.start(Some(out.data_size), "reencrypting");
    let result = (|| -> Result<()> {
        let mut state = state;
        loop {
            if state.hotzone().is_some() {
                let n = recover(h, io, &state, keys)?;
                out.bytes += n;
                out.steps += 1;
                done += n;
                progress.update(done);
            } else {
                let Some(old) = state.segments.iter().find(|s| s.side == Side::Old) else {
                    return finish(h, io);
                };
                let offset = old.offset;
                let len = out.hotzone.min(end - offset);
                let last = offset + len >= end;
                protect(&state, io, offset, len)?;
                h.set_forward_hotzone(offset, len, !last)?;
                if !none {
                    h.write_reencryption(io)?;
                }
                let ciphers = Ciphers::new(&state, keys)?;
                rewrite(io, &ciphers, offset, len, &mut done, progress)?;
                out.bytes += len;
                out.steps += 1;
                if last {
                    return finish(h, io);
                }
                h.finish_forward_hotzone()?;
                if !none {
                    h.write_reencryption(io)?;
                }
            }
            match ReencryptState::of(h)? {
                Some(s) => state = s,
                None => return Ok(()),
            }
        }
    })();
    progress.finish();
    result.map(|()| out)
}
