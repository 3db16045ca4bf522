//! loop-AES against the real kernel (the lab VM, /work/shared/lab): volumes mapped by
//! `cryptsetup loopaesOpen` (kernel dm-crypt: `aes-cbc-plain64` for one key,
//! `aes:64-cbc-lmk` for 64 and 65 keys) on image files.
//!
//! - The kernel writes known data; on the host cryptblk reads it back identically through
//!   `decrypt --type loopaes` and through `loopaesOpen` served over NBD, and its table (key
//!   included) equals the kernel's `dmsetup table --showkeys`.
//! - cryptblk writes known data through its NBD export on the host; in the guest the kernel
//!   reads it identically (key file from standard input, as after `gpg --decrypt`).
//! - Malformed key files and options: cryptblk's exit code is cryptsetup's in the guest.
//!
//! Guest script: fixtures/loopaes/guest.sh. One VM boot, small images; well under a minute
//! under TCG. Skipped only when CRYPTBLK_SKIP_LAB=1; a lab that cannot boot fails the test.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

/// A key file of `n` lines of `len` printable characters.
fn keyfile(n: usize, len: usize, salt: usize) -> Vec<u8> {
    let mut v = Vec::new();
    for i in 0..n {
        for j in 0..len {
            v.push(b'#' + ((i * 17 + j * 5 + salt) % 88) as u8);
        }
        v.push(b'\n');
    }
    v
}

/// (name, key lines, options given to both tools, data offset in sectors)
const CASES: &[(&str, usize, &str, usize)] = &[
    ("single", 1, "", 0),
    ("v2", 64, "-s 128", 0),
    ("v3", 65, "--offset 8", 8),
    ("v3b", 65, "-s 192 --offset 4 --skip 0 --hash sha512", 4),
];

const DATA: usize = 1 << 20;

/// (name, arguments with @K for the bad/ folder and @DEV for the device)
const BAD: &[(&str, &str)] = &[
    ("keys2", "--key-file @K/keys2.key @DEV"),
    ("keys63", "--key-file @K/keys63.key @DEV"),
    ("keys66", "--key-file @K/keys66.key @DEV"),
    ("shortline", "--key-file @K/shortline.key @DEV"),
    ("unterminated", "--key-file @K/unterminated.key @DEV"),
    ("empty", "--key-file @K/empty.key @DEV"),
    ("gpg", "--key-file @K/gpg.key @DEV"),
    ("missing", "--key-file @K/missing.key @DEV"),
    ("nokeyfile", "@DEV"),
    ("hashnone", "--key-file @K/one.key -s 512 @DEV"),
    ("hashshort", "--key-file @K/one.key --hash sha1 @DEV"),
    ("testpass", "--test-passphrase --key-file @K/one.key @DEV"),
    ("nodev", "--key-file @K/one.key /nonexistent/dev"),
];

fn bad_files(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let w = |n: &str, c: &[u8]| std::fs::write(dir.join(format!("{n}.key")), c).unwrap();
    w("keys2", &keyfile(2, 20, 0));
    w("keys63", &keyfile(63, 20, 0));
    w("keys66", &keyfile(66, 20, 0));
    let mut s = keyfile(64, 20, 0);
    s.remove(5);
    w("shortline", &s);
    let mut u = keyfile(1, 20, 0);
    u.pop();
    w("unterminated", &u);
    w("empty", b"");
    w(
        "gpg",
        b"-----BEGIN PGP MESSAGE-----\n\nhQEMA5x0aGVyZQ==\n-----END PGP MESSAGE-----\n",
    );
    w("one", &keyfile(1, 20, 0));
}

#[test]
fn kernel_and_cryptblk_read_each_others_loop_aes_volumes() {
    if std::env::var("CRYPTBLK_SKIP_LAB").as_deref() == Ok("1") {
        eprintln!("skipping the kernel lab test: CRYPTBLK_SKIP_LAB=1 is set");
        return;
    }
    let Some(_) = tool("nbdcopy") else { return };
    let share = tempfile::Builder::new()
        .prefix("cb-loopaes-lab")
        .tempdir_in("/var/tmp")
        .unwrap();
    let s = share.path();
    let work = tempdir();
    let mut cases = String::new();
    for (i, &(name, n, opts, offset)) in CASES.iter().enumerate() {
        cases += &format!("{name} {opts}\n");
        let key = s.join(format!("{name}.key"));
        std::fs::write(&key, keyfile(n, 32 + i, i)).unwrap();
        write_pattern(&s.join(format!("{name}.kplain")), DATA, 10 + i as u64);
        // Junk before and in the data area: the offset area must survive both tools.
        let junk = write_pattern(
            &work.path().join("junk"),
            DATA + offset * 512,
            50 + i as u64,
        );
        std::fs::write(s.join(format!("{name}.blank.img")), &junk).unwrap();
        let cb_img = s.join(format!("{name}.cb.img"));
        std::fs::write(&cb_img, &junk).unwrap();
        let cbplain = work.path().join(format!("{name}.cbplain"));
        write_pattern(&cbplain, DATA, 90 + i as u64);
        let sock = work.path().join(format!("{i}.sock"));
        let map = format!("lalab-{}-{i}", std::process::id() % 10000);
        run_ok(
            cryptblk()
                .arg("loopaesOpen")
                .arg("--key-file")
                .arg(&key)
                .args(opts.split_whitespace())
                .arg(&cb_img)
                .arg(&map)
                .arg("--nbd")
                .arg(&sock),
            b"",
        );
        let served = Served::volume(map);
        run_ok(
            Command::new("nbdcopy").arg(&cbplain).arg(nbd_uri(&sock)),
            b"",
        );
        drop(served);
        std::fs::write(
            s.join(format!("{name}.cbsum")),
            format!("{} {DATA}\n", sha256(&cbplain)),
        )
        .unwrap();
    }
    std::fs::write(s.join("cases"), cases).unwrap();
    bad_files(&s.join("bad"));
    let bad: String = BAD.iter().map(|(n, a)| format!("{n} {a}\n")).collect();
    std::fs::write(s.join("bad.cases"), bad).unwrap();

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/loopaes/guest.sh");
    let started = std::time::Instant::now();
    let out = lab_vm(&script)
        .env("LAB_SHARE", s)
        .env("LAB_TIMEOUT", "600")
        .output()
        .unwrap_or_else(|e| panic!("cannot run the lab: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "lab ({} s):\n{stdout}\n{}",
        started.elapsed().as_secs(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "lab run failed ({})", out.status);
    assert!(stdout.contains("ALL PASSED") && !stdout.contains("FAIL "));
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("PASS ")).count(),
        2 * CASES.len(),
        "every case must be written and read by the kernel"
    );

    // What the kernel wrote, cryptblk reads: offline and served; same table as the kernel's.
    for (i, &(name, _, opts, offset)) in CASES.iter().enumerate() {
        let key = s.join(format!("{name}.key"));
        let img = s.join(format!("{name}.kernel.img"));
        let kplain = std::fs::read(s.join(format!("{name}.kplain"))).unwrap();
        let junk = std::fs::read(s.join(format!("{name}.blank.img"))).unwrap();
        let written = std::fs::read(&img).unwrap();
        assert_eq!(written.len(), junk.len(), "{name}");
        assert!(
            written[..offset * 512] == junk[..offset * 512],
            "{name}: offset area"
        );
        let out = work.path().join(format!("{name}.out"));
        run_ok(
            cryptblk()
                .args(["decrypt", "-q", "--type", "loopaes", "--key-file"])
                .arg(&key)
                .args(opts.split_whitespace())
                .arg(&img)
                .arg(&out),
            b"",
        );
        assert!(
            std::fs::read(&out).unwrap() == kplain,
            "{name}: cryptblk decrypt differs from what the kernel wrote"
        );
        let sock = work.path().join(format!("k{i}.sock"));
        let map = format!("lalabk-{}-{i}", std::process::id() % 10000);
        run_ok(
            cryptblk()
                .args(["open", "-r", "--type", "loopaes", "--key-file", "-"])
                .args(opts.split_whitespace())
                .arg(&img)
                .arg(&map)
                .arg("--nbd")
                .arg(&sock),
            &std::fs::read(&key).unwrap(),
        );
        let served = Served::volume(map.clone());
        let copy = work.path().join(format!("{name}.copy"));
        run_ok(Command::new("nbdcopy").arg(nbd_uri(&sock)).arg(&copy), b"");
        assert!(
            std::fs::read(&copy).unwrap() == kplain,
            "{name}: cryptblk over NBD differs from what the kernel wrote"
        );
        let ours = run_ok(cryptblk().args(["dm", "table", "--showkeys", &map]), b"");
        drop(served);
        let kernel = std::fs::read_to_string(s.join(format!("{name}.kernel.table"))).unwrap();
        let (o, k): (Vec<&str>, Vec<&str>) = (
            ours.split_whitespace().collect(),
            kernel.split_whitespace().collect(),
        );
        // start, length, target, cipher, key, iv_offset; device names differ; offset.
        assert_eq!(
            o[..6],
            k[..6],
            "{name}: table\nours:   {ours}\nkernel: {kernel}"
        );
        assert_eq!(o[7], k[7], "{name}: data offset");
    }

    // Bad input: the exit code is cryptsetup's, with one line and no panic.
    let img = work.path().join("bad.img");
    sparse_file(&img, 1 << 20);
    for (name, args) in BAD {
        let rc: i32 = std::fs::read_to_string(s.join(format!("bad/{name}.rc")))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let theirs = std::fs::read_to_string(s.join(format!("bad/{name}.err"))).unwrap();
        let a = args
            .replace("@K", &s.join("bad").display().to_string())
            .replace("@DEV", &img.display().to_string());
        let mut c = cryptblk();
        c.arg("loopaesOpen")
            .args(a.split_whitespace())
            .args(["bad", "--nbd"])
            .arg(work.path().join("bad.sock"));
        let (ours, err) = code(&mut c);
        eprintln!(
            "{name}: cryptsetup {rc}: {}  cryptblk {ours}: {}",
            theirs.trim(),
            err.trim()
        );
        assert_eq!(ours, rc, "{name}: cryptblk says {err}, cryptsetup {theirs}");
        assert_eq!(err.trim_end().lines().count(), 1, "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
}
