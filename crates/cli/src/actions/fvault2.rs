//! FileVault2: `fvault2Dump`, `open --type fvault2` and `decrypt --type fvault2`, as
//! cryptsetup's FVAULT2 support (passphrase, `--key-file`, or `--volume-key-file`).

use super::volume;
use crate::args::{OpenArgs, Opts};
use crate::exit::{ActionResult, Failure};
use cryptblk_cipher::SecretBytes;
use cryptblk_format::fvault2::Fvault2Header;
use cryptblk_format::keyfile;
use cryptblk_volume::fvault2;
use std::path::Path;

/// The passphrase (`--key-file`, else the terminal or standard input), unlocked to the
/// volume key.
fn unlock(opts: &Opts, h: &Fvault2Header, device: &Path) -> Result<SecretBytes, Failure> {
    let pass = volume::read_secret(
        &volume::key_source(opts, None),
        volume::limits(opts),
        &format!("Enter passphrase for {}: ", device.display()),
    )?;
    fvault2::unlock(h, pass.as_bytes())
}

/// The key of `--volume-key-file`, as cryptsetup reads it.
fn volume_key_file(path: &Path) -> Result<SecretBytes, Failure> {
    fvault2::volume_key_from_file(
        volume::read_volume_key_file(path, cryptblk_format::fvault2::VOLUME_KEY_SIZE)?,
        path,
    )
}

/// `fvault2Dump <device>` (with `--dump-volume-key`, the dump and the volume key, which
/// `--volume-key-file` also stores in a new file).
pub fn dump(opts: &Opts, device: &Path) -> ActionResult {
    let h = fvault2::load(device)?;
    let dev = device.display().to_string();
    if !opts.dump_volume_key {
        print!("{}", h.dump(&dev));
        return Ok(());
    }
    // cryptsetup asks only on a terminal: a passphrase piped in is not the answer.
    if keyfile::stdin_is_tty() {
        volume::confirm(
            opts,
            "Header dump with volume key is sensitive information\nwhich allows access to encrypted partition without a passphrase.",
        )?;
    }
    let vk = unlock(opts, &h, device)?;
    if let Some(out) = &opts.volume_key_file {
        volume::write_new_private(out, vk.as_bytes())?;
    }
    print!("{}", h.dump_volume_key(&dev, vk.as_bytes()));
    Ok(())
}

/// `open --type fvault2 <device> <name>`.
pub fn open(opts: &Opts, a: &OpenArgs) -> ActionResult {
    let h = fvault2::load(&a.device)?;
    let vk = match &opts.volume_key_file {
        Some(p) => {
            let vk = volume_key_file(p)?;
            if opts.test_passphrase {
                // The metadata holds nothing to check a volume key against, so there is
                // nothing to test (cryptsetup fails this with exit 1 too).
                return Err(Failure::usage(
                    "An FVAULT2 volume key cannot be verified with --test-passphrase.",
                ));
            }
            vk
        }
        None => unlock(opts, &h, &a.device)?,
    };
    if opts.test_passphrase {
        return Ok(());
    }
    let name = super::activate::mapping_name(a)?;
    let plan = fvault2::plan(&h, &vk, &a.device, name, &a.perf.table_flags())?;
    super::activate::serve_plan(plan, opts, a)
}

/// `decrypt --type fvault2 <device> <output>`: the logical volume as `open` would show it.
pub fn decrypt(opts: &Opts, device: &Path, output: &Path) -> ActionResult {
    let h = fvault2::load(device)?;
    let vk = match &opts.volume_key_file {
        Some(p) => volume_key_file(p)?,
        None => unlock(opts, &h, device)?,
    };
    let mut out = cryptblk_volume::offline::Output::create(output)?;
    fvault2::write_plaintext(
        &h,
        &vk,
        device,
        out.writer(),
        &mut crate::progress::Bar::for_file(opts, device),
    )?;
    out.commit()
}
