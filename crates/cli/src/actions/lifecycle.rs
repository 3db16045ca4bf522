//! A volume's life after luksFormat, as cryptsetup runs it: `luksConvertKey` (new KDF
//! parameters for a keyslot), `luksSuspend`/`luksResume` of a served volume, `resize` of a
//! served volume. The work is the library's; this parses, prompts and prints.

use super::volume;
use crate::args::Opts;
use crate::exit::{ActionResult, Failure};
use cryptblk_volume::luks as lib;
use std::path::Path;

/// `luksConvertKey <device>`: LUKS2 only; the passphrase of the keyslot to convert (only
/// `--key-slot` when given) from `--key-file` or the terminal. A second positional argument
/// is ignored, as cryptsetup ignores it (its suite passes the device there twice).
pub fn convert_key(opts: &Opts, device: &Path, _ignored: Option<&Path>) -> ActionResult {
    let mut vol = volume::load(opts, device, true)?;
    if vol.luks2().is_none() {
        return Err(lib::not_luks2(device));
    }
    let params = volume::keyslot_params(opts)?;
    let pass = volume::read_secret(
        &volume::key_source(opts, None),
        volume::limits(opts),
        "Enter passphrase for keyslot to be converted: ",
    )?;
    let slot = opts.key_slot.map(|s| s as usize);
    let converted = lib::convert_key(&mut vol, device, pass.as_bytes(), slot, &params)?;
    if opts.verbose {
        // cryptsetup's verbose lines go to standard output.
        println!("Key slot {converted} created.");
    }
    if opts.json {
        println!("{}", serde_json::json!({ "keyslot": converted }));
    }
    Ok(())
}

/// `luksSuspend <name>`.
pub fn suspend(name: &str) -> ActionResult {
    cryptblk_volume::suspend::suspend(name)
}

/// `luksResume <name>`: the header is `--header` or the one the volume was opened from;
/// the key comes from `--volume-key-file`, else a passphrase (`--key-file`, the terminal or
/// standard input; `--key-slot` limits the keyslots tried).
pub fn resume(opts: &Opts, name: &str) -> ActionResult {
    use cryptblk_volume::suspend as lib;
    let st = lib::suspended_status(name)?;
    let header = match &opts.header {
        Some(h) => h.clone(),
        None => lib::header_of(&st)?,
    };
    // cryptsetup reads the header from the data device unless --header names it: a volume
    // opened with a detached header is refused without it.
    if opts.header.is_none() && st.info.device.as_deref() != header.to_str() {
        return Err(Failure::usage(format!(
            "{name} is not active LUKS device name or header is missing."
        )));
    }
    let vol = cryptblk_volume::Volume::load(&header, cryptblk_volume::LuksType::Any, false)?;
    // --link-vk-to-keyring: the volume key resumed with is also added to a keyring.
    let link = super::token::vk_link(opts)?;
    let linked = |vk: &[u8]| -> ActionResult {
        if let Some(l) = &link {
            l.link(vk)?;
        }
        Ok(())
    };
    if let Some(p) = &opts.volume_key_file {
        let vk = vol.volume_key_from_file(p, opts.key_size)?;
        lib::resume_with_key(&st, vk.as_bytes())?;
        return linked(vk.as_bytes());
    }
    if let Some(vk) = super::token::volume_key_from_keyring(opts, &vol)? {
        lib::resume_with_key(&st, vk.as_bytes())?;
        return linked(vk.as_bytes());
    }
    let purpose = cryptblk_format::luks2::UnlockPurpose::Activate;
    if let Some((slot, vk)) = super::token::try_tokens(opts, &vol, &header, purpose)? {
        lib::resume_with_key(&st, vk.as_bytes())?;
        if opts.verbose {
            println!("Key slot {slot} unlocked.");
        }
        return linked(vk.as_bytes());
    }
    if link.is_some() {
        let (slot, vk) = volume::with_tries(
            opts,
            &volume::key_source(opts, None),
            &volume::passphrase_prompt(&header),
            |pass| vol.unlock(pass, opts.key_slot.map(|s| s as usize), purpose),
        )?;
        lib::resume_with_key(&st, vk.as_bytes())?;
        if opts.verbose {
            println!("Key slot {slot} unlocked.");
        }
        return linked(vk.as_bytes());
    }
    let slot = volume::with_tries(
        opts,
        &volume::key_source(opts, None),
        &volume::passphrase_prompt(&header),
        |pass| lib::resume(&st, &vol, pass, opts.key_slot.map(|s| s as usize)),
    )?;
    if opts.verbose {
        println!("Key slot {slot} unlocked.");
    }
    Ok(())
}

/// cryptsetup's resize of a LUKS2 volume whose key is in the kernel keyring (opened without
/// `--disable-keyring`) needs the volume key again: a token, else the passphrase (key file,
/// terminal or standard input), checked against the volume's header; with
/// `--disable-keyring` it is refused. cryptblk keeps the same contract, so scripts behave
/// alike. A suspended volume is left to the resize's own refusal.
fn key_for_resize(opts: &Opts, name: &str) -> Result<(), Failure> {
    use cryptblk_format::luks2::UnlockPurpose;
    let st = cryptblk_volume::control::status(name)?;
    if st.suspended || st.info.key_location.as_deref() != Some("keyring") {
        return Ok(());
    }
    if opts.compat.disable_keyring {
        return Err(Failure::usage(
            "Resize of active device requires volume key in keyring but --disable-keyring option is set.",
        ));
    }
    let header = match (&opts.header, &st.info.header) {
        (Some(h), _) => h.clone(),
        (None, Some(h)) => std::path::PathBuf::from(h),
        (None, None) => return Ok(()),
    };
    let vol = cryptblk_volume::Volume::load(&header, cryptblk_volume::LuksType::Any, false)?;
    let purpose = UnlockPurpose::Activate;
    let slot = match super::token::try_tokens(opts, &vol, &header, purpose)? {
        Some((slot, _)) => slot,
        None => {
            volume::with_tries(
                opts,
                &volume::key_source(opts, None),
                // cryptsetup names the active device's data device.
                &volume::passphrase_prompt(
                    st.info
                        .device
                        .as_deref()
                        .map_or(header.as_path(), std::path::Path::new),
                ),
                |pass| vol.unlock(pass, opts.key_slot.map(|s| s as usize), purpose),
            )?
            .0
        }
    };
    if opts.verbose {
        println!("Key slot {slot} unlocked.");
    }
    Ok(())
}

/// `resize <name> [--size SECTORS | --device-size BYTES]`; `--json` prints the old and new
/// sizes.
pub fn resize(opts: &Opts, name: &str, device_size: Option<u64>) -> ActionResult {
    use cryptblk_volume::resize::{self as lib, ResizeRequest};
    key_for_resize(opts, name)?;
    let req = ResizeRequest {
        size_sectors: opts.size,
        device_size,
    };
    let done = lib::resize(name, &req)?;
    if opts.verbose {
        eprintln!("Resized {name} to {} sectors.", done.new_sectors);
    }
    if opts.json {
        println!(
            "{}",
            serde_json::json!({
                "name": done.name,
                "device": done.device,
                "old_sectors": done.old_sectors,
                "new_sectors": done.new_sectors,
                "size": done.new_sectors * 512,
            })
        );
    }
    Ok(())
}
