//! A LUKS2 re-key of a volume while it is served (online), and the table that serves a
//! volume mid-reencryption.
//!
//! A served volume's daemon runs the steps of [`super::run`] on a thread of its own while
//! the export keeps serving. The top mapping's table follows the on-disk state: the data
//! below the boundary through a crypt line under the new key (`backup-final`'s parameters),
//! the rest under the old key (`backup-previous`'s). Each step over the hotzone
//! `[offset, offset + len)`:
//!
//! 1. *Hold*: a mapping of its own, `<name>-hotzone-forward` (cryptsetup's name for its
//!    hotzone device), maps the hotzone under the old key; the top table is swapped to
//!    reach the hotzone through it, and it is suspended: requests in flight there drain and
//!    new ones wait, while the rest of the volume keeps serving.
//! 2. The step itself, exactly as offline (resilience data, the header naming the hotzone,
//!    the rewrite, the header of the finished step): no write can reach the hotzone
//!    meanwhile, so its checksums or journal describe it.
//! 3. *Release*: the hotzone mapping is reloaded under the new key and resumed (the held
//!    requests see the new data, which the header already names as new), then the top
//!    table is swapped to map the hotzone's bytes straight through the new-key line and
//!    the hotzone mapping is removed.
//!
//! Each swap is the dm sequence reload + suspend + resume (requests in flight drain, new
//! ones wait a moment, none fail). A stop request (`close`) is honoured between steps, so
//! the on-disk state is always a finished step that either tool resumes; a crash (the
//! daemon killed) leaves what the offline engine leaves at the same write.

use super::keys::ReencryptKeys;
use super::recovery::Ciphers;
use super::run::{self, RunOptions};
use super::state::{ReencryptState, Side};
use crate::error::{ErrorClass, Result, VolumeError};
use crate::luks::{LuksType, Volume};
use crate::progress::NoProgress;
use cryptblk_cipher::SecretBytes;
use cryptblk_dm::{
    CryptConfig, CryptFlags, CryptKey, ErrorConfig, LinearConfig, Registry, TableSpec,
};
use cryptblk_format::luks2::{Luks2Header, ReencryptDirection, Resilience, SegmentInfo};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;
use zeroize::Zeroizing;

/// Where an online reencryption stands, as `status` reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    /// The volume is mid-reencryption and served, but no run is going on (opened
    /// mid-reencryption, or a run was stopped by `close`... of an earlier daemon).
    #[default]
    Paused,
    /// The daemon is reencrypting.
    Running,
    /// The run reached the end: the header is the finished one.
    Finished,
    /// The run stopped between two steps (the volume is closing); resumable.
    Stopped,
    /// A step failed; `error` says why.
    Failed,
}

/// Progress of a reencryption of a served volume (`status` shows it; `status --json` as
/// `reencryption`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReencryptProgress {
    /// Where the run stands.
    pub state: RunState,
    /// Bytes of the data area under the new key.
    pub done: u64,
    /// Bytes of the data area.
    pub total: u64,
    /// Hotzone length of this run (0 when not running).
    pub hotzone: u64,
    /// Steps this run finished.
    pub steps: u64,
    /// Bytes this run rewrote per second, averaged since it began.
    pub bytes_per_sec: u64,
    /// Why the run failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One piece of the served data area: bytes `[from, to)` of the data device and whose key
/// maps them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    side: Side,
    from: u64,
    to: u64,
}

/// How the data area of a reencryption is mapped: device, flags and both sides' keys.
struct Layout<'a> {
    state: &'a ReencryptState,
    keys: &'a ReencryptKeys,
    /// The data device as tables name it.
    device: String,
    /// Activation flags of every crypt line (the sector size is each side's).
    flags: CryptFlags,
    /// Start of the data area on the device (bytes).
    start: u64,
}

impl Layout<'_> {
    /// A crypt line for the data from byte `from` under `seg`'s parameters and `key`.
    fn crypt(
        &self,
        seg: &SegmentInfo,
        key: Option<&SecretBytes>,
        from: u64,
    ) -> Result<CryptConfig> {
        let cipher = seg
            .encryption
            .as_deref()
            .ok_or_else(|| VolumeError::device("reencryption segment without a cipher"))?;
        let key =
            key.ok_or_else(|| VolumeError::device("a volume key of the reencryption is locked"))?;
        let rel = from
            .checked_sub(seg.offset)
            .ok_or_else(|| VolumeError::device("data before its segment's start"))?;
        let mut cfg = CryptConfig::new(
            cipher,
            CryptKey::for_cipher(cipher, key),
            seg.iv_tweak + rel / 512,
            &self.device,
            from / 512,
        );
        cfg.flags = self.flags;
        cfg.flags.sector_size = seg.sector_size;
        Ok(cfg)
    }

    /// The crypt line of `side` (old or new) from byte `from`.
    fn side(&self, side: Side, from: u64) -> Result<CryptConfig> {
        match side {
            Side::New => self.crypt(&self.state.fin, self.keys.new.as_ref(), from),
            _ => self.crypt(&self.state.previous, self.keys.old.as_ref(), from),
        }
    }

    /// The table of `pieces` (contiguous from the data start); a hotzone piece goes through
    /// mapping `hotzone`.
    fn table(&self, pieces: &[Piece], hotzone: &str) -> Result<Zeroizing<String>> {
        let mut spec = TableSpec::default();
        for p in pieces.iter().filter(|p| p.to > p.from) {
            let len = (p.to - p.from) / 512;
            match p.side {
                Side::Hotzone => spec.push(
                    len,
                    LinearConfig {
                        device: hotzone.to_string(),
                        offset: 0,
                    },
                ),
                side => spec.push(len, self.side(side, p.from)?),
            }
        }
        Ok(spec.to_text(true))
    }
}

/// The pieces of a header's state with no hotzone, up to `end`.
fn state_pieces(state: &ReencryptState, end: u64) -> Result<Vec<Piece>> {
    let mut out = Vec::new();
    for s in &state.segments {
        if s.side == Side::Hotzone {
            return Err(VolumeError::device(
                "Device requires reencryption recovery. Run repair first.",
            ));
        }
        let to = s.size.map_or(end, |n| (s.offset + n).min(end));
        if to > s.offset {
            out.push(Piece {
                side: s.side,
                from: s.offset,
                to,
            });
        }
    }
    Ok(out)
}

/// The table that serves a volume mid-reencryption whose hotzone was recovered (see
/// [`super::run::recover`]): the new key's segment and the old key's, each with its
/// parameters, over `device` of `dev_size` bytes (whole encryption sectors of both sides
/// are mapped). `flags` are the activation flags of both crypt lines. Keys included: only
/// ever sent through a pipe.
pub fn served_table(
    state: &ReencryptState,
    keys: &ReencryptKeys,
    device: &str,
    flags: &CryptFlags,
    dev_size: u64,
) -> Result<Zeroizing<String>> {
    let start = state.fin.offset.min(state.previous.offset);
    let ss = u64::from(state.previous.sector_size.max(state.fin.sector_size));
    if dev_size <= start {
        return Err(VolumeError::device("The device has no data area."));
    }
    let end = start + (dev_size - start) / ss * ss;
    let layout = Layout {
        state,
        keys,
        device: device.to_string(),
        flags: *flags,
        start,
    };
    layout.table(&state_pieces(state, end)?, "")
}

/// The bytes of the data area under the new key.
fn done_bytes(state: &ReencryptState, start: u64, end: u64) -> u64 {
    state
        .segments
        .iter()
        .find(|s| s.side != Side::New)
        .map_or(end, |s| s.offset)
        - start
}

/// `status` of a volume opened mid-reencryption with no run going on.
pub fn paused_progress(state: &ReencryptState, dev_size: u64) -> ReencryptProgress {
    let start = state.fin.offset.min(state.previous.offset);
    let end = dev_size.max(start);
    ReencryptProgress {
        state: RunState::Paused,
        done: done_bytes(state, start, end).min(end - start),
        total: end - start,
        ..ReencryptProgress::default()
    }
}

/// What an online reencryption is started with.
pub struct OnlineRequest {
    /// The served (top) mapping.
    pub name: String,
    /// The LUKS2 header, on the data device (detached headers are not supported online).
    pub header: PathBuf,
    /// Both volume keys.
    pub keys: ReencryptKeys,
    /// Hotzone size and device block.
    pub opts: RunOptions,
}

struct Shared {
    stop: AtomicBool,
    progress: Mutex<ReencryptProgress>,
}

impl Shared {
    fn set(&self, f: impl FnOnce(&mut ReencryptProgress)) {
        f(&mut self.progress.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

/// A reencryption running in the background of the daemon that serves the volume.
pub struct OnlineJob {
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
}

/// Everything the worker thread owns.
struct Worker {
    registry: Arc<Registry>,
    name: String,
    hotzone_name: String,
    h: Luks2Header,
    /// Header and data (the same file: detached headers are refused), holding the header
    /// lock for the whole run.
    file: File,
    keys: ReencryptKeys,
    device: String,
    flags: CryptFlags,
    start: u64,
    end: u64,
    hotzone: u64,
    shared: Arc<Shared>,
}

fn busy(msg: impl Into<String>) -> VolumeError {
    VolumeError::new(ErrorClass::Busy, msg)
}

fn dm(e: cryptblk_dm::DmError) -> VolumeError {
    VolumeError::device(e.to_string())
}

impl OnlineJob {
    /// Checks that the reencryption the header of `req` describes matches what `registry`
    /// serves as `req.name` (same device, same keys at the same boundary), then runs it on
    /// a thread of its own. Fails before anything is written.
    pub fn start(registry: Arc<Registry>, req: OnlineRequest) -> Result<OnlineJob> {
        let Volume::Luks2(h, file) = Volume::load(&req.header, LuksType::Luks2, true)? else {
            return Err(VolumeError::usage(
                "online reencryption needs a LUKS2 header",
            ));
        };
        // Another header writer (luksAddKey...) waits until the run ends.
        crate::lock::lock_header(&file, true)
            .map_err(|e| VolumeError::device(format!("cannot lock the header: {e}")))?;
        let h = *h;
        let state = ReencryptState::of(&h)?
            .ok_or_else(|| VolumeError::usage("Device reencryption not in progress."))?;
        if state.keyslot.direction != ReencryptDirection::Forward {
            return Err(VolumeError::usage(
                "online backward reencryption is not supported yet",
            ));
        }
        run::verify_digest(&h, &state, &req.keys)?;
        // The old key only while old data is left (cryptsetup drops its keyslots before it
        // clears the requirement).
        let old_left = state.segments.iter().any(|s| s.side != Side::New);
        if req.keys.new.is_none() || (old_left && req.keys.old.is_none()) {
            return Err(VolumeError::device(
                "online reencryption needs both volume keys",
            ));
        }
        // The engine counts in logical bytes from the data offset; the tables here in
        // device bytes (a forward re-key moves no data: both sides share the offset).
        let end = state.previous.offset + run::data_end(&state, &file)?;
        let start = state.fin.offset.min(state.previous.offset);
        run::check_checksum_blocks(&state.keyslot.resilience, end - start)?;
        let hotzone = run::hotzone_length(&state, &req.opts)?;
        let top = registry.get(&req.name).map_err(dm)?;
        if top.info().suspended {
            return Err(busy(format!(
                "Volume {} is suspended; resume it first.",
                req.name
            )));
        }
        let live = TableSpec::parse(top.table(true).as_str()).map_err(dm)?;
        let first = live
            .crypt_lines()
            .next()
            .ok_or_else(|| VolumeError::usage(format!("{} has no crypt line", req.name)))?
            .clone();
        let layout = Layout {
            state: &state,
            keys: &req.keys,
            device: first.device.clone(),
            flags: first.flags,
            start,
        };
        let expected = layout.table(&state_pieces(&state, end)?, "")?;
        let expected = TableSpec::parse(&expected).map_err(dm)?;
        if expected != live {
            return Err(VolumeError::usage(format!(
                "The table {} serves does not match the reencryption state of its header \
                 (served size {} bytes, data area {} bytes).",
                req.name,
                top.info().size,
                end - start
            )));
        }
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            progress: Mutex::new(ReencryptProgress {
                state: RunState::Running,
                done: done_bytes(&state, start, end),
                total: end - start,
                hotzone,
                ..ReencryptProgress::default()
            }),
        });
        let worker = Worker {
            registry,
            hotzone_name: format!("{}-hotzone-forward", req.name),
            name: req.name,
            h,
            file,
            keys: req.keys,
            device: first.device,
            flags: first.flags,
            start,
            end,
            hotzone,
            shared: shared.clone(),
        };
        let handle = std::thread::Builder::new()
            .name("reencrypt".into())
            .spawn(move || worker.run())
            .map_err(|e| VolumeError::device(format!("cannot start the reencryption: {e}")))?;
        Ok(OnlineJob {
            shared,
            handle: Some(handle),
        })
    }

    /// The run's progress.
    pub fn progress(&self) -> ReencryptProgress {
        self.shared
            .progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// True while the worker still runs.
    pub fn is_running(&self) -> bool {
        self.handle.as_ref().is_some_and(|h| !h.is_finished())
    }

    /// Asks the run to stop after its current step and waits for it.
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for OnlineJob {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How far a failed step got, which decides what the held hotzone may serve afterwards.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing names the hotzone on disk: it is still all old data.
    Held,
    /// The header names the hotzone: only recovery can tell its blocks apart.
    Named,
}

impl Worker {
    fn run(mut self) {
        let started = Instant::now();
        let mut rewritten = 0u64;
        let result = (|| -> Result<RunState> {
            loop {
                if self.shared.stop.load(Ordering::SeqCst) {
                    // With resilience none the steps wrote no header: record the boundary
                    // now, so the volume reopens with the right keys.
                    if self.resilience() == Resilience::None {
                        self.h.write_reencryption(&self.file)?;
                    }
                    return Ok(RunState::Stopped);
                }
                let Some(state) = ReencryptState::of(&self.h)? else {
                    return Ok(RunState::Finished);
                };
                let Some(old) = state.segments.iter().find(|s| s.side == Side::Old) else {
                    // Everything is new already: write the final header.
                    let areas = self.h.finish_reencryption()?;
                    self.h.write_reencryption(&self.file)?;
                    cryptblk_format::luks2::reencrypt_write::wipe_areas(&self.file, &areas)?;
                    return Ok(RunState::Finished);
                };
                let offset = old.offset;
                let len = self.hotzone.min(self.end - offset);
                let last = offset + len >= self.end;
                self.step(&state, offset, len, last)?;
                rewritten += len;
                let secs = started.elapsed().as_secs_f64().max(1e-3);
                self.shared.set(|p| {
                    p.done = offset + len - self.start;
                    p.steps += 1;
                    p.bytes_per_sec = (rewritten as f64 / secs) as u64;
                });
                if last {
                    return Ok(RunState::Finished);
                }
            }
        })();
        if !matches!(result, Ok(RunState::Failed) | Err(_)) {
            self.remove_hotzone();
        }
        self.shared.set(|p| match result {
            Ok(s) => p.state = s,
            Err(e) => {
                p.state = RunState::Failed;
                p.error = Some(e.message);
            }
        });
    }

    fn resilience(&self) -> Resilience {
        self.h
            .reencrypt_keyslot()
            .ok()
            .flatten()
            .map_or(Resilience::None, |k| k.resilience)
    }

    fn layout<'a>(&'a self, state: &'a ReencryptState) -> Layout<'a> {
        Layout {
            state,
            keys: &self.keys,
            device: self.device.clone(),
            flags: self.flags,
            start: self.start,
        }
    }

    /// The hotzone mapping serving `table`: created, or (left over from the previous step,
    /// which no table uses any more) given `table` in a swap.
    fn hotzone_mapping(&self, table: &str) -> Result<Arc<cryptblk_dm::Mapping>> {
        match self.registry.lookup(&self.hotzone_name) {
            Some(m) => {
                self.registry
                    .replace_table(&self.hotzone_name, table)
                    .map_err(dm)?;
                Ok(m)
            }
            None => self.registry.create(&self.hotzone_name, table).map_err(dm),
        }
    }

    /// Removes the hotzone mapping at the end of a run (waiting out a request that still
    /// holds a table using it).
    fn remove_hotzone(&self) {
        for _ in 0..100 {
            match self.registry.remove(&self.hotzone_name) {
                Err(cryptblk_dm::DmError::Busy(..)) => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                _ => return,
            }
        }
    }

    /// Swaps the top mapping's table (reload, suspend, resume).
    fn swap_top(&self, table: &str) -> Result<()> {
        self.registry.replace_table(&self.name, table).map_err(dm)
    }

    /// One step over `[offset, offset + len)`: hold, rewrite as offline, release.
    fn step(&mut self, state: &ReencryptState, offset: u64, len: u64, last: bool) -> Result<()> {
        let end = self.end;
        let (hold_table, hz_old, hz_new, after) = {
            let l = self.layout(state);
            let hz_line = |side: Side| -> Result<Zeroizing<String>> {
                Ok(TableSpec::single(len / 512, l.side(side, offset)?).to_text(true))
            };
            let piece = |side, from, to| Piece { side, from, to };
            let hold = l.table(
                &[
                    piece(Side::New, l.start, offset),
                    piece(Side::Hotzone, offset, offset + len),
                    piece(Side::Old, offset + len, end),
                ],
                &self.hotzone_name,
            )?;
            let after = l.table(
                &[
                    piece(Side::New, l.start, offset + len),
                    piece(Side::Old, offset + len, end),
                ],
                "",
            )?;
            (hold, hz_line(Side::Old)?, hz_line(Side::New)?, after)
        };
        let hz = self.hotzone_mapping(&hz_old)?;
        let result = (|| -> std::result::Result<(), (Phase, VolumeError)> {
            let held = |e: VolumeError| (Phase::Held, e);
            self.swap_top(&hold_table).map_err(held)?;
            hz.suspend().map_err(dm).map_err(held)?;
            let none = state.keyslot.resilience == Resilience::None;
            // Logical offsets (from the data start), as the offline engine's.
            let l = offset - state.fin.offset;
            let logical_end = end - state.previous.offset;
            let mut keep = Vec::new();
            let old =
                run::protect(state, &self.file, &self.file, l, len, &mut keep).map_err(held)?;
            self.h
                .set_reencrypt_layout(&run::layout(state, logical_end, l, Some((l, len))))
                .map_err(|e| held(e.into()))?;
            if !none {
                self.h
                    .write_reencryption(&self.file)
                    .map_err(|e| held(e.into()))?;
            }
            let named = |e: VolumeError| (Phase::Named, e);
            let ciphers = Ciphers::new(state, &self.keys).map_err(named)?;
            let mut done = 0;
            run::rewrite(
                state,
                &self.file,
                &ciphers,
                l,
                len,
                old,
                &mut done,
                &mut NoProgress,
            )
            .map_err(named)?;
            if last {
                run::finish(&mut self.h, &self.file, &self.file).map_err(named)?;
            } else {
                self.h
                    .set_reencrypt_layout(&run::layout(state, logical_end, l + len, None))
                    .map_err(|e| named(e.into()))?;
                if !none {
                    self.h
                        .write_reencryption(&self.file)
                        .map_err(|e| named(e.into()))?;
                }
            }
            // The header names the hotzone as new data: the held requests may see it.
            self.registry
                .reload(&self.hotzone_name, &hz_new)
                .map_err(|e| named(dm(e)))?;
            hz.resume().map_err(|e| named(dm(e)))?;
            self.swap_top(&after).map_err(named)?;
            Ok(())
        })();
        match result {
            Ok(()) => {
                drop(hz);
                // A request that just left may still hold the old top table (and so the
                // hotzone mapping) for a moment: then the next step reuses it.
                let _ = self.registry.remove(&self.hotzone_name);
                Ok(())
            }
            Err((phase, e)) => {
                // Never leave requests waiting on a hotzone nobody will release: all old
                // data may still be served; a hotzone the header names cannot be served
                // until recovery decides each block (a reopen does that).
                if phase == Phase::Named {
                    let table = TableSpec::single(len / 512, ErrorConfig).to_text(false);
                    let _ = self.registry.reload(&self.hotzone_name, &table);
                }
                let _ = hz.resume();
                Err(VolumeError::new(
                    e.code,
                    format!(
                        "reencryption step at byte {offset} failed: {}{}",
                        e.message,
                        if phase == Phase::Named {
                            " (close the volume and open it again to recover the hotzone)"
                        } else {
                            ""
                        }
                    ),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::state::StateSegment;
    use super::*;
    use cryptblk_format::luks2::{ReencryptKeyslot, ReencryptMode};

    const MIB: u64 = 1 << 20;

    fn backup(id: u32, sector_size: u32, flag: &str) -> SegmentInfo {
        SegmentInfo {
            id,
            kind: "crypt".into(),
            offset: 16 * MIB,
            size: None,
            iv_tweak: 0,
            encryption: Some("aes-xts-plain64".into()),
            sector_size,
            flags: vec![flag.into()],
        }
    }

    fn state(segments: Vec<StateSegment>) -> ReencryptState {
        ReencryptState {
            keyslot: ReencryptKeyslot {
                id: 2,
                mode: ReencryptMode::Reencrypt,
                direction: ReencryptDirection::Forward,
                resilience: Resilience::Journal,
                area_offset: 0x8000,
                area_size: MIB,
            },
            previous: backup(2, 512, "backup-previous"),
            fin: backup(3, 4096, "backup-final"),
            old_digest: "0".into(),
            new_digest: "1".into(),
            moved: None,
            segments,
        }
    }

    /// The served table maps the new key's segment with backup-final's parameters and the
    /// old key's with backup-previous's, each line's IV offset and device offset at its
    /// own start; the device end is cut to whole sectors of both sides.
    #[test]
    fn served_table_maps_each_segment_with_its_sides_key_and_parameters() {
        let st = state(vec![
            StateSegment {
                offset: 16 * MIB,
                size: Some(4 * MIB),
                side: Side::New,
                logical: 0,
            },
            StateSegment {
                offset: 20 * MIB,
                size: None,
                side: Side::Old,
                logical: 4 * MIB,
            },
        ]);
        let keys = ReencryptKeys {
            old: Some(SecretBytes::from_slice(&[0x11; 64])),
            new: Some(SecretBytes::from_slice(&[0x22; 64])),
        };
        let t = served_table(
            &st,
            &keys,
            "/dev/x",
            &CryptFlags::default(),
            24 * MIB + 1024,
        )
        .unwrap();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines,
            [
                format!(
                    "0 8192 crypt aes-xts-plain64 {} 0 /dev/x 32768 1 sector_size:4096",
                    "22".repeat(64)
                ),
                format!(
                    "8192 8192 crypt aes-xts-plain64 {} 8192 /dev/x 40960",
                    "11".repeat(64)
                ),
            ]
        );
        let p = paused_progress(&st, 24 * MIB);
        assert_eq!(
            (p.state, p.done, p.total),
            (RunState::Paused, 4 * MIB, 8 * MIB)
        );
        // A cut hotzone is never mapped: it needs recovery first.
        let cut = state(vec![StateSegment {
            offset: 16 * MIB,
            size: Some(MIB),
            side: Side::Hotzone,
            logical: 0,
        }]);
        let e = served_table(&cut, &keys, "/dev/x", &CryptFlags::default(), 24 * MIB).unwrap_err();
        assert!(e.message.contains("recovery"), "{}", e.message);
        // The old key is needed while old data is mapped.
        let no_old = ReencryptKeys {
            old: None,
            new: keys.new.clone(),
        };
        assert!(served_table(&st, &no_old, "/dev/x", &CryptFlags::default(), 24 * MIB).is_err());
    }
}
