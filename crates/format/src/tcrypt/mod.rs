//! TrueCrypt and VeraCrypt volumes (cryptsetup's TCRYPT type): header search, key derivation
//! and the cipher chains, read-only as cryptsetup treats them (it never writes these headers).
//!
//! A header is 512 bytes: a 64-byte salt, then 448 bytes encrypted with a key derived from
//! the passphrase (mixed with key files) by PBKDF2 or Argon2id. No field says which hash,
//! cipher chain or mode made it, so unlocking tries every allowed combination until the
//! decrypted magic (`TRUE` or `VERA`) and both CRC32s check out. The layouts and iteration
//! counts follow the TrueCrypt and VeraCrypt volume format specifications.

mod chain;
mod header;
mod kdf;

pub use chain::{ChainMode, CipherChain, TCRYPT_CHAINS};
pub use header::{TcryptHeader, HEADER_LEN};
pub use kdf::{pool_keyfiles, Prf};

use crate::error::{FormatError, Result};
use crate::hdrio::HeaderIo;
use cryptblk_cipher::SecretBytes;

/// Where the hidden volume's header sits in TrueCrypt 6.0 and later (and VeraCrypt).
pub const HIDDEN_HEADER_OFFSET: u64 = 65536;
/// Where the hidden volume's header sat before TrueCrypt 6.0: 1536 bytes before the end.
pub const HIDDEN_HEADER_OFFSET_OLD: u64 = 1536;
/// The backup of the normal header: 128 KiB before the end.
pub const BACKUP_HEADER_OFFSET: u64 = 131072;
/// The backup of the hidden header: 64 KiB before the end.
pub const HIDDEN_BACKUP_HEADER_OFFSET: u64 = 65536;
/// System encryption keeps its header in the last sector of the first track (sector 62).
pub const SYSTEM_HEADER_OFFSET: u64 = 62 * 512;

/// What cryptsetup's TCRYPT options ask for (`--tcrypt-hidden`, `--veracrypt-pim`, ...).
pub struct TcryptParams {
    /// The passphrase (may be empty when key files are given).
    pub passphrase: SecretBytes,
    /// The contents of each `--key-file`, in order (at most 1 MiB of each is used).
    pub keyfiles: Vec<SecretBytes>,
    /// `--hash`: only this PRF (cryptsetup's names: `sha512`, `ripemd160`, `argon2id`, ...).
    pub hash: Option<String>,
    /// `--cipher`: only chains whose first cipher is this, or exactly this chain.
    pub cipher: Option<String>,
    /// `--veracrypt-pim`: a VeraCrypt Personal Iterations Multiplier (0: the defaults).
    pub pim: u32,
    /// Off with `--disable-veracrypt`: then only TrueCrypt iteration counts are tried.
    pub veracrypt: bool,
    /// `--tcrypt-hidden`: the hidden volume's header.
    pub hidden: bool,
    /// `--tcrypt-system`: system encryption (header in sector 62, system iteration counts).
    pub system: bool,
    /// `--tcrypt-backup`: the backup header near the end of the device.
    pub backup: bool,
}

impl TcryptParams {
    /// cryptsetup's defaults for a passphrase: VeraCrypt on, every hash and chain, the
    /// normal header.
    pub fn new(passphrase: SecretBytes) -> Self {
        TcryptParams {
            passphrase,
            keyfiles: Vec::new(),
            hash: None,
            cipher: None,
            pim: 0,
            veracrypt: true,
            hidden: false,
            system: false,
            backup: false,
        }
    }
}

/// An unlocked TCRYPT volume: its decrypted header, how it was opened and its keys.
pub struct TcryptVolume {
    /// The decrypted header.
    pub header: TcryptHeader,
    /// The PRF whose derived key decrypted the header.
    pub prf: Prf,
    /// The cipher chain and mode of header and data.
    pub chain: &'static CipherChain,
    /// The volume key as cryptsetup reports it: each cipher's dm-crypt key, one after the
    /// other ([`CipherChain::volume_key`], [`CipherChain::volume_key_len`] bytes).
    pub volume_key: SecretBytes,
    /// Byte offset of the header that opened.
    pub header_offset: u64,
    /// Size of the device in bytes.
    pub device_size: u64,
    /// Whether the volume was opened as system encryption.
    pub system: bool,
}

/// One layer of the data mapping: a dm-crypt cipher specification and its key.
pub struct TcryptLayer {
    /// dm-crypt cipher specification (`serpent-xts-plain64`, `aes-lrw-benbi`).
    pub spec: String,
    /// The key of this layer.
    pub key: SecretBytes,
}

impl TcryptVolume {
    /// Start of the encrypted data in 512-byte sectors from the start of the device.
    pub fn data_offset_sectors(&self) -> u64 {
        self.header
            .data_offset_bytes(self.device_size, self.header_offset)
            / 512
    }

    /// Length of the encrypted data in 512-byte sectors.
    pub fn data_size_sectors(&self) -> u64 {
        self.header
            .data_size_bytes(self.device_size, self.header_offset)
            / 512
    }

    /// The IV offset of the data mapping. XTS counts sectors from the start of the device
    /// (or drive, for system encryption); LRW counts blocks from the start of the data; the
    /// legacy CBC modes count from the header's master key offset, which formats that
    /// record none put at the second sector (as cryptsetup does, for hidden volumes too).
    pub fn iv_offset_sectors(&self) -> u64 {
        match self.chain.mode {
            ChainMode::Xts => self.data_offset_sectors(),
            ChainMode::Lrw => 0,
            _ if self.header.mk_offset == 0 => HEADER_LEN as u64 / 512,
            _ => self.header.mk_offset / 512,
        }
    }

    /// The dm-crypt layers in the order a read applies them (outermost cipher first), as
    /// cryptsetup stacks one dm-crypt device per cipher; `None` for the legacy cascades and
    /// TrueCrypt's Blowfish, which the kernel cannot map.
    pub fn layers(&self) -> Option<Vec<TcryptLayer>> {
        self.chain.layers(self.header.keys.as_bytes())
    }

    /// The whole data chain as one sector cipher with this volume's IV offset (every mode,
    /// the legacy cascades included); `implementation` as in [`SectorOptions`].
    ///
    /// [`SectorOptions`]: cryptblk_cipher::SectorOptions
    pub fn data_cipher(
        &self,
        implementation: Option<String>,
    ) -> Result<Box<dyn cryptblk_cipher::SectorCipher>> {
        self.chain.data_cipher(
            self.header.keys.as_bytes(),
            self.iv_offset_sectors(),
            implementation,
        )
    }

    /// The `tcryptDump` text; with `volume_key` the key-dump form of `--dump-volume-key`.
    pub fn dump(&self, device_name: &str, volume_key: bool) -> String {
        let kind = if self.header.is_veracrypt() {
            "VERACRYPT"
        } else {
            "TCRYPT"
        };
        let mut s = format!("{kind} header information for {device_name}\n");
        if volume_key {
            s.push_str(&format!("Cipher chain:  \t{}\n", self.chain.name));
            s.push_str(&format!("Cipher mode:   \t{}\n", self.chain.mode.spec()));
            s.push_str(&format!(
                "Payload offset:\t{}\n",
                self.data_offset_sectors()
            ));
            s.push_str(&format!("MK bits:       \t{}\n", self.volume_key.len() * 8));
            s.push_str("MK dump:\t");
            for (i, chunk) in self.volume_key.as_bytes().chunks(16).enumerate() {
                if i > 0 {
                    s.push_str("\n\t\t");
                }
                for b in chunk {
                    s.push_str(&format!("{b:02x} "));
                }
            }
            s.push('\n');
            return s;
        }
        s.push_str(&format!("Version:       \t{}\n", self.header.version));
        s.push_str(&format!(
            "Driver req.:\t{:x}.{:x}\n",
            self.header.tc_version >> 8,
            self.header.tc_version & 0xff
        ));
        s.push_str(&format!("Sector size:\t{}\n", self.header.sector_size()));
        s.push_str(&format!(
            "MK offset:\t{}\n",
            // Formats that record no offset show the header's end, even for a hidden volume.
            if self.header.mk_offset == 0 {
                HEADER_LEN as u64
            } else {
                self.header.mk_offset
            }
        ));
        s.push_str(&format!("PBKDF2 hash:\t{}\n", self.prf.name()));
        s.push_str(&format!("Cipher chain:\t{}\n", self.chain.name));
        s.push_str(&format!("Cipher mode:\t{}\n", self.chain.mode.spec()));
        s.push_str(&format!("MK bits:       \t{}\n", self.volume_key.len() * 8));
        s
    }
}

/// The header offsets to try for `params`, relative to the start of the device.
fn header_offsets(params: &TcryptParams, device_size: u64) -> Vec<u64> {
    let from_end = |n: u64| device_size.checked_sub(n);
    let mut v = Vec::new();
    if params.system {
        // System encryption has no hidden header of its own here; the backup sits behind
        // the first track too.
        v.push(SYSTEM_HEADER_OFFSET);
    } else if params.hidden {
        if params.backup {
            v.extend(from_end(HIDDEN_BACKUP_HEADER_OFFSET));
        } else {
            v.push(HIDDEN_HEADER_OFFSET);
            v.extend(from_end(HIDDEN_HEADER_OFFSET_OLD));
        }
    } else if params.backup {
        v.extend(from_end(BACKUP_HEADER_OFFSET));
    } else {
        v.push(0);
    }
    v.retain(|o| {
        o.checked_add(HEADER_LEN as u64)
            .is_some_and(|end| end <= device_size)
    });
    v
}

/// Looks for the header `params` describe on `io` and decrypts it with every allowed
/// combination of PRF, iteration count, cipher chain and mode.
///
/// Errors: an unknown `--hash` or `--cipher` is an invalid parameter (exit 1); a device too
/// small for the header, or no combination that decrypts it, is cryptsetup's "No device
/// header detected with this passphrase." (exit 2).
pub fn unlock(io: &dyn HeaderIo, params: &TcryptParams) -> Result<TcryptVolume> {
    let prfs = kdf::candidates(params)?;
    let chains = chain::candidates(params.cipher.as_deref())?;
    let device_size = io
        .size()
        .map_err(|e| FormatError::io("getting device size", e))?;
    let password = kdf::password(params)?;
    for offset in header_offsets(params, device_size) {
        let mut raw = [0u8; HEADER_LEN];
        io.read_at(offset, &mut raw)
            .map_err(|e| FormatError::io("reading TCRYPT header", e))?;
        for (prf, iterations) in &prfs {
            let key = prf.derive(password.as_bytes(), &raw[..64], *iterations)?;
            for chain in &chains {
                if let Some(header) = chain.decrypt_header(key.as_bytes(), &raw, params.veracrypt) {
                    let volume_key = chain.volume_key(header.keys.as_bytes());
                    return Ok(TcryptVolume {
                        header,
                        prf: *prf,
                        chain,
                        volume_key,
                        header_offset: offset,
                        device_size,
                        system: params.system,
                    });
                }
            }
        }
    }
    Err(FormatError::WrongPassphrase)
}

/// The message cryptsetup prints when no header decrypts (exit code 2).
pub const NO_HEADER: &str = "No device header detected with this passphrase.";
