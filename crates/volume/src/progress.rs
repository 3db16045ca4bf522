//! Progress of long operations, reported to whoever drives them: the CLI draws a bar on a
//! terminal, a library user may log or ignore it. The library never touches a terminal.

use crate::error::{Result, VolumeError};
use cryptblk_dm::device::{BlockDevice, WriteFlags};
use std::time::Duration;

/// Receives the progress of one long operation.
pub trait Progress {
    /// The operation `what` starts; `total` bytes when known.
    fn start(&mut self, total: Option<u64>, what: &str);
    /// `done` bytes of the total are finished.
    fn update(&mut self, done: u64);
    /// The operation ended (successfully or not).
    fn finish(&mut self);
}

/// Progress nobody watches.
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&mut self, _total: Option<u64>, _what: &str) {}
    fn update(&mut self, _done: u64) {}
    fn finish(&mut self) {}
}

// cryptsetup's units for progress lines, shared by the CLI's progress and the daemon's log
// (an online reencryption reports there).

/// cryptsetup's time: `12m44s` under 90 minutes, `26h12m44s` under 36 hours, else `3 days`.
pub fn human_time(d: Duration) -> String {
    let s = d.as_secs();
    if s < 90 * 60 {
        format!("{:02}m{:02}s", s / 60, s % 60)
    } else if s < 36 * 3600 {
        format!("{:02}h{:02}m{:02}s", s / 3600, (s / 60) % 60, s % 60)
    } else {
        format!("{:02} days", s / 86400)
    }
}

/// cryptsetup's byte count: whole MiB under 4 GiB, GiB under 4 TiB, and so on.
pub fn human_written(bytes: u64) -> String {
    const UNITS: [(u32, &str); 5] = [
        (32, "MiB"),
        (42, "GiB"),
        (52, "TiB"),
        (62, "PiB"),
        (64, "EiB"),
    ];
    let mut shift = 20;
    for (limit, unit) in UNITS {
        if limit == 64 || bytes < (1u64 << limit) {
            return format!("{:4} {unit} written", bytes >> shift);
        }
        shift += 10;
    }
    unreachable!("the last unit takes every size")
}

/// cryptsetup's speed: `speed 445.2 MiB/s` (B, KiB, MiB or GiB).
pub fn human_speed(bytes_per_sec: f64) -> String {
    let (v, unit) = if bytes_per_sec > 1073741824.0 {
        (bytes_per_sec / 1073741824.0, "GiB")
    } else if bytes_per_sec > 1048576.0 {
        (bytes_per_sec / 1048576.0, "MiB")
    } else if bytes_per_sec > 1024.0 {
        (bytes_per_sec / 1024.0, "KiB")
    } else {
        (bytes_per_sec, "B")
    };
    format!("speed {v:5.1} {unit}/s")
}

/// The line cryptsetup prints when a run ends: `Finished, time 00m02s, 1024 MiB written, ...`.
pub fn finished_line(elapsed: Duration, written: u64, bytes_per_sec: f64) -> String {
    format!(
        "Finished, time {}, {}, {}",
        human_time(elapsed),
        human_written(written),
        human_speed(bytes_per_sec)
    )
}

/// Bytes written per request by [`zero_fill`] (cryptsetup's wipe block is 1 MiB too).
const WIPE_CHUNK: usize = 1 << 20;

/// Writes zeros over all of `dev` and flushes, so every block of an integrity-protected
/// device gets a valid tag; returns the bytes written.
pub fn zero_fill(dev: &dyn BlockDevice, what: &str, progress: &mut dyn Progress) -> Result<u64> {
    let total = dev.size();
    progress.start(Some(total), what);
    let zeros = vec![0u8; WIPE_CHUNK];
    let mut off = 0u64;
    let result = (|| {
        while off < total {
            let n = (total - off).min(WIPE_CHUNK as u64) as usize;
            dev.write_at(off, &zeros[..n], WriteFlags::default())
                .map_err(|e| VolumeError::device(format!("Wipe failed at byte {off}: {e}")))?;
            off += n as u64;
            progress.update(off);
        }
        dev.flush()
            .map_err(|e| VolumeError::device(format!("Flushing after the wipe failed: {e}")))
    })();
    progress.finish();
    result.map(|()| total)
}
