//! `--vhost-user SOCKET [--queues N]` on the command line: `open` and `dm create` leave a
//! daemon serving the socket (0600, the caller's), `status` names it, `close` removes it;
//! bad combinations are refused with exit 1 before anything is created. The protocol itself
//! is tested in crates/export/tests/vhost_user.rs, a real VM in vhost_user_lab.rs.

mod common;
use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

#[test]
fn open_serves_a_private_socket_and_close_removes_it() {
    let dir = tempdir();
    let key = write_file(dir.path(), "key", b"vhost cli");
    let img = dir.path().join("vol.img");
    cryptblk_luks2(&img, &key, 32 << 20);
    let socket = dir.path().join("vm.sock");
    let name = format!("cbvucli-{}", std::process::id() % 100_000);
    let out = run_ok(
        cryptblk()
            .args(["open", "--json", "--key-file"])
            .arg(&key)
            .arg(&img)
            .arg(&name)
            .arg("--vhost-user")
            .arg(&socket)
            .args(["--queues", "3"]),
        b"",
    );
    let served = Served::volume(&name);
    let facts: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(facts["export"]["kind"], "vhostuser", "{facts}");
    assert_eq!(facts["export"]["queues"], 3);
    assert_eq!(facts["export"]["socket"], socket.to_str().unwrap());
    let meta = std::fs::metadata(&socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // SAFETY: getuid has no preconditions.
    assert_eq!(meta.uid(), unsafe { libc::getuid() });
    let text = run_ok(cryptblk().arg("status").arg(&name), b"");
    assert!(
        text.contains(&format!("export:      vhost-user {}", socket.display())),
        "{text}"
    );
    drop(served);
    assert!(
        !socket.exists(),
        "close stops the export and removes its socket"
    );
}

#[test]
fn dm_create_serves_a_table_over_vhost_user() {
    let dir = tempdir();
    let socket = dir.path().join("t.sock");
    let table = write_file(dir.path(), "t.table", b"0 2048 zero\n");
    let name = format!("cbvudm-{}", std::process::id() % 100_000);
    run_ok(
        cryptblk()
            .args(["dm", "create", &name, "--table-file"])
            .arg(&table)
            .arg("--vhost-user")
            .arg(&socket),
        b"",
    );
    /// Removes the mapping even when an assertion fails, so no daemon is left behind.
    struct Remove(String);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = run(cryptblk().args(["dm", "remove"]).arg(&self.0), b"");
        }
    }
    let served = Remove(name.clone());
    let facts = status(&name);
    assert_eq!(facts["export"]["kind"], "vhostuser", "{facts}");
    assert_eq!(facts["export"]["queues"], 1, "one queue by default");
    assert!(socket.exists());
    drop(served);
    assert!(!socket.exists(), "dm remove stops the export");
}

#[test]
fn bad_vhost_user_options_are_refused_before_serving() {
    let dir = tempdir();
    let table = write_file(dir.path(), "t.table", b"0 2048 zero\n");
    let socket = dir.path().join("x.sock");
    let cases: [(&[&str], &str); 4] = [
        (
            &["--vhost-user", "S", "--nbd", "/tmp/x/n.sock"],
            "choose one export",
        ),
        (&["--vhost-user", "S", "--ublk"], "choose one export"),
        (&["--vhost-user", "S", "--queues", "0"], "out of range"),
        (
            &["--nbd", "/tmp/x/n.sock", "--queues", "2"],
            "--queues needs",
        ),
    ];
    for (i, (args, want)) in cases.iter().enumerate() {
        let args: Vec<String> = args
            .iter()
            .map(|a| {
                if *a == "S" {
                    socket.display().to_string()
                } else {
                    a.to_string()
                }
            })
            .collect();
        let (code, err) = code(
            cryptblk()
                .args(["dm", "create", &format!("cbvubad{i}"), "--table-file"])
                .arg(&table)
                .args(&args),
        );
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "one error line: {err}");
        assert!(!socket.exists(), "{args:?} created nothing");
    }
}
