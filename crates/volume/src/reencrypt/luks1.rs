//! LUKS1 offline re-key as cryptsetup 2.6 does it with its legacy LUKS1 code: the same
//! temporary files in the working directory, the same mark on the device, the same log, so
//! that either tool can finish a run the other one began.
//!
//! What cryptsetup does (learned from running it and from its `utils_reencrypt_luks1.c`):
//! - three files in the current directory, named by the volume UUID: `LUKS-<uuid>.org` (a
//!   header backup of the device, mode 0400), `LUKS-<uuid>.new` (a new LUKS1 header with the
//!   same UUID and data offset, a new volume key, the keyslots re-wrapped in the same slot
//!   numbers) and `LUKS-<uuid>.log`, a 512-byte text log (`offset = N` is how many data
//!   bytes lie under the new key, forward);
//! - the device's magic becomes `LUKS\xde\xad` ([`UNUSABLE_MAGIC`]) so nothing opens it
//!   while the data is mixed; its UUID is still read from the header to find the files;
//! - the data is copied through the old and the new key block by block; at the end the new
//!   header is restored onto the device and the files are removed. A log file in the working
//!   directory means "resume".
//!
//! cryptsetup updates the log only at the start and the end (`--write-log`: after every
//! block), after the block's write, so a crash in between re-encrypts a block twice. cryptblk
//! keeps every block recoverable instead: before a block is overwritten its old ciphertext
//! goes to a journal record in the log file after cryptsetup's 512 bytes (which cryptsetup
//! never reads), and the log's text gains a `cryptblk-hotzone = LEN` line. cryptsetup
//! refuses a log with a line it does not know ("Wrong log format."), so it never resumes
//! inside that window and harms nothing; outside it the log is exactly cryptsetup's.

use crate::error::{ErrorClass, Result, VolumeError};
use crate::progress::Progress;
use crate::reencrypt::RunOutcome;
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::{SecretBytes, SectorCipher, SectorOptions};
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::kdf::PbkdfRequest;
use cryptblk_format::luks1::{Luks1FormatParams, Luks1Header, Luks1Volume, LUKS1_MAGIC};
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The magic cryptsetup writes over `LUKS\xba\xbe` while it reencrypts a LUKS1 device.
pub const UNUSABLE_MAGIC: [u8; 6] = *b"LUKS\xde\xad";
/// cryptsetup's default block (`--block-size 4`, in MiB).
pub const DEFAULT_BLOCK: u64 = 4 << 20;
/// The log text's size: cryptsetup reads and writes exactly one sector.
const LOG_TEXT: usize = 512;
/// Where cryptblk's journal record starts in the log file (past cryptsetup's sector).
const JOURNAL_AT: u64 = 4096;
/// The record's own header: magic, offset, length, SHA-256 of the ciphertext, padded so
/// the ciphertext after it stays 4 KiB-aligned.
const JOURNAL_HEAD: usize = 4096;
const JOURNAL_MAGIC: &[u8; 16] = b"cryptblk-l1-hz\x00\x01";
/// The log line that marks a block in flight (cryptsetup refuses it, see the module doc).
const PENDING_KEY: &str = "cryptblk-hotzone";

/// The three temporary files of a run, in the working directory.
#[derive(Clone, Debug)]
pub struct TempFiles {
    /// `LUKS-<uuid>.log`.
    pub log: PathBuf,
    /// `LUKS-<uuid>.org`: the old header.
    pub org: PathBuf,
    /// `LUKS-<uuid>.new`: the new header.
    pub new: PathBuf,
}

impl TempFiles {
    /// The files of the volume `uuid` in `dir`, named as cryptsetup names them.
    pub fn new(dir: &Path, uuid: &str) -> TempFiles {
        let f = |ext: &str| dir.join(format!("LUKS-{uuid}.{ext}"));
        TempFiles {
            log: f("log"),
            org: f("org"),
            new: f("new"),
        }
    }

    fn remove(&self) -> Result<()> {
        // The log goes first (cryptsetup's order): without it nothing is in progress.
        for p in [&self.log, &self.org, &self.new] {
            match std::fs::remove_file(p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(VolumeError::device(format!(
                        "Cannot remove {}: {e}",
                        p.display()
                    )))
                }
            }
        }
        Ok(())
    }
}

/// cryptsetup's reencryption log (version 2), plus cryptblk's in-flight block marker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Log {
    /// The volume UUID (must match the device's).
    pub uuid: String,
    /// 0 forward, 1 backward.
    pub direction: u32,
    /// 0 re-key, 1 encrypt, 2 decrypt.
    pub mode: u32,
    /// Forward: bytes of the data area already under the new key.
    pub offset: u64,
    /// Data shift in bytes (`--reduce-device-size`).
    pub shift: u64,
    /// Length of the block in flight whose old ciphertext the journal record holds.
    pub pending: Option<u64>,
}

impl Log {
    /// A new forward re-key log at offset 0.
    pub fn new(uuid: &str) -> Log {
        Log {
            uuid: uuid.to_string(),
            direction: 0,
            mode: 0,
            offset: 0,
            shift: 0,
            pending: None,
        }
    }

    /// The 512-byte sector cryptsetup writes (zero-padded text), with the marker line after
    /// `# EOF` while a block is in flight.
    pub fn render(&self) -> [u8; LOG_TEXT] {
        let mut text = format!(
            "# LUKS reencryption log, DO NOT EDIT OR DELETE.\nversion = 2\nUUID = {}\n\
             direction = {}\nmode = {}\noffset = {}\nshift = {}\n# EOF\n",
            self.uuid, self.direction, self.mode, self.offset, self.shift
        );
        if let Some(len) = self.pending {
            text.push_str(&format!("{PENDING_KEY} = {len}\n"));
        }
        let mut out = [0u8; LOG_TEXT];
        let n = text.len().min(LOG_TEXT - 1);
        out[..n].copy_from_slice(&text.as_bytes()[..n]);
        out
    }

    /// Parses a log sector as cryptsetup does: line by line up to the last newline, `#`
    /// lines are comments, any unknown line is an error; the UUID must be `uuid`.
    pub fn parse(buf: &[u8], uuid: &str) -> Result<Log> {
        let wrong = || VolumeError::usage("Wrong log format.");
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        let text = std::str::from_utf8(&buf[..end.min(LOG_TEXT - 1)]).map_err(|_| wrong())?;
        let mut log = Log::new(uuid);
        let mut seen_uuid = false;
        // Text after the last newline is not a line (cryptsetup stops there too).
        let complete = match text.rfind('\n') {
            Some(i) => &text[..i],
            None => "",
        };
        for line in complete.split('\n') {
            if line.starts_with('#') {
                continue;
            }
            let (key, value) = line.split_once('=').ok_or_else(wrong)?;
            let value = value.trim();
            let num = || value.parse::<u64>().map_err(|_| wrong());
            match key.trim() {
                "version" if (1..=2).contains(&num()?) => {}
                "UUID" if value == uuid => seen_uuid = true,
                "direction" => log.direction = num()? as u32,
                "mode" if num()? <= 2 => log.mode = num()? as u32,
                "offset" => log.offset = num()?,
                "shift" => log.shift = num()?,
                PENDING_KEY => log.pending = Some(num()?),
                _ => return Err(wrong()),
            }
        }
        if !seen_uuid {
            return Err(wrong());
        }
        Ok(log)
    }
}

/// The UUID of a LUKS1 device cryptsetup (or cryptblk) marked unusable for reencryption,
/// `None` for any other device.
pub fn marked_uuid(dev: &dyn HeaderIo) -> Option<String> {
    let mut buf = [0u8; 0xa8 + 40];
    dev.read_at(0, &mut buf).ok()?;
    if buf[..6] != UNUSABLE_MAGIC || buf[6..8] != [0, 1] {
        return None;
    }
    let raw = &buf[0xa8..];
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    let uuid = std::str::from_utf8(&raw[..end]).ok()?;
    // The UUID names files: nothing but a UUID's characters.
    (!uuid.is_empty() && uuid.chars().all(|c| c.is_ascii_hexdigit() || c == '-'))
        .then(|| uuid.to_string())
}

/// What a new re-key changes.
#[derive(Clone, Debug)]
pub struct Luks1Params {
    /// New `cipher-mode` (`--cipher`); the old one when `None`.
    pub cipher: Option<String>,
    /// New volume key length in bytes (`--key-size`); the old one when `None`.
    pub key_bytes: Option<usize>,
    /// Hash of the new header (`--hash`; cryptsetup's default sha256, not the old one).
    pub hash: HashAlgorithm,
    /// PBKDF2 of the new keyslots.
    pub kdf: PbkdfRequest,
    /// The new volume key (`--volume-key-file`); random when `None`.
    pub volume_key: Option<SecretBytes>,
    /// Keep the volume key: re-wrap the keyslots only, no data rewritten (`--keep-key`).
    pub keep_key: bool,
}

/// A re-key ready to run (started, or found in progress and unlocked).
pub struct Luks1Rekey {
    files: TempFiles,
    log: Log,
    log_file: File,
    data_offset: u64,
    data_size: u64,
    old: Option<Box<dyn SectorCipher>>,
    new: Option<Box<dyn SectorCipher>>,
    /// The keyslots the new header holds.
    pub keyslots: Vec<usize>,
}

fn dev_err(what: &str) -> impl Fn(std::io::Error) -> VolumeError + '_ {
    move |e| VolumeError::device(format!("{what}: {e}"))
}

fn data_cipher(h: &Luks1Header, key: &SecretBytes) -> Result<Box<dyn SectorCipher>> {
    Ok(cryptblk_cipher::open_cipher(
        &h.cipher_spec(),
        key.as_bytes(),
        &SectorOptions {
            sector_size: 512,
            iv_offset: 0,
            iv_large_sectors: false,
            implementation: None,
        },
    )?)
}

fn create(path: &Path, mode: u32) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| VolumeError::device(format!("Cannot create {}: {e}", path.display())))
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(dev_err("syncing the working directory"))
}

/// The data area's length: whole sectors after the data offset.
fn data_size(dev: &dyn HeaderIo, h: &Luks1Header) -> Result<u64> {
    let size = dev.size().map_err(dev_err("reading the device size"))?;
    Ok(size.saturating_sub(h.data_offset_bytes()) / 512 * 512)
}

/// Same volume key digest: the same header generation.
fn same_key(a: &Luks1Header, b: &Luks1Header) -> bool {
    a.mk_digest == b.mk_digest && a.mk_digest_salt == b.mk_digest_salt
}

/// What the working directory and the device say about a run.
pub enum Found {
    /// Nothing in progress: no log for this volume.
    Nothing,
    /// A run is in progress (device marked, log present): resume it.
    InProgress(String),
    /// The device carries the new header already: only the files were left (cleaned up).
    Finished,
}

/// Looks for a run of the volume on `dev` in `dir`. A log next to an unmarked device whose
/// header is not the new one is a run that stopped before it marked the device (nothing on
/// the device changed yet): its files are removed and [`Found::Nothing`] returned.
pub fn find(dev: &File, dir: &Path) -> Result<Found> {
    if let Some(uuid) = marked_uuid(dev) {
        let files = TempFiles::new(dir, &uuid);
        if !files.log.exists() {
            return Err(VolumeError::device(format!(
                "Device is marked for LUKS1 reencryption but {} is missing (run in the \
                 directory that holds the reencryption files).",
                files.log.display()
            )));
        }
        return Ok(Found::InProgress(uuid));
    }
    let vol = Luks1Volume::open(dev)?;
    let files = TempFiles::new(dir, &vol.header().uuid);
    if !files.log.exists() {
        return Ok(Found::Nothing);
    }
    let finished = File::open(&files.new)
        .ok()
        .and_then(|f| Luks1Volume::open(f).ok())
        .is_some_and(|n| same_key(n.header(), vol.header()));
    files.remove()?;
    Ok(if finished {
        Found::Finished
    } else {
        Found::Nothing
    })
}

impl Luks1Rekey {
    /// Starts a re-key of the LUKS1 volume on `dev`: `passphrases` are the keyslots to carry
    /// over (slot, passphrase), each checked against its slot. Writes `.org`, `.new` and the
    /// log in `dir`, then marks the device.
    pub fn start(
        dev: &File,
        dir: &Path,
        passphrases: &[(usize, SecretBytes)],
        p: &Luks1Params,
    ) -> Result<Luks1Rekey> {
        let vol = Luks1Volume::open(dev)?;
        let h = vol.header().clone();
        if passphrases.is_empty() {
            return Err(VolumeError::usage("No keyslot to carry over."));
        }
        let mut old_key = None;
        for (slot, pass) in passphrases {
            let u = vol.unlock(pass.as_bytes(), Some(*slot))?;
            old_key = Some(u.volume_key);
        }
        let old_key = old_key.expect("one passphrase at least");
        let files = TempFiles::new(dir, &h.uuid);
        // No log: any files of this UUID are left over from a start that never got as far
        // as the log, so nothing depends on them.
        files.remove()?;

        // Until the log exists nothing depends on these files: a failure removes them.
        let prepared = prepare_headers(&vol, &files, &old_key, passphrases, p);
        let (new_h, new_key) = match prepared {
            Ok(v) => v,
            Err(e) => {
                let _ = files.remove();
                return Err(e);
            }
        };

        let log = Log::new(&h.uuid);
        let log_file = create(&files.log, 0o600)?;
        write_log(&log_file, &log)?;
        sync_dir(dir)?;

        // The mark: from here the device opens nowhere until the new header is restored.
        let mut magic = [0u8; 8];
        dev.read_exact_at(&mut magic, 0)
            .map_err(dev_err("reading the header"))?;
        if magic[..6] != LUKS1_MAGIC {
            return Err(VolumeError::device(
                "LUKS1 signature changed under the run.",
            ));
        }
        dev.write_all_at(&UNUSABLE_MAGIC, 0)
            .map_err(dev_err("marking the device"))?;
        dev.sync_all().map_err(dev_err("syncing the device"))?;

        let keyslots = passphrases.iter().map(|(s, _)| *s).collect();
        let (old, new) = if p.keep_key {
            (None, None)
        } else {
            (
                Some(data_cipher(&h, &old_key)?),
                Some(data_cipher(&new_h, &new_key)?),
            )
        };
        Ok(Luks1Rekey {
            files,
            log,
            log_file,
            data_offset: h.data_offset_bytes(),
            data_size: data_size(dev, &h)?,
            old,
            new,
            keyslots,
        })
    }

    /// Resumes the run of volume `uuid` (found by [`find`]) with one passphrase: it must open
    /// the new header (in `slot` when given) and the old one in the same keyslot, as
    /// cryptsetup's resume asks.
    pub fn resume(
        dev: &File,
        dir: &Path,
        uuid: &str,
        passphrase: &[u8],
        slot: Option<usize>,
    ) -> Result<Luks1Rekey> {
        let files = TempFiles::new(dir, uuid);
        let log_file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&files.log)
            .map_err(|e| VolumeError::device(format!("Cannot open reencryption log file: {e}")))?;
        let mut text = [0u8; LOG_TEXT];
        log_file
            .read_exact_at(&mut text, 0)
            .map_err(|_| VolumeError::device("Cannot read reencryption log file."))?;
        let log = Log::parse(&text, uuid)?;
        if log.mode != 0 || log.direction != 0 || log.shift != 0 {
            return Err(VolumeError::usage(
                "Only a forward LUKS1 re-key can be resumed by cryptblk (this log is an \
                 encryption, decryption or data shift).",
            ));
        }
        let open = |p: &Path| -> Result<Luks1Volume<File>> {
            let f = File::open(p)
                .map_err(|e| VolumeError::device(format!("Cannot open {}: {e}", p.display())))?;
            Ok(Luks1Volume::open(f)?)
        };
        let newvol = open(&files.new)?;
        let orgvol = open(&files.org)?;
        if newvol.header().uuid != uuid || orgvol.header().uuid != uuid {
            return Err(VolumeError::device(
                "Reencryption files do not match the device.",
            ));
        }
        let n = newvol.unlock(passphrase, slot)?;
        let o = orgvol.unlock(passphrase, Some(n.keyslot))?;
        let (nh, oh) = (newvol.header(), orgvol.header());
        if nh.payload_offset != oh.payload_offset {
            return Err(VolumeError::usage(
                "Data offset change (--reduce-device-size) is not supported by cryptblk's \
                 LUKS1 reencryption.",
            ));
        }
        // Keeping the key (no data to move) is the only way both keys are the same.
        let keep = o.volume_key.as_bytes() == n.volume_key.as_bytes();
        let keyslots = (0..8).filter(|&s| nh.keyslots[s].is_enabled()).collect();
        Ok(Luks1Rekey {
            data_offset: oh.data_offset_bytes(),
            data_size: data_size(dev, oh)?,
            old: (!keep)
                .then(|| data_cipher(oh, &o.volume_key))
                .transpose()?,
            new: (!keep)
                .then(|| data_cipher(nh, &n.volume_key))
                .transpose()?,
            files,
            log,
            log_file,
            keyslots,
        })
    }

    /// Bytes of the data area.
    pub fn data_size(&self) -> u64 {
        self.data_size
    }

    /// Reencrypts the rest of the data in blocks of `block` bytes, restores the new header
    /// onto the device and removes the files.
    pub fn run(
        &mut self,
        dev: &File,
        block: u64,
        progress: &mut dyn Progress,
    ) -> Result<RunOutcome> {
        let block = block.clamp(512, 64 << 20) / 512 * 512;
        let mut out = RunOutcome {
            data_size: self.data_size,
            hotzone: block,
            ..RunOutcome::default()
        };
        if self.log.offset > self.data_size {
            return Err(VolumeError::device(
                "Reencryption log offset lies past the data area.",
            ));
        }
        progress.start(Some(self.data_size), "Reencrypting");
        let result = self.copy(dev, block, &mut out, progress);
        progress.finish();
        result?;
        self.restore(dev)?;
        Ok(out)
    }

    fn copy(
        &mut self,
        dev: &File,
        block: u64,
        out: &mut RunOutcome,
        progress: &mut dyn Progress,
    ) -> Result<()> {
        if self.old.is_none() {
            // --keep-key: no data to rewrite.
            return Ok(());
        }
        progress.update(self.log.offset);
        // The block is plaintext between its decryption and its encryption: it lives in
        // locked memory of its own (out of swap and core dumps, wiped when dropped), as the
        // keys do. The mapping is page aligned, so the data after the 4 KiB journal head is
        // too.
        let mut locked = SecretBytes::zeroed(JOURNAL_HEAD + block as usize);
        let buf = locked.as_mut_bytes();
        if let Some(len) = self.log.pending {
            if let Some(cipher_text) = self.journal(len)? {
                let n = cipher_text.len();
                buf[JOURNAL_HEAD..JOURNAL_HEAD + n].copy_from_slice(&cipher_text);
                self.rewrite(dev, buf, n, out)?;
                progress.update(self.log.offset);
            } else {
                // The record never became whole, so the block was never touched.
                self.log.pending = None;
                write_log(&self.log_file, &self.log)?;
            }
        }
        while self.log.offset < self.data_size {
            let n = (self.data_size - self.log.offset).min(block) as usize;
            let at = self.data_offset + self.log.offset;
            dev.read_exact_at(&mut buf[JOURNAL_HEAD..JOURNAL_HEAD + n], at)
                .map_err(dev_err("reading the data"))?;
            // The journal record: old ciphertext first, durable before the marker.
            let digest = Sha256::digest(&buf[JOURNAL_HEAD..JOURNAL_HEAD + n]);
            buf[..JOURNAL_HEAD].fill(0);
            buf[..16].copy_from_slice(JOURNAL_MAGIC);
            buf[16..24].copy_from_slice(&self.log.offset.to_le_bytes());
            buf[24..32].copy_from_slice(&(n as u64).to_le_bytes());
            buf[32..64].copy_from_slice(&digest);
            self.log_file
                .write_all_at(&buf[..JOURNAL_HEAD + n], JOURNAL_AT)
                .map_err(dev_err("writing the reencryption journal"))?;
            self.log_file
                .sync_data()
                .map_err(dev_err("syncing the reencryption journal"))?;
            self.log.pending = Some(n as u64);
            write_log(&self.log_file, &self.log)?;
            self.rewrite(dev, buf, n, out)?;
            progress.update(self.log.offset);
        }
        Ok(())
    }

    /// The block in flight's old ciphertext from a whole journal record, `None` when the
    /// record is missing, torn or of another block.
    fn journal(&self, len: u64) -> Result<Option<Vec<u8>>> {
        let mut head = [0u8; 64];
        if self.log_file.read_exact_at(&mut head, JOURNAL_AT).is_err()
            || &head[..16] != JOURNAL_MAGIC
            || head[16..24] != self.log.offset.to_le_bytes()
            || head[24..32] != len.to_le_bytes()
            || len > 64 << 20
        {
            return Ok(None);
        }
        let mut data = vec![0u8; len as usize];
        if self
            .log_file
            .read_exact_at(&mut data, JOURNAL_AT + JOURNAL_HEAD as u64)
            .is_err()
            || Sha256::digest(&data)[..] != head[32..64]
        {
            return Ok(None);
        }
        Ok(Some(data))
    }

    /// Rewrites the block at the log's offset whose old ciphertext is `buf[JOURNAL_HEAD..][..n]`
    /// under the new key, then moves the log past it.
    fn rewrite(
        &mut self,
        dev: &File,
        buf: &mut [u8],
        n: usize,
        out: &mut RunOutcome,
    ) -> Result<()> {
        let (old, new) = match (&self.old, &self.new) {
            (Some(o), Some(n)) => (o, n),
            _ => return Err(VolumeError::device("both volume keys are needed")),
        };
        let data = &mut buf[JOURNAL_HEAD..JOURNAL_HEAD + n];
        let sector = self.log.offset / 512;
        old.decrypt(sector, data)?;
        new.encrypt(sector, data)?;
        dev.write_all_at(data, self.data_offset + self.log.offset)
            .map_err(dev_err("writing the data"))?;
        dev.sync_data().map_err(dev_err("syncing the data"))?;
        self.log.offset += n as u64;
        self.log.pending = None;
        write_log(&self.log_file, &self.log)?;
        out.bytes += n as u64;
        out.steps += 1;
        Ok(())
    }

    /// The new header onto the device (keyslot areas first, the header sector with the
    /// magic last, so the device is unusable until it is whole), then the files go.
    fn restore(&mut self, dev: &File) -> Result<()> {
        let newvol = Luks1Volume::open(
            File::open(&self.files.new).map_err(dev_err("opening the new header"))?,
        )?;
        let image = newvol.header_backup()?;
        let size = (newvol.header().required_size() as usize).min(image.len());
        if size > 4096 {
            dev.write_all_at(&image[4096..size], 4096)
                .map_err(dev_err("writing the new keyslots"))?;
            dev.sync_data()
                .map_err(dev_err("syncing the new keyslots"))?;
        }
        dev.write_all_at(&image[..size.min(4096)], 0)
            .map_err(dev_err("writing the new header"))?;
        dev.sync_all().map_err(dev_err("syncing the new header"))?;
        self.files.remove()
    }
}

/// Writes `.org` (the header backup) and `.new` (the new header with every keyslot of
/// `passphrases`, in the same slot numbers); returns the new header and volume key.
fn prepare_headers(
    vol: &Luks1Volume<&File>,
    files: &TempFiles,
    old_key: &SecretBytes,
    passphrases: &[(usize, SecretBytes)],
    p: &Luks1Params,
) -> Result<(Luks1Header, SecretBytes)> {
    let h = vol.header();
    let org = create(&files.org, 0o400)?;
    org.write_all_at(&vol.header_backup()?, 0)
        .map_err(dev_err("writing the header backup"))?;
    org.sync_all()
        .map_err(dev_err("syncing the header backup"))?;

    let cipher = p.cipher.clone().unwrap_or_else(|| h.cipher_spec());
    let key_bytes = if p.keep_key {
        h.key_bytes as usize
    } else {
        p.key_bytes.unwrap_or(h.key_bytes as usize)
    };
    let mut fp = Luks1FormatParams::new(&cipher, key_bytes, p.hash)?;
    fp.uuid = Some(h.uuid.clone());
    fp.data_offset_sectors = Some(h.payload_offset as u64);
    fp.kdf = p.kdf;
    fp.kdf.hash = p.hash;
    fp.keyslot = passphrases[0].0;
    fp.volume_key = if p.keep_key {
        Some(old_key.clone())
    } else {
        p.volume_key.clone()
    };
    let new_file = create(&files.new, 0o600)?;
    let (mut newvol, new_key) = Luks1Volume::format(new_file, &fp, passphrases[0].1.as_bytes())
        .map_err(|e| VolumeError::usage(format!("Creation of LUKS backup headers failed: {e}")))?;
    for (slot, pass) in &passphrases[1..] {
        newvol.add_key(&new_key, pass.as_bytes(), Some(*slot), &fp.kdf)?;
    }
    newvol
        .device()
        .sync_all()
        .map_err(dev_err("syncing the new header"))?;
    Ok((newvol.header().clone(), new_key))
}

fn write_log(f: &File, log: &Log) -> Result<()> {
    f.write_all_at(&log.render(), 0)
        .and_then(|()| f.sync_data())
        .map_err(|_| {
            VolumeError::new(
                ErrorClass::WrongDevice,
                "Cannot write reencryption log file.",
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_round_trips_in_cryptsetups_layout() {
        let mut l = Log::new("d48cac46-5d09-4414-b8d4-08048cd75f06");
        l.offset = 4194304;
        let sector = l.render();
        let text =
            std::str::from_utf8(&sector[..sector.iter().position(|&b| b == 0).unwrap()]).unwrap();
        assert_eq!(
            text,
            "# LUKS reencryption log, DO NOT EDIT OR DELETE.\nversion = 2\n\
             UUID = d48cac46-5d09-4414-b8d4-08048cd75f06\ndirection = 0\nmode = 0\n\
             offset = 4194304\nshift = 0\n# EOF\n"
        );
        assert_eq!(Log::parse(&sector, &l.uuid).unwrap(), l);
        l.pending = Some(1 << 20);
        assert_eq!(Log::parse(&l.render(), &l.uuid).unwrap(), l);
        assert!(Log::parse(&sector, "other").is_err());
        assert!(Log::parse(b"offset = x\n", &l.uuid).is_err());
    }
}
