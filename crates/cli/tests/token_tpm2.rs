//! `systemd-tpm2` tokens against a software TPM (swtpm on a free 127.0.0.1 port, started and
//! stopped by each test):
//! - volumes enrolled by `systemd-cryptenroll --tpm2-device=swtpm:... --tpm2-pcrs=...` (with
//!   and without `--tpm2-with-pin`) open in cryptblk by token and give cryptsetup's volume
//!   key; after a PCR is extended they are refused in one line with exit code 2, and the
//!   passphrase still opens them;
//! - volumes cryptblk enrolls (`cryptblk enroll --tpm2-device`) unseal with tpm2-tools alone
//!   (an independent TPM client following systemd's scheme: transient primary from the same
//!   template, PolicyPCR [+ PolicyAuthValue with SHA-256 of the PIN], load, unseal), and the
//!   base64 of what they unseal passes `cryptsetup open --test-passphrase`; cryptsetup's
//!   luksDump shows the token through systemd's own token plugin, and
//!   `systemd-cryptenroll --wipe-slot=tpm2` recognises and removes it.
//!
//! Debian's systemd 252 plugin for cryptsetup (`--token-only`) looks only for /dev/tpmrm0,
//! which this host lacks; `token_tpm2_lab.rs` runs that check in the kernel lab.

mod common;
use common::*;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A software TPM 2.0 (fresh state) listening on 127.0.0.1; killed on drop.
struct Swtpm {
    child: Child,
    port: u16,
    _state: tempfile::TempDir,
}

impl Swtpm {
    /// Starts swtpm, or None when it is missing and CRYPTBLK_SKIP_SWTPM=1 asks to skip.
    fn start() -> Option<Swtpm> {
        tool("swtpm")?;
        for _ in 0..20 {
            // The swtpm TCTI talks to the TPM on `port` and to its control channel on
            // `port + 1`: two free ports the kernel just handed out are very likely still
            // free a moment later; a lost race is retried.
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            if port == u16::MAX || TcpListener::bind(("127.0.0.1", port + 1)).is_err() {
                continue;
            }
            drop(l);
            let state = tempdir();
            let mut child = Command::new("swtpm")
                .args(["socket", "--tpm2", "--tpmstate"])
                .arg(format!("dir={}", state.path().display()))
                .arg("--server")
                .arg(format!("type=tcp,port={port},bindaddr=127.0.0.1"))
                .arg("--ctrl")
                .arg(format!("type=tcp,port={},bindaddr=127.0.0.1", port + 1))
                .args(["--flags", "not-need-init,startup-clear"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("cannot start swtpm");
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Some(Swtpm {
                        child,
                        port,
                        _state: state,
                    });
                }
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("swtpm did not start listening");
    }

    /// The TCTI systemd and cryptblk take for it.
    fn tcti(&self) -> String {
        format!("swtpm:host=127.0.0.1,port={}", self.port)
    }

    /// A tpm2-tools command talking to it.
    fn tools(&self, name: &str) -> Command {
        let mut c = tool(name).expect("tpm2-tools");
        c.env("TPM2TOOLS_TCTI", self.tcti());
        c
    }

    /// Extends PCR `pcr` (sha256 bank): the measured state changes.
    fn extend(&self, pcr: u32) {
        run_ok(
            self.tools("tpm2_pcrextend").arg(format!(
                "{pcr}:sha256=00000000000000000000000000000000000000000000000000000000000000ff"
            )),
            b"",
        );
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const PASS: &[u8] = b"the passphrase";

/// A LUKS2 image formatted by cryptsetup with [`PASS`] in keyslot 0.
fn image(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let img = dir.join("v.img");
    let k = write_file(dir, "k", PASS);
    cryptsetup_luks2(&img, &k, 20 << 20)?;
    Some((img, k))
}

/// `systemd-cryptenroll --tpm2-device=TCTI --tpm2-pcrs=PCRS [--tpm2-with-pin=yes]`, the
/// existing passphrase (and new PIN) given as systemd reads them non-interactively.
fn systemd_enroll(tpm: &Swtpm, img: &Path, pcrs: &str, pin: Option<&str>) {
    let mut c = tool("systemd-cryptenroll").expect("systemd-cryptenroll");
    c.arg(format!("--tpm2-device={}", tpm.tcti()))
        .arg(format!("--tpm2-pcrs={pcrs}"))
        .env("PASSWORD", std::str::from_utf8(PASS).unwrap());
    if let Some(p) = pin {
        c.arg("--tpm2-with-pin=yes").env("NEWPIN", p);
    }
    run_ok(c.arg(img), b"");
}

/// The volume key cryptblk finds by token only (`stdin` answers a PIN prompt), which must
/// be cryptsetup's (read with the passphrase).
fn token_volume_key(img: &Path, k: &Path, extra: &[&str], stdin: &[u8]) {
    let theirs = cryptsetup_volume_key(img, k, &[]).unwrap();
    let out = run(
        cryptblk()
            .args(["luksDump", "--dump-volume-key", "-q", "--token-only"])
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

/// `cryptblk open --test-passphrase --token-only` with `extra`: (exit code, stderr).
fn open_by_token(img: &Path, extra: &[&str], stdin: &[u8]) -> (i32, String) {
    let out = run(
        cryptblk()
            .args(["open", "--test-passphrase", "--token-only"])
            .args(extra)
            .arg(img),
        stdin,
    );
    (
        exit_code(&out),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn systemd_cryptenroll_tpm2_volume_opens_until_the_pcrs_change() {
    let dir = tempdir();
    let Some((img, k)) = image(dir.path()) else {
        return;
    };
    let Some(tpm) = Swtpm::start() else { return };
    systemd_enroll(&tpm, &img, "0+7", None);
    let dev = tpm.tcti();

    // By --tpm2-device, and by SYSTEMD_TPM2_DEVICE as systemd reads it.
    token_volume_key(&img, &k, &["--tpm2-device", &dev], b"");
    let out = run(
        cryptblk()
            .args([
                "open",
                "--test-passphrase",
                "--token-type",
                "systemd-tpm2",
                "-v",
            ])
            .env("SYSTEMD_TPM2_DEVICE", &dev)
            .arg(&img),
        b"",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Without token options the token is tried first and no passphrase is read.
    let (code, err) = {
        let out = run(
            cryptblk()
                .args(["open", "--test-passphrase", "--tpm2-device", &dev])
                .arg(&img),
            b"",
        );
        (
            exit_code(&out),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(code, 0, "{err}");

    // The measured state changes: the token is refused in one line, exit 2.
    tpm.extend(7);
    let (code, err) = open_by_token(&img, &["--tpm2-device", &dev], b"");
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("PCR") && err.contains("0+7"), "{err}");
    // Without --token-only the passphrase still opens it, after that line.
    let out = run(
        cryptblk()
            .args(["open", "--test-passphrase", "--tpm2-device", &dev])
            .arg(&img),
        b"the passphrase\n",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("PCR"), "{err}");

    // No TPM there: one line, exit 1, as cryptsetup's plugin reports a missing TPM.
    drop(tpm);
    let (code, err) = open_by_token(&img, &["--tpm2-device", &dev], b"");
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("TPM2"), "{err}");
}

#[test]
fn systemd_cryptenroll_tpm2_pin_volume_opens_with_the_pin() {
    let dir = tempdir();
    let Some((img, k)) = image(dir.path()) else {
        return;
    };
    let Some(tpm) = Swtpm::start() else { return };
    systemd_enroll(&tpm, &img, "7", Some("4711"));
    let dev = tpm.tcti();

    token_volume_key(&img, &k, &["--tpm2-device", &dev], b"4711\n");
    // A wrong PIN: one line, exit 2 (last: each failure counts toward the TPM's lockout).
    let (code, err) = open_by_token(&img, &["--tpm2-device", &dev], b"1234\n");
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("PIN"), "{err}");
}

/// Unseals a systemd-tpm2 token with tpm2-tools alone, as systemd does it; returns the
/// base64 passphrase in a file.
fn unseal_with_tpm2_tools(tpm: &Swtpm, img: &Path, dir: &Path, pin: Option<&str>) -> PathBuf {
    let json = run_ok(
        cryptsetup()
            .unwrap()
            .args(["token", "export", "--token-id", "0"])
            .arg(img),
        b"",
    );
    let token: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(token["type"], "systemd-tpm2");
    let b64 = write_file(
        dir,
        "blob.b64",
        token["tpm2-blob"].as_str().unwrap().as_bytes(),
    );
    let out = run(Command::new("base64").arg("-d").arg(&b64), b"");
    assert!(out.status.success());
    let blob = out.stdout;
    let n = u16::from_be_bytes([blob[0], blob[1]]) as usize;
    write_file(dir, "priv", &blob[..2 + n]);
    write_file(dir, "pub", &blob[2 + n..]);
    let pcrs: Vec<String> = token["tpm2-pcrs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.to_string())
        .collect();
    let auth = match pin {
        Some(p) => format!("+hex:{}", sha256_hex(p.as_bytes(), dir)),
        None => String::new(),
    };
    let script = format!(
        r#"set -e
cd "$1"
tpm2_createprimary -Q -C o -g sha256 -G ecc256:null:aes128cfb \
  -a 'restricted|decrypt|fixedtpm|fixedparent|sensitivedataorigin|userwithauth' -c prim.ctx
tpm2_load -Q -C prim.ctx -u pub -r priv -c seal.ctx
tpm2_flushcontext -t
tpm2_startauthsession -Q --policy-session -S s.ctx
tpm2_policypcr -Q -S s.ctx -l sha256:{pcrs}
{authvalue}
tpm2_unseal -c seal.ctx -p "session:s.ctx{auth}" > secret
tpm2_flushcontext s.ctx
tpm2_flushcontext -t
base64 -w0 secret > pass
rm -f secret"#,
        pcrs = pcrs.join(","),
        authvalue = if pin.is_some() {
            "tpm2_policyauthvalue -Q -S s.ctx"
        } else {
            ""
        },
    );
    run_ok(tpm.tools("sh").args(["-c", &script, "sh"]).arg(dir), b"");
    dir.join("pass")
}

fn sha256_hex(data: &[u8], dir: &Path) -> String {
    let p = write_file(dir, "pin", data);
    let h = sha256(&p);
    std::fs::remove_file(p).unwrap();
    h
}

/// What cryptsetup's luksDump shows for token 0 (through systemd's plugin when it loads).
fn dump_tokens(img: &Path) -> String {
    let out = run_ok(cryptsetup().unwrap().arg("luksDump").arg(img), b"");
    let start = out.find("Tokens:").unwrap();
    let end = out.find("Digests:").unwrap();
    out[start..end].to_string()
}

#[test]
fn cryptblk_enrolled_tpm2_token_is_systemds() {
    let dir = tempdir();
    let Some((img, k)) = image(dir.path()) else {
        return;
    };
    let Some(tpm) = Swtpm::start() else { return };
    let dev = tpm.tcti();
    run_ok(
        cryptblk()
            .args(["enroll", "--tpm2-device", &dev, "--tpm2-pcrs", "7", "-v"])
            .arg("--key-file")
            .arg(&k)
            .arg(&img),
        b"",
    );
    // The keyslot is systemd-cryptenroll's kind: PBKDF2-SHA512, 1000 iterations.
    let dump = run_ok(cryptsetup().unwrap().arg("luksDump").arg(&img), b"");
    let slot1 = &dump[dump.find("  1: luks2").unwrap()..];
    assert!(slot1.contains("PBKDF:      pbkdf2"), "{dump}");
    assert!(slot1.contains("Hash:       sha512"), "{dump}");
    assert!(slot1.contains("Iterations: 1000"), "{dump}");
    // systemd's plugin parses the token for cryptsetup's luksDump.
    let tokens = dump_tokens(&img);
    assert!(tokens.contains("0: systemd-tpm2"), "{tokens}");
    assert!(tokens.contains("tpm2-pcr-bank:    sha256"), "{tokens}");
    assert!(tokens.contains("tpm2-primary-alg: ecc"), "{tokens}");
    assert!(tokens.contains("tpm2-pin:         false"), "{tokens}");
    assert!(tokens.contains("Keyslot:    1"), "{tokens}");

    // tpm2-tools unseal it as systemd would, and the passphrase opens keyslot 1.
    let work = tempdir();
    let pass = unseal_with_tpm2_tools(&tpm, &img, work.path(), None);
    let out = run_ok(
        cryptsetup()
            .unwrap()
            .args(["open", "--test-passphrase", "-v", "--key-file"])
            .arg(&pass)
            .arg(&img),
        b"",
    );
    assert!(out.contains("Key slot 1 unlocked"), "{out}");
    assert_eq!(std::fs::read(&pass).unwrap().len(), 44);

    // cryptblk opens its own token, and refuses once PCR 7 moves.
    token_volume_key(&img, &k, &["--tpm2-device", &dev], b"");
    tpm.extend(7);
    let (code, err) = open_by_token(&img, &["--tpm2-device", &dev], b"");
    assert_eq!(code, 2, "{err}");

    // systemd-cryptenroll knows it as a TPM2 enrollment and wipes it.
    run_ok(
        tool("systemd-cryptenroll")
            .unwrap()
            .arg("--wipe-slot=tpm2")
            .env("PASSWORD", "the passphrase")
            .arg(&img),
        b"",
    );
    let tokens = dump_tokens(&img);
    assert!(!tokens.contains("systemd-tpm2"), "{tokens}");
}

#[test]
fn cryptblk_enrolled_tpm2_pin_token_unseals_with_the_pin() {
    let dir = tempdir();
    let Some((img, k)) = image(dir.path()) else {
        return;
    };
    let Some(tpm) = Swtpm::start() else { return };
    let dev = tpm.tcti();
    // The existing passphrase from the key file, the new PIN from standard input.
    run_ok(
        cryptblk()
            .args(["enroll", "--tpm2-device", &dev, "--tpm2-pcrs", "0,7"])
            .arg("--tpm2-with-pin")
            .arg("--key-file")
            .arg(&k)
            .arg(&img),
        b"2468\n",
    );
    let tokens = dump_tokens(&img);
    assert!(tokens.contains("tpm2-pin:         true"), "{tokens}");
    let work = tempdir();
    let pass = unseal_with_tpm2_tools(&tpm, &img, work.path(), Some("2468"));
    run_ok(
        cryptsetup()
            .unwrap()
            .args(["open", "--test-passphrase", "--key-file"])
            .arg(&pass)
            .arg(&img),
        b"",
    );
    token_volume_key(&img, &k, &["--tpm2-device", &dev], b"2468\n");
}

#[test]
fn enroll_refusals_change_nothing() {
    let dir = tempdir();
    let Some((img, k)) = image(dir.path()) else {
        return;
    };
    let before = std::fs::read(&img).unwrap();
    // No TPM at this address.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (rc, err) = code(
        cryptblk()
            .args(["enroll", "--tpm2-device"])
            .arg(format!("swtpm:host=127.0.0.1,port={port}"))
            .arg("--key-file")
            .arg(&k)
            .arg(&img),
    );
    assert_eq!(rc, 1, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // Not a PCR; not a TCTI; both tang and TPM2 options.
    for bad in [
        vec!["--tpm2-device", "/dev/tpmrm0", "--tpm2-pcrs", "7+99"],
        vec!["--tpm2-device", "nonsense"],
        vec!["--tang", "http://127.0.0.1:1", "--tpm2-pcrs", "7"],
    ] {
        let (rc, err) = code(
            cryptblk()
                .arg("enroll")
                .args(&bad)
                .arg("--key-file")
                .arg(&k)
                .arg(&img),
        );
        assert_eq!(rc, 1, "{bad:?}: {err}");
    }
    assert!(std::fs::read(&img).unwrap() == before, "the image changed");
}

/// `clevis luks bind -d IMG tpm2 CONFIG`, clevis's tpm2-tools talking to `tpm`.
fn clevis_bind_tpm2(tpm: &Swtpm, img: &Path, config: &str) {
    let mut c = tool("clevis").expect("clevis");
    run_ok(
        c.args(["luks", "bind", "-y", "-k", "-", "-d"])
            .arg(img)
            .args(["tpm2", config])
            .env("TPM2TOOLS_TCTI", tpm.tcti()),
        PASS,
    );
}

#[test]
fn clevis_tpm2_pin_opens_until_the_pcrs_change() {
    let dir = tempdir();
    let Some((img, k)) = image(dir.path()) else {
        return;
    };
    let Some(tpm) = Swtpm::start() else { return };
    if !Path::new("/usr/bin/clevis-encrypt-tpm2").exists() {
        panic!("clevis-tpm2 is required by this test (run scripts/install-deps.sh)");
    }
    clevis_bind_tpm2(&tpm, &img, r#"{"pcr_bank":"sha256","pcr_ids":"0,7"}"#);
    let dev = tpm.tcti();
    token_volume_key(&img, &k, &["--tpm2-device", &dev], b"");
    // The TPM clevis's own tools would use: TPM2TOOLS_TCTI.
    let out = run(
        cryptblk()
            .args(["open", "--test-passphrase", "--token-only"])
            .env("TPM2TOOLS_TCTI", &dev)
            .arg(&img),
        b"",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    tpm.extend(0);
    let (code, err) = open_by_token(&img, &["--tpm2-device", &dev], b"");
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("PCR"), "{err}");

    // Bound without PCRs (the object's empty auth value is its only guard).
    let (img2, k2) = {
        let d = dir.path().join("b");
        std::fs::create_dir(&d).unwrap();
        image(&d).unwrap()
    };
    clevis_bind_tpm2(&tpm, &img2, "{}");
    token_volume_key(&img2, &k2, &["--tpm2-device", &dev], b"");
}
