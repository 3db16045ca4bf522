//! Kernel cross-checks in the lab VM (/work/shared/lab: Debian 6.12 kernel under QEMU with
//! ublk_drv, dm-crypt, brd): tests/lab/run.sh stages this test's `cryptblk` binary and runs
//! the guest scripts of tests/lab/, which judge cryptblk against the real kernel.
//!
//! - smoke.sh: a zero table served over ublk appears as /dev/ublkbN and is deleted on close.
//! - compat.sh: LUKS2 aes-xts-plain64 (512/4096-byte sectors), LUKS1 aes-cbc-essiv:sha256
//!   and plain dmsetup tables; data and ext4 file systems written by cryptblk over ublk are
//!   read by kernel dm-crypt and the other way round (sha256, fsck, fio crc32c verify).
//! - crash.sh: SIGKILL of the daemon under fio load: the ublk device stays, I/O waits, the same
//!   `open` again takes /dev/ublkbN over and fio (crc32c verify) and a flushing writer finish
//!   without an error (ublk user recovery); then `cryptblk upgrade` twice under a second
//!   fio and writer (same device, new pid, 0 errors), and an upgrade whose successor dies
//!   after taking the stack (upgrade exits non-zero naming the same open, which recovers).
//! - wide-ciphers.sh: Adiantum LUKS2 and plain volumes, kernel and cryptblk both ways
//!   (HCTR2 and ARIA too where the kernel has them).
//!
//! Skipped only when CRYPTBLK_SKIP_LAB=1; otherwise a lab that cannot boot fails the test.
//! The scripts run one after the other (each VM takes both CPUs); about 5 minutes in all.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

static ONE_VM_AT_A_TIME: Mutex<()> = Mutex::new(());

fn workspace() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn skipped() -> bool {
    if std::env::var("CRYPTBLK_SKIP_LAB").as_deref() == Ok("1") {
        eprintln!("skipping the kernel lab test: CRYPTBLK_SKIP_LAB=1 is set");
        return true;
    }
    false
}

/// Runs one guest script through tests/lab/run.sh and fails with its output unless every
/// check in it passed.
fn run_lab(script: &str) {
    if skipped() {
        return;
    }
    let _vm = ONE_VM_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let runner = workspace().join("tests/lab/run.sh");
    let started = std::time::Instant::now();
    let out = Command::new(&runner)
        .arg("--no-build")
        .arg(script)
        .env("CRYPTBLK_BIN", env!("CARGO_BIN_EXE_cryptblk"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", runner.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "{script} ({} s):\n{stdout}\n{stderr}",
        started.elapsed().as_secs()
    );
    assert!(
        out.status.success(),
        "lab script {script} failed ({}); see the output above",
        out.status
    );
    assert!(
        stdout.contains("ALL PASSED") && !stdout.contains("FAIL "),
        "lab script {script} did not report success"
    );
}

#[test]
fn lab_ublk_smoke() {
    run_lab("smoke.sh");
}

#[test]
fn lab_kernel_dm_crypt_reads_cryptblk_and_back() {
    run_lab("compat.sh");
}

/// Each AES-XTS implementation (aws-lc, vaes-avx512-xts, vaes-avx2-xts, aesni-xts,
/// rustcrypto; as the guest CPU has them) with 256- and 512-bit keys: the kernel reads what
/// it wrote and it reads what the kernel wrote.
#[test]
fn lab_kernel_reads_every_xts_path_and_back() {
    run_lab("xts-paths.sh");
}

/// wide-ciphers.sh: Adiantum (`xchacha12,aes-adiantum-plain64` and xchacha20) in LUKS2
/// volumes with 512- and 4096-byte sectors and in plain mappings: the kernel's dm-crypt reads
/// what cryptblk wrote and cryptblk what the kernel wrote. HCTR2 and ARIA are checked the
/// same way where the kernel has them (the lab's does not: logged as not proven).
#[test]
fn lab_kernel_reads_adiantum_and_back() {
    run_lab("wide-ciphers.sh");
}

#[test]
fn lab_sigkill_of_the_daemon_is_survived() {
    run_lab("crash.sh");
}

/// tests/lab/vm.sh (every lab test's runner) against a stand-in run-in-vm.sh that "panics"
/// on its first N boots the way the Debian kernel sometimes does under TCG (exit 125, no
/// script output, "Kernel panic" on the console): such boots are retried, at most twice;
/// a script that printed anything keeps its result, and a failing one is never retried.
#[test]
fn vm_sh_boots_again_only_when_the_kernel_died_before_the_script() {
    let lab = tempfile::tempdir().unwrap();
    let fake = lab.path().join("run-in-vm.sh");
    std::fs::write(
        &fake,
        r#"#!/bin/bash
n=$(cat "$FAKE_COUNT" 2>/dev/null || echo 0); echo $((n+1)) > "$FAKE_COUNT"
: > "$LAB_LOGDIR/out.log"
if [ "$n" -lt "$FAKE_PANICS" ]; then
  echo "[ 6.113304] Kernel panic - not syncing: Fatal exception in interrupt" > "$LAB_LOGDIR/console.log"
  exit 125
fi
echo "ran $1" >> "$LAB_LOGDIR/out.log"; cat "$LAB_LOGDIR/out.log"
[ "$FAKE_RC" = 125 ] || echo "LAB_EXIT=$FAKE_RC" >> "$LAB_LOGDIR/out.log"
exit "$FAKE_RC"
"#,
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    // (panicking boots, the script's status) -> (vm.sh's status, boots)
    let cases = [
        ((0, 0), (0, 1)),
        ((1, 0), (0, 2)),
        ((2, 0), (0, 3)),
        ((3, 0), (125, 3)),
        ((0, 7), (7, 1)),
        // The script printed and then lost its exit marker: a failure of the run, not a boot.
        ((0, 125), (125, 1)),
        ((1, 3), (3, 2)),
    ];
    for ((panics, rc), (want_rc, want_boots)) in cases {
        let count = lab.path().join("count");
        let _ = std::fs::remove_file(&count);
        let out = Command::new(workspace().join("tests/lab/vm.sh"))
            .arg("guest.sh")
            .env("LAB_DIR", lab.path())
            .env_remove("LAB_LOGDIR")
            .env("FAKE_COUNT", &count)
            .env("FAKE_PANICS", panics.to_string())
            .env("FAKE_RC", rc.to_string())
            .output()
            .unwrap();
        let boots: u32 = std::fs::read_to_string(&count)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(
            (out.status.code(), boots),
            (Some(want_rc), want_boots),
            "{panics} panicking boots, script status {rc}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if want_rc != 125 || rc == 125 {
            assert!(String::from_utf8_lossy(&out.stdout).contains("ran guest.sh"));
        }
    }
}
