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

/// Writes the plaintext of the whole data area (from the first data segment to the end of
/// the device of `dev_size` bytes, whole encryption sectors) to `dst`; returns its length.
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
    let sector = u64::from(state.previous.sector_size.max(state.fin.sector_size));
    let start = state.segments.first().map_or(0, |s| s.offset);
    let end = start + (dev_size.saturating_sub(start) / sector) * sector;
    progress.start(Some(end - start), "decrypting");
    let result = (|| -> Result<()> {
        let mut buf = vec![0u8; CHUNK as usize];
        for seg in &state.segments {
            let seg_end = seg.size.map_or(end, |s| (seg.offset + s).min(end));
            if seg_end <= seg.offset {
                continue;
            }
            if seg.side == Side::Hotzone {
                let plain =
                    hotzone_plaintext(state, &ciphers, header, data, seg, seg_end - seg.offset)?;
                dst.write_all(&plain)?;
                progress.update(seg_end - start);
                continue;
            }
            let cipher = if seg.side == Side::Old {
                ciphers.old()?
            } else {
                ciphers.new_side()?
            };
            let mut pos = seg.offset;
            while pos < seg_end {
                let n = (seg_end - pos).min(CHUNK) as usize;
                data.read_exact_at(&mut buf[..n], pos)?;
                cipher.decrypt_at(pos, &mut buf[..n])?;
                dst.write_all(&buf[..n])?;
                pos += n as u64;
                progress.update(pos - start);
            }
        }
        dst.flush()?;
        Ok(())
    })();
    progress.finish();
    result.map(|()| end - start)
}
