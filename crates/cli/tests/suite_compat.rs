//! cryptsetup's own suite (compat-test, compat-test2) as checks of the project's suite, each
//! against the real cryptsetup: the interactive LUKS1 format, change-key and long-passphrase
//! dialogs on a terminal (prompts naming a loop device's backing file, the YES question on
//! standard output, "No usable keyslot is available."), `-v` lines on standard output, an
//! unbound keyslot holding `--volume-key-file`'s key, `luksConvertKey` ignoring a second
//! positional, `--serialize-memory-hard-pbkdf`'s lock file, `--usage`, `--debug-json`, and
//! `close` refused while another mapping is stacked on `/dev/mapper/NAME`.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

/// A loop device over a file, detached when dropped.
struct Loop(PathBuf);

impl Loop {
    fn new(file: &Path) -> Loop {
        require_root("attaching a loop device");
        let out = run_ok(
            tool("losetup").unwrap().args(["-f", "--show"]).arg(file),
            b"",
        );
        Loop(PathBuf::from(out.trim()))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = run(tool("losetup").unwrap().arg("-d").arg(&self.0), b"");
    }
}

/// cryptsetup, interactive (no --batch-mode).
fn cryptsetup_tty() -> Command {
    tool("cryptsetup").expect("cryptsetup");
    Command::new("cryptsetup")
}

fn secret<'a>(prompt: &'a str, answer: &'a str) -> PtyStep<'a> {
    PtyStep {
        prompt,
        answer,
        secret: true,
    }
}

const SURE: &str = "Are you sure? (Type 'yes' in capital letters): ";

/// A 20 MiB LUKS2 image at `img` formatted by the real cryptsetup with `passphrase` (a
/// line, as typed) in keyslot 0, fast PBKDF.
fn luks2_by_cryptsetup(img: &Path, passphrase: &[u8]) {
    sparse_file(img, 20 << 20);
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["luksFormat", "--type", "luks2"])
            .args(FAST)
            .arg(img),
        passphrase,
    );
}

/// compat-test [35], [36], [38], [40]: on a loop device over `img`, both tools name the
/// backing file in their passphrase prompts, ask YES first (on standard output), and end
/// with the same lines and exit codes.
#[test]
fn interactive_luks1_dialogs_on_a_loop_device() {
    let dir = tempdir();
    let long: String = "0123456789abcdef0123456789ABCDEF".repeat(16);
    assert_eq!(long.len(), 512, "cryptsetup's longest passphrase");
    for (who, mk) in [
        ("cryptsetup", cryptsetup_tty as fn() -> Command),
        ("cryptblk", cryptblk as fn() -> Command),
    ] {
        let img = dir.path().join(format!("{who}.img"));
        sparse_file(&img, 12 << 20);
        let lo = Loop::new(&img);
        let enter = format!("Enter passphrase for {}: ", img.display());
        let format = |pass: &str, again: &str| {
            let mut c = mk();
            c.args(["luksFormat", "--type", "luks1", "--force-password", "-v"])
                .args(FAST)
                .arg(&lo.0);
            run_on_pty(
                &mut c,
                &[
                    PtyStep {
                        prompt: SURE,
                        answer: "YES",
                        secret: false,
                    },
                    secret(&enter, pass),
                    secret("Verify passphrase: ", again),
                ],
            )
        };
        let test_pass = |pass: &str, extra: &[&str]| {
            let mut c = mk();
            c.args(["open", "-v", "--test-passphrase"])
                .args(extra)
                .arg(&lo.0);
            run_on_pty(&mut c, &[secret(&enter, pass)])
        };
        // [36]: on an erased LUKS1 device a mismatch formats nothing, and the open that
        // follows finds no keyslot.
        run_ok(
            mk().args(["luksFormat", "-q", "--type", "luks1"])
                .args(FAST)
                .arg(&lo.0),
            b"pw0\n",
        );
        run_ok(mk().args(["erase", "-q"]).arg(&lo.0), b"");
        let r = format("pw0", "pw0 x");
        assert_eq!(r.code, 2, "{who}: {}", r.output);
        assert!(
            r.output.contains("Passphrases do not match."),
            "{who}: {}",
            r.output
        );
        let r = test_pass("pw0", &["-T", "1"]);
        assert_eq!(r.code, 1, "{who}: {}", r.output);
        assert!(
            r.output.contains("No usable keyslot is available."),
            "{who}: {}",
            r.output
        );
        // [35]
        let r = format("pw0", "pw0");
        assert_eq!(r.code, 0, "{who}: {}", r.output);
        for line in ["Key slot 0 created.", "Command successful."] {
            assert!(r.output.contains(line), "{who}: {line}: {}", r.output);
        }
        let r = test_pass("pw0", &[]);
        assert_eq!(r.code, 0, "{who}: {}", r.output);
        for line in ["Key slot 0 unlocked.", "Command successful."] {
            assert!(r.output.contains(line), "{who}: {line}: {}", r.output);
        }
        // [38]
        let mut c = mk();
        c.args(["luksChangeKey", "-v"]).args(FAST).arg(&lo.0);
        let r = run_on_pty(
            &mut c,
            &[
                secret("Enter passphrase to be changed: ", "pw0"),
                secret("Enter new passphrase: ", "pw1"),
                secret("Verify passphrase: ", "pw1"),
            ],
        );
        assert_eq!(r.code, 0, "{who}: {}", r.output);
        assert!(r.output.contains("Command successful."), "{}", r.output);
        let r = test_pass("pw1", &[]);
        assert_eq!(r.code, 0, "{who}: {}", r.output);
        // [40]: a 512-character passphrase typed, then read back from a key file.
        let r = format(&long, &long);
        assert_eq!(r.code, 0, "{who}: {}", r.output);
        let key = write_file(dir.path(), &format!("{who}.key"), long.as_bytes());
        let out = run(
            mk().args(["open", "-v", "--test-passphrase", "--key-file"])
                .arg(&key)
                .arg(&lo.0),
            b"",
        );
        assert!(out.status.success(), "{who}: {out:?}");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.contains("Command successful."), "{who}: {said}");
    }
}

/// The YES question goes to standard output and leaves the cursor after it, as cryptsetup's:
/// with standard error discarded it is still on the terminal, without a line break.
#[test]
fn yes_question_on_standard_output() {
    let dir = tempdir();
    for (who, mk) in [
        ("cryptsetup", cryptsetup_tty as fn() -> Command),
        ("cryptblk", cryptblk as fn() -> Command),
    ] {
        let img = dir.path().join(format!("{who}.img"));
        sparse_file(&img, 12 << 20);
        let before = sha256(&img);
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg("exec \"$@\" 2>/dev/null")
            .arg("sh")
            .arg(mk().get_program())
            .args(["luksFormat", "--type", "luks1"])
            .arg(&img);
        for (k, v) in mk().get_envs() {
            if let Some(v) = v {
                c.env(k, v);
            }
        }
        let r = run_on_pty(
            &mut c,
            &[PtyStep {
                prompt: SURE,
                answer: "no",
                secret: false,
            }],
        );
        assert_eq!(r.code, 1, "{who}: {}", r.output);
        assert!(
            r.output
                .contains("Are you sure? (Type 'yes' in capital letters): no"),
            "{who}: {:?}",
            r.output
        );
        assert_eq!(before, sha256(&img), "{who} changed the image");
    }
}

/// `-v` lines ("Key slot N created/unlocked/removed.") are on standard output, as
/// cryptsetup prints them, with the same slot numbers.
#[test]
fn verbose_key_slot_lines_on_standard_output() {
    let dir = tempdir();
    let mut said: Vec<Vec<String>> = Vec::new();
    for (who, mk) in [
        ("cryptsetup", cryptsetup_tty as fn() -> Command),
        ("cryptblk", cryptblk as fn() -> Command),
    ] {
        let img = dir.path().join(format!("{who}.img"));
        sparse_file(&img, 20 << 20);
        let steps: [(&[&str], &[u8]); 5] = [
            (&["luksFormat", "-q", "--type", "luks2"], b"pw\n"),
            (&["luksAddKey"], b"pw\npw2\n"),
            (&["open", "--test-passphrase", "-S", "1"], b"pw2\n"),
            (&["luksConvertKey", "-S", "1"], b"pw2\n"),
            (&["luksRemoveKey"], b"pw2\n"),
        ];
        let mut lines = Vec::new();
        for (args, input) in steps {
            let out = run(
                mk().args(args).arg("-v").args(fast_if(args)).arg(&img),
                input,
            );
            assert!(out.status.success(), "{who} {args:?}: {out:?}");
            let stdout = String::from_utf8_lossy(&out.stdout);
            lines.extend(
                stdout
                    .lines()
                    .filter(|l| l.starts_with("Key slot "))
                    .map(String::from),
            );
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!stderr.contains("Key slot "), "{who} {args:?}: {stderr}");
        }
        said.push(lines);
    }
    assert!(!said[0].is_empty());
    assert_eq!(said[0], said[1], "cryptsetup, then cryptblk");
}

/// FAST for the actions that make keyslots.
fn fast_if(args: &[&str]) -> &'static [&'static str] {
    if matches!(args[0], "luksFormat" | "luksAddKey" | "luksConvertKey") {
        &FAST
    } else {
        &[]
    }
}

/// compat-test2 [38] (L1407, L1431-1435): `luksAddKey --unbound -s 512 --volume-key-file K`
/// stores K's 64 bytes, which cryptsetup's `luksDump --unbound` writes back out unchanged.
#[test]
fn unbound_keyslot_holds_the_volume_key_file() {
    let dir = tempdir();
    let img = dir.path().join("img");
    let key5 = write_file(dir.path(), "key5", b"key five");
    let k0 = dir.path().join("k0");
    write_pattern(&k0, 64, 7);
    sparse_file(&img, 20 << 20);
    run_ok(
        cryptblk()
            .args(["luksFormat", "-q", "--type", "luks2", "--key-slot", "5"])
            .args(FAST)
            .arg(&img)
            .arg(&key5),
        b"",
    );
    run_ok(
        cryptblk()
            .args(["luksAddKey", "-q", "--unbound", "-s", "512", "-S", "3"])
            .args(FAST)
            .arg("--volume-key-file")
            .arg(&k0)
            .arg(&img),
        b"pw3\n",
    );
    let k1 = dir.path().join("k1");
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["luksDump", "--unbound", "-S", "3", "--volume-key-file"])
            .arg(&k1)
            .arg(&img),
        b"pw3\n",
    );
    assert_eq!(std::fs::read(&k1).unwrap(), std::fs::read(&k0).unwrap());
    // A file shorter than the key size is refused, as cryptsetup refuses it.
    let short = write_file(dir.path(), "short", &[1u8; 63]);
    let before = sha256(&img);
    for (who, mut c) in [
        ("cryptsetup", cryptsetup().unwrap()),
        ("cryptblk", cryptblk()),
    ] {
        let out = run(
            c.args(["luksAddKey", "--unbound", "-s", "512"])
                .args(FAST)
                .arg("--volume-key-file")
                .arg(&short)
                .arg(&img),
            b"pw4\n",
        );
        assert_eq!(exit_code(&out), 1, "{who}: {out:?}");
        assert_eq!(before, sha256(&img), "{who} changed the image");
    }
}

/// compat-test2 L1500-1502: cryptsetup's luksConvertKey takes one device and ignores a
/// second positional argument (the suite passes the device twice); the passphrase comes
/// from standard input and the keyslot gets the keyslot cipher asked for.
#[test]
fn luks_convert_key_ignores_a_second_positional() {
    let dir = tempdir();
    let mut dumps = Vec::new();
    for (who, mut c) in [
        ("cryptsetup", cryptsetup().unwrap()),
        ("cryptblk", cryptblk()),
    ] {
        let img = dir.path().join(format!("{who}.img"));
        luks2_by_cryptsetup(&img, b"pw\n");
        let out = run(
            c.args(["luksConvertKey", "--key-slot", "0"])
                .arg(&img)
                .args([
                    "--keyslot-cipher",
                    "aes-cbc-plain64",
                    "--keyslot-key-size",
                    "128",
                ])
                .args(FAST)
                .arg(&img),
            b"pw\n",
        );
        assert!(out.status.success(), "{who}: {out:?}");
        let dump = run_ok(cryptsetup().unwrap().arg("luksDump").arg(&img), b"");
        let fields: Vec<String> = dump
            .lines()
            .skip_while(|l| !l.contains("0: luks2"))
            .take(9)
            .filter(|l| l.contains("Cipher:") || l.contains("Cipher key:"))
            .map(|l| l.trim().to_string())
            .collect();
        dumps.push(fields);
    }
    assert_eq!(
        dumps[0],
        ["Cipher:     aes-cbc-plain64", "Cipher key: 128 bits"].map(String::from)
    );
    assert_eq!(dumps[0], dumps[1]);
}

/// compat-test2 [52] (L1763-1769): `open --serialize-memory-hard-pbkdf` of an Argon2
/// keyslot takes cryptsetup's lock file in /run/cryptsetup and removes it after; a format,
/// or an open without the option, leaves a lock file alone.
#[test]
fn serialize_memory_hard_pbkdf_uses_cryptsetups_lock_file() {
    require_root("/run/cryptsetup is root's");
    let lock = Path::new("/run/cryptsetup/LN_memory-hard-access");
    let argon = [
        "--pbkdf",
        "argon2id",
        "--pbkdf-force-iterations",
        "4",
        "--pbkdf-memory",
        "32769",
        "--pbkdf-parallel",
        "1",
    ];
    let dir = tempdir();
    for (who, mk) in [
        ("cryptsetup", cryptsetup_tty as fn() -> Command),
        ("cryptblk", cryptblk as fn() -> Command),
    ] {
        let img = dir.path().join(format!("{who}.img"));
        sparse_file(&img, 20 << 20);
        std::fs::create_dir_all(lock.parent().unwrap()).unwrap();
        std::fs::write(lock, b"").unwrap();
        run_ok(
            mk().args(["luksFormat", "-q", "--type", "luks2"])
                .args(argon)
                .arg(&img),
            b"pw\n",
        );
        assert!(lock.exists(), "{who}: the format removed the lock file");
        run_ok(mk().args(["open", "--test-passphrase"]).arg(&img), b"pw\n");
        assert!(
            lock.exists(),
            "{who}: an open without the option used the lock"
        );
        run_ok(
            mk().args(["open", "--serialize-memory-hard-pbkdf", "--test-passphrase"])
                .arg(&img),
            b"pw\n",
        );
        assert!(
            !lock.exists(),
            "{who}: the lock file was not used and removed"
        );
    }
}

/// compat-test L866-868: `close` of a mapping that another one is stacked on (opened on
/// `/dev/mapper/NAME`) is refused as the kernel refuses it ("Device NAME is still in use.",
/// exit 5); once the upper one is closed the lower one closes.
#[test]
fn close_refused_while_a_mapping_is_stacked_on_it() {
    let dir = tempdir();
    let img = dir.path().join("img");
    sparse_file(&img, 8 << 20);
    let lower = format!("t-stack-lo-{}", std::process::id());
    let upper = format!("t-stack-up-{}", std::process::id());
    let plain = [
        "--type",
        "plain",
        "--cipher",
        "aes-cbc-essiv:sha256",
        "--key-size",
        "256",
        "--hash",
        "sha256",
    ];
    run_ok(
        cryptblk().arg("open").args(plain).arg(&img).arg(&lower),
        b"pw1\n",
    );
    let _lower = Served::volume(lower.clone());
    run_ok(
        cryptblk()
            .arg("open")
            .args(plain)
            .arg(format!("/dev/mapper/{lower}"))
            .arg(&upper),
        b"pw2\n",
    );
    let _upper = Served::volume(upper.clone());
    let out = run(cryptblk().arg("close").arg(&lower), b"");
    assert_eq!(exit_code(&out), 5, "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        format!("Device {lower} is still in use.")
    );
    run_ok(cryptblk().args(["status", &lower]), b"");
    run_ok(cryptblk().args(["close", &upper]), b"");
    run_ok(cryptblk().args(["close", &lower]), b"");
}

/// `--usage` prints a short usage on standard error and exits 0 wherever it stands, and
/// `--debug-json` is accepted as cryptsetup accepts it.
#[test]
fn usage_and_debug_json_as_cryptsetup() {
    let dir = tempdir();
    let img = dir.path().join("img");
    luks2_by_cryptsetup(&img, b"pw\n");
    for (who, mk) in [
        ("cryptsetup", cryptsetup_tty as fn() -> Command),
        ("cryptblk", cryptblk as fn() -> Command),
    ] {
        for args in [&["--usage"][..], &["open", "--usage"][..]] {
            let out = run(mk().args(args), b"");
            assert_eq!(exit_code(&out), 0, "{who} {args:?}: {out:?}");
            // popt prints it on standard error.
            let text = String::from_utf8_lossy(&out.stderr);
            assert!(text.starts_with("Usage: "), "{who}: {text}");
            assert!(text.contains("[--usage]"), "{who}: {text}");
            assert!(out.stdout.is_empty(), "{who}: {out:?}");
        }
        let out = run(mk().args(["--debug-json", "isLuks"]).arg(&img), b"");
        assert_eq!(exit_code(&out), 0, "{who}: {out:?}");
    }
}

/// compat-test2 [19] (L845, L852, L877-879): a LUKS2 volume opened without
/// `--disable-keyring` has its key "in the keyring", and `resize` needs it again: an empty
/// passphrase is refused and the size kept, `--disable-keyring` is refused with cryptsetup's
/// message, the passphrase resizes. Opened with `--disable-keyring` ("key location:
/// dm-crypt") it resizes without one.
#[test]
fn luks2_resize_needs_the_key_unless_opened_with_disable_keyring() {
    let dir = tempdir();
    let img = dir.path().join("img");
    luks2_by_cryptsetup(&img, b"pw1\n");
    let name = format!("t-rs-keyring-{}", std::process::id());
    let size = |name: &str| -> String {
        let st = run_ok(cryptblk().args(["status", name]), b"");
        st.lines()
            .find(|l| l.trim_start().starts_with("size:"))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let location = |name: &str| -> String {
        let st = run_ok(cryptblk().args(["status", name]), b"");
        st.lines()
            .find_map(|l| l.trim_start().strip_prefix("key location: "))
            .unwrap_or_default()
            .to_string()
    };
    run_ok(cryptblk().arg("open").arg(&img).arg(&name), b"pw1\n");
    let served = Served::volume(name.clone());
    assert_eq!(location(&name), "keyring");
    let before = size(&name);
    let out = run(
        cryptblk().args(["-q", "resize", "--size", "96", &name]),
        b"\n",
    );
    assert_ne!(exit_code(&out), 0, "{out:?}");
    assert_eq!(size(&name), before);
    let out = run(
        cryptblk().args(["-q", "resize", "--disable-keyring", "--size", "100", &name]),
        b"pw1\n",
    );
    assert_eq!(exit_code(&out), 1, "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "Resize of active device requires volume key in keyring but --disable-keyring option is set."
    );
    assert_eq!(size(&name), before);
    run_ok(
        cryptblk().args(["-q", "resize", "--size", "96", &name]),
        b"pw1\n",
    );
    assert_eq!(size(&name), "size:    96 sectors");
    drop(served);
    run_ok(
        cryptblk()
            .args(["open", "--disable-keyring"])
            .arg(&img)
            .arg(&name),
        b"pw1\n",
    );
    let _served = Served::volume(name.clone());
    assert_eq!(location(&name), "dm-crypt");
    run_ok(
        cryptblk().args(["-q", "resize", "--size", "64", &name]),
        b"\n",
    );
    assert_eq!(size(&name), "size:    64 sectors");
}

/// compat-test2's `dm_crypt_keyring_support` probes `--version | grep KEYRING` before its
/// keyring sections ([19]'s resize refusals, [32], [54]): cryptblk names the flag as
/// cryptsetup does, after "flags:".
#[test]
fn version_names_the_keyring_flag() {
    for (who, mut c) in [("cryptsetup", cryptsetup_tty()), ("cryptblk", cryptblk())] {
        let out = run_ok(c.arg("--version"), b"");
        let flags = out
            .split_once(" flags: ")
            .map(|(_, f)| f)
            .unwrap_or_default();
        assert!(
            flags.split_whitespace().any(|f| f == "KEYRING"),
            "{who}: {out:?}"
        );
    }
}

/// `luksDump --unbound` refusals as cryptsetup makes them (exit code and message, nothing
/// printed, image unchanged): a bound, inactive or LUKS1 keyslot "does not contain unbound
/// key"; `--dump-volume-key` wins over `--unbound` and finds no volume key in an unbound
/// keyslot; `--unbound` wins over `--dump-json-metadata`.
#[test]
fn luks_dump_unbound_refusals_as_cryptsetup() {
    let dir = tempdir();
    let l2 = dir.path().join("l2.img");
    let l1 = dir.path().join("l1.img");
    sparse_file(&l2, 20 << 20);
    sparse_file(&l1, 12 << 20);
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["luksFormat", "--type", "luks2"])
            .args(FAST)
            .arg(&l2),
        b"pw\n",
    );
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["luksAddKey", "--unbound", "-s", "72", "-S", "3"])
            .args(FAST)
            .arg(&l2),
        b"pw3\n",
    );
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["luksFormat", "--type", "luks1"])
            .args(FAST)
            .arg(&l1),
        b"pw\n",
    );
    // Options, image, standard input, exit code, last line of standard error.
    type Case<'a> = (&'a [&'a str], &'a Path, &'a [u8], i32, &'a str);
    let cases: [Case; 6] = [
        (
            &["-S", "0"],
            &l2,
            b"pw\n",
            1,
            "Keyslot 0 does not contain unbound key.",
        ),
        (
            &["-S", "5"],
            &l2,
            b"pw3\n",
            1,
            "Keyslot 5 does not contain unbound key.",
        ),
        (
            &["-S", "0"],
            &l1,
            b"pw\n",
            1,
            "Keyslot 0 does not contain unbound key.",
        ),
        (
            &["-S", "3"],
            &l2,
            b"wrong\n",
            2,
            "No key available with this passphrase.",
        ),
        (
            &["-S", "3", "--dump-volume-key"],
            &l2,
            b"pw3\n",
            1,
            "No usable keyslot is available.",
        ),
        (&["-S", "3", "--dump-json-metadata"], &l2, b"pw3\n", 0, ""),
    ];
    for (extra, img, input, want, msg) in cases {
        let before = sha256(img);
        let mut outs = Vec::new();
        for (who, mut c) in [
            ("cryptsetup", cryptsetup().unwrap()),
            ("cryptblk", cryptblk()),
        ] {
            let out = run(
                c.args(["luksDump", "--unbound"]).args(extra).arg(img),
                input,
            );
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            assert_eq!(exit_code(&out), want, "{who} {extra:?}: {err}");
            assert_eq!(err.lines().last().unwrap_or(""), msg, "{who} {extra:?}");
            assert_eq!(before, sha256(img), "{who} {extra:?} changed the image");
            outs.push(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        if want == 0 {
            // The unbound key's dump, not the JSON.
            for o in &outs {
                assert!(o.contains("Unbound Key:"), "{extra:?}: {o}");
            }
        } else {
            assert_eq!(outs, ["", ""], "{extra:?}");
        }
    }
}
