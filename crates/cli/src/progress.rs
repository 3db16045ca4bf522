//! Progress for long operations (offline encrypt/decrypt, integrity wipes): a bar on a
//! terminal, nothing otherwise, so scripts and `--json` output stay clean.

use cryptblk_dm::device::{BlockDevice, WriteFlags};
use indicatif::{ProgressBar, ProgressStyle};

use crate::exit::Failure;

/// Bytes written per request by [`zero_fill`].
const WIPE_CHUNK: usize = 1 << 20;

/// A byte-counting bar labelled `what` (a spinner when `total` is unknown); hidden unless
/// `show` and standard error is a terminal.
pub fn bar(total: Option<u64>, what: &str, show: bool) -> ProgressBar {
    if !show || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return ProgressBar::hidden();
    }
    let pb = match total {
        Some(t) => ProgressBar::new(t),
        None => ProgressBar::new_spinner(),
    };
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// Writes zeros over all of `dev` and flushes, so every block of an integrity-protected
/// device gets a valid tag; returns the bytes written.
pub fn zero_fill(dev: &dyn BlockDevice, what: &str, show: bool) -> Result<u64, Failure> {
    let total = dev.size();
    let pb = bar(Some(total), what, show);
    let zeros = vec![0u8; WIPE_CHUNK];
    let mut off = 0u64;
    while off < total {
        let n = (total - off).min(WIPE_CHUNK as u64) as usize;
        dev.write_at(off, &zeros[..n], WriteFlags::default())
            .map_err(|e| Failure::device(format!("Wipe failed at byte {off}: {e}")))?;
        off += n as u64;
        pb.set_position(off);
    }
    dev.flush()
        .map_err(|e| Failure::device(format!("Flushing after the wipe failed: {e}")))?;
    pb.finish_and_clear();
    Ok(total)
}
