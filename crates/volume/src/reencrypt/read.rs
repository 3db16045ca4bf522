//! Reading the plaintext of a volume mid-reencryption: every data segment through the
//! cipher of its side, the hotzone through recovery. Nothing is written.

use super::keys::ReencryptKeys;
use super::recovery::{hotzone_plaintext, Ciphers};
use super::state::{ReencryptState, Side};
use crate::error::Result;
use crate::progress::Progress;
use cryptblk_format::hdrio::HeaderIo;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;

/// Bytes decrypted per call.
const CHUNK: u64 = 4 << 20;

/// Writes the plaintext of the whole data area (the volume's data in logical order, as
/// many bytes as the original data held: [`ReencryptState::logical_size`] of the device of
/// `dev_size` bytes) to `dst`; returns its length. `header` holds the resilience data,
/// `data` the data (the same file unless the header is detached).
pub fn read_plaintext(
    state: &ReencryptState,
    keys: &ReencryptKeys,
    header: &dyn HeaderIo,
    data: &File,
    dev_size: u64,
    dst: &mut dyn Write,
    progress: &mut dyn Progress,
) -> Result<u64> {
    let ciphers = Ciphers::new(state, keys)?;
    let end = state.logical_size(dev_size);
    progress.start(Some(end), "decrypting");
    let result = (|| -> Result<()> {
        let mut buf = vec![0u8; CHUNK as usize];
        for seg in &state.segments {
            let seg_end = seg.size.map_or(end, |s| (seg.logical + s).min(end));
            if seg_end <= seg.logical {
                continue;
            }
            if seg.side == Side::Hotzone {
                let plain =
                    hotzone_plaintext(state, &ciphers, header, data, seg, seg_end - seg.logical)?;
                dst.write_all(&plain)?;
                progress.update(seg_end);
                continue;
            }
            let cipher = if seg.side == Side::Old {
                ciphers.old()?
            } else {
                ciphers.new_side()?
            };
            let mut pos = seg.logical;
            while pos < seg_end {
                let n = (seg_end - pos).min(CHUNK) as usize;
                data.read_exact_at(&mut buf[..n], seg.offset + (pos - seg.logical))?;
                cipher.decrypt_logical(pos, &mut buf[..n])?;
                dst.write_all(&buf[..n])?;
                pos += n as u64;
                progress.update(pos);
            }
        }
        dst.flush()?;
        Ok(())
    })();
    progress.finish();
    result.map(|()| end)
}
