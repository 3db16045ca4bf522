//! Unlock by token with the real enrolling tools: a `luks2-keyring` token (cryptsetup's
//! `token add`, key placed with keyctl), a `systemd-recovery` keyslot enrolled by
//! `systemd-cryptenroll --recovery-key`, and `clevis luks bind ... tang` against a tang
//! server run on 127.0.0.1 (tangd behind socat): each opens in cryptblk with no passphrase
//! (the recovery key typed instead), and falls back to the passphrase with a clear message
//! when the token cannot deliver (server stopped, key missing, no handler).

mod common;
use common::*;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn image(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let img = dir.join("v.img");
    let k = write_file(dir, "k", b"the passphrase");
    cryptsetup_luks2(&img, &k, 20 << 20)?;
    Some((img, k))
}

/// The volume key as cryptsetup reads it with the passphrase, and as cryptblk reads it with
/// `extra` options and `stdin` (no key file): they must be the same key.
fn same_volume_key(img: &Path, k: &Path, extra: &[&str], stdin: &[u8]) {
    let theirs = cryptsetup_volume_key(img, k, &[]).unwrap();
    let out = run(
        cryptblk()
            .args(["luksDump", "--dump-volume-key", "-q"])
            .args(extra)
            .arg(img),
        stdin,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ours = parse_volume_key(&String::from_utf8_lossy(&out.stdout)).unwrap();
    assert_eq!(ours, theirs);
}

#[test]
fn keyring_token() {
    let dir = tempdir();
    let Some((img, k)) = image(dir.path()) else {
        return;
    };
    let Some(_) = tool("keyctl") else { return };
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["token", "add", "--key-description", "cryptblk-test:vol"])
            .arg(&img),
        b"",
    );
    // A fresh session keyring per run: the key is there for both tools, then gone.
    let script = r#"keyctl padd user cryptblk-test:vol @s < "$2" >/dev/null
"$1" open --test-passphrase --token-only "$3" && echo ours-ok
cryptsetup open --test-passphrase --token-only "$3" && echo theirs-ok"#;
    let out = run_ok(
        Command::new("keyctl")
            .args(["session", "-", "sh", "-c", script, "sh"])
            .arg(env!("CARGO_BIN_EXE_cryptblk"))
            .arg(&k)
            .arg(&img),
        b"",
    );
    assert!(
        out.contains("ours-ok") && out.contains("theirs-ok"),
        "{out}"
    );
    // Missing key: --token-only fails as cryptsetup's does (exit 2); without it the
    // passphrase from standard input still opens, after one line per failed token.
    let script = r#""$1" open --test-passphrase --token-only "$2"; echo "ours=$?"
cryptsetup open --test-passphrase --token-only "$2" 2>/dev/null; echo "theirs=$?""#;
    let out = run_ok(
        Command::new("keyctl")
            .args(["session", "-", "sh", "-c", script, "sh"])
            .arg(env!("CARGO_BIN_EXE_cryptblk"))
            .arg(&img),
        b"",
    );
    assert!(out.contains("ours=2") && out.contains("theirs=2"), "{out}");
    let out = run(
        Command::new("keyctl")
            .args(["session", "-"])
            .arg(env!("CARGO_BIN_EXE_cryptblk"))
            .args(["open", "--test-passphrase"])
            .arg(&img),
        b"the passphrase\n",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("Token 0 (luks2-keyring): no key 'cryptblk-test:vol'"),
        "{err}"
    );
    assert!(err.contains("using a passphrase instead"), "{err}");
}

#[test]
fn systemd_recovery_key() {
    let dir = tempdir();
    let Some((img, k)) = image(dir.path()) else {
        return;
    };
    let Some(mut enroll) = tool("systemd-cryptenroll") else {
        return;
    };
    let out = run(
        enroll
            .env("PASSWORD", "the passphrase")
            .arg("--recovery-key")
            .arg(&img),
        b"",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let key = text
        .split_whitespace()
        .find(|w| w.len() == 71 && w.split('-').count() == 8)
        .unwrap_or_else(|| panic!("no recovery key in {text:?}"))
        .to_string();
    let dump = run_ok(cryptblk().arg("luksDump").arg(&img), b"");
    assert!(
        dump.contains("  0: systemd-recovery\n\tKeyslot:    1\n"),
        "{dump}"
    );
    // By token: the recovery key is asked for and opens the token's keyslot.
    let out = run(
        cryptblk()
            .args([
                "open",
                "--test-passphrase",
                "-v",
                "--token-type",
                "systemd-recovery",
            ])
            .arg(&img),
        format!("{key}\n").as_bytes(),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // cryptsetup prints its verbose lines on standard output.
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("Key slot 1 unlocked."), "{said}");
    // Typed without dashes and in capitals, as systemd accepts it.
    let loose = key.replace('-', "").to_uppercase();
    same_volume_key(
        &img,
        &k,
        &["--token-id", "0"],
        format!("{loose}\n").as_bytes(),
    );
    // The default order: no token runs unasked; the key is a passphrase like any other.
    let out = run(
        cryptblk().args(["open", "--test-passphrase"]).arg(&img),
        format!("{key}\n").as_bytes(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Not a recovery key: one line, exit 2, no KDF run needed.
    let (c, err) = {
        let o = run(
            cryptblk()
                .args([
                    "open",
                    "--test-passphrase",
                    "--token-only",
                    "--token-id",
                    "0",
                ])
                .arg(&img),
            b"the passphrase\n",
        );
        (
            exit_code(&o),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    assert_eq!(c, 2, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("not a recovery key"), "{err}");
}

/// tangd on 127.0.0.1 behind socat, with keys made by tangd-keygen; stopped on drop.
struct Tang {
    child: Child,
    url: String,
}

impl Tang {
    fn start(dir: &Path) -> Option<Tang> {
        tool("socat")?;
        let keygen = Path::new("/usr/libexec/tangd-keygen");
        if !keygen.exists() {
            tool("tangd-keygen")?;
        }
        let db = dir.join("tang-db");
        std::fs::create_dir_all(&db).unwrap();
        run_ok(Command::new(keygen).arg(&db), b"");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("socat")
            .arg(format!("TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork"))
            .arg(format!("EXEC:/usr/libexec/tangd {}", db.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(10), "tang did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(Tang {
            child,
            url: format!("http://127.0.0.1:{port}"),
        })
    }
}

impl Drop for Tang {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn clevis_tang() {
    let dir = tempdir();
    let Some((img, k)) = image(dir.path()) else {
        return;
    };
    let Some(mut clevis) = tool("clevis") else {
        return;
    };
    let Some(tang) = Tang::start(dir.path()) else {
        return;
    };
    let cfg = format!(r#"{{"url":"{}"}}"#, tang.url);
    run_ok(
        clevis
            .args(["luks", "bind", "-y", "-k"])
            .arg(&k)
            .arg("-d")
            .arg(&img)
            .args(["tang", &cfg]),
        b"",
    );
    // No passphrase anywhere: the token opens, and the key is the volume's.
    let out = run(
        cryptblk()
            .args(["open", "--test-passphrase", "-v"])
            .arg(&img),
        b"",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Key slot 1 unlocked."));
    same_volume_key(&img, &k, &["--token-only"], b"");
    // Server stopped: --token-only fails in one line; otherwise the passphrase opens after
    // a line naming the unreachable server.
    drop(tang);
    let o = run(
        cryptblk()
            .args(["open", "--test-passphrase", "--token-only"])
            .arg(&img),
        b"",
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(exit_code(&o), 0);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("Token 0 (clevis): tang server http://127.0.0.1:"),
        "{err}"
    );
    assert!(err.contains("unreachable"), "{err}");
    let o = run(
        cryptblk().args(["open", "--test-passphrase"]).arg(&img),
        b"the passphrase\n",
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("unreachable") && err.contains("using a passphrase instead"),
        "{err}"
    );
    // A key file skips tokens altogether, as in cryptsetup.
    let o = run(
        cryptblk()
            .args(["open", "--test-passphrase", "--key-file"])
            .arg(&k)
            .arg(&img),
        b"",
    );
    assert!(o.status.success());
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `clevis luks bind ... sss`: a threshold of tang shares. t=2 of two shares opens with the
/// server up and falls back, naming the shares, with it down; t=1 with a dead server first
/// skips to the live one.
#[test]
fn clevis_sss_of_tang() {
    let dir = tempdir();
    let Some((img, k)) = image(dir.path()) else {
        return;
    };
    let Some(_) = tool("clevis") else { return };
    let Some(tang) = Tang::start(dir.path()) else {
        return;
    };
    let adv = write_file(
        dir.path(),
        "adv.jws",
        run_ok(
            Command::new("curl").args(["-sf", &format!("{}/adv", tang.url)]),
            b"",
        )
        .as_bytes(),
    );
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://127.0.0.1:{}", l.local_addr().unwrap().port())
    };
    let bind = |cfg: String| {
        run_ok(
            Command::new("clevis")
                .args(["luks", "bind", "-y", "-k"])
                .arg(&k)
                .arg("-d")
                .arg(&img)
                .args(["sss", &cfg]),
            b"",
        );
    };
    bind(format!(
        r#"{{"t":2,"pins":{{"tang":[{{"url":"{0}"}},{{"url":"{0}"}}]}}}}"#,
        tang.url
    ));
    bind(format!(
        r#"{{"t":1,"pins":{{"tang":[{{"url":"{dead}","adv":"{}"}},{{"url":"{}"}}]}}}}"#,
        adv.display(),
        tang.url
    ));
    // Token 0 (t=2) and token 1 (t=1, first share unreachable) each open.
    for id in ["0", "1"] {
        let o = run(
            cryptblk()
                .args([
                    "open",
                    "--test-passphrase",
                    "--token-only",
                    "-v",
                    "--token-id",
                    id,
                ])
                .arg(&img),
            b"",
        );
        assert!(
            o.status.success(),
            "token {id}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    same_volume_key(&img, &k, &["--token-only", "--token-id", "0"], b"");
    drop(tang);
    let o = run(
        cryptblk()
            .args(["open", "--test-passphrase", "--token-id", "0"])
            .arg(&img),
        b"the passphrase\n",
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("clevis sss: 0 of the 2 shares needed (share 0: tang server"),
        "{err}"
    );
}

/// `cryptblk enroll --tang` writes what clevis reads: `clevis luks pass` recovers the
/// passphrase through the server and cryptsetup accepts it; cryptblk opens it by token.
#[test]
fn enroll_tang_for_clevis() {
    let dir = tempdir();
    let Some((img, k)) = image(dir.path()) else {
        return;
    };
    let Some(mut clevis) = tool("clevis") else {
        return;
    };
    let Some(tang) = Tang::start(dir.path()) else {
        return;
    };
    // A thumbprint the server does not advertise is refused before anything is written.
    let before = sha256(&img);
    let (c, err) = code(
        cryptblk()
            .args([
                "enroll",
                "--tang",
                &tang.url,
                "--tang-thumbprint",
                "nope",
                "--key-file",
            ])
            .arg(&k)
            .arg(&img),
    );
    assert_eq!(c, 1, "{err}");
    assert!(err.contains("does not advertise signing key nope"), "{err}");
    assert_eq!(sha256(&img), before);
    // The signing key's thumbprint (tangd-keygen names each key file by its thumbprint,
    // which is what tang-show-keys prints) is accepted.
    let thp = std::fs::read_dir(dir.path().join("tang-db"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".jwk").map(str::to_string))
        .collect::<Vec<_>>();
    let mut ok = false;
    for t in &thp {
        let o = run(
            cryptblk()
                .args([
                    "enroll",
                    "-v",
                    "--tang",
                    &tang.url,
                    "--tang-thumbprint",
                    t,
                    "--key-file",
                ])
                .arg(&k)
                .arg(&img),
            b"",
        );
        if o.status.success() {
            ok = true;
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                err.contains("Key slot 1 created.") && err.contains("Token 0 created."),
                "{err}"
            );
            break;
        }
    }
    assert!(ok, "no thumbprint of {thp:?} was accepted");
    let pass = run(
        clevis.args(["luks", "pass", "-s", "1", "-d"]).arg(&img),
        b"",
    );
    assert!(
        pass.status.success(),
        "{}",
        String::from_utf8_lossy(&pass.stderr)
    );
    assert_eq!(pass.stdout.len(), 43);
    let pf = write_file(dir.path(), "p", &pass.stdout);
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["open", "--test-passphrase", "-S", "1", "--key-file"])
            .arg(&pf)
            .arg(&img),
        b"",
    );
    same_volume_key(&img, &k, &["--token-only"], b"");
    drop(tang);
}

#[test]
fn tokens_without_handler() {
    let dir = tempdir();
    let Some((img, _)) = image(dir.path()) else {
        return;
    };
    for (ty, extra) in [
        (
            "systemd-fido2",
            r#","fido2-credential":"AAAA","fido2-salt":"BBBB","fido2-rp":"io.systemd.cryptsetup""#,
        ),
        ("x-unknown", ""),
    ] {
        let j = write_file(
            dir.path(),
            "t.json",
            format!(r#"{{"type":"{ty}","keyslots":["0"]{extra}}}"#).as_bytes(),
        );
        run_ok(
            cryptsetup()
                .unwrap()
                .args([
                    "token",
                    "import",
                    "--token-id",
                    "0",
                    "--token-replace",
                    "--json-file",
                ])
                .arg(&j)
                .arg(&img),
            b"",
        );
        let dump = run_ok(cryptblk().arg("luksDump").arg(&img), b"");
        assert!(dump.contains(&format!("  0: {ty}\n")), "{dump}");
        let o = run(
            cryptblk()
                .args(["open", "--test-passphrase", "--token-only"])
                .arg(&img),
            b"",
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(exit_code(&o), 1, "{err}");
        assert!(err.contains("handler for this token type"), "{err}");
        let o = run(
            cryptblk().args(["open", "--test-passphrase"]).arg(&img),
            b"the passphrase\n",
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        // --token-type picks nothing of another type.
        let o = run(
            cryptblk()
                .args([
                    "open",
                    "--test-passphrase",
                    "--token-only",
                    "--token-type",
                    "clevis",
                ])
                .arg(&img),
            b"",
        );
        assert_eq!(exit_code(&o), 1);
        assert_eq!(
            String::from_utf8_lossy(&o.stderr).trim(),
            "No usable token is available."
        );
    }
}

/// `open` (served) and `luksResume` unlock by token too: a keyring token opens the volume
/// with no key file, and after `luksSuspend` resumes it with `--token-only`; without the key
/// in the keyring the resume fails and the volume stays suspended.
#[test]
fn open_and_resume_by_token() {
    let dir = tempdir();
    let Some((img, k)) = image(dir.path()) else {
        return;
    };
    let Some(_) = tool("keyctl") else { return };
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["token", "add", "--key-description", "cryptblk-test:resume"])
            .arg(&img),
        b"",
    );
    let name = format!("t-token-{}", std::process::id());
    let sock = dir.path().join("nbd.sock");
    let in_session = |args: &[&dyn AsRef<std::ffi::OsStr>]| {
        let mut c = Command::new("keyctl");
        c.args(["session", "-", "sh", "-c"])
            .arg(r#"keyctl padd user cryptblk-test:resume @s < "$1" >/dev/null; shift; exec "$@""#)
            .arg("sh")
            .arg(&k)
            .arg(env!("CARGO_BIN_EXE_cryptblk"))
            .env("CRYPTBLK_RUNTIME_DIR", runtime_dir());
        for a in args {
            c.arg(a);
        }
        run(&mut c, b"")
    };
    let o = in_session(&[&"open", &"-v", &img, &name, &"--nbd", &sock]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let _served = Served::volume(name.clone());
    assert!(String::from_utf8_lossy(&o.stdout).contains("Key slot 0 unlocked."));
    run_ok(cryptblk().args(["luksSuspend", &name]), b"");
    let (c, err) = code(cryptblk().args(["luksResume", "--token-only", &name]));
    assert_eq!(c, 2, "{err}");
    assert_eq!(status(&name)["suspended"], true);
    let o = in_session(&[&"luksResume", &"--token-only", &name]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(status(&name)["suspended"], false);
}
