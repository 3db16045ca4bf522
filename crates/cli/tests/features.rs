//! The Cargo features of this build as a user meets them (issue 29): `--version` names them,
//! no build links librbd or libtss2 (`ldd`; with the features they are loaded on use), a build
//! without them refuses `rbd:` stores and TPM2 enrollment with one line and exit 1, and every
//! build formats a volume cryptsetup opens, serves it over NBD and closes it.
//!
//! CI runs this file twice: in the default build with the rest of the suite, and on a
//! `--no-default-features` build (the container build: no librbd, no tpm2-tss) of its own,
//! see .ci/run. Each test checks what its build must do, so both runs can fail.

mod common;
use common::reenc::plaintext_by_cryptsetup;
use common::*;
use std::process::Command;

/// The build's features as `--version` must name them.
fn expected_features() -> String {
    let sign = |on: bool| if on { '+' } else { '-' };
    format!(
        "({}rbd {}tpm2 {}blkid)",
        sign(cfg!(feature = "rbd")),
        sign(cfg!(feature = "tpm2")),
        sign(cfg!(feature = "blkid")),
    )
}

/// cryptsetup's `flags:` words scripts probe, in cryptsetup's order: BLKID when libblkid is
/// built in (install-deps.sh installs libblkid1, so it loads), KEYRING always.
fn expected_flags() -> &'static str {
    if cfg!(feature = "blkid") {
        " flags: BLKID KEYRING"
    } else {
        " flags: KEYRING"
    }
}

#[test]
fn version_names_the_features_built_in() {
    let out = run_ok(cryptblk().arg("--version"), b"");
    let want = format!("{}{}", expected_features(), expected_flags());
    assert!(
        out.trim_end().ends_with(&want),
        "expected {want} in {out:?}"
    );
}

/// No build links librbd or tpm2-tss (issue 28: every process, every served volume's daemon,
/// would map and relocate them): with the features, they are loaded when an RBD image or a
/// TPM2 token is used (crates/rbd, crates/volume/src/token/tss2_load.rs); a new tss-esapi
/// call that the loader's table lacks links libtss2 again and fails here.
#[test]
fn no_build_links_librbd_or_libtss2() {
    let ldd = run_ok(Command::new("ldd").arg(env!("CARGO_BIN_EXE_cryptblk")), b"");
    for lib in [
        "librbd.so",
        "librados.so",
        "libtss2",
        "libcrypto.so",
        "libblkid.so",
    ] {
        assert!(!ldd.contains(lib), "{lib} linked:\n{ldd}");
    }
}

/// Runs `cmd` with the shared library `soname` replaced by an empty file (a bind mount of
/// /dev/null in a mount namespace of its own), as on a machine without that library.
#[cfg(any(feature = "rbd", feature = "tpm2"))]
fn without_library(soname: &str, cmd: &Command) -> std::process::Output {
    let cache = run_ok(Command::new("ldconfig").arg("-p"), b"");
    let path = cache
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{soname} ")))
        .and_then(|l| l.split("=> ").nth(1))
        .unwrap_or_else(|| panic!("{soname} is not installed (scripts/install-deps.sh):\n{cache}"));
    let real = std::fs::canonicalize(path.trim()).expect("the library's file");
    let mut hidden = Command::new("unshare");
    hidden
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind /dev/null "$0" && exec "$@""#)
        .arg(real)
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => hidden.env(k, v),
            None => hidden.env_remove(k),
        };
    }
    run(&mut hidden, b"")
}

/// A default build on a machine without librbd: an `rbd:` store fails with one line naming
/// the library to install, exit 1 (as a build without rbd), before any cluster is asked.
#[cfg(feature = "rbd")]
#[test]
fn rbd_store_without_librbd_installed() {
    let dir = tempdir();
    let key = write_file(dir.path(), "key", b"features key");
    let sock = dir.path().join("rbd.sock");
    let mut open = cryptblk();
    open.args(["open", "--key-file"])
        .arg(&key)
        .args(["rbd:pool/image", "t-feat-norbd", "--nbd"])
        .arg(&sock);
    let out = without_library("librbd.so.1", &open);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot load librbd.so.1"), "{err}");
    assert!(err.contains("install librbd1"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(!sock.exists(), "nothing is served");
}

/// A default build on a machine without tpm2-tss: TPM2 enrollment fails with one line naming
/// the library, exit 1, the header untouched; a volume is still formatted and opened there.
#[cfg(feature = "tpm2")]
#[test]
fn tpm2_enroll_without_libtss2_installed() {
    let dir = tempdir();
    let key = write_file(dir.path(), "key", b"features key");
    let img = dir.path().join("img");
    cryptsetup_luks2(&img, &key, 32 << 20).expect("cryptsetup formats the image");
    let before = sha256(&img);
    let mut enroll = cryptblk();
    enroll
        .args(["enroll", "--tpm2-device", "/dev/null", "--key-file"])
        .arg(&key)
        .arg(&img);
    let out = without_library("libtss2-esys.so.0", &enroll);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot load libtss2-esys.so.0"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert_eq!(before, sha256(&img), "the header is unchanged");
    let mut test = cryptblk();
    test.args(["open", "--test-passphrase", "--key-file"])
        .arg(&key)
        .arg(&img);
    let out = without_library("libtss2-esys.so.0", &test);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An `rbd:` store in a build without rbd: one line naming the missing support, exit 1
/// (cryptsetup's answer to a request for something it was built without), nothing served.
#[cfg(not(feature = "rbd"))]
#[test]
fn rbd_store_without_rbd_support() {
    let dir = tempdir();
    let key = write_file(dir.path(), "key", b"features key");
    let sock = dir.path().join("rbd.sock");
    let out = run(
        cryptblk()
            .args(["open", "--key-file"])
            .arg(&key)
            .args(["rbd:pool/image", "t-feat-rbd", "--nbd"])
            .arg(&sock),
        b"",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cryptblk was built without rbd support."),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(!sock.exists(), "nothing is served");
}

/// TPM2 enrollment in a build without tpm2: one line, exit 1, the header untouched.
#[cfg(not(feature = "tpm2"))]
#[test]
fn tpm2_enroll_without_tpm2_support() {
    let dir = tempdir();
    let key = write_file(dir.path(), "key", b"features key");
    let img = dir.path().join("img");
    cryptsetup_luks2(&img, &key, 32 << 20).expect("cryptsetup formats the image");
    let before = sha256(&img);
    let out = run(
        cryptblk()
            .args(["enroll", "--tpm2-device", "/dev/null", "--key-file"])
            .arg(&key)
            .arg(&img),
        b"",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cryptblk was built without tpm2 support."),
        "{err}"
    );
    assert_eq!(before, sha256(&img), "the header is unchanged");
}

/// The container build's use: luksFormat (a header cryptsetup accepts), open --nbd, data
/// written through the export decrypts with cryptsetup's volume key (independent model),
/// close removes the socket.
#[test]
fn luks_format_open_nbd_close() {
    let dir = tempdir();
    let key = write_file(dir.path(), "key", b"features key");
    let img = dir.path().join("img");
    sparse_file(&img, 32 << 20);
    run_ok(
        cryptblk()
            .args(["luksFormat", "-q", "--type", "luks2"])
            .args(FAST)
            .arg("--key-file")
            .arg(&key)
            .arg(&img),
        b"",
    );
    let sock = dir.path().join("vol.sock");
    let served = open_nbd(&img, &key, "t-feat-nbd", &sock, &[]);
    let plain = dir.path().join("plain");
    let data = write_pattern(&plain, 1 << 20, 29);
    run_ok(
        Command::new("nbdcopy")
            .arg(&plain)
            .arg(nbd_uri(&sock))
            .arg("--destination-is-zero"),
        b"",
    );
    run_ok(cryptblk().args(["close", "t-feat-nbd"]), b"");
    // Already closed: the guard's own close finds nothing.
    drop(served);
    assert!(!sock.exists(), "the socket is gone after close");
    let (_, decrypted) = plaintext_by_cryptsetup(&img, &key);
    assert!(
        decrypted[..data.len()] == data[..],
        "cryptsetup's volume key does not decrypt what the export stored"
    );
}
