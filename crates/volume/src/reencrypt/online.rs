//! A LUKS2 reencryption of a volume while it is served (online), and the table that serves
//! a volume mid-reencryption.
//!
//! A served volume's daemon runs the steps of [`super::run`] on a thread of its own while
//! the export keeps serving: a re-key, or a decryption or encryption (a plaintext side is
//! mapped linear), forward or backward as the header says, with the header on the data
//! device or detached. The top mapping's table follows the on-disk state, in the volume's
//! logical bytes: the new side's data through lines under the new key (`backup-final`'s
//! parameters), the old side's under the old key (`backup-previous`'s), each at the
//! device bytes where that side keeps it (a data shift puts them apart). Each step over the
//! hotzone `[offset, offset + len)`:
//!
//! 1. *Hold*: a mapping of its own, `<name>-hotzone-forward` or `-backward` (cryptsetup's
//!    names for its hotzone device), maps the hotzone under the old key; the top table is swapped to
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
use cryptblk_dm::{
    CryptConfig, CryptFlags, CryptKey, ErrorConfig, LinearConfig, Mapping, Registry, TableSpec,
    TargetSpec,
};
use cryptblk_format::luks2::{Luks2Header, ReencryptDirection, Resilience};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
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

/// One piece of the served volume: logical bytes `[from, to)` (from the first byte of the
/// volume's data) and the side whose key (or plaintext) maps them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    side: Side,
    from: u64,
    to: u64,
}

/// `pieces` with `[from, to)` given to `side`; neighbours of one side merged (their bytes
/// and IVs are contiguous, see [`Layout::push`]).
fn with_range(pieces: &[Piece], from: u64, to: u64, side: Side) -> Vec<Piece> {
    let mut out: Vec<Piece> = pieces
        .iter()
        .filter(|p| p.from < from)
        .map(|p| Piece {
            to: p.to.min(from),
            ..*p
        })
        .collect();
    out.push(Piece { side, from, to });
    out.extend(pieces.iter().filter(|p| p.to > to).map(|p| Piece {
        from: p.from.max(to),
        ..*p
    }));
    merged(out)
}

/// `pieces` without empty ones, neighbours of one (non-hotzone) side merged.
fn merged(pieces: Vec<Piece>) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    for p in pieces.into_iter().filter(|p| p.to > p.from) {
        match out.last_mut() {
            Some(q) if q.side == p.side && q.to == p.from && p.side != Side::Hotzone => q.to = p.to,
            _ => out.push(p),
        }
    }
    out
}

/// How the data area of a reencryption is mapped: device, flags and both sides' keys.
/// Tables count in logical bytes (sector 0 is the first byte of the volume's data); each
/// side's bytes lie where [`ReencryptState::old_phys`] and [`ReencryptState::new_phys`]
/// put them (apart with a data shift, the old side's first bytes in the moved segment).
struct Layout<'a> {
    state: &'a ReencryptState,
    keys: &'a ReencryptKeys,
    /// The data device as tables name it.
    device: String,
    /// Activation flags of every crypt line (the sector size is each side's).
    flags: CryptFlags,
}

impl Layout<'_> {
    /// The line mapping `side`'s bytes from logical `from`: crypt under the side's
    /// parameters and key (IVs count from the volume's first byte), or linear for a
    /// plaintext side (an encryption's old data, a decryption's new data).
    fn line(&self, side: Side, from: u64) -> Result<TargetSpec> {
        let (seg, key, phys) = match side {
            Side::New => (
                &self.state.fin,
                self.keys.new.as_ref(),
                self.state.new_phys(from),
            ),
            _ => (
                &self.state.previous,
                self.keys.old.as_ref(),
                self.state.old_phys(from),
            ),
        };
        if seg.kind == "linear" {
            return Ok(LinearConfig {
                device: self.device.clone(),
                offset: phys / 512,
            }
            .into());
        }
        let cipher = seg
            .encryption
            .as_deref()
            .ok_or_else(|| VolumeError::device("reencryption segment without a cipher"))?;
        let key =
            key.ok_or_else(|| VolumeError::device("a volume key of the reencryption is locked"))?;
        let mut cfg = CryptConfig::new(
            cipher,
            CryptKey::for_cipher(cipher, key),
            seg.iv_tweak + from / 512,
            &self.device,
            phys / 512,
        );
        cfg.flags = self.flags;
        cfg.flags.sector_size = seg.sector_size;
        Ok(cfg.into())
    }

    /// Appends the lines of `side` over logical `[from, to)`: one, or two where the old
    /// side's bytes continue outside the moved segment.
    fn push(&self, spec: &mut TableSpec, side: Side, from: u64, to: u64) -> Result<()> {
        let split = match (&self.state.moved, side) {
            (Some(m), Side::Old) => m.size.filter(|&n| from < n && n < to),
            _ => None,
        };
        for (a, b) in split.map_or(vec![(from, to)], |n| vec![(from, n), (n, to)]) {
            spec.push((b - a) / 512, self.line(side, a)?);
        }
        Ok(())
    }

    /// The table of `pieces` (contiguous from logical 0); a hotzone piece goes through
    /// mapping `hotzone`.
    fn table(&self, pieces: &[Piece], hotzone: &str) -> Result<Zeroizing<String>> {
        let mut spec = TableSpec::default();
        for p in pieces.iter().filter(|p| p.to > p.from) {
            match p.side {
                Side::Hotzone => spec.push(
                    (p.to - p.from) / 512,
                    LinearConfig {
                        device: hotzone.to_string(),
                        offset: 0,
                    },
                ),
                side => self.push(&mut spec, side, p.from, p.to)?,
            }
        }
        Ok(spec.to_text(true))
    }
}

/// The pieces of a header's state with no hotzone, up to logical `end`.
fn state_pieces(state: &ReencryptState, end: u64) -> Result<Vec<Piece>> {
    let mut out = Vec::new();
    for s in &state.segments {
        if s.side == Side::Hotzone {
            return Err(VolumeError::device(
                "Device requires reencryption recovery. Run repair first.",
            ));
        }
        let to = s.size.map_or(end, |n| (s.logical + n).min(end));
        out.push(Piece {
            side: s.side,
            from: s.logical,
            to,
        });
    }
    Ok(merged(out))
}

/// The table that serves a volume mid-reencryption whose hotzone was recovered (see
/// [`super::run::recover`]): the new side's data and the old side's, each with its
/// parameters, over data device `device` of `dev_size` bytes (the volume's data:
/// [`ReencryptState::logical_size`]). `flags` are the activation flags of the crypt lines.
/// Keys included: only ever sent through a pipe.
pub fn served_table(
    state: &ReencryptState,
    keys: &ReencryptKeys,
    device: &str,
    flags: &CryptFlags,
    dev_size: u64,
) -> Result<Zeroizing<String>> {
    let start = state.fin.offset.min(state.previous.offset);
    if dev_size <= start {
        return Err(VolumeError::device("The device has no data area."));
    }
    let end = state.logical_size(dev_size);
    let layout = Layout {
        state,
        keys,
        device: device.to_string(),
        flags: *flags,
    };
    layout.table(&state_pieces(state, end)?, "")
}

/// The activation plan of a volume mid-reencryption whose hotzone was recovered: the
/// [`served_table`] of its data on `at.device` (header at `at.header`, the same file or a
/// detached one), named `name`, with `status` facts and the paused progress. `flags` are
/// the activation flags of the crypt lines.
pub fn mid_reencryption_plan(
    h: &Luks2Header,
    state: &ReencryptState,
    keys: &ReencryptKeys,
    at: crate::plan::LuksLocation<'_>,
    name: &str,
    flags: &CryptFlags,
) -> Result<crate::plan::ActivationPlan> {
    let device = crate::device::table_path(at.device)?;
    let dev_size = crate::device::device_size(at.device)?;
    let table = served_table(state, keys, &device.display().to_string(), flags, dev_size)?;
    let canonical = |p: &std::path::Path| -> Result<String> {
        Ok(std::fs::canonicalize(p)
            .map_err(|e| VolumeError::device(format!("{}: {e}", p.display())))?
            .display()
            .to_string())
    };
    let start = state.fin.offset.min(state.previous.offset);
    let key_bits = keys.new.as_ref().map_or(0, |k| k.len() * 8);
    let info = crate::facts::VolumeFacts {
        kind: "LUKS2".into(),
        uuid: Some(h.uuid().to_string()),
        cipher: state.fin.encryption.clone(),
        keysize: Some(format!("{key_bits} bits")),
        device: Some(canonical(at.device)?),
        header: Some(canonical(at.header)?),
        sector_size: Some(u64::from(state.fin.sector_size)),
        offset: Some(format!("{} sectors", start / 512)),
        reencryption: Some(paused_progress(state, dev_size)),
        // Kept for the online run: a table of linear lines alone does not show them
        // (the daemon passes them on in `OnlineRequest::flags`).
        activation_flags: Some(flags.activation_only().format()),
        ..Default::default()
    };
    Ok(crate::plan::ActivationPlan {
        name: name.to_string(),
        table,
        lower: Vec::new(),
        keyed_lower: Vec::new(),
        info,
    })
}

/// The bytes of the volume's data under the new key (or new plaintext).
fn done_bytes(pieces: &[Piece]) -> u64 {
    pieces
        .iter()
        .filter(|p| p.side == Side::New)
        .map(|p| p.to - p.from)
        .sum()
}

/// `status` of a volume opened mid-reencryption with no run going on.
pub fn paused_progress(state: &ReencryptState, dev_size: u64) -> ReencryptProgress {
    let end = state.logical_size(dev_size);
    ReencryptProgress {
        state: RunState::Paused,
        done: state_pieces(state, end).map_or(0, |p| done_bytes(&p)),
        total: end,
        ..ReencryptProgress::default()
    }
}

/// What an online reencryption is started with.
pub struct OnlineRequest {
    /// The served (top) mapping.
    pub name: String,
    /// The LUKS2 header (on the data device, or a detached header file).
    pub header: PathBuf,
    /// The data device when the header is detached; `None`: the header's own file.
    pub data: Option<PathBuf>,
    /// Both volume keys (the key of a plaintext side is not needed).
    pub keys: ReencryptKeys,
    /// Hotzone size and device block.
    pub opts: RunOptions,
    /// The activation flags the volume was opened with (`allow_discards`, the pipeline),
    /// for a table with no crypt line to carry them (an encryption's all-linear start);
    /// a crypt line's flags win.
    pub flags: Option<CryptFlags>,
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
    /// `forward` or `backward` (the daemon's log names it).
    direction: &'static str,
    hotzone_name: String,
    h: Luks2Header,
    /// The header's file, holding the header lock for the whole run.
    header: File,
    /// The data device when the header is detached.
    data: Option<File>,
    keys: ReencryptKeys,
    device: String,
    flags: CryptFlags,
    /// Logical size of the volume's data.
    end: u64,
    hotzone: u64,
    /// Chunk sizes for the steps.
    opts: RunOptions,
    /// A hotzone's old data between its protection and its rewrite (reused).
    keep: Vec<u8>,
    /// The keyed ciphers, built at the first step and kept for the run: the backup
    /// segments (old and new parameters) do not change during a run, and keying them
    /// every step cost cgroup-file reads and mlock calls each time (as it did offline).
    ciphers: Option<Ciphers>,
    shared: Arc<Shared>,
}

/// The served mapping `name` (refused while suspended: exit 5), its live table and the
/// device its first line maps, which every table of a run maps too.
fn live_volume(registry: &Registry, name: &str) -> Result<(Arc<Mapping>, TableSpec, String)> {
    let top = registry.get(name).map_err(dm)?;
    if top.info().suspended {
        return Err(busy(format!(
            "Volume {name} is suspended; resume it first."
        )));
    }
    let live = TableSpec::parse(top.table(true).as_str()).map_err(dm)?;
    let device = live
        .lines
        .first()
        .and_then(|l| l.target.devices().first().map(|d| d.to_string()))
        .ok_or_else(|| VolumeError::usage(format!("{name} has an empty table")))?;
    Ok((top, live, device))
}

fn busy(msg: impl Into<String>) -> VolumeError {
    VolumeError::new(ErrorClass::Busy, msg)
}

fn dm(e: cryptblk_dm::DmError) -> VolumeError {
    VolumeError::device(e.to_string())
}

/// True when the keys at hand map every side the data still has: the new side's key
/// unless it is plaintext, the old side's while old data is left and it is not plaintext.
fn keys_cover(state: &ReencryptState, keys: &ReencryptKeys) -> bool {
    let old_left = state.segments.iter().any(|s| s.side != Side::New);
    (state.new_is_plain() || keys.new.is_some())
        && (!old_left || state.old_is_plain() || keys.old.is_some())
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
        let data = match &req.data {
            Some(p) => Some(
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(p)
                    .map_err(|e| {
                        VolumeError::device(format!("Cannot open device {}: {e}", p.display()))
                    })?,
            ),
            None => None,
        };
        let h = *h;
        let state = ReencryptState::of(&h)?
            .ok_or_else(|| VolumeError::usage("Device reencryption not in progress."))?;
        run::verify_digest(&h, &state, &req.keys)?;
        if !keys_cover(&state, &req.keys) {
            return Err(VolumeError::device(
                "online reencryption needs both volume keys",
            ));
        }
        let end = run::data_end(&state, data.as_ref().unwrap_or(&file))?;
        run::check_checksum_blocks(&state.keyslot.resilience, end)?;
        let hotzone = run::hotzone_length(&state, &req.opts)?;
        let (top, live, device) = live_volume(&registry, &req.name)?;
        // cryptsetup keeps the dm device's activation flags across its table reloads; an
        // all-linear table (encryption not begun) cannot hold them, so open recorded them.
        let flags = live
            .crypt_lines()
            .next()
            .map(|c| c.flags)
            .or(req.flags)
            .unwrap_or_default();
        let layout = Layout {
            state: &state,
            keys: &req.keys,
            device: device.clone(),
            flags,
        };
        let pieces = state_pieces(&state, end)?;
        let expected = layout.table(&pieces, "")?;
        let expected = TableSpec::parse(&expected).map_err(dm)?;
        if expected != live {
            return Err(VolumeError::usage(format!(
                "The table {} serves does not match the reencryption state of its header \
                 (served size {} bytes, data area {} bytes).",
                req.name,
                top.info().size,
                end
            )));
        }
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            progress: Mutex::new(ReencryptProgress {
                state: RunState::Running,
                done: done_bytes(&pieces),
                total: end,
                hotzone,
                ..ReencryptProgress::default()
            }),
        });
        let direction = match state.keyslot.direction {
            ReencryptDirection::Forward => "forward",
            ReencryptDirection::Backward => "backward",
        };
        let worker = Worker {
            registry,
            hotzone_name: format!("{}-hotzone-{direction}", req.name),
            direction,
            name: req.name,
            h,
            header: file,
            data,
            keys: req.keys,
            device,
            flags,
            end,
            hotzone,
            opts: req.opts,
            keep: Vec::new(),
            ciphers: None,
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

/// What an online decryption exporting the header on the data device starts with
/// (cryptsetup's `reencrypt --decrypt --header NEW_FILE` of an active volume).
pub struct ExportRequest {
    /// The served (top) mapping.
    pub name: String,
    /// The data device, which holds the LUKS2 header.
    pub device: PathBuf,
    /// The new header file (created empty by the caller; absolute).
    pub export: PathBuf,
    /// The volume key.
    pub key: cryptblk_cipher::SecretBytes,
    /// Resilience of the hotzones and the digest's iterations.
    pub resilience: super::encdec::DecryptResilience,
    /// Hotzone size and device block.
    pub opts: RunOptions,
}

/// Starts a decryption of the served volume `req.name` whose header is on its data device,
/// exporting the header to `req.export`, as cryptsetup 2.6.1 does online (facts from its
/// source): the header area copied to the new file and the device's LUKS2 magics wiped
/// ([`super::encdec::export_header`]); the table of the reencryption state loaded; the
/// volume suspended (requests in flight drain, new ones wait); the first data-offset bytes
/// of ciphertext copied to the device start ([`super::encdec::move_first_segment`]) and
/// the reencryption header written to the new file; the volume resumed on the new table
/// (the old data's first bytes read from the moved copy, which no request could change
/// while it was made). Then the steps run as for any online reencryption, with the new
/// file as the (detached) header. A failure before the reencryption header is written
/// puts the original header back on the device and removes the new file.
pub fn start_decrypt_export(registry: Arc<Registry>, req: ExportRequest) -> Result<OnlineJob> {
    let Volume::Luks2(h, file) = Volume::load(&req.device, LuksType::Luks2, true)? else {
        return Err(VolumeError::usage("online decryption needs a LUKS2 header"));
    };
    crate::lock::lock_header(&file, true)
        .map_err(|e| VolumeError::device(format!("cannot lock the header: {e}")))?;
    if h.reencryption_in_progress() {
        return Err(VolumeError::usage(
            "LUKS2 reencryption already initialized. Aborting operation.",
        ));
    }
    let dev_size = crate::device::device_size(&req.device)?;
    let mut new_h = super::encdec::plan_decrypt_export(&h, dev_size, &req.key, &req.resilience)?;
    let state = ReencryptState::of(&new_h)?
        .ok_or_else(|| VolumeError::device("the decryption metadata was not made"))?;
    let shift = state.previous.offset;
    let keys = ReencryptKeys {
        old: Some(req.key.clone()),
        new: None,
    };
    let (top, live, device) = live_volume(&registry, &req.name)?;
    let flags = live
        .crypt_lines()
        .next()
        .map_or_else(CryptFlags::default, |c| c.flags);
    let end = state.logical_size(dev_size);
    // What is served now: all of the data under the old key, in place.
    let before_state = ReencryptState {
        moved: None,
        segments: vec![super::state::StateSegment {
            offset: shift,
            size: None,
            side: Side::Old,
            logical: 0,
        }],
        ..state.clone()
    };
    let before = Layout {
        state: &before_state,
        keys: &keys,
        device: device.clone(),
        flags,
    }
    .table(&state_pieces(&before_state, end)?, "")?;
    if TableSpec::parse(&before).map_err(dm)? != live {
        return Err(VolumeError::usage(format!(
            "Mismatching parameters on device {}.",
            req.name
        )));
    }
    let after = Layout {
        state: &state,
        keys: &keys,
        device,
        flags,
    }
    .table(&state_pieces(&state, end)?, "")?;
    let export = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&req.export)
        .map_err(|e| {
            VolumeError::device(format!(
                "Cannot open header file {}: {e}",
                req.export.display()
            ))
        })?;
    // Header writers wait for the run: this one from the export on.
    crate::lock::lock_header(&export, true)
        .map_err(|e| VolumeError::device(format!("cannot lock the header: {e}")))?;
    let undo = |e: VolumeError| -> VolumeError {
        // Nothing names the reencryption yet: the original header goes back, and the
        // export with it (as cryptsetup restores it).
        match super::encdec::restore_exported_header(&export, &file, shift) {
            Ok(()) => {
                let _ = std::fs::remove_file(&req.export);
                e
            }
            Err(r) => VolumeError::new(
                e.code,
                format!(
                    "{}; restoring the original header failed too ({}): the header is \
                     in {}",
                    e.message,
                    r.message,
                    req.export.display()
                ),
            ),
        }
    };
    super::encdec::export_header(&h, &file, &export).map_err(undo)?;
    registry
        .reload(&req.name, &after)
        .map_err(|e| undo(dm(e)))?;
    let held = (|| -> Result<()> {
        top.suspend().map_err(dm)?;
        super::encdec::move_first_segment(&file, shift)?;
        Ok(())
    })();
    if let Err(e) = held {
        // Back to the table that was served, over the data as it was.
        let _ = registry.reload(&req.name, &before);
        let _ = top.resume();
        return Err(undo(e));
    }
    if let Err(e) = new_h.write_reencryption(&export) {
        // The header may be half written, so neither table is known to be right: like
        // cryptsetup, fail the volume's I/O (an error table) rather than serve either.
        let e: VolumeError = e.into();
        let table = TableSpec::single(end / 512, ErrorConfig).to_text(false);
        let _ = registry.reload(&req.name, &table);
        let _ = top.resume();
        return Err(VolumeError::new(
            e.code,
            format!(
                "writing the reencryption header to {} failed ({}); close the volume and \
                 run repair on that header",
                req.export.display(),
                e.message
            ),
        ));
    }
    top.resume().map_err(dm)?;
    drop((export, file));
    OnlineJob::start(
        registry,
        OnlineRequest {
            name: req.name,
            header: req.export,
            data: Some(req.device),
            keys,
            opts: req.opts,
            // The live table's crypt line had them; every later table keeps them.
            flags: Some(flags),
        },
    )
}

/// The name cryptsetup's `--resilience` gives a resilience mode.
fn resilience_name(r: Resilience) -> &'static str {
    match r {
        Resilience::None => "none",
        Resilience::Checksum { .. } => "checksum",
        Resilience::Journal => "journal",
        Resilience::Datashift { .. } => "datashift",
        Resilience::DatashiftChecksum { .. } => "datashift-checksum",
        Resilience::DatashiftJournal { .. } => "datashift-journal",
    }
}

/// How often the daemon's log reports a running reencryption: at every tenth of the data
/// and at least every [`LOG_EVERY`], so a long run shows it is alive without a line per
/// step (a 1 GiB run has thousands).
const LOG_EVERY: Duration = Duration::from_secs(30);

/// The daemon's log lines of one run, in cryptsetup's units (`Progress: 40.0%, ETA 00m03s`,
/// `Finished, time 00m04s, 1008 MiB written, speed 245.7 MiB/s`).
struct LogProgress {
    name: String,
    total: u64,
    /// The next tenth of `total` (1..=10) that gets a line.
    next_tenth: u64,
    started: Instant,
    last_line: Instant,
}

impl LogProgress {
    fn new(name: String, total: u64, done: u64, started: Instant) -> Self {
        LogProgress {
            name,
            total,
            next_tenth: Self::tenth(done, total) + 1,
            started,
            last_line: started,
        }
    }

    /// Whole tenths of `total` that `done` covers.
    fn tenth(done: u64, total: u64) -> u64 {
        if total == 0 {
            return 10;
        }
        (done as u128 * 10 / total as u128) as u64
    }

    fn percent(&self, done: u64) -> f64 {
        if self.total == 0 {
            return 100.0;
        }
        done as f64 * 100.0 / self.total as f64
    }

    /// Bytes rewritten per second since the run began.
    fn speed(&self, rewritten: u64) -> f64 {
        rewritten as f64 / self.started.elapsed().as_secs_f64().max(1e-3)
    }

    /// A step ended with `done` bytes under the new key, `rewritten` by this run.
    fn step(&mut self, done: u64, rewritten: u64) {
        let now = Instant::now();
        let tenth = Self::tenth(done, self.total);
        // The last step is reported by `end` (Finished).
        if done >= self.total
            || (tenth < self.next_tenth && now.duration_since(self.last_line) < LOG_EVERY)
        {
            return;
        }
        self.next_tenth = tenth + 1;
        self.last_line = now;
        let speed = self.speed(rewritten);
        let eta = if speed > 0.0 {
            Duration::from_secs_f64((self.total.saturating_sub(done) as f64 / speed).min(1e9))
        } else {
            Duration::ZERO
        };
        log::info!(
            "{}: reencryption Progress: {:5.1}%, ETA {}, {}, {}",
            self.name,
            self.percent(done),
            crate::progress::human_time(eta),
            crate::progress::human_written(rewritten),
            crate::progress::human_speed(speed)
        );
    }

    /// The run ended as `result` says.
    fn end(&self, result: &Result<RunState>, done: u64, rewritten: u64) {
        let elapsed = self.started.elapsed();
        let summary = crate::progress::finished_line(elapsed, rewritten, self.speed(rewritten));
        match result {
            Ok(RunState::Finished) => log::info!("{}: reencryption {summary}", self.name),
            Ok(RunState::Stopped) => log::info!(
                "{}: reencryption stopped at {:.1}% (resumable); {}",
                self.name,
                self.percent(done),
                summary.replacen("Finished", "ran", 1)
            ),
            Ok(s) => log::warn!(
                "{}: reencryption ended {s:?} at {:.1}%",
                self.name,
                self.percent(done)
            ),
            Err(e) => log::error!(
                "{}: reencryption failed at {:.1}%: {}",
                self.name,
                self.percent(done),
                e.message
            ),
        }
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
        let first = self.shared.progress.lock().map_or(0, |p| p.done);
        let mut log = LogProgress::new(self.name.clone(), self.end, first, started);
        log::info!(
            "{}: reencryption started ({}, hotzone {} KiB, resilience {}): {} of {} bytes \
             already under the new key",
            self.name,
            self.direction,
            self.hotzone >> 10,
            resilience_name(self.resilience()),
            first,
            self.end
        );
        let result = (|| -> Result<RunState> {
            loop {
                if self.shared.stop.load(Ordering::SeqCst) {
                    // With resilience none the steps wrote no header: record the boundary
                    // now, so the volume reopens with the right keys.
                    if self.resilience() == Resilience::None {
                        self.h.write_reencryption(&self.header)?;
                    }
                    return Ok(RunState::Stopped);
                }
                let Some(state) = ReencryptState::of(&self.h)? else {
                    return Ok(RunState::Finished);
                };
                let Some(step) = run::next_step(&state, self.end, self.hotzone) else {
                    // Everything is new already: write the final header.
                    let data = self.data.as_ref().unwrap_or(&self.header);
                    run::finish(&mut self.h, &self.header, data)?;
                    return Ok(RunState::Finished);
                };
                let done = self.step(&state, step)?;
                rewritten += step.len;
                let secs = started.elapsed().as_secs_f64().max(1e-3);
                self.shared.set(|p| {
                    p.done = done;
                    p.steps += 1;
                    p.bytes_per_sec = (rewritten as f64 / secs) as u64;
                });
                log.step(done, rewritten);
                if step.last {
                    return Ok(RunState::Finished);
                }
            }
        })();
        if !matches!(result, Ok(RunState::Failed) | Err(_)) {
            self.remove_hotzone();
        }
        let done = self.shared.progress.lock().map_or(0, |p| p.done);
        log.end(&result, done, rewritten);
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

    /// One step over the hotzone of `step` (logical bytes, in either direction): hold,
    /// rewrite as offline, release. Returns the bytes under the new key afterwards.
    fn step(&mut self, state: &ReencryptState, step: run::Step) -> Result<u64> {
        let end = self.end;
        let (l, len) = (step.l, step.len);
        let (hold_table, hz_old, hz_new, after, done) = {
            let lay = self.layout(state);
            let hz_table = |side: Side| -> Result<Zeroizing<String>> {
                let mut spec = TableSpec::default();
                lay.push(&mut spec, side, l, l + len)?;
                Ok(spec.to_text(true))
            };
            let pieces = state_pieces(state, end)?;
            let hold = lay.table(
                &with_range(&pieces, l, l + len, Side::Hotzone),
                &self.hotzone_name,
            )?;
            let after_pieces = with_range(&pieces, l, l + len, Side::New);
            let after = lay.table(&after_pieces, "")?;
            (
                hold,
                hz_table(Side::Old)?,
                hz_table(Side::New)?,
                after,
                done_bytes(&after_pieces),
            )
        };
        if self.ciphers.is_none() {
            self.ciphers = Some(Ciphers::new(state, &self.keys)?);
        }
        let hz = self.hotzone_mapping(&hz_old)?;
        let mut keep = std::mem::take(&mut self.keep);
        let result = (|| -> std::result::Result<(), (Phase, VolumeError)> {
            let held = |e: VolumeError| (Phase::Held, e);
            self.swap_top(&hold_table).map_err(held)?;
            hz.suspend().map_err(dm).map_err(held)?;
            let none = state.keyslot.resilience == Resilience::None;
            let data = self.data.as_ref().unwrap_or(&self.header);
            let old = run::protect(state, &self.header, data, l, len, &mut keep, &self.opts)
                .map_err(held)?;
            self.h
                .set_reencrypt_layout(&run::layout(state, end, step.x, Some((l, len))))
                .map_err(|e| held(e.into()))?;
            if !none {
                self.h
                    .write_reencryption(&self.header)
                    .map_err(|e| held(e.into()))?;
            }
            let named = |e: VolumeError| (Phase::Named, e);
            let ciphers = self.ciphers.as_ref().expect("keyed before the step");
            let mut done = 0;
            run::rewrite(
                state,
                data,
                ciphers,
                l,
                len,
                old,
                &mut done,
                &mut NoProgress,
                &self.opts,
            )
            .map_err(named)?;
            if step.last {
                run::finish(&mut self.h, &self.header, data).map_err(named)?;
            } else {
                self.h
                    .set_reencrypt_layout(&run::layout(state, end, step.next, None))
                    .map_err(|e| named(e.into()))?;
                if !none {
                    self.h
                        .write_reencryption(&self.header)
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
        self.keep = keep;
        match result {
            Ok(()) => {
                drop(hz);
                // A request that just left may still hold the old top table (and so the
                // hotzone mapping) for a moment: then the next step reuses it.
                let _ = self.registry.remove(&self.hotzone_name);
                Ok(done)
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
                        "reencryption step at byte {l} failed: {}{}",
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
    use cryptblk_cipher::SecretBytes;
    use cryptblk_format::luks2::{ReencryptKeyslot, ReencryptMode, SegmentInfo};

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

    fn linear(id: u32, offset: u64, size: Option<u64>, flag: &str) -> SegmentInfo {
        SegmentInfo {
            id,
            kind: "linear".into(),
            offset,
            size,
            iv_tweak: 0,
            encryption: None,
            sector_size: 512,
            flags: vec![flag.into()],
        }
    }

    fn seg(side: Side, logical: u64, size: Option<u64>) -> StateSegment {
        StateSegment {
            offset: 0,
            size,
            side,
            logical,
        }
    }

    /// A backward decryption: the old (crypt) data at the start, the new plaintext after
    /// the boundary mapped linear at its own bytes; a step's hold and after tables put the
    /// hotzone through the hotzone mapping, then to the plaintext side.
    #[test]
    fn backward_decryption_maps_the_plaintext_side_linear() {
        let mut st = state(vec![
            seg(Side::Old, 0, Some(20 * MIB)),
            seg(Side::New, 20 * MIB, None),
        ]);
        st.keyslot.direction = ReencryptDirection::Backward;
        st.keyslot.mode = ReencryptMode::Decrypt;
        st.previous.offset = 0;
        st.fin = linear(3, 0, None, "backup-final");
        let keys = ReencryptKeys {
            old: Some(SecretBytes::from_slice(&[0x11; 64])),
            new: None,
        };
        let t = served_table(&st, &keys, "/dev/x", &CryptFlags::default(), 24 * MIB).unwrap();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines,
            [
                format!(
                    "0 40960 crypt aes-xts-plain64 {} 0 /dev/x 0",
                    "11".repeat(64)
                ),
                "40960 8192 linear /dev/x 40960".to_string(),
            ]
        );
        let l = Layout {
            state: &st,
            keys: &keys,
            device: "/dev/x".into(),
            flags: CryptFlags::default(),
        };
        let pieces = state_pieces(&st, 24 * MIB).unwrap();
        assert_eq!(done_bytes(&pieces), 4 * MIB);
        let hold = l
            .table(
                &with_range(&pieces, 19 * MIB, 20 * MIB, Side::Hotzone),
                "hz",
            )
            .unwrap();
        assert_eq!(
            hold.lines().skip(1).collect::<Vec<_>>(),
            ["38912 2048 linear hz 0", "40960 8192 linear /dev/x 40960"]
        );
        let after = with_range(&pieces, 19 * MIB, 20 * MIB, Side::New);
        assert_eq!(done_bytes(&after), 5 * MIB);
        let after = l.table(&after, "").unwrap();
        assert_eq!(
            after.lines().nth(1),
            Some("38912 10240 linear /dev/x 38912"),
            "the new plaintext merges into one line"
        );
    }

    /// An encryption with a data shift: the old plaintext's first `shift` bytes lie in the
    /// moved segment (mapped from there), the rest in place; the new side's data lies
    /// `shift` further on with IVs counted from the volume's first byte.
    #[test]
    fn datashift_encryption_maps_the_moved_segment_and_the_shift() {
        let mut st = state(vec![
            seg(Side::Old, 0, Some(10 * MIB)),
            seg(Side::New, 10 * MIB, Some(20 * MIB)),
        ]);
        st.keyslot.direction = ReencryptDirection::Backward;
        st.keyslot.mode = ReencryptMode::Encrypt;
        st.previous = linear(2, 0, Some(30 * MIB), "backup-previous");
        st.fin.offset = MIB;
        st.fin.sector_size = 512;
        st.moved = Some(linear(4, 31 * MIB, Some(MIB), "backup-moved-segment"));
        let keys = ReencryptKeys {
            old: None,
            new: Some(SecretBytes::from_slice(&[0x22; 64])),
        };
        let t = served_table(&st, &keys, "/dev/x", &CryptFlags::default(), 32 * MIB).unwrap();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines,
            [
                "0 2048 linear /dev/x 63488".to_string(),
                "2048 18432 linear /dev/x 2048".to_string(),
                format!(
                    "20480 40960 crypt aes-xts-plain64 {} 20480 /dev/x 22528",
                    "22".repeat(64)
                ),
            ]
        );
    }
}
