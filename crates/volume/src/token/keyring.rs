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

/// Where `--link-vk-to-keyring KEYRING::KEY` puts the volume key: the keyring (a special
/// one, a serial number, or one found by name) and the key's type and description, as
/// cryptsetup 2.7 parses them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VkLink {
    /// The target keyring as keyctl(2) names it: a special id (negative) or a serial.
    pub keyring: KeyringRef,
    /// `user` (the default) or `logon`.
    pub key_type: String,
    /// The key's description.
    pub description: String,
}

/// A keyring named on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyringRef {
    /// A serial number, or a special keyring's negative id (`@s` is -3...).
    Id(i32),
    /// A keyring found by its description (`%:name`, `%keyring:name`) from the session.
    Named(String),
}

/// The key types a volume key may be linked as.
const VK_KEY_TYPES: &[&str] = &["user", "logon"];

impl VkLink {
    /// Parses `KEYRING::KEY`: KEYRING is `@t`, `@p`, `@s`, `@u`, `@us`, `@g`, `@a`, a
    /// serial number, or `%:NAME`/`%keyring:NAME`; KEY is `NAME` or `%TYPE:NAME` with TYPE
    /// `user` or `logon`.
    pub fn parse(spec: &str) -> Result<VkLink> {
        let bad = || {
            VolumeError::usage(format!(
                "Invalid --link-vk-to-keyring value '{spec}' (expected <keyring>::<key>)."
            ))
        };
        let (ring, key) = spec.split_once("::").ok_or_else(bad)?;
        let keyring = parse_keyring(ring).ok_or_else(bad)?;
        let (key_type, description) = match key.strip_prefix('%') {
            Some(rest) => {
                let (t, d) = rest.split_once(':').ok_or_else(bad)?;
                if !VK_KEY_TYPES.contains(&t) {
                    return Err(bad());
                }
                (t, d)
            }
            None => ("user", key),
        };
        if description.is_empty() || description.contains('\0') {
            return Err(bad());
        }
        Ok(VkLink {
            keyring,
            key_type: key_type.to_string(),
            description: description.to_string(),
        })
    }

    /// Adds the volume key `vk` as this key (replacing a key of the same type and
    /// description there) in the keyring. The key stays after cryptblk exits, as
    /// cryptsetup's does: that is what the option asks for.
    pub fn link(&self, vk: &[u8]) -> Result<()> {
        let ring = match &self.keyring {
            KeyringRef::Id(id) => *id,
            KeyringRef::Named(name) => find_keyring(name)?,
        };
        let fail = |e: std::io::Error| {
            VolumeError::usage(format!(
                "Failed to link volume key as {} key '{}' to the keyring: {e}",
                self.key_type, self.description
            ))
        };
        let ty = std::ffi::CString::new(self.key_type.as_str()).map_err(|_| fail(einval()))?;
        let desc = std::ffi::CString::new(self.description.as_str()).map_err(|_| fail(einval()))?;
        // linux-keyutils adds only `user` keys; a `logon` key (readable by the kernel only)
        // needs add_key(2) itself.
        // SAFETY: the strings are NUL-terminated and outlive the call; `vk` is a valid
        // buffer of its length.
        let r = unsafe {
            libc::syscall(
                libc::SYS_add_key,
                ty.as_ptr(),
                desc.as_ptr(),
                vk.as_ptr(),
                vk.len(),
                ring,
            )
        };
        if r < 0 {
            return Err(fail(std::io::Error::last_os_error()));
        }
        Ok(())
    }
}

fn einval() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::EINVAL)
}

/// A keyring part of `--link-vk-to-keyring`, as keyctl(1) names keyrings.
fn parse_keyring(s: &str) -> Option<KeyringRef> {
    let special = |n: &str| -> Option<i32> {
        Some(match n {
            "t" => -1,
            "p" => -2,
            "s" => -3,
            "u" => -4,
            "us" => -5,
            "g" => -6,
            "a" => -7,
            _ => return None,
        })
    };
    if let Some(n) = s.strip_prefix('@') {
        return special(n).map(KeyringRef::Id);
    }
    if let Some(rest) = s.strip_prefix('%') {
        let (t, name) = rest.split_once(':')?;
        if !(t.is_empty() || t == "keyring") || name.is_empty() {
            return None;
        }
        return Some(KeyringRef::Named(name.to_string()));
    }
    s.parse::<i32>()
        .ok()
        .filter(|&n| n != 0)
        .map(KeyringRef::Id)
}

/// The serial of keyring `name`, searched from the session keyring as keyctl(1) finds
/// `%:name` (the thread and process keyrings first, as request_key does).
fn find_keyring(name: &str) -> Result<i32> {
    let n =
        std::ffi::CString::new(name).map_err(|_| VolumeError::usage("keyring name holds NUL"))?;
    let ty = c"keyring";
    let mut last = std::io::Error::from_raw_os_error(libc::ENOKEY);
    for ring in [-1i32, -2, -3] {
        // SAFETY: KEYCTL_SEARCH reads two NUL-terminated strings that outlive the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_keyctl,
                libc::KEYCTL_SEARCH,
                ring,
                ty.as_ptr(),
                n.as_ptr(),
                0,
            )
        };
        if r > 0 {
            return Ok(r as i32);
        }
        last = std::io::Error::last_os_error();
    }
    Err(VolumeError::usage(format!(
        "Keyring '{name}' not found: {last}"
    )))
}

/// `--volume-key-keyring DESC`: the volume key from a `user` key in the caller's keyrings
/// (`NAME` or `%user:NAME`). A `logon` key cannot be read from userspace, so cryptblk, which
/// must read the key, refuses it in one line.
pub fn read_volume_key(desc: &str) -> Result<SecretBytes> {
    let name = match desc.strip_prefix('%') {
        Some(rest) => match rest.split_once(':') {
            Some(("user", n)) if !n.is_empty() => n,
            Some(("logon", _)) => {
                return Err(VolumeError::usage(
                    "A logon key cannot be read from userspace; cryptblk needs the volume key \
                     as a user key.",
                ))
            }
            _ => {
                return Err(VolumeError::usage(format!(
                    "Invalid --volume-key-keyring value '{desc}'."
                )))
            }
        },
        None => desc,
    };
    read_user_key(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_link_specs_as_cryptsetup() {
        let l = VkLink::parse("@s::%logon:cs:vk").unwrap();
        assert_eq!(l.keyring, KeyringRef::Id(-3));
        assert_eq!(
            (l.key_type.as_str(), l.description.as_str()),
            ("logon", "cs:vk")
        );
        let l = VkLink::parse("-5::name").unwrap();
        assert_eq!(l.keyring, KeyringRef::Id(-5));
        assert_eq!(l.key_type, "user");
        for ring in ["%:ring", "%keyring:ring"] {
            let l = VkLink::parse(&format!("{ring}::%user:k")).unwrap();
            assert_eq!(l.keyring, KeyringRef::Named("ring".into()));
        }
        // The refusals compat-test2 checks.
        for bad in [
            "%ring::",
            ":ring::k",
            "@uuu::k",
            "@usu::k",
            "ring::%user",
            "ring::%user:",
            "%user:k",
            "@t::%0:k",
            "@t::%blah:k",
            "@t::%userlogon:k",
        ] {
            assert!(VkLink::parse(bad).is_err(), "{bad}");
        }
    }
}
