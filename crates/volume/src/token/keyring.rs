//! `luks2-keyring`: the passphrase is a `user` key in the kernel keyring, found by the
//! description stored in the token (`token add --key-description`), as cryptsetup's built-in
//! handler finds it.
//!
//! The keyring calls go through `linux-keyutils` (the raw keyctl(2) system calls, no C
//! library). Its `KeyRing::request_key` must link what it finds into a destination keyring
//! (it cannot pass request_key(2)'s 0), so the search is made as request_key(2) makes it
//! without a callout, keyring by keyring: thread, process, then session keyring (each
//! recursively, the found key possessed), and nothing is linked anywhere.

use super::TokenHandler;
use crate::error::{Result, VolumeError};
use cryptblk_cipher::SecretBytes;
use linux_keyutils::{KeyError, KeyRing, KeyRingIdentifier};
use serde_json::Value;

/// The token type.
pub const TYPE: &str = "luks2-keyring";

/// The `luks2-keyring` handler.
pub struct Keyring;

impl TokenHandler for Keyring {
    fn type_name(&self) -> &'static str {
        TYPE
    }

    /// cryptsetup accepts exactly `type`, `keyslots` and a string `key_description`.
    fn validate(&self, token: &Value) -> Result<()> {
        let obj = token
            .as_object()
            .ok_or_else(|| VolumeError::usage("token is not an object"))?;
        if !token["key_description"].is_string() {
            return Err(VolumeError::usage(
                "luks2-keyring token lacks key_description",
            ));
        }
        if obj
            .keys()
            .any(|k| !matches!(k.as_str(), "type" | "keyslots" | "key_description"))
        {
            return Err(VolumeError::usage("luks2-keyring token has unknown fields"));
        }
        Ok(())
    }

    fn open(&self, token: &Value, _input: Option<&[u8]>) -> Result<SecretBytes> {
        let desc = token["key_description"]
            .as_str()
            .ok_or_else(|| VolumeError::usage("luks2-keyring token lacks key_description"))?;
        read_user_key(desc)
    }
}

/// Reads the `user` key with description `desc` from the caller's keyrings (thread,
/// process, session, then the user keyrings linked from them, as `request_key(2)` searches
/// them).
pub fn read_user_key(desc: &str) -> Result<SecretBytes> {
    // cryptsetup reports a missing key as a token that cannot unlock its keyslots (exit 2).
    let not_found = |e: KeyError| {
        VolumeError::new(
            crate::ErrorClass::NoPermission,
            format!("no key '{desc}' in the kernel keyring ({})", describe(e)),
        )
    };
    if desc.contains('\0') {
        return Err(VolumeError::usage("key description holds NUL"));
    }
    let mut missing = KeyError::KeyDoesNotExist;
    let mut found = None;
    for ring in [
        KeyRingIdentifier::Thread,
        KeyRingIdentifier::Process,
        KeyRingIdentifier::Session,
    ] {
        // A thread or process keyring that does not exist is not created.
        let Ok(ring) = KeyRing::from_special_id(ring, false) else {
            continue;
        };
        match ring.search(desc) {
            Ok(key) => {
                found = Some(key);
                break;
            }
            // Keep the most telling reason (e.g. a revoked key) over "not found".
            Err(KeyError::KeyDoesNotExist) => {}
            Err(e) => missing = e,
        }
    }
    let key = found.ok_or_else(|| not_found(missing))?;
    // Ask the size first (an empty buffer), then read straight into locked memory.
    let size = key.read(&mut [0u8; 0]).map_err(not_found)?;
    let mut buf = SecretBytes::zeroed(size);
    let got = key.read(&mut buf.as_mut_bytes()).map_err(not_found)?;
    if got != buf.len() {
        // The key changed size between the calls: take what fits.
        return Ok(SecretBytes::from_slice(
            &buf.as_bytes()[..got.min(buf.len())],
        ));
    }
    Ok(buf)
}

/// The system's words for the errors a key lookup meets.
fn describe(e: KeyError) -> String {
    let errno = match e {
        KeyError::KeyDoesNotExist => libc::ENOKEY,
        KeyError::AccessDenied => libc::EACCES,
        KeyError::PermissionDenied => libc::EPERM,
        KeyError::KeyExpired => libc::EKEYEXPIRED,
        KeyError::KeyRevoked => libc::EKEYREVOKED,
        KeyError::KeyRejected => libc::EKEYREJECTED,
        KeyError::OutOfMemory => libc::ENOMEM,
        KeyError::Unknown(n) => n,
        other => return format!("{other:?}"),
    };
    std::io::Error::from_raw_os_error(errno).to_string()
}
