//! Progress of long operations, reported to whoever drives them: the CLI draws a bar on a
//! terminal, a library user may log or ignore it. The library never touches a terminal.

use crate::error::{Result, VolumeError};
use cryptblk_dm::device::{BlockDevice, WriteFlags};

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
