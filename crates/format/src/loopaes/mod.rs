//! loop-AES key files, as cryptsetup's `loopaesOpen` reads them (cryptsetup's
//! `lib/loopaes/`).
//!
//! A loop-AES volume has no header: the key file is everything. Its facts (cryptsetup 2.6
//! man page and behaviour):
//!
//! - The file is text: keys separated by end-of-line (`\n` or `\r`; NUL bytes separate too
//!   and empty lines are skipped). Every key must be terminated, so the last line needs its
//!   newline. 1 key is single-key mode (`<cipher>-cbc-plain64`), 64 keys multi-key v2 and 65
//!   keys multi-key v3 (`<cipher>:64-cbc-lmk`, the 65th key seeding the `lmk` IV). All keys
//!   have the same non-zero length; anything else is "Incompatible loop-AES keyfile
//!   detected.".
//! - Each key line is hashed on its own into a key of the volume's key size (`--key-size`,
//!   256 bits by default): sha256 for 128-bit keys, sha384 for 192, sha512 for 256, truncated
//!   to the key size; `--hash` overrides the choice. The first byte of every derived key is
//!   then XORed with 0x55 for 64 keys or 0xF4 for 65 keys (nothing for one key). The dm-crypt
//!   key is the derived keys concatenated.
//! - A GPG-encrypted key file (`BEGIN PGP MESSAGE` in its first 100 bytes) is refused: it is
//!   decrypted outside (`gpg --decrypt KEYFILE | cryptblk ... --key-file -`).

use crate::error::{FormatError, Result};
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;

/// cryptsetup's default loop-AES cipher.
pub const DEFAULT_CIPHER: &str = "aes";
/// cryptsetup's default loop-AES key size in bits (`--with-loopaes-keybits`, 256).
pub const DEFAULT_KEY_BITS: u32 = 256;
/// The most keys a key file holds (multi-key v3).
pub const MAX_KEYS: usize = 65;
/// cryptsetup's message for every malformed key file.
pub const INCOMPATIBLE: &str = "Incompatible loop-AES keyfile detected.";

/// The derived dm-crypt key of a key file.
pub struct LoopaesKey {
    /// How many keys the file held: 1, 64 or 65.
    pub keys_count: usize,
    /// The derived keys, concatenated (`keys_count` times the key size).
    pub key: SecretBytes,
}

impl LoopaesKey {
    /// The dm-crypt cipher specification that maps a volume of `base_cipher` (`aes`,
    /// `twofish`, ...) with this key, as cryptsetup writes it.
    pub fn cipher_spec(&self, base_cipher: &str) -> String {
        cipher_spec(base_cipher, self.keys_count)
    }
}

/// The dm-crypt cipher specification for `keys_count` keys of `base_cipher`: one key is
/// `<cipher>-cbc-plain64`, 64 or 65 keys `<cipher>:64-cbc-lmk`.
pub fn cipher_spec(base_cipher: &str, keys_count: usize) -> String {
    if keys_count == 1 {
        format!("{base_cipher}-cbc-plain64")
    } else {
        format!("{base_cipher}:64-cbc-lmk")
    }
}

/// The hash cryptsetup picks for a key size in bytes when `--hash` is not given.
pub fn default_hash(key_size: usize) -> Option<HashAlgorithm> {
    match key_size {
        16 => Some(HashAlgorithm::Sha256),
        24 => Some(HashAlgorithm::Sha384),
        32 => Some(HashAlgorithm::Sha512),
        _ => None,
    }
}

/// The byte XORed into the first byte of each derived key for a file of `keys_count` keys.
fn tweak(keys_count: usize) -> u8 {
    match keys_count {
        64 => 0x55,
        65 => 0xf4,
        _ => 0,
    }
}

/// True when the start of `buffer` is an ASCII-armoured GPG message (cryptsetup looks at
/// the first 100 bytes).
pub fn is_gpg(buffer: &[u8]) -> bool {
    let head = &buffer[..buffer.len().min(100)];
    head.windows(17).any(|w| w == b"BEGIN PGP MESSAGE")
}

/// The key lines of `buffer`: separated by `\n`, `\r` or NUL, empty lines skipped; the last
/// one must be terminated. At most [`MAX_KEYS`] are taken; anything after them, an
/// unterminated key, keys of different lengths or a count other than 1, 64 or 65 is
/// [`INCOMPATIBLE`].
pub fn split_keys(buffer: &[u8]) -> Result<Vec<&[u8]>> {
    let bad = || FormatError::Incompatible(INCOMPATIBLE.into());
    let is_sep = |b: u8| b == b'\n' || b == b'\r' || b == 0;
    let mut keys = Vec::new();
    let mut at = 0;
    while at < buffer.len() && keys.len() < MAX_KEYS {
        let len = buffer[at..].iter().take_while(|&&b| !is_sep(b)).count();
        if at + len == buffer.len() {
            // The key runs to the end of the file without a newline.
            return Err(bad());
        }
        keys.push(&buffer[at..at + len]);
        at += len;
        at += buffer[at..].iter().take_while(|&&b| is_sep(b)).count();
    }
    let first = keys.first().map_or(0, |k| k.len());
    if at != buffer.len()
        || first == 0
        || keys.iter().any(|k| k.len() != first)
        || !matches!(keys.len(), 1 | 64 | 65)
    {
        return Err(bad());
    }
    Ok(keys)
}

/// Derives the dm-crypt key from key file contents `buffer`: keys of `key_size` bytes hashed
/// with `hash` (default: by key size, see [`default_hash`]).
pub fn derive_key(buffer: &[u8], key_size: usize, hash: Option<&str>) -> Result<LoopaesKey> {
    if buffer.is_empty() {
        return Err(FormatError::Incompatible(INCOMPATIBLE.into()));
    }
    if is_gpg(buffer) {
        return Err(FormatError::Incompatible(
            "Detected not yet supported GPG encrypted keyfile; decrypt it first: \
             gpg --decrypt <KEYFILE> | cryptblk --key-file=- ..."
                .into(),
        ));
    }
    let keys = split_keys(buffer)?;
    let hash_name = hash
        .map(str::to_string)
        .or_else(|| default_hash(key_size).map(|h| h.name().to_string()));
    let processing = || {
        FormatError::Incompatible(format!(
            "Key processing error (using hash {}).",
            hash_name.as_deref().unwrap_or("[none]")
        ))
    };
    let alg = match &hash_name {
        Some(h) if key_size > 0 => HashAlgorithm::from_name(h).map_err(|_| processing())?,
        _ => return Err(processing()),
    };
    // cryptsetup truncates the digest to the key size and cannot lengthen it.
    if alg.output_len() < key_size {
        return Err(processing());
    }
    let t = tweak(keys.len());
    let mut key = SecretBytes::zeroed(key_size * keys.len());
    for (line, out) in keys
        .iter()
        .zip(key.as_mut_bytes().chunks_exact_mut(key_size))
    {
        let digest = SecretBytes::from_vec(alg.digest(&[*line]));
        out.copy_from_slice(&digest.as_bytes()[..key_size]);
        out[0] ^= t;
    }
    Ok(LoopaesKey {
        keys_count: keys.len(),
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(n: usize, len: usize) -> Vec<u8> {
        let mut v = Vec::new();
        for i in 0..n {
            let line: String = (0..len)
                .map(|j| (b'A' + ((i + j) % 26) as u8) as char)
                .collect();
            v.extend_from_slice(line.as_bytes());
            v.push(b'\n');
        }
        v
    }

    #[test]
    fn key_counts_and_specs() {
        for (n, spec) in [
            (1, "aes-cbc-plain64"),
            (64, "aes:64-cbc-lmk"),
            (65, "aes:64-cbc-lmk"),
        ] {
            let k = derive_key(&lines(n, 20), 32, None).unwrap();
            assert_eq!((k.keys_count, k.key.len()), (n, n * 32));
            assert_eq!(k.cipher_spec("aes"), spec);
        }
    }

    #[test]
    fn derivation_follows_cryptsetup_rules() {
        // 64 keys, 128-bit: sha256 of each line truncated to 16 bytes, first byte ^ 0x55.
        let file = lines(64, 25);
        let k = derive_key(&file, 16, None).unwrap();
        let first = file.split(|&b| b == b'\n').next().unwrap();
        let mut want = HashAlgorithm::Sha256.digest(&[first]);
        want.truncate(16);
        want[0] ^= 0x55;
        assert_eq!(&k.key.as_bytes()[..16], &want[..]);
        // 65 keys: 0xF4; the default for 256-bit keys is sha512.
        let file = lines(65, 25);
        let k = derive_key(&file, 32, None).unwrap();
        let last = file.split(|&b| b == b'\n').nth(64).unwrap();
        let mut want = HashAlgorithm::Sha512.digest(&[last]);
        want.truncate(32);
        want[0] ^= 0xf4;
        assert_eq!(&k.key.as_bytes()[64 * 32..], &want[..]);
        // --hash overrides; one key is not tweaked.
        let k = derive_key(b"0123456789abcdefghij\r\n", 16, Some("sha1")).unwrap();
        let want = HashAlgorithm::Sha1.digest(&[&b"0123456789abcdefghij"[..]]);
        assert_eq!(k.key.as_bytes(), &want[..16]);
    }

    #[test]
    fn malformed_files_are_incompatible() {
        let incompatible = |buf: &[u8]| match derive_key(buf, 16, None) {
            Err(FormatError::Incompatible(m)) => m,
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("accepted {:?}", String::from_utf8_lossy(buf)),
        };
        assert_eq!(incompatible(b""), INCOMPATIBLE);
        assert_eq!(incompatible(b"unterminated"), INCOMPATIBLE);
        assert_eq!(incompatible(&lines(2, 20)), INCOMPATIBLE);
        assert_eq!(incompatible(&lines(63, 20)), INCOMPATIBLE);
        assert_eq!(incompatible(&lines(66, 20)), INCOMPATIBLE);
        let mut short = lines(64, 20);
        short.splice(0..1, []);
        assert_eq!(incompatible(&short), INCOMPATIBLE);
        assert_eq!(incompatible(b"\n\n\n"), INCOMPATIBLE);
        assert!(incompatible(b"-----BEGIN PGP MESSAGE-----\nxx\n").contains("GPG"));
        assert!(derive_key(&lines(1, 20), 64, None).is_err());
        assert!(derive_key(&lines(1, 20), 32, Some("sha1")).is_err());
        assert!(derive_key(&lines(1, 20), 16, Some("nohash")).is_err());
        // Blank lines and CR LF after a key are separators; a leading blank line is an empty
        // key, as in cryptsetup.
        assert_eq!(
            derive_key(b"key-one-xxxxxxxxxxx\r\n\n\r", 16, None)
                .unwrap()
                .keys_count,
            1
        );
        assert_eq!(incompatible(b"\nkey-one-xxxxxxxxxxx\n"), INCOMPATIBLE);
    }
}
