//! The Cargo features of this build as a user meets them (issue 29): `--version` names them,
//! the binary links librbd only with `rbd` and libtss2 only with `tpm2` (`ldd`), a build
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
        "({}rbd {}tpm2)",
        sign(cfg!(feature = "rbd")),
        sign(cfg!(feature = "tpm2"))
    )
}

#[test]
fn version_names_the_features_built_in() {
    let out = run_ok(cryptblk().arg("--version"), b"");
    assert!(
        out.trim_end().ends_with(&expected_features()),
        "expected {} in {out:?}",
        expected_features()
    );
}

#[test]
fn linked_libraries_follow_the_features() {
    let ldd = run_ok(Command::new("ldd").arg(env!("CARGO_BIN_EXE_cryptblk")), b"");
    for (lib, feature) in [
        ("librbd.so", cfg!(feature = "rbd")),
        ("librados.so", cfg!(feature = "rbd")),
        ("libtss2-esys.so", cfg!(feature = "tpm2")),
    ] {
        assert_eq!(
            ldd.contains(lib),
            feature,
            "{lib} linked: {}, feature built in: {feature}:\n{ldd}",
            ldd.contains(lib)
        );
    }
    // No build links any libtss2 without tpm2 (tss-esapi pulls in several).
    if !cfg!(feature = "tpm2") {
        assert!(!ldd.contains("libtss2"), "{ldd}");
    }
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
