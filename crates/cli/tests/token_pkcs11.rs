//! `systemd-pkcs11` tokens against a real PKCS#11 token: SoftHSM2 (a fresh token directory
//! per test, named by `SOFTHSM2_CONF`), holding an RSA-2048 key pair and its certificate
//! (made by openssl, stored with softhsm2-util and pkcs11-tool), reached through p11-kit's
//! proxy as systemd reaches it.
//! - A volume enrolled by `systemd-cryptenroll --pkcs11-token-uri` opens in cryptblk by token
//!   (PIN typed, or from `$PIN` as systemd reads it) with cryptsetup's volume key; a wrong
//!   PIN is one line and exit code 1, as cryptsetup with systemd's token plugin reports it.
//! - A volume cryptblk enrolls (`cryptblk enroll --pkcs11-token-uri`) opens in cryptsetup
//!   2.6.1 through systemd's own token plugin (`open --test-passphrase --token-only`, PIN on
//!   standard input), its keyslot has systemd's parameters, and `systemd-cryptenroll
//!   --wipe-slot=pkcs11` recognises and removes it.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const PASS: &[u8] = b"the passphrase";
const PIN: &str = "4711";
const URI: &str = "pkcs11:token=cryptblk-test;id=%01";

/// A SoftHSM2 token `cryptblk-test` (user PIN [`PIN`]) with an RSA key pair and
/// certificate, id 01; its files live in `dir`.
struct SoftHsm {
    conf: PathBuf,
}

impl SoftHsm {
    fn new(dir: &Path) -> Option<SoftHsm> {
        let tokens = dir.join("tokens");
        std::fs::create_dir(&tokens).unwrap();
        let conf = write_file(
            dir,
            "softhsm2.conf",
            format!(
                "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
                tokens.display()
            )
            .as_bytes(),
        );
        let hsm = SoftHsm { conf };
        run_ok(
            hsm.cmd("softhsm2-util")?.args([
                "--init-token",
                "--free",
                "--label",
                "cryptblk-test",
                "--pin",
                PIN,
                "--so-pin",
                "123456",
            ]),
            b"",
        );
        let key = dir.join("key.pem");
        let cert = dir.join("cert.der");
        run_ok(
            tool("openssl")?
                .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout"])
                .arg(&key)
                .args(["-outform", "der", "-out"])
                .arg(&cert)
                .args(["-subj", "/CN=cryptblk-test", "-days", "2"]),
            b"",
        );
        run_ok(
            hsm.cmd("softhsm2-util")?
                .arg("--import")
                .arg(&key)
                .args(["--token", "cryptblk-test", "--label", "k", "--id", "01"])
                .args(["--pin", PIN]),
            b"",
        );
        std::fs::remove_file(&key).unwrap();
        run_ok(
            hsm.cmd("pkcs11-tool")?
                .args(["--module", &softhsm_module(), "--login", "--pin", PIN])
                .arg("--write-object")
                .arg(&cert)
                .args(["--type", "cert", "--id", "01", "--label", "k"]),
            b"",
        );
        Some(hsm)
    }

    /// `name` with this token's configuration.
    fn cmd(&self, name: &str) -> Option<Command> {
        let mut c = tool(name)?;
        c.env("SOFTHSM2_CONF", &self.conf).env_remove("PIN");
        Some(c)
    }
}

/// SoftHSM2's module, as Debian installs it.
fn softhsm_module() -> String {
    let p = "/usr/lib/softhsm/libsofthsm2.so";
    assert!(
        Path::new(p).exists(),
        "{p} missing (run scripts/install-deps.sh)"
    );
    p.to_string()
}

/// A LUKS2 image formatted by cryptsetup with [`PASS`] in keyslot 0.
fn image(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let img = dir.join("v.img");
    let k = write_file(dir, "k", PASS);
    cryptsetup_luks2(&img, &k, 20 << 20)?;
    Some((img, k))
}

/// cryptblk with the token's configuration.
fn ours(hsm: &SoftHsm) -> Command {
    let mut c = cryptblk();
    c.env("SOFTHSM2_CONF", &hsm.conf).env_remove("PIN");
    c
}

/// (exit code, stdout, stderr) of `cmd` fed `stdin`.
fn outcome(cmd: &mut Command, stdin: &[u8]) -> (i32, String, String) {
    let o = run(cmd, stdin);
    (
        exit_code(&o),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn systemd_cryptenroll_pkcs11_volume_opens_in_cryptblk() {
    let dir = tempdir();
    let Some((img, k)) = image(dir.path()) else {
        panic!("a tool or service this test needs is missing (scripts/install-deps.sh installs it; see the line above)");
    };
    let Some(hsm) = SoftHsm::new(dir.path()) else {
        panic!("a tool or service this test needs is missing (scripts/install-deps.sh installs it; see the line above)");
    };
    let Some(mut enroll) = hsm.cmd("systemd-cryptenroll") else {
        panic!("a tool or service this test needs is missing (scripts/install-deps.sh installs it; see the line above)");
    };
    run_ok(
        enroll
            .arg(format!("--pkcs11-token-uri={URI}"))
            .env("PASSWORD", std::str::from_utf8(PASS).unwrap())
            .env("PIN", PIN)
            .arg(&img),
        b"",
    );
    let theirs = cryptsetup_volume_key(&img, &k, &[]).unwrap();

    // The PIN typed (here: standard input), by --token-only.
    let (c, out, err) = outcome(
        ours(&hsm)
            .args(["luksDump", "--dump-volume-key", "-q", "--token-only"])
            .arg(&img),
        format!("{PIN}\n").as_bytes(),
    );
    assert_eq!(c, 0, "{err}");
    assert_eq!(parse_volume_key(&out).unwrap(), theirs);

    // The PIN from $PIN, as systemd reads it; the token is tried unasked and opens keyslot 1.
    let (c, out, err) = outcome(
        ours(&hsm)
            .env("PIN", PIN)
            .args(["open", "--test-passphrase", "-v"])
            .arg(&img),
        b"",
    );
    assert_eq!(c, 0, "{err}");
    // cryptsetup's verbose lines are on standard output.
    assert!(out.contains("Key slot 1 unlocked."), "{out}{err}");

    // A wrong PIN: cryptsetup (systemd's plugin) exits 1; cryptblk too, in one line.
    let (theirs_code, _, theirs_err) = outcome(
        hsm.cmd("cryptsetup")
            .unwrap()
            .args(["open", "--test-passphrase", "--token-only"])
            .arg(&img),
        b"0000\n",
    );
    assert_eq!(theirs_code, 1, "{theirs_err}");
    let (c, _, err) = outcome(
        ours(&hsm)
            .args(["open", "--test-passphrase", "--token-only"])
            .arg(&img),
        b"0000\n",
    );
    assert_eq!(c, theirs_code, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("PIN for token 'cryptblk-test' is incorrect"),
        "{err}"
    );

    // Without --token-only, the passphrase still opens it after the token's line.
    let (c, out, err) = outcome(
        ours(&hsm)
            .env("PIN", "0000")
            .args(["open", "--test-passphrase", "-v"])
            .arg(&img),
        PASS,
    );
    assert_eq!(c, 0, "{err}");
    assert!(
        err.contains("incorrect") && out.contains("Key slot 0 unlocked."),
        "{out}{err}"
    );
}

#[test]
fn cryptblk_enrolled_pkcs11_token_opens_in_cryptsetup_and_systemd() {
    let dir = tempdir();
    let Some((img, _k)) = image(dir.path()) else {
        panic!("a tool or service this test needs is missing (scripts/install-deps.sh installs it; see the line above)");
    };
    let Some(hsm) = SoftHsm::new(dir.path()) else {
        panic!("a tool or service this test needs is missing (scripts/install-deps.sh installs it; see the line above)");
    };
    // The existing passphrase from standard input; no PIN is needed to enroll.
    let (c, _, err) = outcome(
        ours(&hsm)
            .args(["enroll", "--pkcs11-token-uri", URI])
            .arg(&img),
        PASS,
    );
    assert_eq!(c, 0, "{err}");
    assert!(
        err.contains("New PKCS#11 token enrolled as key slot 1."),
        "{err}"
    );

    // systemd's own token plugin in cryptsetup 2.6.1 decrypts the key and opens keyslot 1.
    let (c, out, err) = outcome(
        hsm.cmd("cryptsetup")
            .unwrap()
            .args(["open", "--test-passphrase", "--token-only", "-v"])
            .arg(&img),
        format!("{PIN}\n").as_bytes(),
    );
    assert_eq!(c, 0, "{err}");
    // cryptsetup 2.6.1 says it on standard output.
    assert!(out.contains("Key slot 1 unlocked."), "{out}{err}");

    // The token (fields in systemd's order) and keyslot are what systemd-cryptenroll writes.
    let json = run_ok(
        cryptsetup()
            .unwrap()
            .args(["token", "export", "--token-id", "0"])
            .arg(&img),
        b"",
    );
    let t: serde_json::Value = serde_json::from_str(&json).unwrap();
    let keys: Vec<&str> = t.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        ["type", "keyslots", "pkcs11-uri", "pkcs11-key"],
        "{json}"
    );
    assert_eq!(t["pkcs11-uri"], URI);
    assert_eq!(t["keyslots"], serde_json::json!(["1"]));
    let dump = run_ok(cryptsetup().unwrap().arg("luksDump").arg(&img), b"");
    let slot1 = &dump[dump.find("  1: luks2").expect(&dump)..];
    for line in [
        "PBKDF:      pbkdf2",
        "Hash:       sha512",
        "Iterations: 1000",
        "AF hash:    sha512",
    ] {
        assert!(slot1.contains(line), "{line} missing from {slot1}");
    }

    // systemd-cryptenroll recognises the token: --wipe-slot=pkcs11 removes keyslot and token.
    run_ok(
        hsm.cmd("systemd-cryptenroll")
            .unwrap()
            .arg("--wipe-slot=pkcs11")
            .env("PASSWORD", std::str::from_utf8(PASS).unwrap())
            .arg(&img),
        b"",
    );
    let dump = run_ok(cryptsetup().unwrap().arg("luksDump").arg(&img), b"");
    assert!(
        !dump.contains("systemd-pkcs11") && !dump.contains("  1: luks2"),
        "{dump}"
    );
}

#[test]
fn enroll_refusals_leave_the_header_alone() {
    let dir = tempdir();
    let Some((img, _k)) = image(dir.path()) else {
        panic!("a tool or service this test needs is missing (scripts/install-deps.sh installs it; see the line above)");
    };
    let Some(hsm) = SoftHsm::new(dir.path()) else {
        panic!("a tool or service this test needs is missing (scripts/install-deps.sh installs it; see the line above)");
    };
    let before = sha256(&img);
    for (uri, why) in [
        (
            "pkcs11:token=no-such-token",
            "No PKCS#11 token matching the URI",
        ),
        (
            "pkcs11:token=cryptblk-test;id=%02",
            "No public key matching the PKCS#11 URI",
        ),
        ("http://x", "Invalid PKCS#11 URI"),
    ] {
        let (c, _, err) = outcome(
            ours(&hsm)
                .args(["enroll", "--pkcs11-token-uri", uri])
                .arg(&img),
            PASS,
        );
        assert_eq!(c, 1, "{uri}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{uri}: {err}");
        assert!(err.contains(why), "{uri}: {err}");
    }
    // A wrong existing passphrase: cryptsetup's exit code 2.
    let (c, _, err) = outcome(
        ours(&hsm)
            .args(["enroll", "--pkcs11-token-uri", URI])
            .arg(&img),
        b"wrong",
    );
    assert_eq!(c, 2, "{err}");
    assert_eq!(sha256(&img), before);
}
