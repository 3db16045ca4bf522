//! Command-line grammar: cryptsetup's action names and option names, so habits and scripts
//! carry over (`cryptblk luksFormat --type luks2 -d key dev`), plus cryptblk's own actions.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// Transparent disk encryption in userspace, compatible with dm-crypt and cryptsetup.
#[derive(Parser, Debug)]
#[command(
    name = "cryptblk",
    version = crate::features::version(),
    about,
    long_about = None,
    disable_help_subcommand = true,
    disable_help_flag = true,
    args_override_self = true
)]
pub struct Cli {
    /// Print help (`-h` is `--hash`, as in cryptsetup).
    #[arg(long, global = true, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// Options shared by the actions, accepted before or after the action as cryptsetup does.
    #[command(flatten)]
    pub opts: Opts,
    /// The action to perform.
    #[command(subcommand)]
    pub action: Action,
}

impl Cli {
    /// Sets [`Opts::key_file`] from the `--key-file` options: only TCRYPT (`--type tcrypt`,
    /// `tcryptDump`) takes more than one, as in cryptsetup.
    pub fn one_key_file(&mut self) -> Result<(), String> {
        let tcrypt = self.opts.volume_type == Some(VolumeType::Tcrypt)
            || matches!(self.action, Action::TcryptDump { .. });
        if self.opts.key_files.len() > 1 && !tcrypt {
            return Err("Only one --key-file argument is allowed.".into());
        }
        self.opts.key_file = self.opts.key_files.first().cloned();
        Ok(())
    }
}

/// Volume types, as cryptsetup's `--type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum VolumeType {
    /// LUKS1 or LUKS2, whichever the header is (for `open`).
    Luks,
    /// LUKS version 1.
    Luks1,
    /// LUKS version 2.
    Luks2,
    /// Plain dm-crypt: no header.
    Plain,
    /// TrueCrypt or VeraCrypt (cryptsetup's TCRYPT): open, decrypt, tcryptDump.
    Tcrypt,
    /// BitLocker (read with `bitlkDump`, opened with a passphrase, recovery password,
    /// startup key file or volume key).
    Bitlk,
    /// FileVault2 (CoreStorage; read with `fvault2Dump`, opened with the passphrase or the
    /// volume key).
    Fvault2,
    /// loop-AES (no header: a key file of 1, 64 or 65 keys), as cryptsetup's `loopaesOpen`.
    Loopaes,
}

/// Keyslot KDFs, as cryptsetup's `--pbkdf`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PbkdfKind {
    /// PBKDF2 (the only one LUKS1 has).
    Pbkdf2,
    /// Argon2i.
    Argon2i,
    /// Argon2id (LUKS2 default).
    Argon2id,
}

/// Options with cryptsetup's names and meanings.
#[derive(Args, Debug, Default, Clone)]
pub struct Opts {
    /// Volume type: luks, luks1, luks2, plain, tcrypt, bitlk or loopaes.
    #[arg(short = 'M', long = "type", global = true, value_enum)]
    pub volume_type: Option<VolumeType>,
    /// Cipher specification, e.g. aes-xts-plain64.
    #[arg(short = 'c', long, global = true)]
    pub cipher: Option<String>,
    /// Key size in bits.
    #[arg(short = 's', long, global = true)]
    pub key_size: Option<u32>,
    /// Encryption sector size in bytes (512..4096).
    #[arg(long, global = true)]
    pub sector_size: Option<u32>,
    /// Hash for keyslot PBKDF2/AF (LUKS) or passphrase hashing (plain).
    #[arg(short = 'h', long, global = true)]
    pub hash: Option<String>,
    /// Keyslot KDF.
    #[arg(long, global = true, value_enum)]
    pub pbkdf: Option<PbkdfKind>,
    /// Target time for keyslot KDF calibration, in milliseconds.
    #[arg(short = 'i', long, global = true)]
    pub iter_time: Option<u32>,
    /// Argon2 memory cost in KiB.
    #[arg(long, global = true)]
    pub pbkdf_memory: Option<u32>,
    /// Argon2 parallel threads.
    #[arg(long, global = true)]
    pub pbkdf_parallel: Option<u32>,
    /// Fixed KDF iterations (PBKDF2) or time cost (Argon2), skipping calibration.
    #[arg(long, global = true)]
    pub pbkdf_force_iterations: Option<u32>,
    /// Read the passphrase or key from this file ('-' for standard input); TCRYPT takes
    /// several, key files mixed into the passphrase.
    #[arg(short = 'd', long = "key-file", global = true, action = clap::ArgAction::Append)]
    pub key_files: Vec<PathBuf>,
    /// The one `--key-file` every other action takes ([`Cli::one_key_file`] sets it).
    #[arg(skip)]
    pub key_file: Option<PathBuf>,
    /// Bytes to skip at the start of the key file.
    #[arg(long, global = true)]
    pub keyfile_offset: Option<u64>,
    /// Bytes to read from the key file.
    #[arg(short = 'l', long, global = true)]
    pub keyfile_size: Option<u64>,
    /// New key file for luksAddKey/luksChangeKey is the positional argument; this is the slot.
    #[arg(short = 'S', long, global = true)]
    pub key_slot: Option<u32>,
    /// Detached LUKS header file.
    #[arg(long, global = true)]
    pub header: Option<PathBuf>,
    /// UUID for a new volume (or for luksUUID --uuid).
    #[arg(long, global = true)]
    pub uuid: Option<String>,
    /// LUKS2 label.
    #[arg(long, global = true)]
    pub label: Option<String>,
    /// LUKS2 subsystem.
    #[arg(long, global = true)]
    pub subsystem: Option<String>,
    /// Keyslot priority for `config`: prefer, normal or ignore.
    #[arg(long, global = true)]
    pub priority: Option<String>,
    /// LUKS2 metadata (JSON area + binary header) size, e.g. 16k .. 4m.
    #[arg(long, global = true)]
    pub luks2_metadata_size: Option<String>,
    /// LUKS2 keyslots area size.
    #[arg(long, global = true)]
    pub luks2_keyslots_size: Option<String>,
    /// Use the volume key in this file instead of a keyslot (or as the new key for luksFormat).
    #[arg(long, global = true, alias = "master-key-file")]
    pub volume_key_file: Option<PathBuf>,
    /// open: also add the volume key to a kernel keyring, `KEYRING::KEY` (cryptsetup 2.7:
    /// `@s::%user:NAME`, `%:RING::%logon:NAME`...); of several, the first is used.
    #[arg(long, global = true, value_name = "KEYRING::KEY")]
    pub link_vk_to_keyring: Vec<String>,
    /// Use the volume key held by this `user` key in the kernel keyring (cryptsetup 2.7).
    #[arg(long, global = true, value_name = "KEY")]
    pub volume_key_keyring: Vec<String>,
    /// Header backup file for luksHeaderBackup / luksHeaderRestore.
    #[arg(long, global = true)]
    pub header_backup_file: Option<PathBuf>,
    /// Do not ask for confirmation.
    #[arg(short = 'q', long, global = true)]
    pub batch_mode: bool,
    /// Open read-only.
    #[arg(short = 'r', long, global = true)]
    pub readonly: bool,
    /// Only check the passphrase; do not activate anything.
    #[arg(long, global = true)]
    pub test_passphrase: bool,
    /// open/refresh of a LUKS2 volume: store the activation flags given with it
    /// (--allow-discards, --perf-same_cpu_crypt, --perf-submit_from_crypt_cpus,
    /// --perf-no_read_workqueue, --perf-no_write_workqueue, --integrity-no-journal) in the
    /// header, replacing the stored ones (none given: clears them); later opens use them
    /// without the options. This activation uses only the given flags.
    #[arg(long, global = true)]
    pub persistent: bool,
    /// Use an unbound keyslot (LUKS2).
    #[arg(long, global = true)]
    pub unbound: bool,
    /// luksDump: print the volume key (asks for a passphrase).
    #[arg(long, global = true, alias = "dump-master-key")]
    pub dump_volume_key: bool,
    /// luksDump: print the LUKS2 JSON metadata only.
    #[arg(long, global = true)]
    pub dump_json_metadata: bool,
    /// Plain: start of the data, in 512-byte sectors.
    #[arg(short = 'o', long, global = true)]
    pub offset: Option<u64>,
    /// Plain: IV offset, in 512-byte sectors.
    #[arg(short = 'p', long, global = true)]
    pub skip: Option<u64>,
    /// Plain: size of the mapping, in 512-byte sectors.
    #[arg(short = 'b', long, global = true)]
    pub size: Option<u64>,
    /// Use the given implementation for the data cipher (see `cryptblk ciphers`).
    #[arg(long, global = true)]
    pub cipher_implementation: Option<String>,
    /// Machine-readable output where an action supports it.
    #[arg(long, global = true)]
    pub json: bool,
    /// More output on standard error.
    #[arg(short = 'v', long, global = true)]
    pub verbose: bool,
    /// Print a progress line every this many seconds (long operations), as cryptsetup.
    #[arg(long, global = true, value_name = "SECS")]
    pub progress_frequency: Option<u64>,
    /// Print progress as cryptsetup's JSON lines on standard output (long operations).
    #[arg(long, global = true)]
    pub progress_json: bool,
    /// Device-mapper style debug output (never contains secrets); `--debug-json` is the
    /// same here (cryptsetup's adds its JSON metadata, which luksDump shows).
    #[arg(long, global = true, alias = "debug-json")]
    pub debug: bool,
    /// Integrity options (integritysetup's names; `--integrity` is cryptsetup's too).
    #[command(flatten)]
    pub integrity: IntegrityOpts,
    /// TrueCrypt/VeraCrypt options (cryptsetup's names).
    #[command(flatten)]
    pub tcrypt: TcryptOpts,
    /// LUKS2 token options (the `token` action and unlock by token).
    #[command(flatten)]
    pub token: TokenOpts,
    /// cryptsetup options kept for its command lines (`--test-args`, `--shared`, ...).
    #[command(flatten)]
    pub compat: CompatOpts,
}

/// cryptsetup options that cryptblk takes so cryptsetup's command lines parse; which action
/// takes which is checked up front as cryptsetup checks it (`args_check`). Some change
/// nothing in cryptblk (said below); the rest are refused when the action runs
/// ([`CompatOpts::unsupported`]).
#[derive(Args, Debug, Default, Clone)]
pub struct CompatOpts {
    /// Only check the command line (as cryptsetup does), then exit 0 without doing anything.
    #[arg(long, global = true)]
    pub test_args: bool,
    /// open --type plain: share the device with another mapping (cryptblk never opens a
    /// device exclusively, so this changes nothing).
    #[arg(long, global = true)]
    pub shared: bool,
    /// open: unlock Argon2 keyslots one process at a time, under cryptsetup's global lock
    /// (/run/cryptsetup/LN_memory-hard-access), so parallel opens do not exhaust memory.
    #[arg(long, global = true)]
    pub serialize_memory_hard_pbkdf: bool,
    /// luksFormat/reencrypt: accepted; new volume keys always come from getrandom(2), which
    /// gives what /dev/random gives once the kernel's pool is ready.
    #[arg(long, global = true)]
    pub use_random: bool,
    /// luksFormat/reencrypt: accepted, as --use-random.
    #[arg(long, global = true)]
    pub use_urandom: bool,
    /// open: change the flags of a served volume, as the `refresh` action.
    #[arg(long, global = true)]
    pub refresh: bool,
    /// Accepted; cryptblk's own header and data locks (OFD locks on the device itself, not
    /// cryptsetup's lock files) stay on.
    #[arg(long, global = true)]
    pub disable_locks: bool,
    /// luksFormat/reencrypt: no libblkid probe for (nor wiping of) existing signatures.
    #[arg(long, global = true)]
    pub disable_blkid: bool,
    /// open: the LUKS2 volume key counts as held by the mapping, not the kernel keyring, as
    /// cryptsetup's option means (`status` says "key location: dm-crypt" and `resize` needs
    /// no passphrase); resize: refused for a volume whose key is in the keyring.
    #[arg(long, global = true)]
    pub disable_keyring: bool,
    /// Accepted; cryptblk loads no external token plugins.
    #[arg(long, global = true)]
    pub disable_external_tokens: bool,
    /// Accepted; cryptblk has no password quality check to disable.
    #[arg(long, global = true)]
    pub force_password: bool,
    /// open --type plain with --sector-size over 512: IVs counted in sectors of that size
    /// (not supported yet: refused when the action runs).
    #[arg(long, global = true)]
    pub iv_large_sectors: bool,
    /// luksFormat (LUKS1): align the data at a multiple of SECTORS; with --header, the data
    /// offset itself (LUKS2: refused when the action runs).
    #[arg(long, global = true, value_name = "SECTORS")]
    pub align_payload: Option<u32>,
    /// LUKS2 keyslot area cipher (with --keyslot-key-size).
    #[arg(long, global = true)]
    pub keyslot_cipher: Option<String>,
    /// LUKS2 keyslot area key size in bits (with --keyslot-cipher).
    #[arg(long, global = true, value_name = "BITS")]
    pub keyslot_key_size: Option<u32>,
    /// luksAddKey/luksChangeKey: read the new key from this file (as the positional one).
    #[arg(long, global = true)]
    pub new_keyfile: Option<PathBuf>,
    /// luksAddKey/luksChangeKey: bytes to read from the new key file (0: all).
    #[arg(long, global = true)]
    pub new_keyfile_size: Option<u32>,
    /// luksAddKey/luksChangeKey: bytes to skip in the new key file.
    #[arg(long, global = true)]
    pub new_keyfile_offset: Option<u64>,
    /// luksAddKey: the slot for the new key (then --key-slot names the keyslot to unlock).
    #[arg(long, global = true)]
    pub new_key_slot: Option<u32>,
    /// resize: the new size in bytes (a multiple of 512, units as cryptsetup's: 32m,
    /// 1024S, ...; not with --size). open/reencrypt: use only this many bytes of the device
    /// (not supported yet: refused when the action runs).
    #[arg(long, global = true, value_name = "BYTES")]
    pub device_size: Option<String>,
    /// open/luksResume: how many times a passphrase typed on a terminal is asked for when
    /// it opens no keyslot (default 3; a key file or piped input is read once).
    #[arg(short = 'T', long, global = true)]
    pub tries: Option<u32>,
}

impl CompatOpts {
    /// The first option given that cryptblk takes but does not implement yet.
    pub fn unsupported(&self) -> Option<&'static str> {
        [(self.iv_large_sectors, "--iv-large-sectors")]
            .into_iter()
            .find_map(|(given, name)| given.then_some(name))
    }
}

/// cryptsetup's TCRYPT options; global like cryptsetup's.
#[derive(Args, Debug, Default, Clone)]
pub struct TcryptOpts {
    /// TCRYPT: use the hidden volume's header.
    #[arg(long, global = true)]
    pub tcrypt_hidden: bool,
    /// TCRYPT: system encryption (header in sector 62, system iteration counts).
    #[arg(long, global = true)]
    pub tcrypt_system: bool,
    /// TCRYPT: use the backup header near the end of the device.
    #[arg(long, global = true)]
    pub tcrypt_backup: bool,
    /// TCRYPT: VeraCrypt volumes (ignored: on by default, as in cryptsetup 2.6).
    #[arg(long, global = true)]
    pub veracrypt: bool,
    /// TCRYPT: TrueCrypt volumes only (VeraCrypt headers and iteration counts not tried).
    #[arg(long, global = true)]
    pub disable_veracrypt: bool,
    /// TCRYPT: VeraCrypt Personal Iterations Multiplier.
    #[arg(long, global = true, value_name = "PIM")]
    pub veracrypt_pim: Option<u32>,
}

/// cryptsetup's LUKS2 token options.
#[derive(Args, Debug, Default, Clone)]
pub struct TokenOpts {
    /// Token number: the token to act on, or the only token to unlock with.
    #[arg(long, global = true)]
    pub token_id: Option<u32>,
    /// Unlock with tokens only: no passphrase prompt after them.
    #[arg(long, global = true)]
    pub token_only: bool,
    /// Unlock only with tokens of this type.
    #[arg(long, global = true)]
    pub token_type: Option<String>,
    /// token add|import: replace the token with --token-id.
    #[arg(long, global = true)]
    pub token_replace: bool,
    /// token import|export: read or write the token JSON here ('-': standard input/output).
    #[arg(long, global = true)]
    pub json_file: Option<PathBuf>,
    /// token add: the kernel keyring description of a luks2-keyring token's passphrase.
    #[arg(long, global = true)]
    pub key_description: Option<String>,
    /// The TPM for systemd-tpm2 tokens and `enroll`: a device path or a tpm2-tss TCTI
    /// (`swtpm:host=127.0.0.1,port=2321`); default: $SYSTEMD_TPM2_DEVICE, else /dev/tpmrm0.
    #[arg(long, global = true, value_name = "DEVICE|TCTI")]
    pub tpm2_device: Option<String>,
    /// How long, in seconds, each exchange with a clevis tang server may take in all
    /// (connecting, asking and the whole answer), as systemd's `token-timeout=` (0: no limit);
    /// default 10.
    #[arg(long, global = true, value_name = "SECONDS")]
    pub token_timeout: Option<u64>,
}

/// `token` actions, as cryptsetup's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TokenOp {
    /// Add a luks2-keyring token (--key-description).
    Add,
    /// Remove the token --token-id.
    Remove,
    /// Store a token's JSON (--json-file or standard input).
    Import,
    /// Write a token's JSON (--json-file or standard output).
    Export,
    /// Remove keyslot --key-slot from token --token-id.
    Unassign,
}

/// integritysetup's options (`integrity format|open`); global like cryptsetup's.
#[derive(Args, Debug, Default, Clone)]
pub struct IntegrityOpts {
    /// Integrity algorithm: crc32c (default), crc32, xxhash64, sha1, sha256, blake2b-256,
    /// hmac-sha256, ...
    #[arg(short = 'I', long = "integrity", global = true)]
    pub integrity: Option<String>,
    /// Read the key of a keyed integrity algorithm (hmac-*) from this file.
    #[arg(long, global = true)]
    pub integrity_key_file: Option<PathBuf>,
    /// Size of the integrity key in bytes (default: the whole key file).
    #[arg(long, global = true)]
    pub integrity_key_size: Option<u32>,
    /// Tag size in bytes (default: the algorithm's digest size).
    #[arg(short = 't', long, global = true)]
    pub tag_size: Option<u32>,
    /// Journal size in bytes.
    #[arg(short = 'j', long, global = true)]
    pub journal_size: Option<u64>,
    /// Journal watermark in percent.
    #[arg(long, global = true)]
    pub journal_watermark: Option<u32>,
    /// Journal commit time in milliseconds.
    #[arg(long, global = true)]
    pub journal_commit_time: Option<u32>,
    /// Data sectors per metadata area.
    #[arg(long, global = true)]
    pub interleave_sectors: Option<u32>,
    /// Metadata buffer size in sectors.
    #[arg(long, global = true)]
    pub buffer_sectors: Option<u32>,
    /// Do not wipe the device after format (unwritten blocks fail their tag check).
    #[arg(long, global = true)]
    pub no_wipe: bool,
    /// Open without the journal (direct writes, not crash safe).
    #[arg(short = 'D', long, global = true)]
    pub integrity_no_journal: bool,
    /// Bitmap mode: direct writes, dirty regions recalculated after a crash.
    #[arg(short = 'B', long, global = true)]
    pub integrity_bitmap_mode: bool,
    /// Recovery mode: read-only, tags not checked.
    #[arg(short = 'R', long, global = true)]
    pub integrity_recovery_mode: bool,
    /// Bitmap mode: 512-byte sectors per bitmap bit.
    #[arg(long, global = true)]
    pub bitmap_sectors_per_bit: Option<u64>,
    /// Bitmap mode: bitmap flush interval in milliseconds.
    #[arg(long, global = true)]
    pub bitmap_flush_time: Option<u32>,
    /// Format without `fix_padding` (the layout before kernel 5.4).
    #[arg(long, global = true)]
    pub integrity_legacy_padding: bool,
    /// luksFormat --integrity: do not wipe the device (unwritten sectors fail their tag
    /// check until written).
    #[arg(long, global = true)]
    pub integrity_no_wipe: bool,
    /// Format without `fix_hmac` (tags not salted with the superblock salt).
    #[arg(long, global = true)]
    pub integrity_legacy_hmac: bool,
    /// integrity format|open: keep data alone on this device; superblock, journal and tags
    /// go on the positional (metadata) device.
    #[arg(long, global = true, value_name = "DEVICE")]
    pub data_device: Option<PathBuf>,
    /// integrity open: recalculate tags in the background (reads of blocks not yet
    /// recalculated are not checked); resumes where an interrupted recalculation stopped.
    #[arg(long, global = true)]
    pub integrity_recalculate: bool,
    /// integrity open: recalculate all tags again from the first sector.
    #[arg(long, global = true)]
    pub integrity_recalculate_reset: bool,
    /// integrity format|open: encrypt the journal with this cipher: ctr-aes, cbc-aes,
    /// chacha20 (the kernel's ctr(aes), cbc(aes), chacha20). Not stored on the device:
    /// give it to every open.
    #[arg(long, global = true)]
    pub journal_crypt: Option<String>,
    /// Read the journal encryption key from this file.
    #[arg(long, global = true)]
    pub journal_crypt_key_file: Option<PathBuf>,
    /// Size of the journal encryption key in bytes.
    #[arg(long, global = true)]
    pub journal_crypt_key_size: Option<u32>,
    /// integrity format|open: MAC the journal with this algorithm (hmac-sha256, ...;
    /// the kernel's hmac(sha256)). Recorded in the superblock: required by every open.
    #[arg(long, global = true)]
    pub journal_integrity: Option<String>,
    /// Read the journal MAC key from this file.
    #[arg(long, global = true)]
    pub journal_integrity_key_file: Option<PathBuf>,
    /// Size of the journal MAC key in bytes.
    #[arg(long, global = true)]
    pub journal_integrity_key_size: Option<u32>,
}

/// Actions, named as cryptsetup names them where cryptsetup has them.
#[derive(Subcommand, Debug)]
pub enum Action {
    /// Initialise a LUKS volume.
    #[command(name = "luksFormat")]
    LuksFormat {
        /// Device or image file.
        device: PathBuf,
        /// Key file for the first keyslot (alternative to --key-file).
        #[arg(id = "positional_key_file", value_name = "KEY_FILE")]
        key_file: Option<PathBuf>,
    },
    /// Open a volume: with --test-passphrase only check it.
    #[command(name = "open", alias = "luksOpen")]
    Open(OpenArgs),
    /// Open a loop-AES volume (`open --type loopaes`, cryptsetup's old syntax).
    #[command(name = "loopaesOpen")]
    LoopaesOpen(OpenArgs),
    /// Print a TrueCrypt/VeraCrypt header (asks for the passphrase).
    #[command(name = "tcryptDump")]
    TcryptDump {
        /// Device or image file.
        device: PathBuf,
    },
    /// Print a BitLocker header (with --dump-volume-key, its volume key).
    #[command(name = "bitlkDump")]
    BitlkDump {
        /// Device or image file.
        device: PathBuf,
    },
    /// Print a FileVault2 header (with --dump-volume-key, its volume key).
    #[command(name = "fvault2Dump")]
    Fvault2Dump {
        /// Device or image file.
        device: PathBuf,
    },
    /// Print a LUKS header.
    #[command(name = "luksDump")]
    LuksDump {
        /// Device or header file.
        device: PathBuf,
    },
    /// Add a passphrase or key file to a new keyslot.
    #[command(name = "luksAddKey")]
    LuksAddKey {
        /// Device.
        device: PathBuf,
        /// File with the new key (otherwise asked for / read from stdin).
        new_key_file: Option<PathBuf>,
    },
    /// Remove the keyslot that a passphrase opens.
    #[command(name = "luksRemoveKey")]
    LuksRemoveKey {
        /// Device.
        device: PathBuf,
        /// File with the key to remove.
        #[arg(id = "positional_key_file", value_name = "KEY_FILE")]
        key_file: Option<PathBuf>,
    },
    /// Replace a passphrase.
    #[command(name = "luksChangeKey")]
    LuksChangeKey {
        /// Device.
        device: PathBuf,
        /// File with the new key.
        new_key_file: Option<PathBuf>,
    },
    /// Re-derive a LUKS2 keyslot with new PBKDF parameters (--pbkdf, --iter-time,
    /// --pbkdf-memory, --pbkdf-parallel, --pbkdf-force-iterations, --hash), same passphrase.
    #[command(name = "luksConvertKey")]
    LuksConvertKey {
        /// Device.
        device: PathBuf,
        /// Ignored, as cryptsetup ignores it (the passphrase comes from --key-file or the
        /// terminal).
        #[arg(id = "positional_key_file", value_name = "IGNORED", hide = true)]
        key_file: Option<PathBuf>,
    },
    /// Hold all I/O to a served LUKS volume and wipe its key from memory.
    #[command(name = "luksSuspend")]
    LuksSuspend {
        /// Mapping name.
        name: String,
    },
    /// Unlock a suspended volume again (passphrase, --key-file, --key-slot or
    /// --volume-key-file) and release the held I/O.
    #[command(name = "luksResume")]
    LuksResume {
        /// Mapping name.
        name: String,
    },
    /// Grow or shrink a served crypt volume (default: to the backing device's size less the
    /// data offset); the export tells its clients where its protocol can.
    #[command(name = "resize")]
    Resize {
        /// Mapping name.
        name: String,
    },
    /// Wipe a keyslot by number.
    #[command(name = "luksKillSlot")]
    LuksKillSlot {
        /// Device.
        device: PathBuf,
        /// Keyslot number.
        slot: u32,
        /// File with a key of another slot, for confirmation.
        #[arg(id = "positional_key_file", value_name = "KEY_FILE")]
        key_file: Option<PathBuf>,
    },
    /// Save the LUKS header and keyslot areas to --header-backup-file.
    #[command(name = "luksHeaderBackup")]
    LuksHeaderBackup {
        /// Device.
        device: PathBuf,
    },
    /// Restore the LUKS header from --header-backup-file.
    #[command(name = "luksHeaderRestore")]
    LuksHeaderRestore {
        /// Device.
        device: PathBuf,
    },
    /// Print the UUID, or set it with --uuid.
    #[command(name = "luksUUID")]
    LuksUuid {
        /// Device.
        device: PathBuf,
    },
    /// Exit 0 when the device has a LUKS header (of --type if given), 1 otherwise.
    #[command(name = "isLuks")]
    IsLuks {
        /// Device.
        device: PathBuf,
    },
    /// Wipe all keyslots, making the data unreadable.
    #[command(name = "erase", alias = "luksErase")]
    Erase {
        /// Device.
        device: PathBuf,
    },
    /// Set LUKS2 label, subsystem or keyslot priority.
    #[command(name = "config")]
    Config {
        /// Device.
        device: PathBuf,
    },
    /// Re-encrypt a LUKS2 volume under a new volume key (optionally a new --cipher,
    /// --key-size, --sector-size; LUKS1 offline), encrypt a plain device (--encrypt) or
    /// decrypt a volume (--decrypt) in place, online when it is served, or resume a
    /// reencryption either tool began.
    #[command(name = "reencrypt")]
    Reencrypt {
        /// Device (or the name of the served volume; see --active-name).
        #[arg(required_unless_present = "active_name")]
        device: Option<PathBuf>,
        /// Options of the reencryption.
        #[command(flatten)]
        args: ReencryptArgs,
    },
    /// Repair LUKS2 metadata: rewrite a damaged header copy, remove a conflicting LVM2 label.
    #[command(name = "repair")]
    Repair {
        /// Device.
        device: PathBuf,
    },
    /// Convert between LUKS1 and LUKS2 (--type).
    #[command(name = "convert")]
    Convert {
        /// Device.
        device: PathBuf,
    },
    /// Measure keyslot KDFs and data ciphers in process.
    #[command(name = "benchmark")]
    Benchmark,
    /// List the cipher implementations and which is chosen.
    #[command(name = "ciphers")]
    Ciphers,
    /// Write a new LUKS volume whose data is the plain input (luksFormat options apply).
    #[command(name = "encrypt")]
    Encrypt {
        /// Plain input file or '-' for standard input.
        input: PathBuf,
        /// New volume file or '-' for standard output.
        output: PathBuf,
    },
    /// Stop serving a volume opened with `open` (flushes first); refused while in use.
    #[command(name = "close", alias = "luksClose")]
    Close {
        /// Mapping name.
        name: String,
        /// Close once the last user (NBD client, open of the FUSE file, holder of the ublk
        /// device, vhost-user frontend) has gone; at once if there is none.
        #[arg(long)]
        deferred: bool,
        /// Cancel a previous `close --deferred`.
        #[arg(long)]
        cancel_deferred: bool,
    },
    /// Replace a served volume's daemon by a new process (the installed binary) without the
    /// device going away; not for FUSE exports.
    ///
    /// NBD clients reconnect (new ones wait, never refused),
    /// a vhost-user frontend reconnects, a ublk device stays (user recovery). The old daemon
    /// hands the key over through a pipe only the two share; if the new one fails to start,
    /// the old one serves on and this exits non-zero. ublk: the old daemon exits once the new
    /// one holds the volume (the kernel hands the device over only then); should the new one
    /// fail after that, the device waits with its I/O held until the same open takes it over.
    /// FUSE cannot outlive its daemon: refused (close and reopen instead).
    #[command(name = "upgrade")]
    Upgrade {
        /// Mapping name.
        name: String,
        /// The program to run (default: this cryptblk's own path).
        #[arg(long, value_name = "PATH")]
        binary: Option<PathBuf>,
    },
    /// Show a served volume's table, pipeline, export and counters.
    #[command(name = "status")]
    Status {
        /// Mapping name (optional with `--format prometheus`: every served volume).
        #[arg(required_unless_present = "format")]
        name: Option<String>,
        /// Print the counters in another format: `prometheus` (text exposition 0.0.4, for
        /// node_exporter's textfile collector).
        #[arg(long, value_enum)]
        format: Option<StatusFormat>,
    },
    /// List every served volume: name, export and address, users, pid, state, pipeline.
    #[command(name = "ls")]
    Ls,
    /// Serve every served volume's metrics over HTTP for Prometheus (`GET /metrics`), on a
    /// loopback address only, until killed.
    #[command(name = "metrics")]
    Metrics {
        /// Loopback address and port to listen on (`127.0.0.1:9477`, `[::1]:9477`; port 0
        /// picks a free one, printed on standard output).
        #[arg(long, value_name = "ADDR")]
        listen: String,
    },
    /// Change the crypt pipeline flags of a served volume, live.
    #[command(name = "refresh")]
    Refresh {
        /// Mapping name.
        name: String,
        /// The new flags.
        #[command(flatten)]
        perf: PerfArgs,
    },
    /// Raw device-mapper tables, as dmsetup.
    #[command(subcommand, name = "dm")]
    Dm(DmAction),
    /// dm-verity volumes, as veritysetup.
    #[command(subcommand, name = "verity")]
    Verity(VerityAction),
    /// dm-integrity devices, as integritysetup.
    #[command(subcommand, name = "integrity")]
    Integrity(IntegrityAction),
    /// Reproduce the disk-encryption experiments on a RAM disk: plain vs crypt, queued vs
    /// inline, through the engine, NBD and FUSE+loop, with tables and charts.
    #[command(name = "bench")]
    Bench(BenchArgs),
    /// Manage LUKS2 tokens: add|remove|import|export|unassign.
    #[command(name = "token")]
    Token {
        /// What to do.
        #[arg(value_enum)]
        op: TokenOp,
        /// Device or header file.
        device: PathBuf,
    },
    /// Bind a LUKS2 volume to a tang server as `clevis luks bind ... tang` does (a new
    /// keyslot with a random passphrase and a clevis token that recovers it through the
    /// server), or with --tpm2-device to a TPM2 as `systemd-cryptenroll --tpm2-device` does
    /// (a systemd-tpm2 token sealed to PCR values, optionally with a PIN).
    #[command(name = "enroll")]
    Enroll {
        /// The tang server's URL (http://host[:port]).
        #[arg(long, conflicts_with_all = ["tpm2_pcrs", "tpm2_with_pin"])]
        tang: Option<String>,
        /// TPM2: the PCRs to seal to, `+`- or `,`-separated (as systemd-cryptenroll; default 7).
        #[arg(long, value_name = "PCR[+PCR...]")]
        tpm2_pcrs: Option<String>,
        /// TPM2: also require a PIN (asked twice on a terminal, or read from standard input).
        #[arg(long)]
        tpm2_with_pin: bool,
        /// Trust the server only if this signing key thumbprint (tang-show-keys) is
        /// advertised; otherwise the thumbprints are shown and confirmed (-q trusts them).
        #[arg(long, value_name = "THUMBPRINT")]
        tang_thumbprint: Option<String>,
        /// PKCS#11: the token's RFC 7512 URI (its RSA key wraps the new keyslot's passphrase;
        /// a systemd-pkcs11 token as `systemd-cryptenroll --pkcs11-token-uri` writes).
        #[arg(long, value_name = "URI", conflicts_with_all = ["tang", "tpm2_pcrs", "tpm2_with_pin", "recovery_key"])]
        pkcs11_token_uri: Option<String>,
        /// A new recovery key (printed once on standard output) in a new keyslot with a
        /// systemd-recovery token, as `systemd-cryptenroll --recovery-key`.
        #[arg(long, conflicts_with_all = ["tang", "tpm2_pcrs", "tpm2_with_pin"])]
        recovery_key: bool,
        /// Device or header file.
        device: PathBuf,
    },
    /// Internal: the daemon serving one mapping (reads its spec from standard input).
    #[command(name = "__serve", hide = true)]
    Serve,
    /// Write the decrypted data segment of a volume (open options apply).
    #[command(name = "decrypt")]
    Decrypt {
        /// Volume.
        device: PathBuf,
        /// Plain output file or '-' for standard output.
        output: PathBuf,
    },
}

/// `open`: unlock a volume and serve it.
#[derive(Args, Debug, Clone)]
pub struct OpenArgs {
    /// Device or image file.
    pub device: PathBuf,
    /// Name of the mapping (not needed with --test-passphrase).
    pub name: Option<String>,
    /// Crypt pipeline flags.
    #[command(flatten)]
    pub perf: PerfArgs,
    /// Where to serve the device.
    #[command(flatten)]
    pub export: ExportArgs,
}

/// The crypt pipeline, with cryptsetup's `--perf-*` names. Without any, cryptblk serves
/// inline in both directions (`no_read_workqueue no_write_workqueue`); `--perf-queued` asks
/// for the kernel's default queued model, and the other flags mean what they mean to
/// cryptsetup.
///
/// Flags stored in a LUKS2 header (`open --persistent`, or cryptsetup's) count as given on
/// every open: a stored `--perf-*` flag selects cryptsetup's meaning exactly (stored
/// `no-read-workqueue` alone: reads inline, writes queued), a stored `allow-discards` keeps
/// the inline default. No stored flag can ask for the queued model in both directions (the
/// header has no name for it), so `--perf-queued` cannot be stored; an empty stored set
/// means cryptblk's inline default.
#[derive(Args, Debug, Default, Clone)]
#[command(
    after_help = "Flags stored in a LUKS2 header with --persistent apply to every later open as if \
                  given; --perf-queued cannot be stored (no LUKS2 flag expresses it), and no \
                  stored flag at all means cryptblk's inline default."
)]
pub struct PerfArgs {
    /// Keep crypto work on the CPU that submitted the request.
    #[arg(long = "perf-same_cpu_crypt")]
    pub same_cpu_crypt: bool,
    /// Submit writes from the crypt workers instead of the sorting writer thread.
    #[arg(long = "perf-submit_from_crypt_cpus")]
    pub submit_from_crypt_cpus: bool,
    /// Decrypt reads inline on the submitting thread.
    #[arg(long = "perf-no_read_workqueue")]
    pub no_read_workqueue: bool,
    /// Encrypt writes inline on the submitting thread.
    #[arg(long = "perf-no_write_workqueue")]
    pub no_write_workqueue: bool,
    /// Run the pipeline's worker threads (kcryptd, kcryptd_io, dmcrypt_write) at nice -20,
    /// as dm-crypt's high-priority workqueues (needs CAP_SYS_NICE; without it they keep
    /// their priority and a warning is logged). Like any --perf-* flag, selects the queued
    /// model.
    #[arg(long = "perf-high_priority")]
    pub high_priority: bool,
    /// Use the kernel's default queued model (kcryptd, kcryptd_io, dmcrypt_write); cannot
    /// be stored with --persistent.
    #[arg(long = "perf-queued")]
    pub queued: bool,
    /// Pass discards through to the backing device.
    #[arg(long)]
    pub allow_discards: bool,
}

impl PerfArgs {
    /// The crypt table options these flags stand for.
    ///
    /// No `--perf-*` flag at all means inline in both directions (cryptblk's default). Any
    /// explicit flag gives it cryptsetup's meaning exactly, on top of the kernel's default
    /// queued model: `--perf-no_read_workqueue` alone makes reads inline and leaves writes
    /// queued, as it would with cryptsetup.
    pub fn table_flags(&self) -> Vec<String> {
        self.activation().table_flags()
    }

    /// These flags as the library's activation flags.
    pub fn activation(&self) -> cryptblk_volume::activation::CryptActivation {
        cryptblk_volume::activation::CryptActivation {
            allow_discards: self.allow_discards,
            same_cpu_crypt: self.same_cpu_crypt,
            submit_from_crypt_cpus: self.submit_from_crypt_cpus,
            no_read_workqueue: self.no_read_workqueue,
            no_write_workqueue: self.no_write_workqueue,
            high_priority: self.high_priority,
            queued: self.queued,
        }
    }

    /// Flags from the library's activation flags.
    pub fn from_activation(a: &cryptblk_volume::activation::CryptActivation) -> Self {
        PerfArgs {
            allow_discards: a.allow_discards,
            same_cpu_crypt: a.same_cpu_crypt,
            submit_from_crypt_cpus: a.submit_from_crypt_cpus,
            no_read_workqueue: a.no_read_workqueue,
            no_write_workqueue: a.no_write_workqueue,
            high_priority: a.high_priority,
            queued: a.queued,
        }
    }
}

/// Where a mapping is served. Without --nbd, --fuse, --ublk or --vhost-user: over ublk where
/// /dev/ublk-control is usable (linked as /dev/cryptblk/NAME when root), else over NBD on the
/// Unix socket <runtime dir>/NAME.sock.
#[derive(Args, Debug, Default, Clone)]
pub struct ExportArgs {
    /// Serve over NBD on a Unix socket (unix:PATH, or a path containing '/'), or on TCP at
    /// HOST:PORT or [IPV6]:PORT.
    #[arg(long, value_name = "SOCKET|HOST:PORT")]
    pub nbd: Option<String>,
    /// NBD: clients served at once; more are refused right after they connect (default 512,
    /// which keeps the daemon's descriptors under the usual limit of 1024).
    #[arg(long, value_name = "N", requires = "nbd",
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub max_clients: Option<u32>,
    /// NBD: drop a client that has not finished negotiating within SECS seconds (default 10,
    /// as qemu-nbd).
    #[arg(long, value_name = "SECS", requires = "nbd",
          value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub handshake_timeout: Option<u64>,
    /// NBD: close a connection after SECS seconds without requests (default 0: never, since
    /// the kernel's NBD client can be idle for hours on an unused device).
    #[arg(long, value_name = "SECS", requires = "nbd")]
    pub idle_timeout: Option<u64>,
    /// NBD: TLS through NBD_OPT_STARTTLS, as nbdkit's --tls: off (default), on (offered,
    /// plaintext clients served too) or require.
    #[arg(long, value_name = "off|on|require", requires = "nbd")]
    pub tls: Option<cryptblk_export::nbd::TlsMode>,
    /// NBD: directory holding server-cert.pem, server-key.pem and (for --tls-verify-peer)
    /// ca-cert.pem, as nbdkit's --tls-certificates.
    #[arg(long, value_name = "DIR", requires = "nbd")]
    pub tls_certificates: Option<PathBuf>,
    /// NBD: clients must present a certificate signed by DIR/ca-cert.pem.
    #[arg(long, requires = "nbd")]
    pub tls_verify_peer: bool,
    /// NBD: allow plaintext clients on a TCP address that is not loopback (without it, such
    /// an address needs --tls require).
    #[arg(long, requires = "nbd")]
    pub allow_insecure_tcp: bool,
    /// Serve as the file <DIR>/disk on a FUSE mount (losetup works on it).
    #[arg(long, value_name = "DIR")]
    pub fuse: Option<PathBuf>,
    /// Serve as the kernel block device /dev/ublkbN (needs the ublk_drv module), linked as
    /// /dev/cryptblk/NAME when running as root.
    #[arg(long)]
    pub ublk: bool,
    /// ublk: hardware queues, each served by its own thread (default: one per CPU).
    /// vhost-user: virtqueues offered, each served by its own thread (1-64, default 1).
    #[arg(long, value_name = "N")]
    pub queues: Option<u16>,
    /// ublk: requests in flight per queue (default 64).
    #[arg(long, value_name = "N", requires = "ublk")]
    pub queue_depth: Option<u16>,
    /// Serve as a vhost-user-blk device on the Unix socket SOCKET (created 0600), which a
    /// hypervisor attaches as a VM's virtio-blk disk (QEMU: -chardev socket,path=SOCKET
    /// -device vhost-user-blk-pci; guest RAM must be shared memory).
    #[arg(long, value_name = "SOCKET")]
    pub vhost_user: Option<PathBuf>,
    /// Stay in the foreground instead of leaving a daemon.
    #[arg(long)]
    pub foreground: bool,
}

/// `verity`: read-only volumes checked against a hash tree, as veritysetup.
#[derive(Subcommand, Debug)]
pub enum VerityAction {
    /// Compute the hash tree of <DATA> onto <HASH_DEVICE> and print the root hash.
    Format {
        /// Data device or image.
        data: PathBuf,
        /// Hash device or image (may be the data file with --hash-offset).
        #[arg(id = "hash_device", value_name = "HASH_DEVICE")]
        hash_device: PathBuf,
        /// Tree parameters.
        #[command(flatten)]
        tree: VerityTreeArgs,
    },
    /// Check every block of <DATA> against the tree and <ROOT_HASH> (exit 0 when intact).
    Verify {
        /// Data device or image.
        data: PathBuf,
        /// Hash device or image.
        #[arg(id = "hash_device", value_name = "HASH_DEVICE")]
        hash_device: PathBuf,
        /// Root hash (hex); not with --root-hash-file.
        root_hash: Option<String>,
        /// Where the superblock and tree start on the hash device, in bytes.
        #[arg(long, default_value_t = 0)]
        hash_offset: u64,
        /// Read the root hash (hex) from this file, as veritysetup's option.
        #[arg(long, value_name = "FILE")]
        root_hash_file: Option<PathBuf>,
        /// The tree's parameters, for a hash device without a superblock.
        #[command(flatten)]
        params: VerityParamArgs,
    },
    /// Print the superblock of a hash device.
    Dump {
        /// Hash device or image.
        #[arg(id = "hash_device", value_name = "HASH_DEVICE")]
        hash_device: PathBuf,
        /// Where the superblock starts, in bytes.
        #[arg(long, default_value_t = 0)]
        hash_offset: u64,
        /// The volume's FEC parity (adds veritysetup's FEC lines).
        #[command(flatten)]
        fec: VerityFecArgs,
    },
    /// Stop serving a verity volume.
    Close {
        /// Mapping name.
        name: String,
    },
    /// Show an open verity volume as `veritysetup status` does.
    Status {
        /// Mapping name.
        name: String,
    },
    /// Serve <DATA> read-only, every read checked against the tree (EIO on corruption).
    Open {
        /// Data device or image.
        data: PathBuf,
        /// Mapping name.
        name: String,
        /// Hash device or image.
        #[arg(id = "hash_device", value_name = "HASH_DEVICE")]
        hash_device: PathBuf,
        /// Root hash (hex); not with --root-hash-file.
        root_hash: Option<String>,
        /// Where the superblock and tree start on the hash device, in bytes.
        #[arg(long, default_value_t = 0)]
        hash_offset: u64,
        /// Read the root hash (hex) from this file, as veritysetup's option.
        #[arg(long, value_name = "FILE")]
        root_hash_file: Option<PathBuf>,
        /// The tree's parameters, for a hash device without a superblock.
        #[command(flatten)]
        params: VerityParamArgs,
        /// Where to serve it.
        #[command(flatten)]
        export: ExportArgs,
    },
}

/// Hash tree parameters of `verity verify`/`open` (veritysetup's names; the hash is
/// `--hash`): used with `--no-superblock`; a superblock's own values count otherwise, as in
/// veritysetup.
#[derive(Args, Debug, Clone)]
pub struct VerityParamArgs {
    /// The tree's geometry.
    #[command(flatten)]
    pub geometry: VerityGeometryArgs,
    /// Salt in hex, or '-' for none (the default without a superblock).
    #[arg(long)]
    pub salt: Option<String>,
    /// The hash device has no superblock: the tree starts at --hash-offset.
    #[arg(long)]
    pub no_superblock: bool,
    /// FEC parity that corrects corrupted blocks.
    #[command(flatten)]
    pub fec: VerityFecArgs,
}

/// Reed-Solomon parity of a verity volume (veritysetup's `--fec-*` options).
#[derive(Args, Debug, Clone)]
pub struct VerityFecArgs {
    /// Device or image holding the FEC parity.
    #[arg(long, value_name = "DEVICE")]
    pub fec_device: Option<PathBuf>,
    /// Where the parity starts on the FEC device, in bytes.
    #[arg(long, default_value_t = 0)]
    pub fec_offset: u64,
    /// Parity bytes per 255-byte Reed-Solomon codeword (2..=24).
    #[arg(long, default_value_t = 2)]
    pub fec_roots: u32,
}

/// A hash tree's geometry, as veritysetup names it: shared by `verity format` and by
/// `verify`/`open --no-superblock`.
#[derive(Args, Debug, Clone)]
pub struct VerityGeometryArgs {
    /// Format type: 1 (salt first, padded digests; default) or 0 (Chrome OS).
    #[arg(long = "format", default_value_t = 1)]
    pub hash_type: u32,
    /// Data block size in bytes.
    #[arg(long, default_value_t = 4096)]
    pub data_block_size: u32,
    /// Hash block size in bytes.
    #[arg(long, default_value_t = 4096)]
    pub hash_block_size: u32,
    /// Number of data blocks (default: the whole data device).
    #[arg(long)]
    pub data_blocks: Option<u64>,
}

/// Hash tree parameters of `verity format` (veritysetup's names; the hash is `--hash`).
#[derive(Args, Debug, Clone)]
pub struct VerityTreeArgs {
    /// The tree's geometry.
    #[command(flatten)]
    pub geometry: VerityGeometryArgs,
    /// Salt in hex, or '-' for none (default: 32 random bytes).
    #[arg(long)]
    pub salt: Option<String>,
    /// Where the superblock and tree start on the hash device, in bytes.
    #[arg(long, default_value_t = 0)]
    pub hash_offset: u64,
    /// Do not write a superblock.
    #[arg(long)]
    pub no_superblock: bool,
    /// Also write the root hash (hex, no newline) to this file, as veritysetup does.
    #[arg(long, value_name = "FILE")]
    pub root_hash_file: Option<PathBuf>,
    /// Also write FEC parity over the data and the tree.
    #[command(flatten)]
    pub fec: VerityFecArgs,
}

/// `integrity`: dm-integrity devices, as integritysetup.
#[derive(Subcommand, Debug)]
pub enum IntegrityAction {
    /// Format a device: superblock, empty journal, then (unless --no-wipe) zeros with valid
    /// tags everywhere.
    Format {
        /// Device or image.
        device: PathBuf,
    },
    /// Serve the device, every read checked against its tag.
    Open {
        /// Device or image.
        device: PathBuf,
        /// Mapping name.
        name: String,
        /// Where to serve it.
        #[command(flatten)]
        export: ExportArgs,
    },
    /// Stop serving (flushes and commits the journal first).
    Close {
        /// Mapping name.
        name: String,
    },
    /// Show an open device as `integritysetup status` does (plus the mismatch counter).
    Status {
        /// Mapping name.
        name: String,
    },
    /// Print the superblock as `integritysetup dump` does.
    Dump {
        /// Device or image.
        device: PathBuf,
    },
}

/// `dm`: raw device-mapper tables, as dmsetup.
#[derive(Subcommand, Debug)]
pub enum DmAction {
    /// Create a mapping from a table and serve it.
    Create {
        /// Mapping name.
        name: String,
        /// The table (keyless tables only; crypt keys go in --table-file or stdin).
        #[command(flatten)]
        table: TableArgs,
        /// A lower mapping to create first, in the same daemon, from a table file ('-' for
        /// standard input). Repeatable; created in the order given, each able to name the
        /// ones before it (and the top table all of them) as NAME or /dev/mapper/NAME, as
        /// `dmsetup create` of a stack does in the kernel.
        #[arg(long = "lower", value_name = "NAME=TABLE_FILE")]
        lower: Vec<String>,
        /// Where to serve it.
        #[command(flatten)]
        export: ExportArgs,
    },
    /// Stop serving a mapping (flushes first). The top of a `--lower` stack takes its lower
    /// mappings with it; a lower mapping is refused (busy) while another one uses it.
    Remove {
        /// Mapping name.
        name: String,
    },
    /// Print the live table (keys hidden unless --showkeys).
    Table {
        /// Mapping name.
        name: String,
        /// Show crypt keys.
        #[arg(long)]
        showkeys: bool,
    },
    /// Stage a new table; it goes live at the next resume.
    Reload {
        /// Mapping name.
        name: String,
        /// The table.
        #[command(flatten)]
        table: TableArgs,
    },
    /// Drain in-flight I/O and hold new I/O.
    Suspend {
        /// Mapping name.
        name: String,
    },
    /// Swap in a staged table, if any, and release held I/O.
    Resume {
        /// Mapping name.
        name: String,
    },
    /// Print the status line of each target.
    Status {
        /// Mapping name.
        name: String,
    },
    /// Send a message to the target covering SECTOR, as `dmsetup message` (crypt: `key wipe`,
    /// `key set -` with the hex key on standard input, both while suspended).
    Message {
        /// Mapping name.
        name: String,
        /// A sector inside the target the message is for.
        sector: u64,
        /// The message words.
        #[arg(required = true, num_args = 1.., allow_hyphen_values = true)]
        message: Vec<String>,
    },
    /// List the mappings being served.
    Ls,
}

/// A dm table: inline for keyless tables, else from a file or standard input.
#[derive(Args, Debug, Default, Clone)]
pub struct TableArgs {
    /// The table text (no crypt keys: they would be visible in the process list).
    #[arg(long)]
    pub table: Option<String>,
    /// Read the table from this file ('-' for standard input).
    #[arg(long)]
    pub table_file: Option<PathBuf>,
}

/// `bench` options.
#[derive(Args, Debug, Default, Clone)]
pub struct BenchArgs {
    /// Smoke run (~30 s): small region, short runs, one repeat, fio verification on.
    #[arg(long)]
    pub quick: bool,
    /// Seconds per run (default 0.7; quick 0.2).
    #[arg(long)]
    pub runtime: Option<f64>,
    /// Repeats per cell, alternating configurations (default 5); medians are reported, and a
    /// spread of the plain rows' repeats over 10% marks the run noisy.
    #[arg(long)]
    pub repeats: Option<u32>,
    /// Configurations to run (repeatable; a trailing '*' matches a prefix).
    #[arg(long = "config")]
    pub configs: Vec<String>,
    /// Workloads to run (repeatable).
    #[arg(long = "workload")]
    pub workloads: Vec<String>,
    /// Transports to run: inproc, nbd, loop (repeatable); or, in the kernel lab VM (LAB_DIR,
    /// default ../shared/lab) beside the guest kernel's dm-crypt: ublk, vhost-user.
    #[arg(long = "transport")]
    pub transports: Vec<String>,
    /// Also measure nbdkit's luks filter and qemu-nbd with a LUKS image.
    #[arg(long)]
    pub peers: bool,
    /// CPUs the servers, peers and fio run on: `last` (default: one CPU, so queue-depth-1
    /// runs do not swing with where the scheduler puts client and server), a list such as
    /// `1` or `0-1`, or `all` to let the scheduler place them.
    #[arg(long, value_name = "CPUS", default_value = "last", value_parser = cryptblk_bench::placement::CpuPlacement::parse)]
    pub cpus: cryptblk_bench::placement::CpuPlacement,
    /// Run 4 KiB readwrite this many seconds and flip queued -> inline halfway.
    #[arg(long, value_name = "SECONDS")]
    pub live: Option<f64>,
    /// Write the JSON report here.
    #[arg(long = "json-file", alias = "json-out", value_name = "FILE")]
    pub json_file: Option<PathBuf>,
    /// Write the SVG chart here.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Write a markdown report here.
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
    /// RAM disk size per configuration (bytes, or with k/m/g).
    #[arg(long)]
    pub device_size: Option<String>,
    /// Instead of the dm-crypt matrix: the dm-integrity/dm-verity overhead table (4 KiB
    /// sequential/random write/read per configuration, overhead vs plain); in process, or
    /// with --transport nbd through the NBD export driven by fio (both: one table each).
    #[arg(long)]
    pub integrity_report: bool,
    /// Instead of the dm-crypt matrix: offline re-key throughput of a RAM-backed LUKS2 image
    /// (--device-size, default 1 GiB), cryptblk beside `cryptsetup reencrypt
    /// --force-offline-reencrypt`, alternating, medians of --repeats (default 3); the
    /// resilience modes to compare, comma-separated (default checksum).
    #[arg(
        long,
        value_name = "RESILIENCE",
        num_args = 0..=1,
        default_missing_value = "checksum",
        value_delimiter = ','
    )]
    pub reencrypt: Option<Vec<String>>,
}

/// Reproduce the disk-encryption experiments on a RAM disk: plain vs crypt, queued vs inline,
/// through the engine, NBD and FUSE+loop, with tables and charts.
// `cryptblk bench ...` is parsed by this grammar alone: bench's options and `--json`, without
// the volume options the other actions share (global in `Cli`, where `--pbkdf` or `--hash`
// would be listed by `bench --help` and mean nothing). `cryptblk --json bench` still parses
// through `Cli`. The doc line above is the help's description.
#[derive(Parser, Debug)]
#[command(
    name = "bench",
    bin_name = "cryptblk bench",
    disable_help_subcommand = true
)]
pub struct BenchCli {
    /// Print the report as JSON on standard output.
    #[arg(long)]
    pub json: bool,
    /// The benchmark's options.
    #[command(flatten)]
    pub args: BenchArgs,
}

impl BenchCli {
    /// The `bench` action as [`Cli`] would carry it.
    pub fn into_cli(self) -> Cli {
        Cli {
            help: None,
            opts: Opts {
                json: self.json,
                ..Opts::default()
            },
            action: Action::Bench(self.args),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(p: PerfArgs) -> Vec<String> {
        p.table_flags()
    }

    #[test]
    fn no_perf_flag_means_inline_both_ways() {
        assert_eq!(
            flags(PerfArgs::default()),
            ["no_read_workqueue", "no_write_workqueue"]
        );
    }

    #[test]
    fn queued_is_the_kernel_default() {
        let p = PerfArgs {
            queued: true,
            ..Default::default()
        };
        assert!(flags(p).is_empty());
    }

    #[test]
    fn explicit_flags_keep_cryptsetup_meaning() {
        let p = PerfArgs {
            no_read_workqueue: true,
            ..Default::default()
        };
        assert_eq!(flags(p), ["no_read_workqueue"]);
        let p = PerfArgs {
            same_cpu_crypt: true,
            allow_discards: true,
            ..Default::default()
        };
        assert_eq!(flags(p), ["allow_discards", "same_cpu_crypt"]);
    }

    #[test]
    fn cryptsetup_style_command_lines_parse() {
        let cli = Cli::try_parse_from([
            "cryptblk",
            "-q",
            "luksFormat",
            "--type",
            "luks2",
            "-h",
            "sha512",
            "-d",
            "key",
            "dev",
        ])
        .unwrap();
        assert!(cli.opts.batch_mode);
        assert_eq!(cli.opts.hash.as_deref(), Some("sha512"));
        assert_eq!(cli.opts.volume_type, Some(VolumeType::Luks2));
        assert!(matches!(cli.action, Action::LuksFormat { .. }));
        assert!(Cli::try_parse_from(["cryptblk", "luksDump", "--bogus", "x"]).is_err());
    }

    #[test]
    fn bench_has_its_own_options() {
        use clap::CommandFactory;
        let help = BenchCli::command().render_long_help().to_string();
        assert!(
            help.contains("--repeats") && help.contains("--json"),
            "{help}"
        );
        for volume_option in [
            "--pbkdf",
            "--hash",
            "--iter-time",
            "--cipher",
            "--integrity <",
        ] {
            assert!(!help.contains(volume_option), "{volume_option} in {help}");
        }
        let b = BenchCli::try_parse_from(["bench", "--quick", "--json", "--config", "plain"])
            .unwrap()
            .into_cli();
        assert!(b.opts.json);
        assert!(matches!(&b.action, Action::Bench(a) if a.quick && a.configs == ["plain"]));
        assert!(BenchCli::try_parse_from(["bench", "--pbkdf", "pbkdf2"]).is_err());
        // Global options before the action still reach bench through the main grammar.
        let cli = Cli::try_parse_from(["cryptblk", "--json", "bench", "--quick"]).unwrap();
        assert!(cli.opts.json && matches!(cli.action, Action::Bench(_)));
    }
}

/// Hotzone protection of a reencryption, as cryptsetup's `--resilience`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ResilienceArg {
    /// A hash per block of the hotzone's old data (the default).
    Checksum,
    /// A copy of the hotzone's old data.
    Journal,
    /// No protection: a crash mid-run loses data.
    None,
}

/// Options of `reencrypt` (cryptsetup's names).
#[derive(Args, Debug, Default, Clone)]
pub struct ReencryptArgs {
    /// Hotzone protection: checksum (default), journal or none.
    #[arg(long, value_enum)]
    pub resilience: Option<ResilienceArg>,
    /// Hash of checksum resilience (default sha256).
    #[arg(long)]
    pub resilience_hash: Option<String>,
    /// Largest hotzone (bytes, or with a K/M/G unit).
    #[arg(long, value_name = "BYTES")]
    pub hotzone_size: Option<String>,
    /// Only write the reencryption metadata; run it later with --resume-only.
    #[arg(long)]
    pub init_only: bool,
    /// Only resume a reencryption already in progress.
    #[arg(long)]
    pub resume_only: bool,
    /// Reencrypt offline even where a cryptblk daemon could do it online (a served volume
    /// is then refused as busy); also allows a sector size increase offline.
    #[arg(long)]
    pub force_offline_reencrypt: bool,
    /// The served volume to reencrypt online, by its mapping name (cryptsetup's option).
    #[arg(long, value_name = "NAME")]
    pub active_name: Option<String>,
    /// Encrypt a plain device in place (with --reduce-device-size, or a detached --header).
    #[arg(long, visible_alias = "new")]
    pub encrypt: bool,
    /// Decrypt a LUKS2 device in place (its detached --header).
    #[arg(long)]
    pub decrypt: bool,
    /// Make room for the header by shrinking the data by this much (encryption; the data
    /// moves by half of it).
    #[arg(long, value_name = "BYTES")]
    pub reduce_device_size: Option<String>,
    /// LUKS1 only: reencryption block size in MiB (1-64, default 4).
    #[arg(long, value_name = "MiB")]
    pub block_size: Option<u32>,
    /// LUKS1 only: keep the volume key, re-wrap the keyslots only (no data rewritten).
    #[arg(long)]
    pub keep_key: bool,
    /// LUKS1 only, accepted for cryptsetup's sake: cryptblk always logs and syncs every block.
    #[arg(long)]
    pub write_log: bool,
    /// LUKS1 only, accepted for cryptsetup's sake: cryptblk always syncs every block.
    #[arg(long)]
    pub use_fsync: bool,
    /// LUKS1 only, accepted for cryptsetup's sake (buffered I/O with a sync per block).
    #[arg(long)]
    pub use_directio: bool,
}

/// `status --format`: another rendering of the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StatusFormat {
    /// Prometheus' text exposition format 0.0.4.
    Prometheus,
}
