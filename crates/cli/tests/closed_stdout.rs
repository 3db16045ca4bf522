//! A reader that closes the pipe early (`cryptblk ciphers | head -1`) must not make the
//! command panic: it ends quietly with status 0, as tools fed to `head` do.

mod common;

use common::cryptblk;
use std::process::Stdio;

#[test]
fn closed_stdout_ends_quietly() {
    for args in [
        &["ciphers"][..],
        &["ciphers", "--json"][..],
        &["--help"][..],
    ] {
        // The read end is closed before the command starts, so its first write fails.
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let out = cryptblk()
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .expect("run cryptblk");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
    }
}
