//! Offline image pipelines without dm: a plaintext stream encrypted into a new volume's data
//! segment, and a volume's data segment decrypted into a stream.

use crate::error::Result;
use crate::progress::Progress;
use crate::segment::Segment;
use cryptblk_cipher::{SectorCipher, SectorOptions};
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;

/// Bytes processed per cipher call: large enough to amortise per-call costs.
const CHUNK: usize = 4 << 20;

/// The sector cipher of `seg` keyed with `key`; `implementation` picks one by name
/// (`cryptblk ciphers`), `None` the fastest.
pub fn segment_cipher(
    seg: &Segment,
    key: &[u8],
    implementation: Option<String>,
) -> Result<Box<dyn SectorCipher>> {
    Ok(cryptblk_cipher::open_cipher(
        &seg.cipher,
        key,
        &SectorOptions {
            sector_size: seg.sector_size as usize,
            iv_offset: seg.iv_offset,
            iv_large_sectors: false,
            implementation,
        },
    )?)
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Encrypts `src` to `dst` as the data segment starting at sector 0 of the segment, the last
/// sector zero-padded to `sector` bytes; `total` (the input size, if known) goes to
/// `progress`. Returns the bytes written.
pub fn encrypt_stream(
    cipher: &dyn SectorCipher,
    sector: usize,
    src: &mut dyn Read,
    dst: &mut dyn Write,
    total: Option<u64>,
    progress: &mut dyn Progress,
) -> Result<u64> {
    progress.start(total, "encrypting");
    let mut buf = vec![0u8; CHUNK];
    let mut pos = 0u64;
    let mut read = 0u64;
    let result = (|| -> Result<()> {
        loop {
            let n = read_full(src, &mut buf)?;
            if n == 0 {
                break;
            }
            let padded = n.div_ceil(sector) * sector;
            buf[n..padded].fill(0);
            cipher.encrypt(pos / 512, &mut buf[..padded])?;
            dst.write_all(&buf[..padded])?;
            pos += padded as u64;
            read += n as u64;
            progress.update(read);
            if n < CHUNK {
                break;
            }
        }
        dst.flush()?;
        Ok(())
    })();
    progress.finish();
    result.map(|()| pos)
}

/// The bytes of `seg` on a data device of `dev_size` bytes (whole encryption sectors).
pub fn segment_len(seg: &Segment, dev_size: u64) -> u64 {
    let len = match seg.size {
        Some(s) => s,
        None => dev_size.saturating_sub(seg.offset),
    };
    len - len % u64::from(seg.sector_size)
}

/// Decrypts the first `len` bytes of `seg` on `data` into `dst`.
pub fn decrypt_segment(
    cipher: &dyn SectorCipher,
    seg: &Segment,
    data: &File,
    len: u64,
    dst: &mut dyn Write,
    progress: &mut dyn Progress,
) -> Result<()> {
    progress.start(Some(len), "decrypting");
    let mut buf = vec![0u8; CHUNK];
    let mut pos = 0u64;
    let result = (|| -> Result<()> {
        while pos < len {
            let n = (len - pos).min(CHUNK as u64) as usize;
            data.read_exact_at(&mut buf[..n], seg.offset + pos)?;
            cipher.decrypt(pos / 512, &mut buf[..n])?;
            dst.write_all(&buf[..n])?;
            pos += n as u64;
            progress.update(pos);
        }
        dst.flush()?;
        Ok(())
    })();
    progress.finish();
    result
}
