//! Running (and resuming) a LUKS2 reencryption offline (re-key, encryption, decryption;
//! forward or backward), step by step, with the on-disk state cryptsetup 2.6 writes at
//! every point, so either tool can take over after a crash.
//!
//! Steps work in logical offsets (bytes of the volume's data); the old data of logical
//! `l` lies at [`ReencryptState::old_phys`], its new place is [`ReencryptState::new_phys`]
//! (different only with a data shift). Forward, new data grows from the start; backward
//! (cryptsetup's choice for `--decrypt` and for `--encrypt` with a data shift), from the
//! end. Invariants, per step over the hotzone:
//!
//! 1. When the hotzone is rewritten in place, its resilience data is written and synced
//!    first (checksum: one hash of the hotzone's *old* data per checksum block, packed from
//!    the start of the keyslot area; journal: the old data itself). No header names this
//!    hotzone yet, so a crash here leaves the previous step's consistent state. A hotzone
//!    that moves (datashift, at most the shift long) needs none: its old data is not
//!    overwritten.
//! 2. The header naming the hotzone (`in-reencryption`) is written (both copies). From
//!    here a crash is recovered from the resilience data (each checksum block whose hash
//!    still matches is old, any other is new; a journal holds the old data whole), or for
//!    a moving hotzone by simply redoing it from the old data.
//! 3. The hotzone is rewritten under the new parameters and synced.
//! 4. The header of the finished step is written.
//!
//! Syncs per step, with header and data on one file: 4 (cryptsetup 2.6.1: 5). Each header
//! write syncs its primary copy before the secondary copy is written, but leaves the
//! secondary's sync to the next sync of the file (step 3's data sync; the next step's
//! resilience sync): until then the synced primary is the newest valid copy, and a load
//! prefers it over a stale or torn secondary, so each state above is durable where it
//! was before. The resilience data gets its own sync before the header naming it (where
//! cryptsetup relies on the header's sync, which may reach the disk first).
//!
//! With resilience `none` only step 3 happens (as cryptsetup: nothing records progress,
//! and a crash loses the data of an unfinished run).
//!
//! The last step differs from cryptsetup on purpose: instead of the finished-step header
//! (one new segment while the requirement is still set, which cryptsetup 2.6.1 resumes by
//! reencrypting the whole device again and so destroys it) and then one header write per
//! removed keyslot, one write of the final header follows step 3, and only then the old
//! keyslot areas, the resilience area and an encryption's moved copy of the first data
//! are wiped. Resuming a header cryptsetup left in that window finishes the metadata
//! without touching the data.
//!
//! All I/O goes through [`HeaderIo`] (header and data on one, or a detached header on its
//! own), so tests can cut it at any write.

use super::keys::ReencryptKeys;
use super::recovery::{hotzone_plaintext, read_old_raw, Ciphers};
use super::state::{ReencryptState, Side};
use crate::error::{Result, VolumeError};
use crate::progress::Progress;
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::luks2::{
    reencrypt_write::wipe_areas, LayoutPart, Luks2Header, ReencryptDirection, Resilience,
};

/// Bytes moved through memory at once; the hotzone itself may be larger.
const CHUNK: u64 = 4 << 20;
/// cryptsetup's hard cap on one hotzone (1 GiB).
pub const MAX_HOTZONE: u64 = 1 << 30;
/// cryptsetup's hotzone for resilience `none` without `--hotzone-size` (20 MiB).
pub const DEFAULT_NONE_HOTZONE: u64 = 20 << 20;
/// Largest hotzone whose old data is kept in memory between its protection (checksums or
/// journal) and its rewrite, so it is read once. A longer hotzone (cryptsetup's checksum
/// hotzone is up to 1 GiB, which it holds in memory whole) is hashed chunk by chunk and
/// read again for the rewrite, so memory stays bounded: recovery decides per checksum
/// block (or copies from the journal), so the order of writes within a hotzone does not
/// matter.
pub const BUFFERED_HOTZONE: u64 = CHUNKS_KEPT * CHUNK;
/// [`BUFFERED_HOTZONE`] in chunks (also with [`RunOptions::chunk`] set).
const CHUNKS_KEPT: u64 = 16;

/// Page size the I/O buffers are aligned to.
const PAGE: usize = 4096;

/// `len` bytes of `buf` (grown as needed, contents unspecified) starting on a page
/// boundary. A read from the page cache into a destination that is not page aligned costs
/// about three times the kernel copy time (measured: 16 MiB `pread`s from tmpfs took 0.07 s
/// per 240 MiB into an aligned buffer, 0.25 s at the 16-byte offset malloc gives a large
/// `Vec<u8>`); this was most of the gap between cryptblk's journal reencryption and
/// cryptsetup's, whose buffers are aligned for `O_DIRECT`.
pub(crate) fn page_aligned(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if buf.len() < len + PAGE {
        buf.resize(len + PAGE, 0);
    }
    let skew = (PAGE - buf.as_ptr() as usize % PAGE) % PAGE;
    &mut buf[skew..skew + len]
}

/// cryptsetup's soft cap on a hotzone: a quarter of the physical memory.
fn quarter_of_memory() -> Option<u64> {
    // SAFETY: sysconf only reads system constants.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages > 0 && size > 0).then(|| (pages as u64).saturating_mul(size as u64) / 4)
}

/// How to run the steps.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    /// Largest hotzone in bytes (`--hotzone-size`); `None` lets the resilience area decide.
    pub max_hotzone: Option<u64>,
    /// The data device's block size (cryptsetup aligns hotzones to the largest of it and
    /// both encryption sector sizes).
    pub device_block: u32,
    /// Bytes moved through memory at once (default 4 MiB); a hotzone longer than 16 of
    /// them is hashed or journalled, then rewritten, chunk by chunk instead of being kept
    /// whole (see [`BUFFERED_HOTZONE`]). Smaller values let tests cut writes inside that
    /// chunked path on small images.
    pub chunk: Option<u64>,
}

impl RunOptions {
    /// Bytes moved through memory at once.
    pub(crate) fn chunk(&self) -> u64 {
        self.chunk
            .map_or(CHUNK, |c| c.max(PAGE as u64) / PAGE as u64 * PAGE as u64)
    }

    /// The longest hotzone kept in memory whole between its protection and its rewrite.
    pub(crate) fn keep_whole(&self) -> u64 {
        CHUNKS_KEPT * self.chunk()
    }
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
/// shortens the last one). As cryptsetup 2.6.1 sizes it (its `luksDump` of runs killed
/// after the first hotzone agrees): `none` takes `--hotzone-size` or 20 MiB; `checksum`
/// as many blocks as the area holds hashes of (1 GiB with a 16 MiB header); `journal` the
/// area's length; each capped at 1 GiB, a quarter of the memory and `--hotzone-size`, then
/// aligned down to the largest block or sector size. A datashift hotzone is the shift.
/// A `--hotzone-size` that is not a multiple of that alignment is refused (exit 1).
pub fn hotzone_length(state: &ReencryptState, opts: &RunOptions) -> Result<u64> {
    let ks = &state.keyslot;
    let align = u64::from(
        opts.device_block
            .max(state.previous.sector_size)
            .max(state.fin.sector_size),
    );
    // cryptsetup 2.6.1 refuses a limit off the zone alignment for every resilience,
    // datashift included (where the limit is otherwise unused), with these two lines.
    if let Some(m) = opts.max_hotzone {
        if m % align != 0 {
            return Err(VolumeError::usage(format!(
                "Hotzone size must be multiple of calculated zone alignment ({align} bytes).\n\
                 Failed to load LUKS2 reencryption context."
            )));
        }
    }
    let mut len = match &ks.resilience {
        Resilience::None => opts.max_hotzone.unwrap_or(DEFAULT_NONE_HOTZONE),
        Resilience::Checksum { hash, sector_size } => {
            let h = HashAlgorithm::from_name(hash)?.output_len() as u64;
            ks.area_size / h * u64::from(*sector_size)
        }
        Resilience::Journal => ks.area_size,
        // The data moves by the shift: a longer hotzone would overwrite its own old data.
        // cryptsetup fixes the hotzone to the shift (--hotzone-size does not apply).
        Resilience::Datashift { shift_size }
        | Resilience::DatashiftChecksum { shift_size, .. }
        | Resilience::DatashiftJournal { shift_size } => {
            let len = (*shift_size).min(MAX_HOTZONE);
            return Ok(len - len % align);
        }
    };
    len = len.min(MAX_HOTZONE);
    if let Some(q) = quarter_of_memory() {
        len = len.min(q);
    }
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

/// The logical size of the data on `data` (see [`ReencryptState::logical_size`]), which
/// must hold whole encryption sectors when it runs to the device end.
pub(crate) fn data_end(state: &ReencryptState, data: &dyn HeaderIo) -> Result<u64> {
    let size = data.size().map_err(io_err("reading the device size"))?;
    let start = state.fin.offset.min(state.previous.offset);
    let ss = u64::from(state.sector_size());
    if size <= start {
        return Err(VolumeError::device("The device has no data area."));
    }
    if state.previous.size.is_none() && !(size - state.previous.offset).is_multiple_of(ss) {
        return Err(VolumeError::usage(format!(
            "The data area ({} bytes) is not a multiple of the {ss}-byte encryption sector.",
            size - state.previous.offset
        )));
    }
    Ok(state.logical_size(size))
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

/// Rewrites logical `[l, l + len)` from old to new in chunks (read from the old place,
/// decrypt, encrypt, write to the new place) and syncs.
/// `old`, when given, is the old data of the whole range as [`protect`] read it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rewrite(
    state: &ReencryptState,
    data: &dyn HeaderIo,
    ciphers: &Ciphers,
    l: u64,
    len: u64,
    mut old: Option<&mut [u8]>,
    done: &mut u64,
    progress: &mut dyn Progress,
    opts: &RunOptions,
) -> Result<()> {
    let chunk = opts.chunk();
    let mut own = Vec::new();
    let mut pos = l;
    let threads = crypt_threads();
    while pos < l + len {
        let n = (l + len - pos).min(chunk) as usize;
        let buf = match old.as_mut().filter(|o| o.len() as u64 == len) {
            Some(o) => &mut o[(pos - l) as usize..(pos - l) as usize + n],
            None => {
                let buf = page_aligned(&mut own, n);
                read_old_raw(state, data, pos, buf)?;
                buf
            }
        };
        recrypt(state, ciphers, pos, buf, threads)?;
        data.write_at(state.new_phys(pos), buf)
            .map_err(io_err("writing the hotzone"))?;
        pos += n as u64;
        *done += n as u64;
        progress.update(*done);
    }
    data.sync().map_err(io_err("syncing the data"))
}

/// Threads that hash, decrypt and encrypt a chunk: 1 unless `CRYPTBLK_REENCRYPT_THREADS`
/// asks for more (at most 4). On a loaded machine each hand-off to a thread waits for the
/// scheduler: measured on 2 busy CPUs, 2 threads made a 256 MiB re-key 2-3x slower in
/// wall time for the same CPU time, so the default is cryptsetup's single thread.
fn crypt_threads() -> usize {
    std::env::var("CRYPTBLK_REENCRYPT_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .clamp(1, 4)
}

/// Decrypts `buf` (old data of logical `l`) and encrypts it under the new key, split over
/// `threads` threads at encryption-sector boundaries.
fn recrypt(
    state: &ReencryptState,
    ciphers: &Ciphers,
    l: u64,
    buf: &mut [u8],
    threads: usize,
) -> Result<()> {
    let (old, new) = (ciphers.old()?, ciphers.new_side()?);
    let one = |l: u64, part: &mut [u8]| -> Result<()> {
        old.decrypt_logical(l, part)?;
        new.encrypt_logical(l, part)
    };
    // Pieces below 256 KiB are not worth a thread.
    let ss = state.sector_size() as usize;
    let per = buf.len().div_ceil(threads).div_ceil(ss) * ss;
    if threads == 1 || per < 256 << 10 {
        return one(l, buf);
    }
    std::thread::scope(|s| {
        let jobs: Vec<_> = buf
            .chunks_mut(per)
            .enumerate()
            .map(|(i, part)| {
                let at = l + (i * per) as u64;
                s.spawn(move || one(at, part))
            })
            .collect();
        jobs.into_iter().try_for_each(|j| {
            j.join()
                .unwrap_or_else(|_| Err(VolumeError::device("a cipher thread panicked")))
        })
    })
}

/// One `alg` hash per `bs`-byte block of `buf`, in order, over `threads` threads.
fn block_sums(alg: HashAlgorithm, buf: &[u8], bs: usize, threads: usize) -> Vec<u8> {
    let sums = |part: &[u8]| -> Vec<u8> {
        part.chunks(bs)
            .flat_map(|block| alg.digest(&[block]))
            .collect()
    };
    let per = buf.len().div_ceil(threads).div_ceil(bs) * bs;
    if threads == 1 || per < 256 << 10 {
        return sums(buf);
    }
    std::thread::scope(|s| {
        let jobs: Vec<_> = buf
            .chunks(per)
            .map(|part| s.spawn(move || sums(part)))
            .collect();
        jobs.into_iter()
            .flat_map(|j| j.join().expect("hashing does not panic"))
            .collect()
    })
}

/// Writes the resilience data of logical `[l, l + len)` (step 1) and syncs. A hotzone
/// whose data moves (datashift) needs none: its old data stays where it was. Returns the
/// hotzone's old data as read, in `keep` (reused from step to step: a fresh buffer per
/// step cost a page fault per 4 KiB), when it is at most [`BUFFERED_HOTZONE`] long (for
/// [`rewrite`], so it is read once).
pub(crate) fn protect<'a>(
    state: &ReencryptState,
    header: &dyn HeaderIo,
    data: &dyn HeaderIo,
    l: u64,
    len: u64,
    keep: &'a mut Vec<u8>,
    opts: &RunOptions,
) -> Result<Option<&'a mut [u8]>> {
    let ks = &state.keyslot;
    let chunk = opts.chunk();
    if !state.in_place(l, len) {
        return Ok(None);
    }
    let offset = state.new_phys(l);
    // In place, the old data lies where the new goes.
    let kept = |what, keep: &'a mut Vec<u8>| -> Result<Option<&'a mut [u8]>> {
        if len > opts.keep_whole() {
            return Ok(None);
        }
        let buf = page_aligned(keep, len as usize);
        data.read_at(offset, buf).map_err(io_err(what))?;
        Ok(Some(buf))
    };
    let old = match &ks.resilience {
        Resilience::None => return Ok(None),
        Resilience::Checksum { hash, sector_size }
        | Resilience::DatashiftChecksum {
            hash, sector_size, ..
        } => {
            let alg = HashAlgorithm::from_name(hash)?;
            let bs = u64::from(*sector_size);
            if !len.is_multiple_of(bs) || (len / bs) * alg.output_len() as u64 > ks.area_size {
                return Err(VolumeError::device(
                    "the hotzone does not fit the checksum area",
                ));
            }
            let threads = crypt_threads();
            let old = kept("reading the hotzone", keep)?;
            let sums = match &old {
                Some(v) => block_sums(alg, v, bs as usize, threads),
                None => {
                    let mut sums = Vec::with_capacity((len / bs) as usize * alg.output_len());
                    let step = (chunk - chunk % bs).max(bs);
                    let mut own = Vec::new();
                    let buf = page_aligned(&mut own, step.min(len) as usize);
                    let mut pos = offset;
                    while pos < offset + len {
                        let n = (offset + len - pos).min(step) as usize;
                        data.read_at(pos, &mut buf[..n])
                            .map_err(io_err("reading the hotzone"))?;
                        sums.extend_from_slice(&block_sums(alg, &buf[..n], bs as usize, threads));
                        pos += n as u64;
                    }
                    sums
                }
            };
            header
                .write_at(ks.area_offset, &sums)
                .map_err(io_err("writing the hotzone checksums"))?;
            old
        }
        Resilience::Journal | Resilience::DatashiftJournal { .. } => {
            if len > ks.area_size {
                return Err(VolumeError::device(
                    "the hotzone does not fit the journal area",
                ));
            }
            let old = kept("reading the hotzone", keep)?;
            match &old {
                Some(v) => header
                    .write_at(ks.area_offset, v)
                    .map_err(io_err("writing the hotzone journal"))?,
                None => {
                    let mut own = Vec::new();
                    let buf = page_aligned(&mut own, chunk.min(len) as usize);
                    let mut pos = 0u64;
                    while pos < len {
                        let n = (len - pos).min(chunk) as usize;
                        data.read_at(offset + pos, &mut buf[..n])
                            .map_err(io_err("reading the hotzone"))?;
                        header
                            .write_at(ks.area_offset + pos, &buf[..n])
                            .map_err(io_err("writing the hotzone journal"))?;
                        pos += n as u64;
                    }
                }
            }
            old
        }
        Resilience::Datashift { .. } => {
            return Err(VolumeError::device(
                "a datashift hotzone overlaps its own old data",
            ))
        }
    };
    header
        .sync()
        .map_err(io_err("syncing the resilience data"))?;
    Ok(old)
}

/// Writes the final header in one write, then wipes the removed keyslots' areas (the old
/// key's keyslots and the resilience area) and, after a data shift, the moved copy of
/// the first data (plaintext of an encryption, as cryptsetup wipes it) or the old
/// ciphertext a decryption left after the plaintext it moved back.
pub(crate) fn finish(
    h: &mut Luks2Header,
    header: &dyn HeaderIo,
    data: &dyn HeaderIo,
) -> Result<()> {
    // Only an encryption's moved copy lies outside the final data (a decryption's moved
    // segment is where its plaintext goes).
    let encrypting = h
        .reencrypt_keyslot()?
        .is_some_and(|k| k.mode == cryptblk_format::luks2::ReencryptMode::Encrypt);
    let mut moved = h.moved_segment().filter(|_| encrypting);
    // A decryption that moved the data back leaves old ciphertext in the last `shift`
    // bytes after the plaintext; cryptsetup wipes them too.
    if !encrypting {
        if let (Some((_, shift)), Some(state)) = (h.moved_segment(), ReencryptState::of(h)?) {
            let dev = data.size().map_err(io_err("reading the device size"))?;
            let tail = state.new_phys(state.logical_size(dev));
            moved = Some((tail, shift.min(dev.saturating_sub(tail))));
        }
    }
    let areas = h.finish_reencryption()?;
    // The final keyslots area reaches the data offset; a detached header file smaller than
    // that (a header exported with only its own size) grows to hold it, or cryptsetup
    // refuses the file as too small.
    let need = 2 * h.metadata_size() + h.keyslots_size();
    let have = header.size().map_err(io_err("reading the header size"))?;
    if have < need {
        header
            .write_at(need - 1, &[0])
            .map_err(io_err("growing the header file"))?;
    }
    h.write_reencryption(header)?;
    wipe_areas(header, &areas)?;
    if let Some((off, len)) = moved {
        let zeros = vec![0u8; CHUNK.min(len).max(1) as usize];
        let mut pos = off;
        while pos < off + len {
            let n = (off + len - pos).min(CHUNK) as usize;
            data.write_at(pos, &zeros[..n])
                .map_err(io_err("wiping the moved segment"))?;
            pos += n as u64;
        }
        data.sync().map_err(io_err("syncing the data"))?;
    }
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
    if keys.old.is_none() && !state.old_is_plain() {
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

/// True for a forward run whose first `shift` bytes were moved (a decryption that moves
/// the data back to the device start): cryptsetup 2.6.1 rewrites the rest forward from
/// `shift` first and the moved (in-place) first segment last.
fn moved_first(state: &ReencryptState) -> Option<u64> {
    if state.keyslot.direction == ReencryptDirection::Backward {
        return None;
    }
    state.moved.as_ref().and_then(|m| m.size)
}

/// The boundary between old and new data: forward, the logical end of the new data at
/// the start (after the moved first segment, see [`moved_first`]); backward, the logical
/// start of the new data at the end.
fn boundary(state: &ReencryptState, end: u64) -> u64 {
    let backward = state.keyslot.direction == ReencryptDirection::Backward;
    if let Some(shift) = moved_first(state) {
        return state
            .segments
            .iter()
            .find(|s| s.logical >= shift && s.side != Side::New)
            .map_or(end, |s| s.logical);
    }
    if backward {
        state
            .segments
            .iter()
            .rev()
            .take_while(|s| s.side == Side::New)
            .last()
            .map_or(end, |s| s.logical)
    } else {
        state
            .segments
            .iter()
            .find(|s| s.side != Side::New)
            .map_or(end, |s| s.logical)
    }
}

/// The segments of a reencryption whose new data ends (forward) or starts (backward) at
/// `x`, with the hotzone `hz` (logical start and length) next to it, as cryptsetup lists
/// them: the last one `dynamic` when the original data runs to the device end, one
/// segment alone keeping its backup's size.
pub(crate) fn layout(
    state: &ReencryptState,
    end: u64,
    x: u64,
    hz: Option<(u64, u64)>,
) -> Vec<LayoutPart> {
    let backward = state.keyslot.direction == ReencryptDirection::Backward;
    let mut parts: Vec<(bool, u64, u64, bool)> = Vec::new();
    if let Some(shift) = moved_first(state) {
        // Old moved segment (until its own, last step), new data from `shift` to `x`,
        // the hotzone, old data after it.
        match hz {
            Some((0, n)) => parts.push((true, 0, n, true)),
            _ => parts.push((false, 0, shift, false)),
        }
        parts.push((true, shift, x - shift, false));
        if let Some((a, n)) = hz.filter(|&(a, _)| a != 0) {
            parts.push((true, a, n, true));
        }
        let hi = hz.filter(|&(a, _)| a != 0).map_or(x, |(a, n)| a + n);
        parts.push((false, hi, end - hi, false));
    } else if backward {
        let lo = hz.map_or(x, |(a, _)| a);
        parts.push((false, 0, lo, false));
        if let Some((a, n)) = hz {
            parts.push((true, a, n, true));
        }
        parts.push((true, x, end - x, false));
    } else {
        parts.push((true, 0, x, false));
        if let Some((a, n)) = hz {
            parts.push((true, a, n, true));
        }
        let hi = hz.map_or(x, |(a, n)| a + n);
        parts.push((false, hi, end - hi, false));
    }
    parts.retain(|p| p.2 > 0);
    let count = parts.len();
    parts
        .iter()
        .enumerate()
        .map(|(i, &(new, start, len, hotzone))| {
            let backup_dynamic = if new {
                state.fin.size.is_none()
            } else {
                state.previous.size.is_none()
            };
            let dynamic = !hotzone
                && i + 1 == count
                && if count == 1 {
                    backup_dynamic
                } else {
                    state.previous.size.is_none()
                };
            LayoutPart {
                new,
                start,
                len: (!dynamic).then_some(len),
                hotzone,
            }
        })
        .collect()
}

/// The next step of a reencryption whose header names no hotzone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    /// Logical start of the hotzone.
    pub l: u64,
    /// Its length.
    pub len: u64,
    /// The boundary the header naming the hotzone is laid out with (see [`layout`]).
    pub x: u64,
    /// The boundary after the step.
    pub next: u64,
    /// True for the last step (the final header follows it).
    pub last: bool,
}

/// The hotzone next to the boundary of `state` (data of `end` logical bytes, hotzones of
/// `hotzone` bytes), in the run's direction; `None` when all data is new already (only
/// the final header is left).
pub(crate) fn next_step(state: &ReencryptState, end: u64, hotzone: u64) -> Option<Step> {
    let backward = state.keyslot.direction == ReencryptDirection::Backward;
    let x = boundary(state, end);
    let (l, len) = match moved_first(state) {
        // The moved first segment goes last, unless it is new already.
        Some(shift) if x >= end => {
            let first_new = state.segments.first().is_some_and(|s| s.side == Side::New);
            (0, if first_new { 0 } else { shift })
        }
        Some(_) => (x, hotzone.min(end - x)),
        None if backward => {
            let l = x.saturating_sub(hotzone);
            (l, x - l)
        }
        None => (x, hotzone.min(end - x)),
    };
    if len == 0 {
        return None;
    }
    let x = if moved_first(state).is_some() && l == 0 {
        end
    } else {
        x
    };
    let last = match moved_first(state) {
        Some(_) => l == 0,
        None if backward => l == 0,
        None => l + len >= end,
    };
    Some(Step {
        l,
        len,
        x,
        next: if backward { l } else { l + len },
        last,
    })
}

/// Recovers a hotzone a crash left (its data rewritten from the recovered plaintext under
/// the new key, synced) and writes the header of the finished step (or the final header
/// when it was the last one). Returns the hotzone's length, 0 when there was none. Header
/// and data on one file.
pub fn recover(
    h: &mut Luks2Header,
    io: &dyn HeaderIo,
    state: &ReencryptState,
    keys: &ReencryptKeys,
) -> Result<u64> {
    recover_split(h, io, io, state, keys)
}

/// [`recover`] with the header (and resilience data) on `header` and the data on `data`
/// (a detached header).
pub fn recover_split(
    h: &mut Luks2Header,
    header: &dyn HeaderIo,
    data: &dyn HeaderIo,
    state: &ReencryptState,
    keys: &ReencryptKeys,
) -> Result<u64> {
    let Some(hz) = state.hotzone() else {
        return Ok(0);
    };
    verify_digest(h, state, keys)?;
    let end = data_end(state, data)?;
    let len = hz
        .size
        .ok_or_else(|| VolumeError::device("hotzone segment without a size"))?;
    let ciphers = Ciphers::new(state, keys)?;
    let mut buf = hotzone_plaintext(state, &ciphers, header, data, hz, len)?;
    ciphers.new_side()?.encrypt_logical(hz.logical, &mut buf)?;
    data.write_at(state.new_phys(hz.logical), &buf)
        .map_err(io_err("writing the hotzone"))?;
    data.sync().map_err(io_err("syncing the data"))?;
    let backward = state.keyslot.direction == ReencryptDirection::Backward;
    let (x, all_new) = match moved_first(state) {
        // The moved first segment is the last step.
        Some(_) if hz.logical == 0 => (end, true),
        Some(_) => (hz.logical + len, false),
        None if backward => (hz.logical, hz.logical == 0),
        None => (hz.logical + len, hz.logical + len >= end),
    };
    if all_new {
        finish(h, header, data)?;
    } else {
        h.set_reencrypt_layout(&layout(state, end, x, None))?;
        h.write_reencryption(header)?;
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
    run_split(h, io, io, keys, opts, progress)
}

/// [`run`] with the header (and resilience data) on `header` and the data on `data` (a
/// detached header).
pub fn run_split(
    h: &mut Luks2Header,
    header: &dyn HeaderIo,
    data: &dyn HeaderIo,
    keys: &ReencryptKeys,
    opts: &RunOptions,
    progress: &mut dyn Progress,
) -> Result<RunOutcome> {
    let mut out = RunOutcome::default();
    let Some(state) = ReencryptState::of(h)? else {
        return Err(VolumeError::usage("Device reencryption not in progress."));
    };
    verify_digest(h, &state, keys)?;
    let end = data_end(&state, data)?;
    check_checksum_blocks(&state.keyslot.resilience, end)?;
    out.data_size = end;
    out.hotzone = hotzone_length(&state, opts)?;
    let none = state.keyslot.resilience == Resilience::None;
    let backward = state.keyslot.direction == ReencryptDirection::Backward;
    let x0 = boundary(&state, end);
    let mut done = match moved_first(&state) {
        Some(shift) => x0.saturating_sub(shift),
        None if backward => end - x0,
        None => x0,
    };
    progress.start(Some(out.data_size), "reencrypting");
    let mut keep = Vec::new();
    // The backup segments (old and new parameters) stay the same for the whole run, so
    // the keyed ciphers do too.
    let ciphers = Ciphers::new(&state, keys)?;
    // With header and data on one file, a sync of the data also makes the header durable.
    let one_file = std::ptr::addr_eq(header as *const dyn HeaderIo, data as *const dyn HeaderIo);
    // True while the last header write's secondary copy waits for a sync (see
    // `write_reencryption_then_sync`): the next header write must sync first.
    let mut unsynced = false;
    let settle = |unsynced: &mut bool| -> Result<()> {
        if std::mem::take(unsynced) {
            header.sync().map_err(io_err("syncing the header"))?;
        }
        Ok(())
    };
    let result = (|| -> Result<()> {
        let mut state = state;
        loop {
            if state.hotzone().is_some() {
                settle(&mut unsynced)?;
                let n = recover_split(h, header, data, &state, keys)?;
                out.bytes += n;
                out.steps += 1;
                done += n;
                progress.update(done);
            } else {
                let Some(Step {
                    l,
                    len,
                    x,
                    next,
                    last,
                }) = next_step(&state, end, out.hotzone)
                else {
                    settle(&mut unsynced)?;
                    return finish(h, header, data);
                };
                let old = protect(&state, header, data, l, len, &mut keep, opts)?;
                if state.in_place(l, len) && !none {
                    // protect synced the header file after writing the resilience data.
                    unsynced = false;
                }
                h.set_reencrypt_layout(&layout(&state, end, x, Some((l, len))))?;
                if !none {
                    settle(&mut unsynced)?;
                    // The rewrite's data sync makes the secondary copy durable too.
                    if one_file {
                        h.write_reencryption_then_sync(header)?;
                    } else {
                        h.write_reencryption(header)?;
                    }
                }
                rewrite(
                    &state, data, &ciphers, l, len, old, &mut done, progress, opts,
                )?;
                out.bytes += len;
                out.steps += 1;
                if last {
                    return finish(h, header, data);
                }
                h.set_reencrypt_layout(&layout(&state, end, next, None))?;
                if !none {
                    // The next step's resilience data sync (or `settle`) makes the
                    // secondary copy durable before any other header write.
                    h.write_reencryption_then_sync(header)?;
                    unsynced = true;
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
