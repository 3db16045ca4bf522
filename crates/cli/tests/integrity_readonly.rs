//! Read-only opens of integrity stacks through the real binary:
//! `cryptblk integrity open --readonly` and `cryptblk open --readonly` of a LUKS2
//! `--integrity` volume never write to the backing file.
//!
//! The images were made by the real `integritysetup` / `cryptsetup` and the kernel's
//! dm-integrity in the kernel lab (dm crate's integrity_fixtures, this crate's
//! fixtures/luks2-integrity). `k-sha256-live` is a copy taken while the kernel mapping was
//! live: its last flushed write is only in the journal, so reading it needs a journal
//! replay — which a read-write open writes to the disk (checked here as the control that
//! shows the sha256 comparison can fail) and a read-only open must do in memory only.
//! (Stricter than the kernel, whose read-only table still replays to a writable device and
//! fails with EIO on a read-only one: crates/dm/tests/integrity_timer_readonly_lab.sh.)
//!
//! Each case: the file's sha256 before and after is identical, the data read over NBD
//! (`nbdcopy`, `qemu-img dd`) is what the kernel wrote, a write over NBD (`qemu-io`) is
//! refused, and the daemon holds the file `O_RDONLY` (`/proc/<pid>/fdinfo`). The same
//! opens work on a file that is `chmod 0444` and immutable (`chattr +i`, which even root
//! cannot open for writing).

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn dm_fixture(name: &str) -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../dm/tests/integrity_fixtures"
    ))
    .join(format!("{name}.img.xz"))
}

fn luks_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/luks2-integrity")
        .join(format!("{name}.img.xz"))
}

fn sha256_file(path: &Path) -> String {
    let out = run_ok(Command::new("sha256sum").arg(path), b"");
    out.split_whitespace().next().unwrap().to_string()
}

/// The pattern the lab wrote into the dm fixtures (xorshift64 from 0x5eed, 256 KiB), then
/// its last 8 KiB over its first 8 KiB.
fn lab_pattern_tail_over_head() -> Vec<u8> {
    let mut v = lab_pattern();
    let tail = v[v.len() - 8192..].to_vec();
    v[..8192].copy_from_slice(&tail);
    v
}

/// Everything the export serves, copied with `nbdcopy`.
fn nbd_read_all(sock: &Path, out: &Path) -> Vec<u8> {
    let _ = std::fs::remove_file(out);
    run_ok(Command::new("nbdcopy").arg(nbd_uri(sock)).arg(out), b"");
    std::fs::read(out).unwrap()
}

/// A 4 KiB write at offset 0 with `qemu-io`; true if it succeeded.
fn nbd_write_ok(sock: &Path) -> bool {
    let (ok, text) = qemu_io_nbd(sock, "write -P 0x5a 0 4096");
    ok && text.contains("wrote 4096/4096 bytes") && !text.contains("failed")
}

/// Access modes (`O_ACCMODE` bits of `flags:` in fdinfo) of every descriptor any process
/// holds on `file`.
fn open_modes(file: &Path) -> Vec<(u32, u32)> {
    let want = std::fs::canonicalize(file).unwrap();
    let mut found = Vec::new();
    for p in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).ok().as_deref() != Some(want.as_path()) {
                continue;
            }
            let info = p.path().join("fdinfo").join(fd.file_name());
            let Ok(text) = std::fs::read_to_string(info) else {
                continue;
            };
            let flags = text
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .map(|v| u32::from_str_radix(v.trim(), 8).unwrap())
                .unwrap();
            found.push((pid, flags & libc::O_ACCMODE as u32));
        }
    }
    found
}

fn assert_held_read_only(file: &Path, what: &str) {
    let modes = open_modes(file);
    assert!(
        !modes.is_empty(),
        "{what}: no process holds the backing file"
    );
    assert!(
        modes.iter().all(|&(_, m)| m == libc::O_RDONLY as u32),
        "{what}: backing file open for writing: {modes:?}"
    );
}

/// Makes `file` read-only for everyone, root included: `chmod 0444` and `chattr +i`;
/// undone on drop so the temporary directory can be removed.
struct Immutable(PathBuf);

impl Immutable {
    fn new(file: &Path) -> Option<Self> {
        let mut chattr = tool("chattr")?;
        std::fs::set_permissions(file, std::os::unix::fs::PermissionsExt::from_mode(0o444))
            .unwrap();
        run_ok(chattr.arg("+i").arg(file), b"");
        Some(Immutable(file.to_path_buf()))
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

fn integrity_open(img: &Path, name: &str, sock: &Path, extra: &[&str]) -> Served {
    integrity_open_nbd(
        img,
        name,
        sock,
        &[&["--integrity", "sha256"], extra].concat(),
    )
}

#[test]
fn integrity_open_readonly_replays_in_memory_and_never_writes() {
    let (Some(_), Some(_)) = (tool("nbdcopy"), tool("qemu-io")) else {
        return;
    };
    let dir = tempdir();
    let want = lab_pattern_tail_over_head();
    let sock = dir.path().join("ro.sock");
    let name = format!("t-introro-{}", std::process::id() % 100000);

    // Control: a read-write open replays the kernel's journal to the disk.
    let rw = dir.path().join("rw.img");
    unxz(&dm_fixture("k-sha256-live"), &rw);
    let original = sha256_file(&rw);
    {
        let _s = integrity_open(&rw, &name, &sock, &[]);
        let got = nbd_read_all(&sock, &dir.path().join("rw.out"));
        assert!(got[..want.len()] == want[..], "read-write: pattern differs");
    }
    assert_ne!(
        sha256_file(&rw),
        original,
        "control: a read-write open of the live image did not write (replay), so the \
         read-only check below could not catch a write"
    );

    // Read-only: same data (journal replayed in memory), file untouched.
    let ro = dir.path().join("ro.img");
    unxz(&dm_fixture("k-sha256-live"), &ro);
    assert_eq!(sha256_file(&ro), original);
    {
        let _s = integrity_open(&ro, &name, &sock, &["--readonly"]);
        assert_held_read_only(&ro, "integrity open --readonly");
        let got = nbd_read_all(&sock, &dir.path().join("ro.out"));
        assert!(
            got[..want.len()] == want[..],
            "read-only: the kernel's journaled write is missing (no in-memory replay)"
        );
        assert!(
            !nbd_write_ok(&sock),
            "a write over NBD to a read-only export succeeded"
        );
        let st: serde_json::Value = serde_json::from_str(&run_ok(
            cryptblk().args(["integrity", "status", "--json", &name]),
            b"",
        ))
        .unwrap();
        assert_eq!(st["mode"], "readonly", "{st}");
    }
    assert_eq!(
        sha256_file(&ro),
        original,
        "integrity open --readonly changed the backing file"
    );

    // Immutable and 0444: still opens read-only and serves the same data.
    let Some(_guard) = Immutable::new(&ro) else {
        return;
    };
    {
        let _s = integrity_open(&ro, &name, &sock, &["--readonly"]);
        assert_held_read_only(&ro, "immutable file");
        let got = nbd_read_all(&sock, &dir.path().join("ro2.out"));
        assert!(got[..want.len()] == want[..], "immutable: pattern differs");
    }
    assert_eq!(sha256_file(&ro), original);
}

#[test]
fn luks2_integrity_open_readonly_never_writes() {
    let (Some(_), Some(_)) = (tool("qemu-img"), tool("qemu-io")) else {
        return;
    };
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, b"cryptblk-integrity-fixture-key").unwrap();
    // What guest-make.sh wrote through the kernel's dm-crypt over dm-integrity.
    let pattern: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    let sock = dir.path().join("luks.sock");
    let name = format!("t-luksro-{}", std::process::id() % 100000);
    for fixture in ["xts-plain64-hmac-sha256-512", "gcm-random-aead-4096"] {
        let img = dir.path().join(format!("{fixture}.img"));
        unxz(&luks_fixture(fixture), &img);
        let original = sha256_file(&img);
        let _guard = Immutable::new(&img);
        {
            let _s = open_nbd(&img, &key, &name, &sock, &["--readonly"]);
            assert_held_read_only(&img, fixture);
            let scratch = dir.path().join("head.bin");
            let _ = std::fs::remove_file(&scratch);
            run_ok(
                Command::new("qemu-img")
                    .args(["dd", "-f", "raw", "-O", "raw"])
                    .arg(format!("if={}", nbd_uri(&sock)))
                    .arg(format!("of={}", scratch.display()))
                    .arg(format!("bs={}", pattern.len()))
                    .arg("count=1"),
                b"",
            );
            assert!(
                std::fs::read(&scratch).unwrap() == pattern,
                "{fixture}: pattern the kernel wrote"
            );
            assert!(
                !nbd_write_ok(&sock),
                "{fixture}: a write over NBD to a read-only export succeeded"
            );
        }
        assert_eq!(
            sha256_file(&img),
            original,
            "{fixture}: open --readonly changed the backing file"
        );
    }
}
