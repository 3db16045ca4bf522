//! What every LUKS action needs from the command line: the header device, passphrases and
//! key files (terminal I/O), KDF choices, confirmation. The volume logic itself is
//! [`cryptblk_volume`]'s.

use crate::args::{Opts, PbkdfKind, VolumeType};
use crate::exit::Failure;
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;
use cryptblk_format::kdf::{PbkdfKind as Kind, PbkdfRequest};
use cryptblk_format::keyfile::{self, KeyFileLimits, KeySource};
use cryptblk_format::luks2::KeyslotParams;
pub use cryptblk_volume::device::{device_size, open_file};
pub use cryptblk_volume::{LuksType, Segment, Volume};
use std::io::IsTerminal;
use std::path::Path;

/// The file that holds the header: `--header` or the device itself.
pub fn header_path<'a>(opts: &'a Opts, device: &'a Path) -> &'a Path {
    opts.header.as_deref().unwrap_or(device)
}

/// Loads the LUKS header of `device` (or `--header`), refusing a type other than `--type`.
pub fn load(opts: &Opts, device: &Path, write: bool) -> Result<Volume, Failure> {
    let path = header_path(opts, device);
    let want = match opts.volume_type {
        None | Some(VolumeType::Luks) => LuksType::Any,
        Some(VolumeType::Luks1) => LuksType::Luks1,
        Some(VolumeType::Luks2) => LuksType::Luks2,
        Some(
            VolumeType::Plain
            | VolumeType::Tcrypt
            | VolumeType::Bitlk
            | VolumeType::Fvault2
            | VolumeType::Loopaes,
        ) => {
            // Validate the path first so a missing device reads as such.
            open_file(path, write)?;
            return Err(Failure::usage(format!(
                "Device {} is not a valid LUKS device.",
                path.display()
            )));
        }
    };
    Volume::load(path, want, write)
}

/// Where the (existing) passphrase comes from: `--key-file`, else `positional`, else the
/// terminal or standard input.
pub fn key_source(opts: &Opts, positional: Option<&Path>) -> KeySource {
    match opts.key_file.as_deref().or(positional) {
        Some(p) => KeySource::File(p.to_path_buf()),
        None => KeySource::Passphrase,
    }
}

/// `--keyfile-offset` / `--keyfile-size`.
pub fn limits(opts: &Opts) -> KeyFileLimits {
    KeyFileLimits {
        offset: opts.keyfile_offset.unwrap_or(0),
        // As cryptsetup: a size of 0 means no limit (the whole file).
        size: opts.keyfile_size.filter(|&n| n > 0).map(|n| n as usize),
    }
}

/// The passphrase prompt for `device`, as cryptsetup words it: "Enter passphrase for
/// DEVICE: ", where a loop device is named by its backing file (what `losetup` shows), since
/// that is the name the user knows.
pub fn passphrase_prompt(device: &Path) -> String {
    format!("Enter passphrase for {}: ", prompt_name(device))
}

/// `device`, or the backing file of the loop device it is (cryptsetup's
/// `crypt_loop_backing_file`, read from sysfs).
fn prompt_name(device: &Path) -> String {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    const LOOP_MAJOR: u32 = 7;
    let backing = std::fs::metadata(device)
        .ok()
        .filter(|m| m.file_type().is_block_device())
        .filter(|m| libc::major(m.rdev() as libc::dev_t) == LOOP_MAJOR)
        .and_then(|m| {
            let rdev = m.rdev() as libc::dev_t;
            std::fs::read_to_string(format!(
                "/sys/dev/block/{}:{}/loop/backing_file",
                libc::major(rdev),
                libc::minor(rdev)
            ))
            .ok()
        });
    match backing {
        Some(file) if !file.trim_end().is_empty() => file.trim_end().to_string(),
        _ => device.display().to_string(),
    }
}

/// Reads a passphrase or key as cryptsetup would.
pub fn read_secret(
    source: &KeySource,
    limits: KeyFileLimits,
    prompt: &str,
) -> Result<SecretBytes, Failure> {
    Ok(keyfile::read_key(source, limits, prompt)?)
}

/// Reads a passphrase (`prompt`) and hands it to `try_one`; one typed on a terminal is asked
/// for again after a wrong one, up to `-T/--tries` times (default 3) as cryptsetup does,
/// each miss printing cryptsetup's line. A key file or piped input is read once.
pub fn with_tries<T>(
    opts: &Opts,
    source: &KeySource,
    prompt: &str,
    mut try_one: impl FnMut(&[u8]) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let typed = matches!(source, KeySource::Passphrase) && std::io::stdin().is_terminal();
    let tries = if typed {
        opts.compat.tries.unwrap_or(3).max(1)
    } else {
        1
    };
    let mut left = tries;
    loop {
        let pass = read_secret(source, limits(opts), prompt)?;
        left -= 1;
        match try_one(pass.as_bytes()) {
            Err(f) if f.code == crate::exit::ExitCode::NoPermission && left > 0 => {
                eprintln!("{}", f.message);
            }
            r => return r,
        }
    }
}

/// A new passphrase from `new_key_file`, else the terminal (asked twice) or standard input.
pub fn read_new_secret(new_key_file: Option<&Path>, prompt: &str) -> Result<SecretBytes, Failure> {
    read_new_secret_limited(new_key_file, KeyFileLimits::default(), prompt)
}

/// The new key of luksAddKey/luksChangeKey as cryptsetup reads it: the positional new key
/// file, else `--new-keyfile`, cut by `--new-keyfile-offset`/`--new-keyfile-size`; else
/// the terminal or standard input.
pub fn read_new_key(
    opts: &Opts,
    new_key_file: Option<&Path>,
    prompt: &str,
) -> Result<SecretBytes, Failure> {
    let limits = KeyFileLimits {
        offset: opts.compat.new_keyfile_offset.unwrap_or(0),
        size: opts
            .compat
            .new_keyfile_size
            .filter(|&n| n > 0)
            .map(|n| n as usize),
    };
    let file = new_key_file.or(opts.compat.new_keyfile.as_deref());
    read_new_secret_limited(file, limits, prompt)
}

fn read_new_secret_limited(
    new_key_file: Option<&Path>,
    limits: KeyFileLimits,
    prompt: &str,
) -> Result<SecretBytes, Failure> {
    match new_key_file {
        Some(p) => read_secret(&KeySource::File(p.to_path_buf()), limits, prompt),
        None => {
            let first = read_secret(&KeySource::Passphrase, KeyFileLimits::default(), prompt)?;
            if keyfile::stdin_is_tty() {
                let again = read_secret(
                    &KeySource::Passphrase,
                    KeyFileLimits::default(),
                    "Verify passphrase: ",
                )?;
                if first != again {
                    // cryptsetup: EPERM, exit code 2.
                    return Err(Failure::new(
                        crate::exit::ExitCode::NoPermission,
                        "Passphrases do not match.",
                    ));
                }
            }
            if first.is_empty() {
                return Err(Failure::usage("Empty passphrase is not allowed."));
            }
            Ok(first)
        }
    }
}

/// Reads `--volume-key-file`: its first `key_bytes` bytes, as cryptsetup (a shorter file
/// is refused).
pub fn read_volume_key_file(path: &Path, key_bytes: usize) -> Result<SecretBytes, Failure> {
    cryptblk_volume::format::read_volume_key_file(path, key_bytes)
}

/// The KDF request from `--pbkdf`, `--hash`, `--iter-time`, `--pbkdf-*`.
pub fn pbkdf_request(opts: &Opts, luks1: bool) -> Result<PbkdfRequest, Failure> {
    let hash = hash_opt(opts)?;
    let mut r = match opts.pbkdf {
        None if luks1 => PbkdfRequest::pbkdf2(hash),
        Some(PbkdfKind::Pbkdf2) => PbkdfRequest::pbkdf2(hash),
        Some(_) if luks1 => {
            return Err(Failure::usage(
                "LUKS1 keyslots support only --pbkdf pbkdf2.",
            ))
        }
        None | Some(PbkdfKind::Argon2id) => PbkdfRequest::argon2id(),
        Some(PbkdfKind::Argon2i) => PbkdfRequest {
            kind: Kind::Argon2i,
            ..PbkdfRequest::argon2id()
        },
    };
    r.hash = hash;
    if let Some(t) = opts.iter_time {
        r = r.with_iter_time(t);
    }
    if let Some(n) = opts.pbkdf_force_iterations {
        r = r.with_forced_iterations(n);
    }
    if let Some(m) = opts.pbkdf_memory {
        r.max_memory_kib = m;
    }
    if let Some(p) = opts.pbkdf_parallel {
        r.parallel = p;
    }
    r.check_minimums()?;
    Ok(r)
}

/// `--hash`, default sha256.
pub fn hash_opt(opts: &Opts) -> Result<HashAlgorithm, Failure> {
    cryptblk_volume::format::hash_or_default(opts.hash.as_deref())
}

/// Keyslot parameters for a new LUKS2 keyslot.
pub fn keyslot_params(opts: &Opts) -> Result<KeyslotParams, Failure> {
    let mut p = cryptblk_volume::format::keyslot_params(
        pbkdf_request(opts, false)?,
        hash_opt(opts)?,
        opts.key_slot.map(|s| s as usize),
    );
    // --keyslot-cipher and --keyslot-key-size come together (checked up front).
    p.cipher = opts.compat.keyslot_cipher.clone();
    p.cipher_key_size = opts.compat.keyslot_key_size.map(|bits| bits as usize / 8);
    Ok(p)
}

/// Asks for confirmation as cryptsetup does: on a terminal only, unless `--batch-mode`.
pub fn confirm(opts: &Opts, question: &str) -> Result<(), Failure> {
    if ask_yes(opts, question)? {
        Ok(())
    } else {
        Err(Failure::usage("Operation aborted."))
    }
}

/// cryptsetup's yes-dialog: true without asking in batch mode or when standard input is no
/// terminal, else true only when the user types YES.
pub fn ask_yes(opts: &Opts, question: &str) -> Result<bool, Failure> {
    // cryptsetup asks only on a terminal: with stdin a pipe or file it goes ahead silently,
    // and stdin is left for the passphrase (`echo pw | cryptsetup luksFormat IMG` works).
    if opts.batch_mode || !std::io::stdin().is_terminal() {
        return Ok(true);
    }
    // cryptsetup writes the dialog to standard output and leaves the cursor after the
    // question (expect scripts and `2>/dev/null` users see it there).
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = write!(
            out,
            "\nWARNING!\n========\n{question}\n\nAre you sure? (Type 'yes' in capital letters): "
        );
        let _ = out.flush();
    }
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    Ok(line.trim_end() == "YES")
}

/// Prints a dump made with the volume key, as cryptsetup's dumps do with
/// `--dump-volume-key`: with `--volume-key-file F` the key goes to F instead (a new file,
/// readable only by its owner; an existing F is refused, exit 1, before anything is printed)
/// and the `MK dump:` (or `Unbound Key:`) block becomes "Key stored to file F.".
pub fn print_dump_with_volume_key(opts: &Opts, text: &str, key: &[u8]) -> Result<(), Failure> {
    let Some(out) = &opts.volume_key_file else {
        print!("{text}");
        return Ok(());
    };
    write_new_private(out, key)?;
    let head: String = text
        .lines()
        .take_while(|l| !l.starts_with("MK dump:") && !l.starts_with("Unbound Key:"))
        .map(|l| format!("{l}\n"))
        .collect();
    print!("{head}");
    println!("Key stored to file {}.", out.display());
    Ok(())
}

/// Writes `key` to a file that must not exist yet, readable only by its owner (cryptsetup
/// refuses to overwrite an existing file too, with this message).
pub fn write_new_private(path: &Path, key: &[u8]) -> Result<(), Failure> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .open(path)
        .map_err(|_| {
            Failure::usage(format!("Cannot open keyfile {} for write.", path.display()))
        })?;
    f.write_all(key)
        .and_then(|()| f.sync_all())
        .map_err(|_| Failure::usage(format!("Cannot write to keyfile {}.", path.display())))
}
