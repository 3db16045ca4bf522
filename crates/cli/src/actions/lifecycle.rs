//! A volume's life after luksFormat, as cryptsetup runs it: `luksConvertKey` (new KDF
//! parameters for a keyslot), `luksSuspend`/`luksResume` of a served volume, `resize` of a
//! served volume. The work is the library's; this parses, prompts and prints.

use super::volume;
use crate::args::Opts;
use crate::exit::ActionResult;
use cryptblk_volume::luks as lib;
use std::path::Path;

/// `luksConvertKey <device> [<key file>]`: LUKS2 only; the passphrase of the keyslot to
/// convert (only `--key-slot` when given) from `--key-file`, the positional key file, or
/// the terminal.
pub fn convert_key(opts: &Opts, device: &Path, key_file: Option<&Path>) -> ActionResult {
    let mut vol = volume::load(opts, device, true)?;
    if vol.luks2().is_none() {
        return Err(lib::not_luks2(device));
    }
    let params = volume::keyslot_params(opts)?;
    let pass = volume::read_secret(
        &volume::key_source(opts, key_file),
        volume::limits(opts),
        "Enter passphrase for keyslot to be converted: ",
    )?;
    let slot = opts.key_slot.map(|s| s as usize);
    let converted = lib::convert_key(&mut vol, device, pass.as_bytes(), slot, &params)?;
    if opts.verbose {
        eprintln!("Key slot {converted} created.");
    }
    if opts.json {
        println!("{}", serde_json::json!({ "keyslot": converted }));
    }
    Ok(())
}
