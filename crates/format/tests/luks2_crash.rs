//! Crash safety of LUKS2 metadata updates: every keyslot operation is interrupted at every
//! write it issues (cleanly, and torn after 3 sectors); the device left behind must
//! load and be in the old or the new state — judged by cryptblk and by the real cryptsetup
//! (`open --test-passphrase` on the crashed image).

mod luks2_common;

use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_format::hdrio::{FaultPlan, FaultyIo, HeaderIo, MemIo};
use cryptblk_format::kdf::PbkdfRequest;
use cryptblk_format::luks2::{FormatParams, KeyslotParams, Luks2Header, UnlockPurpose};
use luks2_common::*;

const A: &[u8] = b"passphrase A";
const B: &[u8] = b"passphrase B";
const C: &[u8] = b"passphrase C";

fn params() -> KeyslotParams {
    KeyslotParams::new(PbkdfRequest::pbkdf2(HashAlgorithm::Sha256).with_forced_iterations(1000))
}

/// A 3 MiB volume (1 MiB keyslots area) with A in keyslot 0 and B in keyslot 1.
fn base() -> Vec<u8> {
    let dev = MemIo::zeroed(3 << 20);
    let p = FormatParams {
        keyslots_size: Some(1 << 20),
        keyslot: params(),
        ..FormatParams::default()
    };
    let (mut h, vk, _) = Luks2Header::format(&dev, &p, A).unwrap();
    h.add_keyslot(&dev, &vk, B, &params()).unwrap();
    dev.into_inner()
}

fn opens(dev: &dyn HeaderIo, h: &Luks2Header, pw: &[u8]) -> bool {
    h.unlock(dev, pw, None, UnlockPurpose::Activate).is_ok()
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Add,
    Remove,
    Change,
    Convert,
    Relabel,
}

/// The KDF luksConvertKey moves keyslot 1 to: Argon2id at its smallest cost, so that the
/// old (PBKDF2) and new keyslot are told apart by their KDF type.
fn converted() -> KeyslotParams {
    let mut p = PbkdfRequest::argon2id().with_forced_iterations(4);
    p.max_memory_kib = 32;
    p.parallel = 1;
    KeyslotParams::new(p)
}

fn kdf_of_slot(h: &Luks2Header, slot: usize) -> String {
    h.keyslots()
        .into_iter()
        .find(|k| k.id == slot)
        .map(|k| k.kdf)
        .unwrap_or_default()
}

fn run(op: Op, h: &mut Luks2Header, dev: &dyn HeaderIo) -> cryptblk_format::Result<()> {
    match op {
        Op::Add => {
            let vk = h.unlock(dev, A, None, UnlockPurpose::Activate)?.key;
            h.add_keyslot(dev, &vk, C, &params()).map(|_| ())
        }
        Op::Remove => h.remove_keyslot(dev, 1),
        Op::Change => h.change_key(dev, B, C, None, &params()).map(|_| ()),
        Op::Convert => h.convert_keyslot(dev, B, None, &converted()).map(|_| ()),
        Op::Relabel => {
            h.set_label("new label")?;
            h.write(dev)
        }
    }
}

/// Which passphrases open the crashed device, per the real cryptsetup.
fn cryptsetup_opens(img: &std::path::Path, pw: &[u8]) -> bool {
    let (rc, _, _) = cryptsetup(
        &[
            "open",
            "--test-passphrase",
            "--key-file=-",
            img.to_str().unwrap(),
        ],
        pw,
    );
    rc == 0
}

#[test]
fn every_interrupted_write_leaves_old_or_new_state() {
    let tool = have_cryptsetup();
    let dir = Scratch::new("crash");
    let base = base();
    for op in [Op::Add, Op::Remove, Op::Change, Op::Convert, Op::Relabel] {
        let mut index = 0;
        loop {
            let mut completed = false;
            for torn in [0usize, 3] {
                let dev = FaultyIo::new(
                    MemIo::new(base.clone()),
                    FaultPlan {
                        fail_write: Some(index),
                        torn_sectors: torn,
                    },
                );
                let mut h = Luks2Header::read(&dev).unwrap();
                let result = run(op, &mut h, &dev);
                if dev.writes_attempted() <= index {
                    result.unwrap_or_else(|e| panic!("{op:?} failed without a fault: {e}"));
                    if let Op::Convert = op {
                        let mem = dev.into_inner();
                        let h = Luks2Header::read(&mem).unwrap();
                        assert_eq!(kdf_of_slot(&h, 1), "argon2id");
                        assert!(opens(&mem, &h, B));
                    }
                    completed = true;
                    break;
                }
                assert!(
                    result.is_err(),
                    "{op:?}: write {index} failed but the op reported success"
                );
                let mem = dev.into_inner();
                let h = Luks2Header::read(&mem).unwrap_or_else(|e| {
                    panic!("{op:?} crash at write {index} torn {torn}: unloadable: {e}")
                });
                let (a, b, c) = (opens(&mem, &h, A), opens(&mem, &h, B), opens(&mem, &h, C));
                let ctx = format!("{op:?} crash at write {index} torn {torn}: A={a} B={b} C={c}");
                assert!(a, "{ctx}");
                match op {
                    Op::Add => {
                        assert!(b, "{ctx}");
                        assert_eq!(c, h.keyslots().len() == 3, "{ctx}");
                    }
                    Op::Remove => {
                        assert!(!c, "{ctx}");
                        assert_eq!(b, h.keyslots().len() == 2, "{ctx}");
                    }
                    Op::Change => assert!(b ^ c, "{ctx}"),
                    Op::Convert => {
                        assert!(b && !c, "{ctx}");
                        let kdf = kdf_of_slot(&h, 1);
                        assert!(kdf == "pbkdf2" || kdf == "argon2id", "{ctx}: kdf {kdf}");
                    }
                    Op::Relabel => {
                        assert!(b && !c, "{ctx}");
                        assert!(h.label().is_empty() || h.label() == "new label", "{ctx}");
                    }
                }
                if tool {
                    let img = dir.path("crashed.img");
                    std::fs::write(&img, mem.into_inner()).unwrap();
                    for (pw, ours) in [(A, a), (B, b), (C, c)] {
                        assert_eq!(
                            cryptsetup_opens(&img, pw),
                            ours,
                            "cryptsetup disagrees: {ctx}"
                        );
                    }
                }
            }
            if completed {
                assert!(index > 0, "{op:?} issued no writes");
                break;
            }
            index += 1;
        }
    }
}

#[test]
fn concurrent_update_is_detected() {
    let dev = MemIo::new(base());
    let mut first = Luks2Header::read(&dev).unwrap();
    let mut second = Luks2Header::read(&dev).unwrap();
    first.set_label("first").unwrap();
    first.write(&dev).unwrap();
    second.set_label("second").unwrap();
    let err = second.write(&dev).unwrap_err();
    assert!(err.to_string().contains("concurrent"), "{err}");
    let h = Luks2Header::read(&dev).unwrap();
    assert_eq!(h.label(), "first");
    assert!(!h.needs_repair());
}
