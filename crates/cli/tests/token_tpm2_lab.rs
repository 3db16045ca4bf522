//! systemd's own TPM2 token plugin against tokens cryptblk enrolls, on a real kernel TPM
//! device. Debian systemd 252's `libcryptsetup-token-systemd-tpm2.so` (what `cryptsetup open
//! --token-only` loads) finds its TPM only as /dev/tpmrm0, which this host's kernel lacks
//! (no TPM driver, no tpm_vtpm_proxy, no CUSE), and it ignores SYSTEMD_TPM2_DEVICE. So the
//! lab (/work/shared/lab) boots a kernel with QEMU's TIS TPM backed by swtpm on the host;
//! there cryptblk enrolls, cryptsetup opens through systemd's plugin (with and without a
//! PIN), and cryptblk opens what systemd-cryptenroll enrolled on the same device.
//! Guest script: fixtures/tpm2/guest.sh.
//!
//! Skipped only when CRYPTBLK_SKIP_LAB=1; a lab that cannot boot fails the test.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Copies `files` and the libraries they link into `root`, at their host paths (under both
/// /lib and /usr/lib: the host merges them, the guest image may not).
fn bundle(root: &Path, files: &[PathBuf]) {
    let script = r#"set -e
R=$1; shift
put() { mkdir -p "$R$(dirname "$1")"; cp -L "$1" "$R$1"; }
for f in "$@"; do
  for p in "$f" $(ldd "$f" 2>/dev/null | grep -o '/[^ ]*'); do
    put "$p"
    case $p in
      /usr/lib/*) q=${p#/usr}; mkdir -p "$R$(dirname "$q")"; cp -L "$p" "$R$q" ;;
      /lib/*) q=/usr$p; mkdir -p "$R$(dirname "$q")"; cp -L "$p" "$R$q" ;;
    esac
  done
done"#;
    run_ok(
        Command::new("sh")
            .args(["-c", script, "sh"])
            .arg(root)
            .args(files),
        b"",
    );
}

// Ignored: the guest's checks take a few minutes under TCG, but with a TPM attached its
// poweroff hangs until the lab's timeout (LAB_TIMEOUT, 900 s here), about 16 minutes in all.
// Run: LAB_DIR=/path/to/shared/lab cargo test -p cryptblk --test token_tpm2_lab -- --ignored
#[test]
#[ignore]
fn systemd_token_plugin_opens_cryptblk_tpm2_enrollments_in_the_lab() {
    if std::env::var("CRYPTBLK_SKIP_LAB").as_deref() == Ok("1") {
        eprintln!("skipping the kernel lab test: CRYPTBLK_SKIP_LAB=1 is set");
        return;
    }
    let Some(_) = tool("swtpm") else { return };
    let share = tempfile::Builder::new()
        .prefix("cb-tpm2-lab")
        .tempdir_in("/var/tmp")
        .unwrap();
    let s = share.path();
    std::fs::write(s.join("key"), b"tpm2 in the lab").unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_cryptblk"), s.join("cryptblk")).unwrap();
    // Library paths from the loader's cache, not a hard-coded multiarch directory.
    let cache = String::from_utf8(
        Command::new("ldconfig")
            .arg("-p")
            .output()
            .expect("ldconfig -p")
            .stdout,
    )
    .unwrap();
    let cached: Vec<PathBuf> = cache
        .lines()
        .filter_map(|l| l.split(" => ").nth(1))
        .map(PathBuf::from)
        .collect();
    let libcryptsetup = cached
        .iter()
        .find(|p| p.file_name().is_some_and(|n| n == "libcryptsetup.so.12"))
        .expect("libcryptsetup.so.12 in the loader cache");
    let mut files = vec![
        PathBuf::from(env!("CARGO_BIN_EXE_cryptblk")),
        PathBuf::from("/usr/bin/systemd-cryptenroll"),
        // cryptsetup's token plugins live beside libcryptsetup, in `cryptsetup/`.
        libcryptsetup
            .parent()
            .unwrap()
            .join("cryptsetup/libcryptsetup-token-systemd-tpm2.so"),
    ];
    // tpm2-tss's libraries are dlopened (by systemd and by the TCTI loader): not in ldd.
    files.extend(
        cached
            .iter()
            .filter(|p| {
                p.file_name().is_some_and(|n| {
                    let n = n.to_string_lossy();
                    n.starts_with("libtss2-") && n.contains(".so.")
                })
            })
            .cloned(),
    );
    for f in &files {
        assert!(f.exists(), "{} is needed in the guest", f.display());
    }
    bundle(&s.join("root"), &files);

    // swtpm as QEMU's TPM emulator backend (control channel on a short socket path).
    let work = tempdir();
    let ctrl = work.path().join("tpm.ctrl");
    let mut swtpm = Command::new("swtpm")
        .args(["socket", "--tpm2", "--tpmstate"])
        .arg(format!("dir={}", work.path().display()))
        .arg("--ctrl")
        .arg(format!("type=unixio,path={}", ctrl.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("cannot start swtpm");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ctrl.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tpm2/guest.sh");
    let out = lab_vm(&script)
        .env("LAB_SHARE", s)
        .env("LAB_MEM", "1G")
        // The PVH boot gives the kernel no ACPI entry for the TIS TPM: probe its address.
        .env("LAB_APPEND", "tpm_tis.force=1 tpm_tis.interrupts=0")
        .env(
            "LAB_QEMU_ARGS",
            format!(
                "-chardev socket,id=chrtpm,path={} -tpmdev emulator,id=tpm0,chardev=chrtpm \
                 -device tpm-tis,tpmdev=tpm0",
                ctrl.display()
            ),
        )
        .env("LAB_TIMEOUT", "900")
        .output();
    let _ = swtpm.kill();
    let _ = swtpm.wait();
    let out = out.unwrap_or_else(|e| panic!("cannot run the lab: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "lab run failed ({})", out.status);
    assert!(
        stdout.contains("ALL PASSED") && !stdout.contains("FAIL "),
        "guest checks"
    );
}
