//! The command-line side of LUKS2 with `--integrity` (authenticated encryption): which
//! options cryptsetup accepts with it, and the key sizes they give. Formatting the data
//! device and stacking the mappings is [`cryptblk_volume::luks2_integrity`]'s job.

use crate::args::Opts;
use crate::exit::Failure;

/// Refuses `--integrity` where cryptsetup does, with its messages.
pub fn check_format_options(opts: &Opts, luks1: bool) -> Result<(), Failure> {
    let o = &opts.integrity;
    if o.integrity.is_none() {
        if o.integrity_no_wipe || o.integrity_legacy_padding {
            return Err(Failure::usage(
                "Integrity options can be used only with --integrity.",
            ));
        }
        return Ok(());
    }
    if luks1 {
        return Err(Failure::usage(
            "Integrity option can be used only for LUKS2 format.",
        ));
    }
    if o.integrity_key_file.is_some() || o.tag_size.is_some() || o.journal_size.is_some() {
        return Err(Failure::usage(
            "Options --integrity-key-file, --tag-size and --journal-size are not supported \
             with LUKS2 integrity (the key is part of the volume key, the tag size follows \
             the cipher).",
        ));
    }
    if o.integrity_bitmap_mode || o.integrity_recovery_mode {
        return Err(Failure::usage(
            "Only --integrity-no-journal is supported for LUKS2 integrity devices.",
        ));
    }
    Ok(())
}

/// Encryption key size in bytes for `--integrity` volumes, with cryptsetup's defaults
/// (512 bits for XTS, 256 otherwise).
pub fn encryption_key_bytes(opts: &Opts, cipher: &str) -> Result<usize, Failure> {
    let bits = match opts.key_size {
        Some(b) => b,
        None if cipher.contains("-xts-") => 512,
        None => 256,
    };
    if bits == 0 || bits % 8 != 0 {
        return Err(Failure::usage(format!(
            "Key size {bits} is not a multiple of 8 bits."
        )));
    }
    Ok(bits as usize / 8)
}

/// `--integrity-key-size` for luksFormat, which cryptsetup takes in bits (integritysetup
/// takes bytes for the same option name).
pub fn integrity_key_bytes(opts: &Opts) -> Result<Option<usize>, Failure> {
    match opts.integrity.integrity_key_size {
        None => Ok(None),
        Some(bits) if bits > 0 && bits % 8 == 0 => Ok(Some(bits as usize / 8)),
        Some(bits) => Err(Failure::usage(format!(
            "Cannot use specified integrity key size ({bits} bits is no whole number of bytes)."
        ))),
    }
}
