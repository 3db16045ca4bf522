//! No keyslot lost by a careless command (issue 25): cryptsetup 2.6.1 and cryptblk run the
//! same command on copies of the same image, and must agree on the exit code, the error
//! line and what happened to the image; every refusal leaves the image's bytes unchanged.
//! Slot 0 opens with P1, slot 1 with P2; the PBKDF is the fast [`FAST`] one.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A command's result: exit code, standard error, and the image's sha256 before and after.
#[derive(Debug)]
struct Outcome {
    code: i32,
    stderr: String,
    before: String,
    after: String,
    slots: Vec<String>,
}

/// The keyslot lines of cryptsetup's luksDump of `img` ("0: luks2", ...).
fn slots(img: &Path) -> Vec<String> {
    let out = run(tool("cryptsetup").unwrap().arg("luksDump").arg(img), b"");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            l.starts_with("  ") && t.contains(": luks2") || l.ends_with(": ENABLED")
        })
        .map(|l| l.trim().to_string())
        .collect()
}

/// A fresh copy of `base` named `img` in its own directory `dir/who`, so both tools see the
/// same relative path in their messages.
fn copy(base: &Path, dir: &Path, who: &str) -> PathBuf {
    let d = dir.join(who);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    for f in ["p1", "p2", "vk"] {
        let src = base.parent().unwrap().join(f);
        if src.exists() {
            std::fs::copy(&src, d.join(f)).unwrap();
        }
    }
    let img = d.join("img");
    let _ = std::fs::remove_file(&img);
    run_ok(
        Command::new("cp")
            .arg("--sparse=always")
            .arg(base)
            .arg(&img),
        b"",
    );
    d
}

/// Runs `args` (with `img` as the image) by `tool` in a fresh copy of `base`, `stdin` as
/// input.
fn outcome(mut cmd: Command, base: &Path, who: &str, args: &[&str], stdin: &[u8]) -> Outcome {
    let d = copy(base, &base.parent().unwrap().join("runs"), who);
    let img = d.join("img");
    let before = sha256(&img);
    let out = run(cmd.current_dir(&d).args(args), stdin);
    Outcome {
        code: exit_code(&out),
        stderr: String::from_utf8_lossy(&out.stderr).trim_end().to_string(),
        before,
        after: sha256(&img),
        slots: slots(&img),
    }
}

/// Runs `args` with both tools and checks they agree: exit code, error line(s), keyslots
/// left; a refusal (non-zero exit) must leave the image untouched. Returns cryptsetup's.
fn agree(base: &Path, args: &[&str], stdin: &[u8]) -> Outcome {
    let theirs = outcome(tool("cryptsetup").unwrap(), base, "cryptsetup", args, stdin);
    let ours = outcome(cryptblk(), base, "cryptblk", args, stdin);
    let what = format!("{args:?} with input {:?}", String::from_utf8_lossy(stdin));
    assert_eq!(
        ours.code, theirs.code,
        "{what}: exit code\nours: {ours:?}\ntheirs: {theirs:?}"
    );
    assert_eq!(ours.stderr, theirs.stderr, "{what}: message");
    assert_eq!(ours.slots, theirs.slots, "{what}: keyslots left");
    if theirs.code != 0 {
        assert_eq!(
            theirs.before, theirs.after,
            "{what}: cryptsetup changed the image"
        );
        assert_eq!(
            ours.before, ours.after,
            "{what}: cryptblk changed the image"
        );
    }
    theirs
}

/// A LUKS image (`kind` luks1 or luks2) in `dir/base/img` with slot 0 = P1 and, when
/// `two`, slot 1 = P2; the key files p1, p2 beside it.
fn image(dir: &Path, kind: &str, two: bool, extra: &[&str]) -> PathBuf {
    let b = dir.join("base");
    std::fs::create_dir_all(&b).unwrap();
    let p1 = write_file(&b, "p1", b"P1");
    let p2 = write_file(&b, "p2", b"P2");
    let img = b.join("img");
    sparse_file(&img, 20 << 20);
    run_ok(
        tool("cryptsetup")
            .unwrap()
            .current_dir(&b)
            .args(["-q", "luksFormat", "--type", kind])
            .args(FAST)
            .args(extra)
            .arg(&img)
            .arg(&p1),
        b"",
    );
    if two {
        run_ok(
            tool("cryptsetup")
                .unwrap()
                .args(["-q", "luksAddKey"])
                .args(FAST)
                .arg("--key-file")
                .arg(&p1)
                .arg(&img)
                .arg(&p2),
            b"",
        );
    }
    img
}

#[test]
fn kill_slot_needs_a_passphrase_of_another_keyslot() {
    let dir = tempdir();
    for kind in ["luks2", "luks1"] {
        let base = image(&dir.path().join(kind), kind, true, &[]);
        for q in [&["-q"][..], &[]] {
            let args = |rest: &[&'static str]| [q, &["luksKillSlot", "img", "1"], rest].concat();
            // A wrong passphrase, and the passphrase of the keyslot being killed itself,
            // are refused; another keyslot's passphrase kills it.
            for wrong in [&b"WRONG\n"[..], b"P2\n"] {
                let r = agree(&base, &args(&[]), wrong);
                assert_eq!(r.code, 2, "{kind}: {r:?}");
                assert_eq!(r.stderr, "No key available with this passphrase.");
            }
            let r = agree(&base, &args(&["--key-file", "p2"]), b"");
            assert_eq!(r.code, 2, "{kind}: {r:?}");
            let r = agree(&base, &args(&[]), b"P1\n");
            assert_eq!((r.code, r.slots.len()), (0, 1), "{kind}: {r:?}");
            let r = agree(&base, &args(&["--key-file", "p1"]), b"");
            assert_eq!((r.code, r.slots.len()), (0, 1), "{kind}: {r:?}");
        }
        // An inactive keyslot is refused; input holding nothing lets the kill go on, as
        // cryptsetup's does.
        let r = agree(&base, &["-q", "luksKillSlot", "img", "3"], b"P1\n");
        assert_eq!((r.code, r.stderr.as_str()), (1, "Keyslot 3 is not active."));
        let r = agree(&base, &["-q", "luksKillSlot", "img", "1"], b"");
        assert_eq!((r.code, r.slots.len()), (0, 1), "{kind}: {r:?}");
    }
}

#[test]
fn last_keyslot_without_a_terminal_needs_its_own_passphrase() {
    let dir = tempdir();
    for kind in ["luks2", "luks1"] {
        let base = image(&dir.path().join(kind), kind, false, &[]);
        for q in [&["-q"][..], &[]] {
            let kill = [q, &["luksKillSlot", "img", "0"]].concat();
            let r = agree(&base, &kill, b"WRONG\n");
            assert_eq!(r.code, 2, "{kind}: {r:?}");
            let r = agree(
                &base,
                &[kill.as_slice(), &["--key-file", "p2"]].concat(),
                b"",
            );
            assert_eq!(r.code, 2, "{kind}: {r:?}");
            let r = agree(&base, &kill, b"P1\n");
            assert_eq!((r.code, r.slots.len()), (0, 0), "{kind}: {r:?}");
            let remove = [q, &["luksRemoveKey", "img"]].concat();
            let r = agree(&base, &remove, b"WRONG\n");
            assert_eq!(r.code, 2, "{kind}: {r:?}");
            let r = agree(&base, &remove, b"P1\n");
            assert_eq!((r.code, r.slots.len()), (0, 0), "{kind}: {r:?}");
        }
    }
}

/// Both tools on a terminal, answering `steps`: exit codes and keyslots left agree, the
/// terminal shows `expect` in both, and a refusal leaves the image untouched. Returns the
/// exit code.
fn agree_on_terminal(base: &Path, args: &[&str], steps: &[PtyStep], expect: &[&str]) -> i32 {
    let mut results = Vec::new();
    for (who, cmd) in [
        ("cryptsetup", tool("cryptsetup").unwrap()),
        ("cryptblk", cryptblk()),
    ] {
        let mut cmd = cmd;
        let d = copy(base, &base.parent().unwrap().join("pty"), who);
        let img = d.join("img");
        let before = sha256(&img);
        let r = run_on_pty(cmd.current_dir(&d).args(args), steps);
        for e in expect {
            assert!(
                r.output.contains(e),
                "{who} {args:?}: {e:?} not on the terminal: {:?}",
                r.output
            );
        }
        if r.code != 0 {
            assert_eq!(
                before,
                sha256(&img),
                "{who} {args:?} refused but changed the image"
            );
        }
        results.push((r.code, slots(&img), r.output));
    }
    assert_eq!(
        (&results[0].0, &results[0].1),
        (&results[1].0, &results[1].1),
        "{args:?}: exit code and keyslots, cryptsetup then cryptblk:\n{:?}\n{:?}",
        results[0].2,
        results[1].2
    );
    results[0].0
}

#[test]
fn last_keyslot_on_a_terminal_asks_first() {
    let dir = tempdir();
    let base = image(dir.path(), "luks2", false, &[]);
    let question = "This is the last keyslot. Device will become unusable after purging this key.";
    let aborted = "Operation aborted, the keyslot was NOT wiped.";
    let sure = "(Type 'yes' in capital letters): ";
    let ask = |answer| PtyStep {
        prompt: sure,
        answer,
        secret: false,
    };
    let pass = |prompt, answer| PtyStep {
        prompt,
        answer,
        secret: true,
    };
    let remaining = "Enter any remaining passphrase: ";
    let deleted = "Enter passphrase to be deleted: ";
    // luksKillSlot: the question comes first; anything but YES keeps the keyslot.
    let kill = ["luksKillSlot", "img", "0"];
    assert_eq!(
        agree_on_terminal(&base, &kill, &[ask("no")], &[question, aborted]),
        2
    );
    assert_eq!(
        agree_on_terminal(
            &base,
            &kill,
            &[ask("YES"), pass(remaining, "WRONG")],
            &[question]
        ),
        2
    );
    assert_eq!(
        agree_on_terminal(
            &base,
            &kill,
            &[ask("YES"), pass(remaining, "P1")],
            &[question]
        ),
        0
    );
    // luksRemoveKey: the passphrase first, then the question, key file or not.
    let remove = ["luksRemoveKey", "img"];
    assert_eq!(
        agree_on_terminal(
            &base,
            &remove,
            &[pass(deleted, "P1"), ask("no")],
            &[question, aborted]
        ),
        2
    );
    assert_eq!(
        agree_on_terminal(
            &base,
            &["luksRemoveKey", "img", "p1"],
            &[ask("no")],
            &[question]
        ),
        2
    );
    assert_eq!(
        agree_on_terminal(
            &base,
            &remove,
            &[pass(deleted, "P1"), ask("YES")],
            &[question]
        ),
        0
    );
    // Batch mode asks nothing: luksKillSlot -q on a terminal wipes without a passphrase,
    // as cryptsetup's does.
    assert_eq!(
        agree_on_terminal(&base, &["-q", "luksKillSlot", "img", "0"], &[], &[]),
        0
    );
}

#[test]
fn volume_key_file_is_read_to_the_key_size() {
    let dir = tempdir();
    let b = dir.path().join("base");
    std::fs::create_dir_all(&b).unwrap();
    let key: Vec<u8> = (0..64u8)
        .map(|i| i.wrapping_mul(37).wrapping_add(11))
        .collect();
    write_file(&b, "vk", &key[..32]);
    for (name, bytes) in [("vk31", &key[..31]), ("vk64", &key[..])] {
        write_file(&b, name, bytes);
    }
    // A 256-bit volume key given by the file (as in the issue: 31 of 32 bytes).
    let base = image(
        dir.path(),
        "luks2",
        false,
        &["-s", "256", "--volume-key-file", "vk"],
    );
    for f in ["vk31", "vk64"] {
        std::fs::copy(b.join(f), dir.path().join(f)).unwrap();
    }
    let add = |vk: &'static str| -> Vec<&'static str> {
        [
            &["-q", "luksAddKey"][..],
            &FAST,
            &["--volume-key-file", vk, "img", "p2"],
        ]
        .concat()
    };
    let abs = |n: &str| dir.path().join(n).display().to_string();
    let (vk31, vk64) = (abs("vk31"), abs("vk64"));
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let (vk31, vk64) = (leak(vk31), leak(vk64));
    let r = agree(&base, &add(vk31), b"");
    assert_eq!(r.code, 1, "{r:?}");
    assert_eq!(
        r.stderr,
        format!("Cannot read 32 bytes from keyfile {vk31}.")
    );
    // A longer file gives its first bytes: the key plus anything after it is accepted.
    let r = agree(&base, &add(vk64), b"");
    assert_eq!((r.code, r.slots.len()), (0, 2), "{r:?}");
    // /dev/urandom gives 32 random bytes: the wrong key, refused as such.
    let r = agree(&base, &add("/dev/urandom"), b"");
    assert_eq!(r.code, 2, "{r:?}");
    assert_eq!(r.stderr, "Volume key does not match the volume.");
    let test = ["open", "--test-passphrase", "img", "--volume-key-file"];
    let r = agree(&base, &[&test[..], &[vk31]].concat(), b"");
    assert_eq!(r.code, 1, "{r:?}");
    let r = agree(&base, &[&test[..], &[vk64]].concat(), b"");
    assert_eq!(r.code, 0, "{r:?}");
    // luksFormat reads the new key the same way.
    let format = |vk: &'static str| -> Vec<&'static str> {
        [
            &["-q", "luksFormat", "--type", "luks2", "-s", "256"][..],
            &FAST,
            &["--volume-key-file", vk, "img", "p1"],
        ]
        .concat()
    };
    let r = agree(&base, &format(vk31), b"");
    assert_eq!(r.code, 1, "{r:?}");
    let r = agree(&base, &format("/dev/urandom"), b"");
    assert_eq!(r.code, 0, "{r:?}");
    // Without keyslots only --key-size tells how much to read.
    let erased = dir.path().join("erased");
    std::fs::create_dir_all(&erased).unwrap();
    let e = erased.join("img");
    run_ok(Command::new("cp").arg(&base).arg(&e), b"");
    std::fs::copy(b.join("p2"), erased.join("p2")).unwrap();
    run_ok(
        tool("cryptsetup").unwrap().args(["-q", "erase"]).arg(&e),
        b"",
    );
    let r = agree(&e, &add(vk64), b"");
    assert_eq!(r.code, 1, "{r:?}");
    let r = agree(&e, &[add(vk64).as_slice(), &["-s", "256"]].concat(), b"");
    assert_eq!((r.code, r.slots.len()), (0, 1), "{r:?}");
}

#[test]
fn encrypt_refuses_a_luks_device() {
    let dir = tempdir();
    for kind in ["luks2", "luks1"] {
        let base = image(&dir.path().join(kind), kind, false, &[]);
        for extra in [
            &["--type", "luks2", "--header", "hdr"][..],
            &["--type", "luks1", "--header", "hdr"],
            &["--header", "hdr"],
            &["--reduce-device-size", "4M"],
            &["--type", "luks1", "--reduce-device-size", "4M"],
            &["--type", "luks2", "--reduce-device-size", "4M"],
        ] {
            // `--new` is another name of `--encrypt` (the spelling).
            let flags: &[&str] = if extra[0] == "--header" {
                &["--encrypt", "--new"]
            } else {
                &["--encrypt"]
            };
            for &flag in flags {
                let args = [&["-q", "reencrypt", "img", flag][..], extra, &FAST].concat();
                let r = agree(&base, &args, b"P1\n");
                assert_eq!(r.code, 1, "{kind} {args:?}: {r:?}");
                let run_dir = base.parent().unwrap().join("runs");
                for who in ["cryptsetup", "cryptblk"] {
                    assert!(
                        !run_dir.join(who).join("hdr").exists(),
                        "{who} {args:?} created a header"
                    );
                }
            }
        }
    }
}

#[test]
fn forced_pbkdf_cost_below_the_minimum_is_refused() {
    let dir = tempdir();
    let base = image(dir.path(), "luks2", false, &[]);
    for (kdf, n, min) in [
        ("pbkdf2", "999", "1000"),
        ("argon2id", "3", "4"),
        ("argon2i", "3", "4"),
    ] {
        let pbkdf = ["--pbkdf", kdf, "--pbkdf-force-iterations", n];
        let want = format!(
            "Forced iteration count is too low for {kdf} (minimum is {min}).\n\
             Failed to set pbkdf parameters."
        );
        let format = [
            &["-q", "luksFormat", "--type", "luks2"][..],
            &pbkdf,
            &["img", "p1"],
        ];
        let r = agree(&base, &format.concat(), b"");
        assert_eq!((r.code, r.stderr.as_str()), (1, want.as_str()));
        let add = [
            &["-q", "luksAddKey", "--key-file", "p1"][..],
            &pbkdf,
            &["img", "p2"],
        ];
        let r = agree(&base, &add.concat(), b"");
        assert_eq!((r.code, r.stderr.as_str()), (1, want.as_str()));
    }
    let r = agree(
        &base,
        &[
            "-q",
            "luksFormat",
            "--type",
            "luks1",
            "--pbkdf-force-iterations",
            "999",
            "img",
            "p1",
        ],
        b"",
    );
    assert_eq!(r.code, 1, "{r:?}");
}

#[test]
fn luks2_only_options_are_refused_for_luks1() {
    let dir = tempdir();
    let base = image(dir.path(), "luks1", false, &[]);
    for opt in [
        &["--luks2-metadata-size", "64k"][..],
        &["--luks2-keyslots-size", "1M"],
    ] {
        let args = [
            &["-q", "luksFormat", "--type", "luks1"][..],
            &FAST,
            opt,
            &["img", "p1"],
        ];
        let r = agree(&base, &args.concat(), b"");
        assert_eq!(
            (r.code, r.stderr.as_str()),
            (1, "Unsupported LUKS2 metadata size options.")
        );
    }
    let r = agree(&base, &["luksDump", "--dump-json-metadata", "img"], b"");
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (1, "Dump operation is not supported for this device type.")
    );
}

#[test]
fn unbound_key_needs_no_existing_passphrase() {
    let dir = tempdir();
    let base = image(dir.path(), "luks2", false, &[]);
    // The only line of input is the new keyslot's passphrase.
    let add = [
        &["luksAddKey", "--unbound", "-s", "72"][..],
        &FAST,
        &["img"],
    ]
    .concat();
    let r = agree(&base, &add, b"U\n");
    assert_eq!((r.code, r.slots.len()), (0, 2), "{r:?}");
    assert_eq!(r.slots[1], "1: luks2 (unbound)");
    let r = agree(&base, &[add.as_slice(), &["p2"]].concat(), b"");
    assert_eq!((r.code, r.slots.len()), (0, 2), "{r:?}");
}

/// cryptsetup's luksChangeKey on LUKS1 (compat-test [23]): a keyslot named by `--key-slot`
/// is rewritten in place; without one the new key goes to the first free keyslot and the
/// old one is disabled.
#[test]
fn luks1_change_key_keeps_a_named_slot_and_otherwise_takes_the_first_free() {
    let dir = tempdir();
    let base = image(dir.path(), "luks1", true, &[]);
    let change = |extra: &[&'static str]| {
        [
            &["luksChangeKey", "img", "-d", "p1", "p2"][..],
            &FAST[..],
            extra,
        ]
        .concat()
    };
    let r = agree(&base, &change(&["--key-slot", "0"]), b"");
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.slots, ["Key Slot 0: ENABLED", "Key Slot 1: ENABLED"]);
    let r = agree(&base, &change(&[]), b"");
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.slots, ["Key Slot 1: ENABLED", "Key Slot 2: ENABLED"]);
}

/// luksAddKey/luksChangeKey with cryptsetup's new-key options (compat-test [19], [26]):
/// `--new-keyfile`, `--new-keyfile-size`, `--new-keyfile-offset`, and `--new-key-slot`
/// (then `--key-slot` names the keyslot to unlock). Both tools agree on the exit code and
/// the keyslots, and cryptsetup opens cryptblk's new keyslot with exactly the cut key.
#[test]
fn new_key_options_read_the_new_key_as_cryptsetup_does() {
    let dir = tempdir();
    for kind in ["luks1", "luks2"] {
        let base = image(&dir.path().join(kind), kind, true, &[]);
        std::fs::write(base.with_file_name("vk"), b"0123456789abcdef").unwrap();
        let cases: [(&[&str], &str, &[&str]); 3] = [
            (
                &[
                    "luksAddKey",
                    "img",
                    "-d",
                    "p1",
                    "vk",
                    "--key-slot",
                    "2",
                    "--new-keyfile-size",
                    "8",
                ],
                "2",
                &["--keyfile-size", "8"],
            ),
            (
                &[
                    "luksAddKey",
                    "img",
                    "-d",
                    "p2",
                    "-S",
                    "1",
                    "--new-key-slot",
                    "3",
                    "--new-keyfile",
                    "vk",
                    "--new-keyfile-offset",
                    "1",
                ],
                "3",
                &["--keyfile-offset", "1"],
            ),
            (
                &[
                    "luksChangeKey",
                    "img",
                    "-d",
                    "p1",
                    "vk",
                    "-S",
                    "0",
                    "--new-keyfile-offset",
                    "2",
                    "--new-keyfile-size",
                    "5",
                ],
                "0",
                &["--keyfile-offset", "2", "--keyfile-size", "5"],
            ),
        ];
        for (args, slot, cut) in cases {
            let args = [args, &FAST[..]].concat();
            let r = agree(&base, &args, b"");
            assert_eq!(r.code, 0, "{kind} {args:?}: {r:?}");
            let img = base.parent().unwrap().join("runs/cryptblk/img");
            let vk = img.with_file_name("vk");
            let test = |extra: &[&str]| {
                exit_code(&run(
                    tool("cryptsetup")
                        .unwrap()
                        .args(["open", "--test-passphrase", "-S", slot, "--key-file"])
                        .arg(&vk)
                        .args(extra)
                        .arg(&img),
                    b"",
                ))
            };
            assert_eq!(
                test(cut),
                0,
                "{kind} {args:?}: the cut key opens slot {slot}"
            );
            assert_ne!(
                test(&[]),
                0,
                "{kind} {args:?}: the whole file must not open it"
            );
        }
    }
}
