//! LUKS2 `--integrity` volumes formatted and written by cryptblk, opened by the real
//! cryptsetup and kernel (dm-crypt over dm-integrity) in the lab VM
//! (/work/shared/lab): the kernel must expose the same size and read every byte cryptblk
//! wrote (so every tag cryptblk stored verifies in the kernel), then writes a pattern that
//! cryptblk must read back. Guest script: fixtures/luks2-integrity/guest-kernel-reads.sh.
//!
//! Skipped only when CRYPTBLK_SKIP_LAB=1; a lab that cannot boot fails the test.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

const FAST: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

fn sha256_hex(path: &Path) -> String {
    let out = run_ok(Command::new("sha256sum").arg(path), b"");
    out.split_whitespace().next().unwrap().to_string()
}

/// (name, cipher, integrity, key bits, sector size, extra luksFormat options)
type Variant = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
);

const VARIANTS: &[Variant] = &[
    (
        "xts-plain64-hmac-sha256",
        "aes-xts-plain64",
        "hmac-sha256",
        "256",
        "512",
        &[],
    ),
    (
        "xts-random-hmac-sha256-legacy",
        "aes-xts-random",
        "hmac-sha256",
        "256",
        "4096",
        &["--integrity-legacy-padding"],
    ),
    (
        "gcm-random-aead",
        "aes-gcm-random",
        "aead",
        "256",
        "4096",
        &[],
    ),
    (
        "chacha20-random-poly1305-nowipe",
        "chacha20-random",
        "poly1305",
        "256",
        "512",
        &["--integrity-no-wipe"],
    ),
    (
        "chacha20-plain64-poly1305",
        "chacha20-plain64",
        "poly1305",
        "256",
        "4096",
        &[],
    ),
];

#[test]
fn kernel_reads_cryptblk_integrity_volumes_and_back() {
    if std::env::var("CRYPTBLK_SKIP_LAB").as_deref() == Ok("1") {
        eprintln!("skipping the kernel lab test: CRYPTBLK_SKIP_LAB=1 is set");
        return;
    }
    let Some(_) = tool("nbdcopy") else { return };
    let Some(_) = tool("qemu-img") else { return };
    let share = tempfile::Builder::new()
        .prefix("cb-luks-integrity-lab")
        .tempdir_in("/var/tmp")
        .unwrap();
    let s = share.path();
    let key = s.join("key");
    std::fs::write(&key, b"cryptblk to kernel").unwrap();
    let kpattern = write_pattern(&s.join("kpattern.bin"), 65536, 4242);
    let work = tempdir();
    for (i, (name, cipher, integ, bits, sector, extra)) in VARIANTS.iter().enumerate() {
        let img = s.join(format!("{name}.img"));
        std::fs::write(&img, vec![0u8; 4 << 20]).unwrap();
        run_ok(
            luks_format_integrity(cipher, integ)
                .args(["-s", bits, "--sector-size", sector])
                .args(["--offset", "2048", "--luks2-keyslots-size", "256k"])
                .args(FAST)
                .args(*extra)
                .arg("-d")
                .arg(&key)
                .arg(&img),
            b"",
        );
        // Fill the whole exposed device through cryptblk (every tag written by cryptblk).
        let sock = work.path().join(format!("{i}.sock"));
        let map = format!("cblab-{}-{i}", std::process::id() % 10000);
        let served = open_nbd(&img, &key, &map, &sock, &[]);
        let size: u64 = run_ok(
            Command::new("nbdinfo").arg("--size").arg(nbd_uri(&sock)),
            b"",
        )
        .trim()
        .parse()
        .unwrap();
        let data = work.path().join(format!("{i}.data"));
        write_pattern(&data, size as usize, 100 + i as u64);
        run_ok(Command::new("nbdcopy").arg(&data).arg(nbd_uri(&sock)), b"");
        drop(served);
        std::fs::write(
            s.join(format!("{name}.expect")),
            format!("{size} {}\n", sha256_hex(&data)),
        )
        .unwrap();
    }

    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/luks2-integrity/guest-kernel-reads.sh");
    let out = lab_vm(&script)
        .env("LAB_SHARE", s)
        .env("LAB_TIMEOUT", "900")
        .output()
        .unwrap_or_else(|e| panic!("cannot run the lab: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "lab run failed ({})", out.status);
    assert!(stdout.contains("ALL PASSED") && !stdout.contains("FAIL "));
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("PASS ")).count(),
        VARIANTS.len(),
        "every volume must be checked by the kernel"
    );

    // What the kernel wrote, cryptblk reads.
    for (i, (name, ..)) in VARIANTS.iter().enumerate() {
        let img = s.join(format!("{name}.kernel.img"));
        let sock = work.path().join(format!("k{i}.sock"));
        let map = format!("cblabk-{}-{i}", std::process::id() % 10000);
        let served = open_nbd(&img, &key, &map, &sock, &[]);
        let head = work.path().join(format!("k{i}.head"));
        run_ok(
            Command::new("qemu-img")
                .args(["dd", "-f", "raw", "-O", "raw"])
                .arg(format!("if={}", nbd_uri(&sock)))
                .arg(format!("of={}", head.display()))
                .args(["bs=65536", "count=1"]),
            b"",
        );
        drop(served);
        assert_eq!(
            std::fs::read(&head).unwrap(),
            kpattern,
            "{name}: cryptblk reads what the kernel wrote"
        );
    }
}
