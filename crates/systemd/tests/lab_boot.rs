//! crypttab and fstab under systemd itself (issue 28 item 2): tests/lab/systemd-boot.sh boots
//! the lab's kernel with systemd as PID 1 on a Debian root into which scripts/install.sh put
//! the workspace's cryptblk, cryptblk-generator, units and udev rule; a key-file volume and a
//! tang-bound volume from /etc/crypttab are served over ublk and mounted through /etc/fstab
//! from /dev/cryptblk/NAME. Minutes under TCG (and a debootstrap on first use), so ignored:
//!
//!     cargo test --workspace --test lab_boot -- --ignored --nocapture

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
#[ignore = "boots a systemd guest in the kernel lab (minutes)"]
fn crypttab_volumes_are_served_and_mounted_under_systemd() {
    let generator = Path::new(env!("CARGO_BIN_EXE_cryptblk-generator"));
    let cryptblk = generator.parent().unwrap().join("cryptblk");
    assert!(
        cryptblk.is_file(),
        "{} is built with the workspace",
        cryptblk.display()
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/lab/systemd-boot.sh");
    let mut child = Command::new("bash")
        .arg(&script)
        .arg("--no-build")
        .env("CRYPTBLK_BIN", &cryptblk)
        .env("CRYPTBLK_GENERATOR", generator)
        .env("LAB_TIMEOUT", "1500")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    // The script kills its VM after LAB_TIMEOUT; this bounds the root's debootstrap too.
    let deadline = Instant::now() + Duration::from_secs(2400);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{} did not finish within 40 minutes", script.display());
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(status.success(), "{}: {status}", script.display());
}
