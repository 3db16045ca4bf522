//! cryptsetup's LUKS actions: luksFormat, open, luksDump, key management, header backup,
//! uuid, isLuks, erase, config.

mod memory_hard;
pub(super) mod persistent;

use super::activate;
use super::volume::{self, Volume};
use crate::args::{OpenArgs, Opts, PerfArgs, VolumeType};
use crate::exit::{ActionResult, ExitCode, Failure};
use cryptblk_cipher::SecretBytes;
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::luks1::Luks1FormatParams;
use cryptblk_format::luks2::{FormatParams, Luks2Header, UnlockPurpose};
use cryptblk_format::plain::{PlainParams, PlainVolume};
use cryptblk_volume::blkid;
use cryptblk_volume::format::{parse_bytes, FormatRequest};
use cryptblk_volume::luks::{self as lib, BackupKind, ConfigChange};
use cryptblk_volume::serve::ServeSpec;
use cryptblk_volume::{luks2_integrity, plan};
use std::path::Path;

/// The cipher and key size for a new volume, with cryptsetup 2.x defaults.
fn cipher_and_key_bytes(opts: &Opts) -> Result<(String, usize), Failure> {
    cryptblk_volume::format::cipher_and_key_bytes(opts.cipher.as_deref(), opts.key_size)
}

/// The encryption sector size of a new volume whose data is on `data` (`None`: a new image
/// file the caller writes, always of whole sectors): `--sector-size`, else cryptsetup 2.6's
/// default (4096 for image files and 4K block devices for LUKS2, 512 for LUKS1).
pub fn new_sector_size(opts: &Opts, data: Option<&Path>) -> Result<u32, Failure> {
    if opts.volume_type == Some(VolumeType::Luks1) {
        return Ok(opts.sector_size.unwrap_or(512));
    }
    let offset = opts.offset.or_else(|| aligned_offset_sectors(opts));
    Ok(match data {
        Some(p) => cryptblk_volume::format::luks2_sector_size(opts.sector_size, p, offset)?,
        None => opts
            .sector_size
            .unwrap_or_else(|| cryptblk_volume::format::default_sector_size(4096, None, offset)),
    })
}

/// The data offset (sectors) `--align-payload` gives a LUKS2 format, for the default
/// sector size's check (as an explicit `--offset` would): the alignment itself with a
/// detached header, else the default 16 MiB header rounded up to it.
fn aligned_offset_sectors(opts: &Opts) -> Option<u64> {
    let a = u64::from(opts.compat.align_payload?);
    if opts.header.is_some() {
        return Some(a);
    }
    (a > 0).then(|| (16u64 << 11).div_ceil(a) * a)
}

/// Formats `dev` (a header device) with `sector_size`-byte encryption sectors and returns
/// the volume key and data offset in bytes. Refuses `--integrity`: only `luksFormat` also
/// formats the data device's integrity layer.
pub fn format_on(
    opts: &Opts,
    dev: &dyn HeaderIo,
    passphrase: &[u8],
    sector_size: u32,
) -> Result<(SecretBytes, u64), Failure> {
    if opts.integrity.integrity.is_some() {
        return Err(Failure::usage(
            "Integrity option cannot be used with this action (only luksFormat formats the \
             integrity layer).",
        ));
    }
    format_header(opts, dev, passphrase, sector_size)
}

/// [`format_on`] for `luksFormat`, which may write an integrity-protected segment.
fn format_header(
    opts: &Opts,
    dev: &dyn HeaderIo,
    passphrase: &[u8],
    sector_size: u32,
) -> Result<(SecretBytes, u64), Failure> {
    let integrity = opts.integrity.integrity.clone();
    super::luks_integrity::check_format_options(opts, opts.volume_type == Some(VolumeType::Luks1))?;
    let (cipher, key_bytes) = match &integrity {
        // AEAD and random-IV ciphers are no dm-crypt sector ciphers on their own: the
        // format crate checks them against the integrity algorithm instead.
        Some(_) => {
            let c = opts
                .cipher
                .clone()
                .unwrap_or_else(|| "aes-xts-plain64".into());
            let k = super::luks_integrity::encryption_key_bytes(opts, &c)?;
            (c, k)
        }
        None => cipher_and_key_bytes(opts)?,
    };
    let vk_bytes = cryptblk_volume::format::new_volume_key_bytes(
        key_bytes,
        integrity.as_deref(),
        super::luks_integrity::integrity_key_bytes(opts)?,
    )?;
    let vk = opts
        .volume_key_file
        .as_deref()
        .map(|p| volume::read_volume_key_file(p, vk_bytes))
        .transpose()?;
    let detached = opts.header.is_some();
    let req = match opts.volume_type {
        Some(VolumeType::Luks1) => {
            if opts.sector_size.is_some_and(|s| s != 512) {
                return Err(Failure::usage(
                    "Unsupported encryption sector size for LUKS1.",
                ));
            }
            // LUKS1 has no such areas: cryptsetup refuses the options, writing nothing.
            if opts.luks2_metadata_size.is_some() || opts.luks2_keyslots_size.is_some() {
                return Err(Failure::usage("Unsupported LUKS2 metadata size options."));
            }
            let hash = opts.hash.clone().unwrap_or_else(|| "sha256".into());
            let hash = cryptblk_cipher::hash::HashAlgorithm::from_name(&hash)
                .map_err(|_| Failure::usage(format!("Hash algorithm {hash} not supported.")))?;
            let mut p = Luks1FormatParams::new(&cipher, key_bytes, hash)?;
            p.kdf = volume::pbkdf_request(opts, true)?;
            p.uuid = opts.uuid.clone();
            p.volume_key = vk;
            p.keyslot = opts.key_slot.unwrap_or(0) as usize;
            // --align-payload (sectors), as cryptsetup's LUKS1: with a detached header it is
            // the data offset itself; on the device it rounds the data start up (0 keeps
            // the default 1 MiB).
            let align = opts.compat.align_payload.map(u64::from);
            if let Some(o) = opts.offset {
                p.data_offset_sectors = Some(o);
            } else if detached {
                p.data_offset_sectors = Some(align.unwrap_or(0));
            } else if let Some(a) = align.filter(|&a| a > 0) {
                p.align_sectors = a;
            }
            FormatRequest::Luks1(Box::new(p))
        }
        Some(VolumeType::Luks2) | Some(VolumeType::Luks) | None => {
            // --align-payload (sectors), as cryptsetup's LUKS2: with a detached header the
            // data offset itself, else the alignment of the data after the header.
            let align = opts.compat.align_payload.map(|a| u64::from(a) * 512);
            let data_offset = match (opts.offset, align) {
                (Some(o), _) => Some(o * 512),
                (None, Some(a)) if detached && a > 0 => Some(a),
                _ => None,
            };
            let mut p = FormatParams {
                cipher,
                key_size: key_bytes,
                sector_size,
                uuid: opts.uuid.clone(),
                label: opts.label.clone().unwrap_or_default(),
                subsystem: opts.subsystem.clone().unwrap_or_default(),
                detached_header: detached,
                data_offset,
                data_alignment: align,
                volume_key: vk,
                keyslot: volume::keyslot_params(opts)?,
                integrity,
                integrity_key_size: super::luks_integrity::integrity_key_bytes(opts)?,
                ..FormatParams::default()
            };
            p.digest_hash = volume::hash_opt(opts)?;
            if let Some(m) = &opts.luks2_metadata_size {
                p.metadata_size = parse_bytes(m, "--luks2-metadata-size")?;
            }
            if let Some(k) = &opts.luks2_keyslots_size {
                p.keyslots_size = Some(parse_bytes(k, "--luks2-keyslots-size")?);
            }
            FormatRequest::Luks2(Box::new(p))
        }
        Some(VolumeType::Plain) => {
            return Err(Failure::usage(
                "plain volumes have no header to format; use open --type plain",
            ))
        }
        Some(VolumeType::Tcrypt) => {
            return Err(Failure::usage(
                "TCRYPT headers cannot be formatted (cryptsetup never writes them either)",
            ))
        }
        Some(VolumeType::Bitlk) => {
            return Err(Failure::usage(
                "cryptblk does not create BitLocker volumes (it opens them)",
            ))
        }
        Some(VolumeType::Fvault2) => {
            return Err(Failure::usage(
                "cryptblk does not create FileVault2 volumes (it opens them)",
            ))
        }
        Some(VolumeType::Loopaes) => {
            return Err(Failure::usage(
                "loop-AES volumes have no header to format; use open --type loopaes",
            ))
        }
    };
    cryptblk_volume::format::format_header(dev, &req, passphrase)
}

/// `luksFormat <device> [<key file>]`.
pub fn luks_format(opts: &Opts, device: &Path, key_file: Option<&Path>) -> ActionResult {
    // cryptsetup's order: the device must exist (exit 4), then YES, then the passphrase, so
    // scripted input (`printf 'YES\npass\n'`) and a missing device both behave as there.
    if std::fs::metadata(device).is_err() {
        return Err(Failure::device(format!(
            "Device {} does not exist or access denied.",
            device.display()
        )));
    }
    // cryptsetup's crypt_set_data_offset, before the confirmation and for LUKS1 too: the
    // data must start on a 4096-byte boundary (the largest encryption sector).
    if opts.offset.is_some_and(|o| o % 8 != 0) {
        return Err(Failure::usage("Data offset is not multiple of 4096 bytes."));
    }
    // Formatting a device a daemon serves would pull its data out from under it.
    let _in_use = cryptblk_volume::lock::for_format(&[device])?;
    let header = volume::header_path(opts, device);
    // As cryptsetup built with libblkid: the signatures already on the header device are
    // named (a debug line in batch mode), then wiped once the passphrase is in.
    let signatures = report_signatures(opts, header)?;
    volume::confirm(
        opts,
        &format!(
            "This will overwrite data on {} irrevocably.",
            device.display()
        ),
    )?;
    let pass = new_passphrase_for_format(opts, header, key_file)?;
    // As cryptsetup: an empty device is refused; a LUKS1 header grows a too small file, which
    // then has no room for data (a warning, not a failure).
    let device_size = cryptblk_volume::device::device_size(device)?;
    if opts.header.is_none() && device_size == 0 {
        return Err(Failure::usage(format!(
            "Device {} is too small.",
            device.display()
        )));
    }
    if opts.header.is_some() && !header.exists() {
        std::fs::File::create(header)?;
    }
    let f = volume::open_file(header, true)?;
    let sector_size = new_sector_size(opts, Some(device))?;
    let dev = WipeBeforeFirstWrite {
        file: &f,
        header,
        // The data lock above already holds `device` open exclusively (O_EXCL on a block
        // device): a second exclusive open of it would fail as "in use".
        exclusive: header != device,
        verbose: opts.verbose || opts.debug,
        pending: std::cell::Cell::new(!signatures.is_empty()),
    };
    let (vk, data_offset) = format_header(opts, &dev, pass.as_bytes(), sector_size)?;
    if opts.header.is_none() && device_size <= data_offset {
        // cryptsetup prints this notice on standard output.
        println!(
            "Device {} is too small for activation, there is no remaining space for data.",
            device.display()
        );
    }
    if opts.verbose {
        println!("Key slot {} created.", opts.key_slot.unwrap_or(0));
    }
    if opts.integrity.integrity.is_some() {
        let h = Luks2Header::read(&f)?;
        let how = luks2_integrity::DataFormat {
            legacy_padding: opts.integrity.integrity_legacy_padding,
            no_wipe: opts.integrity.integrity_no_wipe,
        };
        let mut bar = crate::progress::Bar::for_action(
            opts,
            crate::progress::Dest::Stdout,
            &device.display().to_string(),
        );
        luks2_integrity::format_data(&h, &vk, device, how, &mut bar)?;
    }
    Ok(())
}

/// The header device of a format, whose old signatures libblkid wipes just before the
/// format's first write: every refusal the format makes (PBKDF minimums, LUKS2-only options,
/// a short volume key file, ...) comes before that write, so a refused format leaves the old
/// header, keyslots and all, as cryptsetup leaves it.
struct WipeBeforeFirstWrite<'a> {
    file: &'a std::fs::File,
    header: &'a Path,
    exclusive: bool,
    verbose: bool,
    /// Signatures were found and are not wiped yet.
    pending: std::cell::Cell<bool>,
}

impl HeaderIo for WipeBeforeFirstWrite<'_> {
    fn size(&self) -> std::io::Result<u64> {
        HeaderIo::size(self.file)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        HeaderIo::read_at(self.file, offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        if self.pending.replace(false) {
            blkid::wipe_all(self.header, self.exclusive, false, self.verbose)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
        }
        HeaderIo::write_at(self.file, offset, buf)
    }

    fn sync(&self) -> std::io::Result<()> {
        HeaderIo::sync(self.file)
    }
}

/// cryptsetup's `tools_detect_signatures` before a format: every signature on `header`
/// (none when it does not exist yet, or with `--disable-blkid`), each named on standard
/// output as a warning, or in a debug line in batch mode.
pub fn report_signatures(opts: &Opts, header: &Path) -> Result<Vec<blkid::Signature>, Failure> {
    if opts.compat.disable_blkid || !header.exists() {
        return Ok(Vec::new());
    }
    let found = blkid::detect(header, blkid::Filter::All)?;
    for s in &found {
        if opts.batch_mode {
            log::debug!("{}", s.describe(header));
        } else {
            println!("WARNING: {}", s.describe(header));
        }
    }
    Ok(found)
}

/// The new volume's passphrase; asked for as cryptsetup asks, naming the header's device.
fn new_passphrase_for_format(
    opts: &Opts,
    header: &Path,
    key_file: Option<&Path>,
) -> Result<SecretBytes, Failure> {
    match opts.key_file.as_deref().or(key_file) {
        Some(_) => volume::read_secret(
            &volume::key_source(opts, key_file),
            volume::limits(opts),
            "",
        ),
        None => volume::read_new_secret(None, &volume::passphrase_prompt(header)),
    }
}

/// Unlocks a LUKS volume for `open`/`luksDump --dump-volume-key`/`decrypt`: a volume key
/// file, a token (see [`super::token::try_tokens`]), or a passphrase.
pub fn unlock(
    opts: &Opts,
    vol: &Volume,
    device: &Path,
    purpose: UnlockPurpose,
) -> Result<(Option<usize>, SecretBytes), Failure> {
    if let Some(p) = &opts.volume_key_file {
        return Ok((None, vol.volume_key_from_file(p, opts.key_size)?));
    }
    if let Some(key) = super::token::volume_key_from_keyring(opts, vol)? {
        return Ok((None, key));
    }
    if let Some((slot, key)) = super::token::try_tokens(opts, vol, device, purpose)? {
        return Ok((Some(slot), key));
    }
    let (slot, key) = volume::with_tries(
        opts,
        &volume::key_source(opts, None),
        // cryptsetup names the data device here, even with --header.
        &volume::passphrase_prompt(device),
        |pass| {
            // Held for the KDFs only, never while a prompt waits for the user.
            let _serialized = memory_hard::take_if_needed(
                opts.compat.serialize_memory_hard_pbkdf,
                vol,
                opts.key_slot,
            )?;
            vol.unlock(pass, opts.key_slot.map(|s| s as usize), purpose)
        },
    )?;
    Ok((Some(slot), key))
}

/// `open` of a LUKS volume `vol` loaded from `a.device` (not mid-reencryption: see
/// [`super::open`], which dispatches on the volume type).
pub fn open_luks(opts: &Opts, a: &OpenArgs, vol: Volume) -> ActionResult {
    let purpose = if opts.unbound {
        UnlockPurpose::Unbound
    } else if opts.test_passphrase {
        UnlockPurpose::Verify
    } else {
        UnlockPurpose::Activate
    };
    let link = super::token::vk_link(opts)?;
    let (slot, vk) = unlock(opts, &vol, &a.device, purpose)?;
    if let Some(s) = slot {
        if opts.verbose {
            // cryptsetup's verbose lines go to standard output.
            println!("Key slot {s} unlocked.");
        }
    }
    if let Some(l) = link {
        l.link(vk.as_bytes())?;
    }
    if opts.test_passphrase {
        return Ok(());
    }
    if opts.unbound {
        return Err(Failure::usage(
            "an unbound keyslot cannot activate a device (use --test-passphrase)",
        ));
    }
    let name = activate::mapping_name(a)?;
    let flags = persistent::effective(opts, &a.perf, &vol.stored_flags());
    let header = header_location(opts, &a.device);
    let at = plan::LuksLocation {
        device: &a.device,
        header: Path::new(&header),
    };
    let mut plan = plan::luks(&vol, &vk, at, name, &flags.library())?;
    if vol.luks2().is_some() && !opts.compat.disable_keyring {
        // cryptsetup puts a LUKS2 volume key in the kernel keyring and then needs it again
        // to resize; cryptblk keeps that contract (see lifecycle::resize).
        plan.info.key_location = Some("keyring".into());
    }
    let spec = activate::serve_spec(plan, opts, a)?;
    start_persistent(opts, a, &vol, spec, &flags)
}

/// The header file as an absolute path, so that `refresh --persistent` finds it from any
/// working directory.
fn header_location(opts: &Opts, device: &Path) -> String {
    let p = volume::header_path(opts, device);
    std::fs::canonicalize(p)
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}

/// Serves `spec`, then (with `--persistent`) stores the given flags, as cryptsetup does
/// only after a successful activation. In the foreground the action returns at close, so
/// the flags are stored once the tables have been built, just before serving.
fn start_persistent(
    opts: &Opts,
    a: &OpenArgs,
    vol: &Volume,
    spec: ServeSpec,
    flags: &persistent::Activation,
) -> ActionResult {
    let store = || persistent::store(opts, &a.device, &vol.uuid(), flags);
    if a.export.foreground {
        store();
        return super::serving::start(spec, &a.export, opts.json);
    }
    super::serving::start(spec, &a.export, opts.json)?;
    store();
    Ok(())
}

/// `refresh <name>`: new crypt flags on a served volume, live. As cryptsetup, a LUKS2
/// volume's stored flags are added to the given ones unless `--persistent`, which stores
/// the given flags in the header once the refresh succeeded. The header is the `--header`
/// file or the one the volume was opened from; refresh needs no passphrase (the daemon
/// holds the key, and the flags are not secret).
pub fn refresh(opts: &Opts, name: &str, perf: &PerfArgs) -> ActionResult {
    if opts.integrity.integrity_no_journal {
        return Err(Failure::usage(
            "refresh cannot switch the integrity journal of a served volume; close it and \
             open with --integrity-no-journal (add --persistent to store it)",
        ));
    }
    let st = cryptblk_volume::control::status(name)?;
    let info = &st.info;
    let kind = info.kind.as_str();
    if kind == "PLAIN" {
        // Nothing stored, nothing to store (cryptsetup ignores --persistent for plain
        // devices too); discards as given, like every cryptsetup refresh.
        return super::serving::refresh(name, perf);
    }
    if kind != "LUKS1" && kind != "LUKS2" {
        // Raw `dm create` tables: nothing stored; flags as given.
        return super::serving::refresh(name, perf);
    }
    persistent::check_options(opts, perf)?;
    let device = opts
        .header
        .clone()
        .or_else(|| info.header_or_device().map(Into::into))
        .ok_or_else(|| Failure::usage(format!("{name} does not say where its header is")))?;
    let uuid = info.uuid.clone().unwrap_or_default();
    let stored = cryptblk_volume::activation::stored_flags_of(&device, &uuid, name)?;
    let flags = persistent::effective(opts, perf, &stored);
    super::serving::refresh(name, &flags.perf)?;
    // `--header` names the header itself: no second `--header` lookup.
    let header_opts = Opts {
        header: None,
        ..opts.clone()
    };
    persistent::store(&header_opts, &device, &uuid, &flags);
    Ok(())
}

/// Plain mode's defaults as cryptsetup 2.7+ has them (2.6.1 and older: aes-cbc-essiv:sha256
/// and ripemd160; the key size stays 256 bits, so the default is AES-128 in XTS).
const PLAIN_DEFAULT_CIPHER: &str = "aes-xts-plain64";
const PLAIN_DEFAULT_KEY_BITS: u32 = 256;
const PLAIN_DEFAULT_HASH: &str = "sha256";

fn plain_params(opts: &Opts) -> Result<PlainParams, Failure> {
    let cipher = opts
        .cipher
        .clone()
        .unwrap_or_else(|| PLAIN_DEFAULT_CIPHER.into());
    let bits = opts.key_size.unwrap_or(PLAIN_DEFAULT_KEY_BITS);
    Ok(PlainParams {
        cipher_spec: cipher,
        key_bytes: bits as usize / 8,
        hash: opts
            .hash
            .clone()
            .unwrap_or_else(|| PLAIN_DEFAULT_HASH.into()),
        offset_sectors: opts.offset.unwrap_or(0),
        iv_offset_sectors: opts.skip.unwrap_or(0),
        size_sectors: opts.size,
        sector_size: opts.sector_size.unwrap_or(512),
    })
}

/// A plain volume from the options: key file bytes are the key, a passphrase is hashed.
fn plain_volume(opts: &Opts, device: &Path) -> Result<PlainVolume, Failure> {
    let params = plain_params(opts)?;
    let size = volume::device_size(device)?;
    Ok(match &opts.key_file {
        Some(kf) => {
            PlainVolume::from_key_file(&params, kf, opts.keyfile_offset.unwrap_or(0), size)?
        }
        None => {
            let pass = volume::read_secret(
                &volume::key_source(opts, None),
                volume::limits(opts),
                &format!("Enter passphrase for {}: ", device.display()),
            )?;
            PlainVolume::from_passphrase(&params, pass.as_bytes(), size)?
        }
    })
}

/// `open --type plain`.
pub fn open_plain(opts: &Opts, a: &OpenArgs) -> ActionResult {
    plain_default_warnings(opts);
    let pv = plain_volume(opts, &a.device)?;
    if opts.test_passphrase {
        return Ok(());
    }
    let name = activate::mapping_name(a)?;
    let plan = plan::plain(&pv, &a.device, name, &a.perf.table_flags())?;
    activate::serve_plan(plan, opts, a)
}

/// cryptsetup 2.7+'s warnings when plain mode runs on defaults (on stderr, even with
/// `--batch-mode`): the defaults changed in 2.7 and may change again, and nothing on the
/// disk records them.
fn plain_default_warnings(opts: &Opts) {
    let mut warned = false;
    if opts.cipher.is_none() || opts.key_size.is_none() {
        let cipher = opts.cipher.as_deref().unwrap_or(PLAIN_DEFAULT_CIPHER);
        // cryptsetup prints the spec as it parsed it (cipher-mode).
        let cipher = cryptblk_cipher::CipherSpec::parse(cipher)
            .map(|s| s.spec_string())
            .unwrap_or_else(|_| cipher.to_string());
        let bits = opts.key_size.unwrap_or(PLAIN_DEFAULT_KEY_BITS);
        eprintln!("WARNING: Using default options for cipher ({cipher}, key size {bits} bits) that could be incompatible with older versions.");
        warned = true;
    }
    if opts.hash.is_none() && opts.key_file.is_none() {
        eprintln!("WARNING: Using default options for hash ({PLAIN_DEFAULT_HASH}) that could be incompatible with older versions.");
        warned = true;
    }
    if warned {
        eprintln!("For plain mode, always use options --cipher, --key-size and if no keyfile or keyring is used, then also --hash.");
    }
}

/// `luksDump`.
pub fn dump(opts: &Opts, device: &Path) -> ActionResult {
    let vol = volume::load(opts, device, false)?;
    // cryptsetup's precedence: --dump-volume-key, then --unbound, then --dump-json-metadata.
    let unbound = opts.unbound && !opts.dump_volume_key;
    let json = opts.dump_json_metadata && !opts.dump_volume_key && !unbound;
    if json && vol.luks2().is_none() {
        return Err(Failure::usage(
            "Dump operation is not supported for this device type.",
        ));
    }
    if unbound {
        // `--unbound -S N` prints that keyslot's unbound key, as cryptsetup does: only for a
        // LUKS2 keyslot that exists and is unbound (args_check made sure -S is given).
        let slot = opts.key_slot.unwrap_or_default() as usize;
        let is_unbound = vol
            .luks2()
            .is_some_and(|h| h.keyslots().iter().any(|k| k.id == slot && k.unbound));
        if !is_unbound {
            return Err(Failure::usage(format!(
                "Keyslot {slot} does not contain unbound key."
            )));
        }
    }
    if opts.dump_volume_key {
        // An unbound keyslot holds no volume key (cryptsetup: ENOENT, exit 1).
        let named_unbound = opts.key_slot.is_some_and(|s| {
            vol.luks2()
                .is_some_and(|h| h.keyslots().iter().any(|k| k.id == s as usize && k.unbound))
        });
        if named_unbound {
            return Err(Failure::usage("No usable keyslot is available."));
        }
    }
    let (slot_unlocked, vk) = if opts.dump_volume_key || unbound {
        volume::confirm(opts, "Header dump with volume key is sensitive information\nwhich allows access to encrypted partition without a passphrase.")?;
        let purpose = if unbound {
            UnlockPurpose::Unbound
        } else {
            UnlockPurpose::Verify
        };
        // Here --volume-key-file names where the key goes, not where it comes from.
        let from = Opts {
            volume_key_file: None,
            ..opts.clone()
        };
        let (slot, key) = unlock(&from, &vol, device, purpose)?;
        (slot, Some(key))
    } else {
        (None, None)
    };
    match &vol {
        Volume::Luks1(v) => {
            let text = v.dump(&device.display().to_string(), vk.as_ref());
            match &vk {
                Some(k) => volume::print_dump_with_volume_key(opts, &text, k.as_bytes())?,
                None => print!("{text}"),
            }
        }
        Volume::Luks2(h, _) => {
            if json {
                // cryptsetup ends the JSON without a newline.
                print!("{}", h.dump_json());
                return Ok(());
            }
            let dev = device.display().to_string();
            match (&vk, slot_unlocked) {
                (None, _) => print!("{}", h.dump()),
                (Some(k), Some(slot)) if unbound => volume::print_dump_with_volume_key(
                    opts,
                    &h.dump_unbound_key(&dev, slot, k),
                    k.as_bytes(),
                )?,
                (Some(k), _) => volume::print_dump_with_volume_key(
                    opts,
                    &h.dump_volume_key(&dev, k),
                    k.as_bytes(),
                )?,
            }
        }
    }
    Ok(())
}

/// `luksAddKey <device> [<new key file>]`.
pub fn add_key(opts: &Opts, device: &Path, new_key_file: Option<&Path>) -> ActionResult {
    if opts.unbound {
        return add_unbound_key(opts, device, new_key_file);
    }
    // cryptsetup: with --new-key-slot, --key-slot names the keyslot to unlock; without it,
    // --key-slot is the new keyslot's number (its backward-compatible meaning).
    let (old_slot, slot) = match opts.compat.new_key_slot {
        Some(n) => (opts.key_slot.map(|s| s as usize), Some(n as usize)),
        None => (None, opts.key_slot.map(|s| s as usize)),
    };
    let mut vol = volume::load(opts, device, true)?;
    let (existing_slot, vk) = if let Some(p) = &opts.volume_key_file {
        (None, vol.volume_key_from_file(p, opts.key_size)?)
    } else {
        let purpose = if opts.unbound {
            UnlockPurpose::Unbound
        } else {
            UnlockPurpose::Verify
        };
        if let Some((s, k)) = super::token::try_tokens(opts, &vol, device, purpose)? {
            (Some(s), k)
        } else {
            let pass = volume::read_secret(
                &volume::key_source(opts, None),
                volume::limits(opts),
                "Enter any existing passphrase: ",
            )?;
            let (s, k) = vol.unlock(pass.as_bytes(), old_slot, purpose)?;
            (Some(s), k)
        }
    };
    if let (Some(s), true) = (existing_slot, opts.verbose) {
        println!("Key slot {s} unlocked.");
    }
    let new = volume::read_new_key(opts, new_key_file, "Enter new passphrase for key slot: ")?;
    let (kdf1, mut params2) = new_keyslot_kdf(opts, &vol)?;
    params2.slot = slot;
    let added = vol.add_key(&vk, new.as_bytes(), slot, &kdf1, &params2)?;
    if opts.verbose {
        println!("Key slot {added} created.");
    }
    Ok(())
}

/// `luksAddKey --unbound -s BITS <device> [<new key file>]`: a keyslot with a new random key
/// of its own, which needs no existing passphrase (cryptsetup asks none). Its passphrase is
/// the new key file, else `--key-file`, else asked for (or read from standard input).
fn add_unbound_key(opts: &Opts, device: &Path, new_key_file: Option<&Path>) -> ActionResult {
    let bits = opts
        .key_size
        .ok_or_else(|| Failure::usage("Key size is required with --unbound option."))?;
    if bits == 0 || bits % 8 != 0 {
        return Err(Failure::usage(format!(
            "Key size {bits} is not a multiple of 8 bits."
        )));
    }
    let mut vol = volume::load(opts, device, true)?;
    if vol.luks2().is_none() {
        return Err(Failure::usage(format!(
            "Device {} is not a valid LUKS2 device.",
            device.display()
        )));
    }
    // cryptsetup: with --volume-key-file the unbound keyslot holds that key (its first
    // key-size bytes, a shorter file refused before any prompt), else a new random one.
    let given_key = match &opts.volume_key_file {
        Some(p) => Some(volume::read_volume_key_file(p, bits as usize / 8)?),
        None => None,
    };
    let new = match new_key_file.or(opts.key_file.as_deref()) {
        Some(p) => volume::read_secret(
            &cryptblk_format::keyfile::KeySource::File(p.to_path_buf()),
            volume::limits(opts),
            "",
        )?,
        None => volume::read_new_secret(None, "Enter new passphrase for key slot: ")?,
    };
    let params = volume::keyslot_params(opts)?;
    let slot = match given_key {
        Some(key) => vol.add_unbound_key_with(key, new.as_bytes(), &params)?,
        None => vol.add_unbound_key(bits as usize / 8, new.as_bytes(), &params)?,
    };
    if opts.verbose {
        println!("Key slot {slot} created.");
    }
    Ok(())
}

/// The KDF of a new keyslot of `vol` (LUKS1's, and LUKS2's with the keyslot options): only
/// the volume's own version is read from the options, so `--pbkdf argon2id` serves a LUKS2
/// volume and is refused for a LUKS1 one.
fn new_keyslot_kdf(
    opts: &Opts,
    vol: &Volume,
) -> Result<
    (
        cryptblk_format::kdf::PbkdfRequest,
        cryptblk_format::luks2::KeyslotParams,
    ),
    Failure,
> {
    if vol.luks2().is_some() {
        let p = volume::keyslot_params(opts)?;
        Ok((p.pbkdf, p))
    } else {
        let k = volume::pbkdf_request(opts, true)?;
        Ok((k, cryptblk_format::luks2::KeyslotParams::new(k)))
    }
}

/// `luksRemoveKey <device> [<key file>]`: the checks are
/// [`cryptblk_volume::keyslots::remove_key`]'s.
pub fn remove_key(opts: &Opts, device: &Path, key_file: Option<&Path>) -> ActionResult {
    let mut vol = volume::load(opts, device, true)?;
    let mut input = RemovalPrompts { opts, key_file };
    let slot = cryptblk_volume::keyslots::remove_key(
        &mut vol,
        opts.key_slot.map(|s| s as usize),
        &mut input,
    )?;
    if opts.verbose {
        // cryptsetup's lines: the passphrase opened the keyslot it removes.
        println!("Key slot {slot} unlocked.");
        println!("Keyslot {slot} is selected for deletion.");
        println!("Key slot {slot} removed.");
    }
    Ok(())
}

/// `luksChangeKey <device> [<new key file>]`.
pub fn change_key(opts: &Opts, device: &Path, new_key_file: Option<&Path>) -> ActionResult {
    let mut vol = volume::load(opts, device, true)?;
    let old = volume::read_secret(
        &volume::key_source(opts, None),
        volume::limits(opts),
        "Enter passphrase to be changed: ",
    )?;
    // Fail on a wrong passphrase before asking for the new one.
    vol.unlock(
        old.as_bytes(),
        opts.key_slot.map(|s| s as usize),
        UnlockPurpose::Unbound,
    )?;
    let new = volume::read_new_key(opts, new_key_file, "Enter new passphrase: ")?;
    let (kdf1, params2) = new_keyslot_kdf(opts, &vol)?;
    vol.change_key(
        old.as_bytes(),
        new.as_bytes(),
        opts.key_slot.map(|s| s as usize),
        &kdf1,
        &params2,
    )
}

/// `luksKillSlot <device> <slot> [<key file>]`: which passphrase is needed, and when the
/// user must confirm, is [`cryptblk_volume::keyslots::kill_slot`]'s decision (cryptsetup's).
pub fn kill_slot(opts: &Opts, device: &Path, slot: u32, key_file: Option<&Path>) -> ActionResult {
    use cryptblk_volume::keyslots::{KeyFileGiven, KillSlot};
    let mut vol = volume::load(opts, device, true)?;
    let req = KillSlot {
        slot: slot as usize,
        batch: opts.batch_mode,
        key_file: match opts.key_file.as_deref().or(key_file) {
            None => KeyFileGiven::No,
            Some(p) if p == Path::new("-") => KeyFileGiven::Stdin,
            Some(_) => KeyFileGiven::File,
        },
        stdin_is_tty: cryptblk_format::keyfile::stdin_is_tty(),
    };
    let mut input = RemovalPrompts { opts, key_file };
    cryptblk_volume::keyslots::kill_slot(&mut vol, &req, &mut input)?;
    if opts.verbose {
        println!("Key slot {slot} removed.");
    }
    Ok(())
}

/// The terminal, standard input or key file answering a keyslot removal's questions.
struct RemovalPrompts<'a> {
    opts: &'a Opts,
    key_file: Option<&'a Path>,
}

impl cryptblk_volume::keyslots::RemovalInput for RemovalPrompts<'_> {
    fn secret(&mut self, prompt: &str) -> Result<Option<SecretBytes>, Failure> {
        let source = volume::key_source(self.opts, self.key_file);
        match cryptblk_format::keyfile::read_key(&source, volume::limits(self.opts), prompt) {
            Ok(k) => Ok(Some(k)),
            Err(e @ cryptblk_format::FormatError::NothingToRead) => {
                eprintln!("{e}");
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn confirm(&mut self, question: &str) -> Result<bool, Failure> {
        volume::ask_yes(self.opts, question)
    }
}

/// `luksHeaderBackup <device> --header-backup-file <file>`.
pub fn header_backup(opts: &Opts, device: &Path) -> ActionResult {
    let out = opts
        .header_backup_file
        .as_deref()
        .ok_or_else(|| Failure::usage("Option --header-backup-file is required."))?;
    volume::load(opts, device, false)?.backup_header(out)
}

/// `luksHeaderRestore <device> --header-backup-file <file>`: refuses a damaged or too small
/// backup before touching the device.
pub fn header_restore(opts: &Opts, device: &Path) -> ActionResult {
    let src = opts
        .header_backup_file
        .as_deref()
        .ok_or_else(|| Failure::usage("Option --header-backup-file is required."))?;
    let header = volume::header_path(opts, device);
    volume::open_file(src, false)?;
    let current = {
        volume::open_file(header, true)?;
        lib::header_version(header)?
    };
    match lib::backup_kind(src)? {
        BackupKind::Luks1 => {
            if current == Some(2) {
                return Err(Failure::usage(
                    "Header backup is LUKS1 but the device has a LUKS2 header.",
                ));
            }
            if current.is_none() {
                volume::confirm(opts, &format!("Device {} does not contain LUKS header. Replacing header can destroy data on that device.", device.display()))?;
            }
        }
        BackupKind::Luks2 => volume::confirm(
            opts,
            &format!(
                "Device {} will be overwritten with the header from the backup.",
                device.display()
            ),
        )?,
    }
    lib::restore_header(header, src)
}

/// `luksUUID [--uuid U]`.
pub fn uuid(opts: &Opts, device: &Path) -> ActionResult {
    if opts.uuid.is_none() {
        println!("{}", volume::load(opts, device, false)?.uuid());
        return Ok(());
    }
    volume::load(opts, device, true)?.set_uuid(opts.uuid.as_deref())
}

/// `isLuks`: exit 0 for a LUKS device (of `--type`), 1 otherwise; silent unless -v.
pub fn is_luks(opts: &Opts, device: &Path) -> ActionResult {
    match volume::load(opts, device, false) {
        Ok(vol) => {
            if let Volume::Luks2(..) = vol {
                if let Some(s) = lib::lvm2_signature_sector(volume::header_path(opts, device))? {
                    return Err(Failure::usage(format!(
                        "Device contains ambiguous signatures (LVM2_member at sector {s}), cannot auto-recover LUKS2; use repair."
                    )));
                }
            }
            if opts.verbose {
                eprintln!(
                    "Device {} is a {} device.",
                    device.display(),
                    vol.type_name()
                );
            }
            Ok(())
        }
        Err(f) if f.code == ExitCode::WrongDevice => Err(f),
        Err(f) => Err(Failure::usage(if opts.verbose {
            f.message
        } else {
            String::new()
        })),
    }
}

/// `erase`: wipes every keyslot.
pub fn erase(opts: &Opts, device: &Path) -> ActionResult {
    let mut vol = volume::load(opts, device, true)?;
    volume::confirm(opts, &format!("This operation will erase all keyslots on device {}.\nDevice will become unusable after this operation.", device.display()))?;
    vol.erase()
}

/// `config --label/--subsystem/--priority -S N` (LUKS2).
pub fn config(opts: &Opts, device: &Path) -> ActionResult {
    let mut vol = volume::load(opts, device, true)?;
    if vol.luks2().is_none() {
        return Err(Failure::usage(
            "config is only supported for LUKS2 devices.",
        ));
    }
    let priority = match &opts.priority {
        None => None,
        Some(p) => {
            let slot = opts
                .key_slot
                .ok_or_else(|| Failure::usage("Keyslot specification is required (-S)."))?;
            let prio = match p.as_str() {
                "ignore" => 0,
                "normal" => 1,
                "prefer" => 2,
                _ => {
                    return Err(Failure::usage(format!(
                        "Unknown keyslot priority '{p}' (use prefer, normal or ignore)."
                    )))
                }
            };
            Some((slot as usize, prio))
        }
    };
    // cryptsetup sets label and subsystem together: giving one clears the other.
    let labels = opts.label.is_some() || opts.subsystem.is_some();
    let change = ConfigChange {
        label: labels.then(|| opts.label.clone().unwrap_or_default()),
        subsystem: labels.then(|| opts.subsystem.clone().unwrap_or_default()),
        priority,
    };
    lib::configure(&mut vol, &change)
}

/// `convert --type luks1|luks2`: in place, as cryptsetup (not crash-safe there either, so
/// it asks for confirmation and suggests a header backup).
pub fn convert(opts: &Opts, device: &Path) -> ActionResult {
    let want = match opts.volume_type {
        Some(VolumeType::Luks1) => 1,
        Some(VolumeType::Luks2) => 2,
        _ => return Err(Failure::usage("convert needs --type luks1 or --type luks2")),
    };
    let path = volume::header_path(opts, device);
    volume::open_file(path, true)?;
    match (lib::header_version(path)?, want) {
        (Some(v), w) if v == w => Err(Failure::usage(format!(
            "Device {} is already LUKS{v}.",
            device.display()
        ))),
        (Some(1), 2) => {
            volume::confirm(opts, &format!("This operation will convert {} to LUKS2 format.\nMake a header backup first (luksHeaderBackup).", device.display()))?;
            lib::convert(path, 2)
        }
        (Some(2), 1) => {
            volume::confirm(opts, &format!("This operation will convert {} to LUKS1 format.\nMake a header backup first (luksHeaderBackup).", device.display()))?;
            lib::convert(path, 1)
        }
        _ => Err(Failure::usage(format!(
            "Device {} is not a valid LUKS device.",
            device.display()
        ))),
    }
}

/// `repair`: LUKS2 only, as cryptsetup: rebuilds both header copies from the valid one and
/// removes an LVM2 label that makes the device's signature ambiguous.
pub fn repair(opts: &Opts, device: &Path) -> ActionResult {
    let header = volume::header_path(opts, device);
    volume::open_file(header, true)?;
    if lib::header_version(header)? == Some(1) || opts.volume_type == Some(VolumeType::Luks1) {
        // cryptsetup always asks before its LUKS1 repair, and prints each fix.
        volume::confirm(opts, "Really try to repair LUKS device header?")?;
        let done = lib::repair_luks1(header)?;
        for line in &done.fixes {
            eprintln!("{line}");
        }
        if done.fixes.is_empty() && opts.verbose {
            println!("No known problems detected for LUKS header.");
        }
        return Ok(());
    }
    // A sound header is not rewritten (nor asked about), as cryptsetup: a repair that fails
    // afterwards (unknown requirement, unrecoverable reencryption) leaves the image as it was.
    if lib::repair_needed(header).unwrap_or(true) {
        volume::confirm(
            opts,
            &format!(
                "This will rewrite the LUKS2 metadata of {}.",
                device.display()
            ),
        )?;
        lib::repair(header)?;
    } else if opts.verbose {
        println!("No known problems detected for LUKS header.");
    }
    repair_reencryption(opts, device)
}

/// The reencryption recovery part of `repair`
/// ([`cryptblk_volume::reencrypt::repair::repair_reencryption`]): the passphrase opens
/// both keys of a reencryption cut inside a step.
fn repair_reencryption(opts: &Opts, device: &Path) -> ActionResult {
    let mut input = super::reencrypt::CliInput { opts, device };
    cryptblk_volume::reencrypt::repair::repair_reencryption(
        device,
        opts.header.as_deref(),
        super::reencrypt::luks_type(opts),
        opts.key_slot.map(|s| s as usize),
        &mut input,
    )
}
