//! `encrypt` and `decrypt`: volume images for pipelines that have no root and no dm (what
//! containers' luksy does), streaming at cipher speed. The pipelines are
//! [`cryptblk_volume::offline`]'s; this module opens the files and draws the progress.

use super::luks;
use super::volume;
use crate::args::Opts;
use crate::exit::{ActionResult, Failure};
use crate::progress::Bar;
use cryptblk_format::hdrio::MemIo;
use cryptblk_format::luks2::UnlockPurpose;
use cryptblk_volume::offline::{self, Endpoint, Output};
use cryptblk_volume::reencrypt::{self, ReencryptState};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

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
    check_distinct(&[Some(input), opts.key_file.as_deref()], output)?;
    let pass = volume::read_new_secret(
        opts.key_file.as_deref(),
        "Enter passphrase for the new volume: ",
    )?;
    // The header goes to memory first, so the output can be a pipe.
    let header = MemIo::zeroed(64 << 20);
    let sector_size = luks::new_sector_size(opts, None)?;
    let (vk, data_offset) = luks::format_on(opts, &header, pass.as_bytes(), sector_size)?;
    let sector = sector_size as usize;
    let seg = volume::Segment {
        cipher: opts
            .cipher
            .clone()
            .unwrap_or_else(|| cryptblk_volume::format::DEFAULT_LUKS_CIPHER.into()),
        offset: data_offset,
        size: None,
        iv_offset: 0,
        sector_size: sector as u32,
        integrity: None,
    };
    let cipher = offline::segment_cipher(&seg, vk.as_bytes(), opts.cipher_implementation.clone())?;

    let (mut src, total): (Box<dyn Read>, Option<u64>) = if from_stdin {
        (Box::new(std::io::stdin().lock()), None)
    } else {
        let f = File::open(input)
            .map_err(|e| Failure::device(format!("cannot read {}: {e}", input.display())))?;
        let len = f.metadata()?.len();
        (Box::new(f), Some(len))
    };
    // A volume without a single data sector is one `open` refuses as too small: refuse to
    // make it (an empty file before anything is written; an empty stream before the commit).
    let empty = || {
        Failure::device(format!(
            "The input {} is empty: {} would be too small (no data area after the header).",
            input.display(),
            output.display()
        ))
    };
    if total == Some(0) {
        return Err(empty());
    }
    let mut dst = Output::create(output)?;
    dst.writer()
        .write_all(&header.contents()[..data_offset as usize])?;
    let written = offline::encrypt_stream(
        cipher.as_ref(),
        sector,
        &mut *src,
        dst.writer(),
        total,
        &mut Bar::for_file(opts, output),
    )?;
    if written == 0 {
        return Err(empty());
    }
    dst.commit()
}

/// `decrypt <device> <plain-output>`: the decrypted data segment.
pub fn decrypt(opts: &Opts, device: &Path, output: &Path) -> ActionResult {
    if opts.volume_type == Some(crate::args::VolumeType::Tcrypt) {
        check_distinct(&[Some(device), opts.header.as_deref()], output)?;
        return super::tcrypt::decrypt(opts, device, output);
    }
    check_distinct(
        &[
            Some(device),
            opts.header.as_deref(),
            opts.key_file.as_deref(),
        ],
        output,
    )?;
    if opts.volume_type == Some(crate::args::VolumeType::Bitlk) {
        return super::bitlk::decrypt(opts, device, output);
    }
    if opts.volume_type == Some(crate::args::VolumeType::Fvault2) {
        return super::fvault2::decrypt(opts, device, output);
    }
    if opts.volume_type == Some(crate::args::VolumeType::Loopaes) {
        return super::loopaes::decrypt(opts, device, output);
    }
    let vol = volume::load(opts, device, false)?;
    if let Some(h) = vol.luks2() {
        if let Some(state) = ReencryptState::of(h)? {
            return decrypt_mid_reencryption(opts, &vol, h, &state, device, output);
        }
    }
    let (_, vk) = luks::unlock(opts, &vol, device, UnlockPurpose::Activate)?;
    let seg = vol.segment()?;
    if seg.integrity.is_some() {
        return Err(Failure::usage(
            "decrypting a volume with integrity is not supported yet",
        ));
    }
    let cipher = offline::segment_cipher(&seg, vk.as_bytes(), opts.cipher_implementation.clone())?;
    let data = File::open(device)?;
    let dev_size = {
        let mut d = &data;
        d.seek(SeekFrom::End(0))?
    };
    let len = offline::segment_len(&seg, dev_size, device)?;
    let mut dst = Output::create(output)?;
    offline::decrypt_segment(
        cipher.as_ref(),
        &seg,
        &data,
        len,
        dst.writer(),
        &mut Bar::for_file(opts, device),
    )?;
    dst.commit()
}

/// `decrypt` of a volume whose LUKS2 reencryption was interrupted: both keys from the
/// passphrase, the hotzone recovered in memory (the volume is not changed).
fn decrypt_mid_reencryption(
    opts: &Opts,
    vol: &cryptblk_volume::Volume,
    h: &cryptblk_format::luks2::Luks2Header,
    state: &ReencryptState,
    device: &Path,
    output: &Path,
) -> ActionResult {
    let cryptblk_volume::Volume::Luks2(_, header_file) = vol else {
        return Err(Failure::usage("reencryption needs a LUKS2 header"));
    };
    let pass = volume::read_secret(
        &volume::key_source(opts, None),
        volume::limits(opts),
        &format!("Enter passphrase for {}: ", device.display()),
    )?;
    let keys = reencrypt::unlock_keys(
        h,
        header_file,
        state,
        pass.as_bytes(),
        opts.key_slot.map(|s| s as usize),
    )?;
    let data = File::open(device)?;
    let dev_size = {
        let mut d = &data;
        d.seek(SeekFrom::End(0))?
    };
    // As for a volume at rest: no data area, no output (open refuses it the same way).
    if state.logical_size(dev_size) == 0 {
        return Err(Failure::device(format!(
            "Device {} is too small.",
            device.display()
        )));
    }
    let mut dst = Output::create(output)?;
    reencrypt::read_plaintext(
        state,
        &keys,
        header_file,
        &data,
        dev_size,
        dst.writer(),
        &mut Bar::for_file(opts, device),
    )?;
    dst.commit()
}

/// Refuses an output that is one of the inputs (any path to the same file, or standard
/// input or output redirected to it), before anything is read or written.
fn check_distinct(inputs: &[Option<&Path>], output: &Path) -> ActionResult {
    let inputs: Vec<_> = inputs
        .iter()
        .flatten()
        .map(|p| Endpoint::input(p))
        .collect();
    offline::check_output_distinct(&inputs, &Endpoint::output(output))
}
