//! `luks2-keyring`: the passphrase is a `user` key in the kernel keyring, found by the
//! description stored in the token (`token add --key-description`), as cryptsetup's built-in
//! handler finds it.
//!
//! The two keyctl calls are made directly through `libc::syscall`: no maintained crate wraps
//! `request_key(2)` without also pulling in a C library (libkeyutils).

use super::TokenHandler;
use crate::error::{Result, VolumeError};
use cryptblk_cipher::SecretBytes;
use serde_json::Value;
use std::ffi::CString;

/// The token type.
pub const TYPE: &str = "luks2-keyring";

/// The `luks2-keyring` handler.
pub struct Keyring;

const KEYCTL_READ: libc::c_long = 11;

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
/// process, session, then the user keyrings, as `request_key(2)` searches them).
pub fn read_user_key(desc: &str) -> Result<SecretBytes> {
    // cryptsetup reports a missing key as a token that cannot unlock its keyslots (exit 2).
    let not_found = |e: std::io::Error| {
        VolumeError::new(
            crate::ErrorClass::NoPermission,
            format!("no key '{desc}' in the kernel keyring ({e})"),
        )
    };
    let ty = CString::new("user").expect("static");
    let d = CString::new(desc).map_err(|_| VolumeError::usage("key description holds NUL"))?;
    // SAFETY: both strings are NUL-terminated and live across the call; no callout info,
    // no destination keyring.
    let serial = unsafe {
        libc::syscall(
            libc::SYS_request_key,
            ty.as_ptr(),
            d.as_ptr(),
            std::ptr::null::<libc::c_char>(),
            0 as libc::c_long,
        )
    };
    if serial < 0 {
        return Err(not_found(std::io::Error::last_os_error()));
    }
    // Ask the size first, then read straight into locked memory.
    // SAFETY: a null buffer of length 0 only returns the payload size.
    let size = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_READ,
            serial,
            std::ptr::null_mut::<u8>(),
            0 as libc::size_t,
        )
    };
    if size < 0 {
        return Err(not_found(std::io::Error::last_os_error()));
    }
    let mut buf = SecretBytes::zeroed(size as usize);
    // SAFETY: buf holds `size` writable bytes.
    let got = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_READ,
            serial,
            buf.as_mut_bytes().as_mut_ptr(),
            size as libc::size_t,
        )
    };
    if got < 0 {
        return Err(not_found(std::io::Error::last_os_error()));
    }
    if got as usize != buf.len() {
        // The key changed size between the calls: take what fits.
        return Ok(SecretBytes::from_slice(
            &buf.as_bytes()[..(got as usize).min(buf.len())],
        ));
    }
    Ok(buf)
}
