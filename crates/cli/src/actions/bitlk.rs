//! BitLocker: `bitlkDump`, `open --type bitlk` and `decrypt --type bitlk`, as cryptsetup's
//! BITLK support (passphrase, recovery password, startup key file with `--key-file`, clear
//! key, or `--volume-key-file`).

use super::volume;
use crate::args::{OpenArgs, Opts};
use crate::exit::{ActionResult, Failure};
use cryptblk_cipher::SecretBytes;
use cryptblk_format::bitlk::{BitlkHeader, BitlkKey};
use cryptblk_volume::bitlk;
use std::path::Path;

/// The volume key: `--volume-key-file`, else a clear key, else the passphrase, recovery
/// password or startup key file (`--key-file`) read as cryptsetup reads passphrases.
fn volume_key(opts: &Opts, h: &BitlkHeader, device: &Path) -> Result<SecretBytes, Failure> {
    if let Some(p) = &opts.volume_key_file {
        let vk = volume::read_volume_key_file(p, h.encryption.key_bytes())?;
        bitlk::check_volume_key(h, &vk)?;
        return Ok(vk);
    }
    if h.has_clear_key() {
        return bitlk::unlock(h, &BitlkKey::None);
    }
    let secret = volume::read_secret(
        &volume::key_source(opts, None),
        volume::limits(opts),
        &format!("Enter passphrase for {}: ", device.display()),
    )?;
    bitlk::unlock(h, &BitlkKey::Secret(secret.as_bytes()))
}

/// `bitlkDump <device>` (with `--dump-volume-key`, the volume key, printed or with
/// `--volume-key-file` stored in that file).
pub fn dump(opts: &Opts, device: &Path) -> ActionResult {
    let h = bitlk::load(device)?;
    let dev = device.display().to_string();
    if !opts.dump_volume_key {
        print!("{}", h.dump(&dev));
        return Ok(());
    }
    volume::confirm(
        opts,
        "Header dump with volume key is sensitive information\nwhich allows access to encrypted partition without a passphrase.",
    )?;
    // Here --volume-key-file names where the key goes, not where it comes from.
    let from = Opts {
        volume_key_file: None,
        ..opts.clone()
    };
    let vk = volume_key(&from, &h, device)?;
    let text = h.dump_volume_key(&dev, vk.as_bytes());
    volume::print_dump_with_volume_key(opts, &text, vk.as_bytes())
}

/// `open --type bitlk <device> <name>`.
pub fn open(opts: &Opts, a: &OpenArgs) -> ActionResult {
    let h = bitlk::load(&a.device)?;
    bitlk::check_activatable(&h)?;
    if opts.test_passphrase && opts.volume_key_file.is_some() {
        // A BitLocker volume key cannot be checked against the header, so there is nothing
        // to test (cryptsetup fails this with exit 1 too).
        return Err(Failure::usage(
            "A BITLK volume key cannot be verified with --test-passphrase.",
        ));
    }
    let vk = volume_key(opts, &h, &a.device)?;
    if opts.test_passphrase {
        return Ok(());
    }
    let name = super::activate::mapping_name(a)?;
    let plan = bitlk::plan(&h, &vk, &a.device, name, &a.perf.table_flags())?;
    super::activate::serve_plan(plan, opts, a)
}

/// `decrypt --type bitlk <device> <output>`: the volume as `open` would show it.
pub fn decrypt(opts: &Opts, device: &Path, output: &Path) -> ActionResult {
    let h = bitlk::load(device)?;
    bitlk::check_activatable(&h)?;
    let vk = volume_key(opts, &h, device)?;
    let mut out = cryptblk_volume::offline::Output::create(output)?;
    bitlk::write_plaintext(
        &h,
        &vk,
        device,
        out.writer(),
        &mut crate::progress::Bar::for_file(opts, device),
    )?;
    out.commit()
}
