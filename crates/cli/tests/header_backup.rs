//! `luksHeaderBackup` writes a file that holds every keyslot: made new with mode 0400
//! whatever the umask, never through a symlink, never over an existing file; as cryptsetup.

mod common;

use common::{cryptblk, cryptsetup, run, sha256, tempdir};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

/// `tool luksHeaderBackup img --header-backup-file out` run under umask 000.
fn backup(tool: Command, img: &Path, out: &Path) -> std::process::Output {
    let mut sh = Command::new("sh");
    sh.arg("-c")
        .arg("umask 000; exec \"$@\"")
        .arg("sh")
        .arg(tool.get_program())
        .args(tool.get_args())
        .args(["luksHeaderBackup", "--header-backup-file"])
        .arg(out)
        .arg(img);
    for (k, v) in tool.get_envs() {
        if let Some(v) = v {
            sh.env(k, v);
        }
    }
    run(&mut sh, b"")
}

#[test]
fn header_backups_are_0400_new_files_as_cryptsetups() {
    let dir = tempdir();
    let key = common::write_file(dir.path(), "key", b"backup pass");
    for kind in ["luks1", "luks2"] {
        let img = dir.path().join(format!("{kind}.img"));
        if kind == "luks1" {
            common::cryptsetup_luks1(&img, &key, 16 << 20).unwrap();
        } else {
            common::cryptsetup_luks2(&img, &key, 32 << 20).unwrap();
        }
        let ours = dir.path().join(format!("{kind}.ours"));
        let theirs = dir.path().join(format!("{kind}.theirs"));
        let o = backup(cryptblk(), &img, &ours);
        assert!(o.status.success(), "{kind}: {o:?}");
        let t = backup(cryptsetup().unwrap(), &img, &theirs);
        assert!(t.status.success(), "{kind}: {t:?}");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&theirs), 0o400, "{kind}: cryptsetup's");
        assert_eq!(mode(&ours), 0o400, "{kind}: ours under umask 000");
        assert_eq!(sha256(&ours), sha256(&theirs), "{kind}: same bytes");

        // Again onto the existing file: cryptsetup's line and exit 1, the file as it was.
        let before = sha256(&ours);
        for (tool, out) in [(cryptblk(), &ours), (cryptsetup().unwrap(), &theirs)] {
            let again = backup(tool, &img, out);
            assert_eq!(again.status.code(), Some(1), "{kind}: {again:?}");
            assert_eq!(
                String::from_utf8_lossy(&again.stderr).trim_end(),
                format!(
                    "Requested header backup file {} already exists.",
                    out.display()
                )
            );
        }
        assert_eq!(sha256(&ours), before);

        // A symlink planted at the name is not followed: its target keeps its bytes.
        let victim = common::write_file(dir.path(), &format!("{kind}.victim"), b"keep me");
        let link = dir.path().join(format!("{kind}.link"));
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let o = backup(cryptblk(), &img, &link);
        assert_eq!(o.status.code(), Some(1), "{kind}: {o:?}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
    }
}
