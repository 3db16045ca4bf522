//! `cryptblk integrity format|open|dump --data-device` and `open --integrity-recalculate`
//! against integritysetup and the kernel:
//!
//! - `format --data-device D META` writes the superblock the kernel wrote for the same
//!   sizes (the lab's `kdd.dump`, made by `integritysetup format --data-device` with
//!   kernel dm-integrity), and the real `integritysetup dump` agrees with cryptblk's dump;
//! - the kernel's data-device image opens over NBD and reads back the pattern the kernel
//!   wrote; the served table names the data device first with `meta_device:` as the
//!   kernel's table did;
//! - `open --integrity-recalculate` over data written without tags serves at once, every
//!   block reads, status reports `recalc_sector`, `integritysetup dump` then shows
//!   `recalc_sector` = the size, and a flipped bit is detected after a reopen.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../dm/tests/integrity_recalc_fixtures"
);

fn unpack(name: &str, dir: &Path) -> PathBuf {
    let src = Path::new(FIXTURES).join(format!("{name}.img.xz"));
    let dst = dir.join(format!("{name}.img"));
    unxz(&src, &dst);
    dst
}

fn cryptblk_dump(meta: &Path) -> BTreeMap<String, String> {
    dump_fields(&run_ok(
        cryptblk().args(["integrity", "dump"]).arg(meta),
        b"",
    ))
}

#[test]
fn format_with_data_device_matches_the_kernel_and_integritysetup() {
    let dir = tempdir();
    let meta = dir.path().join("meta.img");
    let data = dir.path().join("data.img");
    // The lab's sizes: 2 MiB metadata, 4 MiB data.
    sparse_file(&meta, 2 << 20);
    sparse_file(&data, 4 << 20);
    run_ok(
        cryptblk()
            .args(["integrity", "format", "--batch-mode", "--data-device"])
            .arg(&data)
            .arg(&meta),
        b"",
    );
    let ours = cryptblk_dump(&meta);
    let kernel =
        dump_fields(&std::fs::read_to_string(Path::new(FIXTURES).join("kdd.dump")).unwrap());
    assert_eq!(ours, kernel, "superblock as the kernel formatted it");
    if let Some(mut c) = tool("integritysetup") {
        let theirs = dump_fields(&run_ok(c.arg("dump").arg(&meta), b""));
        assert_eq!(ours, theirs, "integritysetup dump agrees");
    }
    // Wiped: data device zero, which reads back with valid tags (checked by the open test
    // below on the kernel's image; here the data device must not hold a superblock).
    let d = std::fs::read(&data).unwrap();
    assert!(d.iter().all(|&b| b == 0));
}

#[test]
fn kernel_data_device_image_serves_and_recalculation_works() {
    let Some(_) = tool("nbdcopy") else { return };
    let dir = tempdir();
    let meta = unpack("kdd-meta", dir.path());
    let data = unpack("kdd-data", dir.path());
    let sock = dir.path().join("dd.sock");
    {
        let _s = open_nbd_dd(&meta, &data, "t-int-dd", &sock, &[]);
        let out = dir.path().join("out.bin");
        run_ok(Command::new("nbdcopy").arg(nbd_uri(&sock)).arg(&out), b"");
        let got = std::fs::read(&out).unwrap();
        assert_eq!(
            &got[..256 << 10],
            &lab_pattern()[..],
            "kernel-written pattern"
        );
        assert_eq!(
            got.len() as u64,
            4 << 20,
            "data device size, no interleaving"
        );
        let st = run_ok(cryptblk().args(["integrity", "status", "t-int-dd"]), b"");
        assert!(st.contains("(detached)"), "{st}");
        assert!(st.contains("metadata device:"), "{st}");
        let table = run_ok(cryptblk().args(["dm", "table", "t-int-dd"]), b"");
        // The kernel's table: `<data> 0 4 J <n> meta_device:<meta> ...`.
        let data_abs = std::fs::canonicalize(&data).unwrap();
        let meta_abs = std::fs::canonicalize(&meta).unwrap();
        assert!(
            table.contains(&format!("integrity {} 0 4 J ", data_abs.display()))
                && table.contains(&format!("meta_device:{}", meta_abs.display())),
            "{table}"
        );
        let results = std::fs::read_to_string(Path::new(FIXTURES).join("results.txt")).unwrap();
        let kline = results
            .lines()
            .find(|l| l.starts_with("kdd table:"))
            .expect("kernel table recorded");
        assert!(
            kline.contains(" 0 4 J ") && kline.contains(" meta_device:"),
            "{kline}"
        );
    }

    // Recalculation: format --no-wipe, untagged pattern on the data device.
    let meta = dir.path().join("rmeta.img");
    let data = dir.path().join("rdata.img");
    sparse_file(&meta, 2 << 20);
    sparse_file(&data, 4 << 20);
    run_ok(
        cryptblk()
            .args([
                "integrity",
                "format",
                "--batch-mode",
                "--no-wipe",
                "--data-device",
            ])
            .arg(&data)
            .arg(&meta),
        b"",
    );
    let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &lab_pattern(), 0).unwrap();
    drop(f);
    let sock = dir.path().join("rc.sock");
    {
        let _s = open_nbd_dd(
            &meta,
            &data,
            "t-int-rc",
            &sock,
            &["--integrity-recalculate"],
        );
        let out = dir.path().join("rc.bin");
        run_ok(Command::new("nbdcopy").arg(nbd_uri(&sock)).arg(&out), b"");
        assert_eq!(
            &std::fs::read(&out).unwrap()[..256 << 10],
            &lab_pattern()[..]
        );
        let v: serde_json::Value = serde_json::from_str(
            run_ok(
                cryptblk().args(["integrity", "status", "t-int-rc", "--json"]),
                b"",
            )
            .trim(),
        )
        .unwrap();
        assert!(v["recalc_sector"].is_u64(), "{v}");
        assert_eq!(v["failures"], 0);
        // Wait for the recalculation to reach the end.
        let mut done = false;
        for _ in 0..200 {
            let a = run_ok(
                cryptblk().args(["integrity", "status", "t-int-rc", "--json"]),
                b"",
            );
            let v: serde_json::Value = serde_json::from_str(a.trim()).unwrap();
            if v["recalc_sector"] == 8192 {
                done = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(done, "recalculation reached the end");
    }
    let d = cryptblk_dump(&meta);
    assert_eq!(d.get("recalc_sector").map(String::as_str), Some("8192"));
    if let Some(mut c) = tool("integritysetup") {
        let theirs = dump_fields(&run_ok(c.arg("dump").arg(&meta), b""));
        assert_eq!(
            theirs.get("recalc_sector").map(String::as_str),
            Some("8192")
        );
        assert!(theirs["flags"].contains("recalculating"), "{theirs:?}");
    }
    // Reopened without the option: tags are checked; a flipped bit fails the read.
    let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[lab_pattern()[5000] ^ 0x04], 5000).unwrap();
    drop(f);
    let sock = dir.path().join("rc2.sock");
    let _s = open_nbd_dd(&meta, &data, "t-int-rc2", &sock, &[]);
    let out = run(
        Command::new("nbdcopy")
            .arg(nbd_uri(&sock))
            .arg(dir.path().join("rc2.bin")),
        b"",
    );
    assert!(
        !out.status.success(),
        "a flipped bit after recalculation went unnoticed"
    );
}

fn open_nbd_dd(meta: &Path, data: &Path, name: &str, sock: &Path, args: &[&str]) -> Served {
    let data = data.to_str().unwrap();
    integrity_open_nbd(meta, name, sock, &[&["--data-device", data], args].concat())
}
