//! `encrypt` and `decrypt`: volume images for pipelines that have no root and no dm (what
//! containers' luksy does), streaming at cipher speed.

use super::luks;
use super::volume::{self, Volume};
use crate::args::Opts;
use crate::exit::{ActionResult, Failure};
use cryptblk_cipher::{SectorCipher, SectorOptions};
use cryptblk_format::hdrio::MemIo;
use cryptblk_format::luks2::UnlockPurpose;
use indicatif::ProgressBar;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Bytes processed per cipher call: large enough to amortise per-call costs.
const CHUNK: usize = 4 << 20;

fn progress(total: Option<u64>, what: &str) -> ProgressBar {
    crate::progress::bar(total, what, true)
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

fn open_cipher(
    opts: &Opts,
    seg: &volume::Segment,
    key: &[u8],
) -> Result<Box<dyn SectorCipher>, Failure> {
    Ok(cryptblk_cipher::open_cipher(
        &seg.cipher,
        key,
        &SectorOptions {
            sector_size: seg.sector_size as usize,
            iv_offset: seg.iv_offset,
            iv_large_sectors: false,
            implementation: opts.cipher_implementation.clone(),
        },
    )?)
}

/// `encrypt <plain-input> <luks-output>`: a new LUKS volume whose data segment holds the input
/// (the last sector zero-padded).
pub fn encrypt(opts: &Opts, input: &Path, output: &Path) -> ActionResult {
    if opts.header.is_some() {
        return Err(Failure::usage(
            "encrypt writes the header into the output; --header is not supported here",
        ));
    }
    let from_stdin = input.as_os_str() == "-";
    if from_stdin && opts.key_file.is_none() {
        return Err(Failure::usage(
            "with input from standard input the passphrase must come from --key-file",
        ));
    }
    let pass = volume::read_new_secret(
        opts.key_file.as_deref(),
        "Enter passphrase for the new volume: ",
    )?;
    // The header goes to memory first, so the output can be a pipe.
    let header = MemIo::zeroed(64 << 20);
    let (vk, data_offset) = luks::format_on(opts, &header, pass.as_bytes())?;
    let sector = opts.sector_size.unwrap_or(512) as usize;
    let seg = volume::Segment {
        cipher: opts
            .cipher
            .clone()
            .unwrap_or_else(|| "aes-xts-plain64".into()),
        offset: data_offset,
        size: None,
        iv_offset: 0,
        sector_size: sector as u32,
        integrity: None,
    };
    let cipher = open_cipher(opts, &seg, vk.as_bytes())?;

    let (mut src, total): (Box<dyn Read>, Option<u64>) = if from_stdin {
        (Box::new(std::io::stdin().lock()), None)
    } else {
        let f = File::open(input)
            .map_err(|e| Failure::device(format!("cannot read {}: {e}", input.display())))?;
        let len = f.metadata()?.len();
        (Box::new(f), Some(len))
    };
    let mut dst: Box<dyn Write> = if output.as_os_str() == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(
            File::create(output)
                .map_err(|e| Failure::device(format!("cannot create {}: {e}", output.display())))?,
        )
    };
    dst.write_all(&header.contents()[..data_offset as usize])?;
    let pb = progress(total, "encrypting");
    let mut buf = vec![0u8; CHUNK];
    let mut pos = 0u64;
    loop {
        let n = read_full(&mut *src, &mut buf)?;
        if n == 0 {
            break;
        }
        let padded = n.div_ceil(sector) * sector;
        buf[n..padded].fill(0);
        cipher.encrypt(pos / 512, &mut buf[..padded])?;
        dst.write_all(&buf[..padded])?;
        pos += padded as u64;
        pb.inc(n as u64);
        if n < CHUNK {
            break;
        }
    }
    dst.flush()?;
    pb.finish_and_clear();
    Ok(())
}

/// `decrypt <device> <plain-output>`: the decrypted data segment.
pub fn decrypt(opts: &Opts, device: &Path, output: &Path) -> ActionResult {
    let vol = Volume::load(opts, device, false)?;
    let (_, vk) = luks::unlock(opts, &vol, device, UnlockPurpose::Activate)?;
    let seg = vol.segment()?;
    if seg.integrity.is_some() {
        return Err(Failure::usage(
            "decrypting a volume with integrity is not supported yet",
        ));
    }
    let cipher = open_cipher(opts, &seg, vk.as_bytes())?;
    let data = File::open(device)?;
    let dev_size = {
        let mut d = &data;
        d.seek(SeekFrom::End(0))?
    };
    let len = match seg.size {
        Some(s) => s,
        None => dev_size.saturating_sub(seg.offset),
    };
    let len = len - len % seg.sector_size as u64;
    let mut dst: Box<dyn Write> = if output.as_os_str() == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(
            File::create(output)
                .map_err(|e| Failure::device(format!("cannot create {}: {e}", output.display())))?,
        )
    };
    let pb = progress(Some(len), "decrypting");
    let mut buf = vec![0u8; CHUNK];
    let mut pos = 0u64;
    while pos < len {
        let n = (len - pos).min(CHUNK as u64) as usize;
        data.read_exact_at(&mut buf[..n], seg.offset + pos)?;
        cipher.decrypt(pos / 512, &mut buf[..n])?;
        dst.write_all(&buf[..n])?;
        pos += n as u64;
        pb.inc(n as u64);
    }
    dst.flush()?;
    pb.finish_and_clear();
    Ok(())
}
