//! Key hygiene of the daemon that serves a volume, checked from outside as an attacker on
//! the same machine would look: the daemon's memory (read through `/proc/PID/mem` as root)
//! holds the key only in locked memory and no hex copy of it after `dm table --showkeys`,
//! none at all after `key wipe`; another process of the daemon's own user cannot read its
//! memory (not dumpable); core dumps are off. And the control socket does not buffer an
//! unbounded request line. A passphrase typed on a terminal reaches the KDF byte for byte
//! (a tab included), as cryptsetup takes it.

mod common;
use common::memory::find_in_memory;
use common::*;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;

/// The uid/gid the daemon runs as in the hygiene test: an ordinary user, so that "another
/// process of the same user" is not root (root may read any process's memory).
const NOBODY: u32 = 65534;

fn chown_nobody(p: &Path) {
    chown(p, NOBODY, Some(NOBODY));
}

/// Every form of `key` worth looking for: the binary key, each XTS half, and the hex of the
/// key and of each half (lower and upper case).
fn key_forms(key: &[u8]) -> Vec<(String, Vec<u8>)> {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let (a, b) = key.split_at(key.len() / 2);
    let mut forms = vec![
        ("binary key".to_string(), key.to_vec()),
        ("binary first half".to_string(), a.to_vec()),
        ("binary second half".to_string(), b.to_vec()),
    ];
    for (what, part) in [("key", key), ("first half", a), ("second half", b)] {
        forms.push((format!("hex {what}"), hex(part).into_bytes()));
        forms.push((format!("HEX {what}"), hex(part).to_uppercase().into_bytes()));
    }
    forms
}

fn daemon_pid(rt: &Path, name: &str) -> u32 {
    let out = run_ok(as_nobody(rt).args(["status", "--json", name]), b"");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["pid"].as_u64().unwrap() as u32
}

fn status_field(pid: u32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[test]
fn served_key_is_locked_unreadable_and_gone_after_wipe() {
    require_root("to run the daemon as uid 65534 and read its memory");
    tool("setpriv").expect("setpriv (util-linux) runs the daemon as another user");
    tool("qemu-io").expect("qemu-io writes through the export");
    let dir = tempdir();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let rt = dir.path().join("rt");
    std::fs::create_dir(&rt).unwrap();
    std::fs::set_permissions(&rt, std::fs::Permissions::from_mode(0o700)).unwrap();
    chown_nobody(&rt);
    let img = dir.path().join("backing.img");
    sparse_file(&img, 8 << 20);
    chown_nobody(&img);
    // A key no other test or library uses, with distinct halves (XTS refuses equal ones).
    let key: Vec<u8> = (0..64u32).map(|i| (i * 37 + 11) as u8 ^ 0x5c).collect();
    let key_hex: String = key.iter().map(|x| format!("{x:02x}")).collect();
    let table = dir.path().join("table");
    std::fs::write(
        &table,
        format!(
            "0 16384 crypt aes-xts-plain64 {key_hex} 0 {} 0\n",
            img.display()
        ),
    )
    .unwrap();
    let sock = dir.path().join("kh.sock");
    let mut create = as_nobody(&rt);
    create
        .args(["dm", "create", "kh", "--table-file"])
        .arg(&table)
        .arg("--nbd")
        .arg(&sock);
    chown_nobody(dir.path());
    run_ok(&mut create, b"");
    let rt_for_close = rt.clone();
    let _close = scopeguard(move || {
        let _ = run(as_nobody(&rt_for_close).args(["close", "kh"]), b"");
    });
    let (ok, out) = qemu_io_nbd(&sock, "write -P 0xab 0 256k");
    assert!(ok, "{out}");
    let (ok, out) = qemu_io_nbd(&sock, "read -P 0xab 0 256k");
    assert!(ok, "{out}");

    let pid = daemon_pid(&rt, "kh");
    // Not dumpable: the kernel hands the process's /proc files to root, so the daemon's own
    // user can read neither its environment nor its memory; and no core files.
    let meta = std::fs::metadata(format!("/proc/{pid}/mem")).unwrap();
    assert_eq!(
        meta.uid(),
        0,
        "/proc/{pid}/mem belongs to uid {}",
        meta.uid()
    );
    for file in ["mem", "environ"] {
        let read = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--",
                "head",
                "-c1",
            ])
            .arg(format!("/proc/{pid}/{file}"))
            .output()
            .unwrap();
        assert!(
            !read.status.success(),
            "the daemon's user read /proc/{pid}/{file}: {read:?}"
        );
    }
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let core = limits
        .lines()
        .find(|l| l.starts_with("Max core file size"))
        .unwrap();
    assert_eq!(
        core.split_whitespace().skip(4).take(2).collect::<Vec<_>>(),
        ["0", "0"],
        "{core}"
    );

    let shown = run_ok(
        as_nobody(&rt).args(["dm", "table", "kh", "--showkeys"]),
        b"",
    );
    assert!(shown.contains(&key_hex), "{shown}");

    // After the table went out: binary copies only where the engine needs them, every one
    // locked; no hex copy anywhere.
    let mut binary = 0;
    for (what, form) in key_forms(&key) {
        let hits = find_in_memory(pid, &form);
        if what.starts_with("binary") {
            binary += hits.len();
            for (addr, locked, name) in &hits {
                assert!(
                    locked,
                    "{what} at {addr:#x} ({name}) is not in locked memory"
                );
            }
        } else {
            assert!(hits.is_empty(), "{what} left in the daemon at {hits:x?}");
        }
    }
    assert!(
        binary > 0,
        "the scan found no key at all: it cannot be looking"
    );
    eprintln!(
        "key copies in the daemon: {binary} (all locked), VmLck {}",
        status_field(pid, "VmLck:")
    );
    assert_ne!(status_field(pid, "VmLck:"), "0 kB");

    // `key wipe`: nothing of the key is left anywhere.
    run_ok(as_nobody(&rt).args(["dm", "suspend", "kh"]), b"");
    run_ok(
        as_nobody(&rt).args(["dm", "message", "kh", "0", "key", "wipe"]),
        b"",
    );
    for (what, form) in key_forms(&key) {
        let hits = find_in_memory(pid, &form);
        assert!(hits.is_empty(), "{what} left after key wipe at {hits:x?}");
    }
    // Back to a key so the volume closes cleanly.
    run_ok(
        as_nobody(&rt).args(["dm", "message", "kh", "0", "key", "set", "-"]),
        key_hex.as_bytes(),
    );
    run_ok(as_nobody(&rt).args(["dm", "resume", "kh"]), b"");
}

/// Runs `f` on drop (closing the volume even when an assertion fails).
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

fn peak_rss_kb(pid: u32) -> u64 {
    status_field(pid, "VmHWM:")
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn control_socket_refuses_an_endless_line_without_buffering_it() {
    let dir = tempdir();
    let img = dir.path().join("z.img");
    sparse_file(&img, 1 << 20);
    let table = dir.path().join("table");
    std::fs::write(&table, format!("0 2048 linear {} 0\n", img.display())).unwrap();
    let sock = dir.path().join("z.sock");
    run_ok(
        cryptblk()
            .args(["dm", "create", "t-longline", "--table-file"])
            .arg(&table)
            .arg("--nbd")
            .arg(&sock),
        b"",
    );
    let _served = Served::volume("t-longline");
    let pid = status("t-longline")["pid"].as_u64().unwrap() as u32;
    let before = peak_rss_kb(pid);

    // 200 MiB without a newline; the daemon stops reading at 1 MiB and answers.
    let mut s = UnixStream::connect(runtime_dir().join("t-longline.ctl")).unwrap();
    let chunk = vec![b'x'; 1 << 20];
    let mut sent = 0usize;
    while sent < 200 << 20 {
        match s.write_all(&chunk) {
            Ok(()) => sent += chunk.len(),
            Err(_) => break,
        }
    }
    assert!(
        sent < 200 << 20,
        "the daemon read all {sent} bytes of one line"
    );
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    if !answer.is_empty() {
        assert!(answer.contains("longer than"), "{answer}");
    }
    let after = peak_rss_kb(pid);
    eprintln!("sent {sent} bytes; daemon peak RSS {before} kB -> {after} kB");
    assert!(
        after < before + 20 * 1024,
        "peak RSS grew from {before} kB to {after} kB"
    );
    // The daemon still answers.
    run_ok(cryptblk().args(["status", "t-longline"]), b"");
}

/// cryptsetup hashes the passphrase bytes typed on its terminal as they are; a tab is one
/// of them. A prompt that drops control characters (rpassword 7.5 does) would turn
/// `pass<TAB>word` into `password` and not open the volume.
#[test]
fn passphrase_with_a_tab_typed_on_a_terminal() {
    let dir = tempdir();
    let key = write_file(dir.path(), "key", b"pass\tword");
    let img = dir.path().join("img");
    cryptsetup_luks2(&img, &key, 32 << 20).expect("cryptsetup formats the image");
    // One try: on a terminal both tools ask again after a wrong passphrase (-T, 3 by
    // default), and this test types one answer.
    let typed = |cmd: Command, answer: &str| {
        let mut cmd = cmd;
        run_on_pty(
            cmd.args(["open", "--test-passphrase", "--tries", "1"])
                .arg(&img),
            &[PtyStep {
                prompt: "Enter passphrase for ",
                answer,
                secret: true,
            }],
        )
    };
    // The terminal passes the tab through: cryptsetup itself opens with it.
    let theirs = typed(cryptsetup().expect("cryptsetup"), "pass\tword");
    assert_eq!(theirs.code, 0, "cryptsetup: {:?}", theirs.output);
    let ours = typed(cryptblk(), "pass\tword");
    assert_eq!(ours.code, 0, "cryptblk: {:?}", ours.output);
    // Without the tab it is another passphrase (exit 2, as cryptsetup's).
    let ours = typed(cryptblk(), "password");
    assert_eq!(ours.code, 2, "cryptblk: {:?}", ours.output);
}
