//! Crash safety of LUKS1 keyslot updates: an update interrupted at ANY write (optionally torn
//! at a 512-byte boundary) leaves a volume that opens with the old or the new keys.

mod common;

use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_format::hdrio::{FaultPlan, FaultyIo, MemIo};
use cryptblk_format::kdf::PbkdfRequest;
use cryptblk_format::luks1::{Luks1FormatParams, Luks1Volume};
use cryptblk_format::FormatError;

fn fast_kdf() -> PbkdfRequest {
    PbkdfRequest::pbkdf2(HashAlgorithm::Sha256).with_forced_iterations(1000)
}

/// A volume with "alpha" in slot 0 and "beta" in slot 1; returns the bytes and the key.
fn base() -> (Vec<u8>, Vec<u8>) {
    let mut p = Luks1FormatParams::new("aes-xts-plain64", 32, HashAlgorithm::Sha256).unwrap();
    p.kdf = fast_kdf();
    let dev = MemIo::zeroed(0);
    let (mut vol, vk) = Luks1Volume::format(&dev, &p, b"alpha").unwrap();
    vol.add_key(&vk, b"beta", Some(1), &fast_kdf()).unwrap();
    (dev.contents(), vk.as_bytes().to_vec())
}

/// Which of `candidates` unlock the volume in `bytes` (checking the volume key each time).
fn working(bytes: Vec<u8>, vk: &[u8], candidates: &[&'static str]) -> Vec<&'static str> {
    let dev = MemIo::new(bytes);
    let vol = Luks1Volume::open(&dev).expect("volume must still open after a crash");
    let mut ok = Vec::new();
    for &p in candidates {
        match vol.unlock(p.as_bytes(), None) {
            Ok(u) => {
                assert_eq!(u.volume_key.as_bytes(), vk, "{p} unlocked a different key");
                ok.push(p);
            }
            Err(FormatError::WrongPassphrase) => {}
            Err(e) => panic!("unexpected error for {p}: {e}"),
        }
    }
    ok
}

type Op = fn(&mut Luks1Volume<&FaultyIo<MemIo>>, &[u8]) -> Result<(), FormatError>;

fn exercise(name: &str, op: Op, allowed: &[&[&'static str]]) {
    let (image, vk) = base();
    let all = ["alpha", "beta", "gamma", "delta"];
    let mut crash_points = 0;
    for torn in [0usize, 1, 3] {
        for n in 0.. {
            let dev = FaultyIo::new(
                MemIo::new(image.clone()),
                FaultPlan {
                    fail_write: Some(n),
                    torn_sectors: torn,
                },
            );
            let result = {
                let mut vol = Luks1Volume::open(&dev).unwrap();
                op(&mut vol, &vk)
            };
            let attempted = dev.writes_attempted();
            let state = working(dev.into_inner().into_inner(), &vk, &all);
            assert!(
                allowed.iter().any(|set| *set == &state[..]),
                "{name}: crash at write {n} (torn {torn}) left passphrases {state:?}, allowed {allowed:?}"
            );
            if attempted <= n {
                // The operation finished before the injected failure: it must have succeeded
                // and produced the final state.
                result.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(&state[..], *allowed.last().unwrap(), "{name}: final state");
                break;
            }
            assert!(
                result.is_err(),
                "{name}: write {n} failed but the operation reported success"
            );
            crash_points += 1;
        }
    }
    assert!(
        crash_points >= 6,
        "{name}: only {crash_points} crash points exercised"
    );
}

#[test]
fn add_key_is_crash_safe() {
    exercise(
        "add",
        |vol, vk| {
            let vk = cryptblk_cipher::SecretBytes::from_slice(vk);
            vol.add_key(&vk, b"gamma", None, &fast_kdf()).map(|_| ())
        },
        &[&["alpha", "beta"], &["alpha", "beta", "gamma"]],
    );
}

#[test]
fn remove_key_is_crash_safe() {
    exercise(
        "remove",
        |vol, _| vol.remove_key(b"beta").map(|_| ()),
        &[&["alpha", "beta"], &["alpha"]],
    );
}

#[test]
fn kill_slot_is_crash_safe() {
    exercise(
        "kill",
        |vol, _| vol.kill_slot(0),
        &[&["alpha", "beta"], &["beta"]],
    );
}

#[test]
fn change_key_is_crash_safe() {
    // The only intermediate state has both the old and the new passphrase working.
    exercise(
        "change",
        |vol, _| {
            vol.change_key(b"alpha", None, b"delta", None, &fast_kdf())
                .map(|_| ())
        },
        &[
            &["alpha", "beta"],
            &["alpha", "beta", "delta"],
            &["beta", "delta"],
        ],
    );
}
