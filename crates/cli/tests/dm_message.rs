//! `cryptblk dm message`: dmsetup's messages through the daemon, with dm-crypt's `key wipe`
//! and `key set` as the kernel accepts them (only while suspended; a wiped key keeps the
//! mapping suspended until a key is set), and keys never taken from the command line.

mod common;
use common::*;
use std::path::Path;

fn table_file(dir: &Path, text: &str) -> std::path::PathBuf {
    let p = dir.join("table");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn crypt_key_wipe_and_set_hold_the_volume_until_the_key_is_back() {
    let Some(_) = tool("qemu-io") else { return };
    let dir = tempdir();
    let img = dir.path().join("backing.img");
    sparse_file(&img, 8 << 20);
    let key: String = (0..64)
        .map(|i| format!("{:02x}", (i * 7 + 3) % 256))
        .collect();
    let table = format!(
        "0 16384 crypt aes-xts-plain64 {key} 0 {} 0\n",
        img.display()
    );
    let sock = dir.path().join("m.sock");
    run_ok(
        cryptblk()
            .args(["dm", "create", "t-msg", "--table-file"])
            .arg(table_file(dir.path(), &table))
            .arg("--nbd")
            .arg(&sock),
        b"",
    );
    let _served = Served::volume("t-msg");
    let (ok, out) = qemu_io_nbd(&sock, "write -P 0xab 0 64k");
    assert!(ok, "{out}");

    // As the kernel: key messages only while suspended.
    let live = run(
        cryptblk().args(["dm", "message", "t-msg", "0", "key", "wipe"]),
        b"",
    );
    assert_eq!(live.status.code(), Some(1), "{live:?}");
    assert!(
        String::from_utf8_lossy(&live.stderr).contains("suspend"),
        "{live:?}"
    );

    run_ok(cryptblk().args(["dm", "suspend", "t-msg"]), b"");
    run_ok(
        cryptblk().args(["dm", "message", "t-msg", "0", "key", "wipe"]),
        b"",
    );
    let shown = run_ok(cryptblk().args(["dm", "table", "t-msg", "--showkeys"]), b"");
    assert!(
        !shown.contains(&key),
        "the wiped key is still in the table: {shown}"
    );
    // No key, no resume: the mapping stays suspended (I/O would wait, not fail).
    let resumed = run(cryptblk().args(["dm", "resume", "t-msg"]), b"");
    assert!(
        !resumed.status.success(),
        "resumed without a key: {resumed:?}"
    );

    // A key on the command line is refused before it reaches the daemon.
    let inline = run(
        cryptblk().args(["dm", "message", "t-msg", "0", "key", "set", &key]),
        b"",
    );
    assert_eq!(inline.status.code(), Some(1), "{inline:?}");
    assert!(
        String::from_utf8_lossy(&inline.stderr).contains("command line"),
        "{inline:?}"
    );

    run_ok(
        cryptblk().args(["dm", "message", "t-msg", "0", "key", "set", "-"]),
        format!("{key}\n").as_bytes(),
    );
    run_ok(cryptblk().args(["dm", "resume", "t-msg"]), b"");
    let shown = run_ok(cryptblk().args(["dm", "table", "t-msg", "--showkeys"]), b"");
    assert!(shown.contains(&key), "{shown}");
    let (ok, out) = qemu_io_nbd(&sock, "read -P 0xab 0 64k");
    assert!(ok && !out.contains("Pattern verification failed"), "{out}");
}

#[test]
fn messages_go_to_the_target_at_the_sector_and_unknown_ones_are_refused() {
    let dir = tempdir();
    let table = "0 2048 zero\n2048 2048 error\n";
    run_ok(
        cryptblk()
            .args(["dm", "create", "t-msg2", "--table-file"])
            .arg(table_file(dir.path(), table))
            .arg("--nbd")
            .arg(dir.path().join("z.sock")),
        b"",
    );
    let _served = Served::volume("t-msg2");
    for (sector, target) in [("0", "zero"), ("3000", "error")] {
        let out = run(
            cryptblk().args(["dm", "message", "t-msg2", sector, "hello"]),
            b"",
        );
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(target) && err.contains("message"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    let past = run(
        cryptblk().args(["dm", "message", "t-msg2", "4096", "hello"]),
        b"",
    );
    assert_eq!(past.status.code(), Some(1), "{past:?}");
}
