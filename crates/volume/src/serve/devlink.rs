//! The stable name of a ublk export: `/dev/cryptblk/NAME`, a symbolic link to the
//! `/dev/ublkbN` the kernel numbered, for fstab, crypttab units and scripts (the number
//! changes from one open to the next). The daemon makes it when the device appears and
//! removes it on close; only as root, since only root may write in `/dev`.
//!
//! Under udev the name is also udev's, so that systemd has a `dev-cryptblk-NAME.device` for
//! fstab and crypttab units to wait for (a link made by hand is invisible to systemd): the
//! daemon writes `CRYPTBLK_NAME=NAME` to [`UDEV_DIR`]`/ublkbN` and asks the kernel for a
//! `change` event of the device; the rule dist/udev/rules.d/60-cryptblk.rules imports that
//! file (`IMPORT{file}`) and adds `SYMLINK+="cryptblk/NAME"`. A file, not a helper program
//! run by udev, so the rule names no installed path.

use std::path::{Path, PathBuf};

/// The directory of the links.
pub const DIR: &str = "/dev/cryptblk";

/// Where the daemon tells udev the name of its ublk device: one file per kernel name
/// (`ublkbN`), in udev's `KEY=value` format.
pub const UDEV_DIR: &str = "/run/cryptblk/ublk";

/// The link that names mapping `name`'s ublk device.
pub fn link_path(name: &str) -> PathBuf {
    Path::new(DIR).join(name)
}

/// Links `/dev/cryptblk/NAME` to `dev` when running as root; returns the link made. A link
/// left by a daemon that died is replaced (the name's control socket is this daemon's, so
/// no live daemon owns it); anything else at that path is left alone. Failing to link
/// does not fail the open (the device works under its kernel name): it is logged.
pub(super) fn create(name: &str, dev: &Path) -> Option<PathBuf> {
    if crate::control::euid() != 0 {
        return None;
    }
    let link = link_path(name);
    let made = (|| -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(DIR)?;
        if std::fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()) {
            std::fs::remove_file(&link)?;
        }
        std::os::unix::fs::symlink(dev, &link)
    })();
    match made {
        Ok(()) => {
            udev_record(name, dev);
            Some(link)
        }
        Err(e) => {
            eprintln!(
                "cryptblk: cannot link {} to {}: {e}",
                link.display(),
                dev.display()
            );
            None
        }
    }
}

/// A name udev can take into `SYMLINK+=` and systemd into a device unit's name as it is:
/// no white space, quotes, `$`/`%` substitutions or path separators.
fn udev_safe(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._+:@-".contains(&b))
}

/// The record of `dev` (`/dev/ublkbN`) under [`UDEV_DIR`].
fn record_path(dev: &Path) -> Option<PathBuf> {
    dev.file_name().map(|n| Path::new(UDEV_DIR).join(n))
}

/// Writes `CRYPTBLK_NAME=NAME` for udev and asks for a `change` event of `dev` so the rule
/// sees it (the `add` event came before the name was known). Without udev the event goes
/// nowhere; a failure is logged and does not fail the open (the daemon's own link stands).
fn udev_record(name: &str, dev: &Path) {
    if !udev_safe(name) {
        eprintln!(
            "cryptblk: '{name}' is not a name udev links; systemd will know the device as {}",
            dev.display()
        );
        return;
    }
    let Some(record) = record_path(dev) else {
        return;
    };
    let made = (|| -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(UDEV_DIR)?;
        // Written whole under a temporary name, then renamed: udev never reads half a record.
        let tmp = record.with_extension("tmp");
        std::fs::write(&tmp, format!("CRYPTBLK_NAME={name}\n"))?;
        std::fs::rename(&tmp, &record)?;
        let kname = dev.file_name().unwrap_or_default();
        std::fs::write(
            Path::new("/sys/class/block").join(kname).join("uevent"),
            "change",
        )
    })();
    if let Err(e) = made {
        eprintln!(
            "cryptblk: cannot name {} for udev ({}): {e}",
            dev.display(),
            record.display()
        );
    }
}

/// Removes `link` if it still points to `dev` (a later daemon of the same name may own it),
/// whether the daemon made it (`/dev/ublkbN`) or udev did (`../ublkbN`), and the udev record.
pub(super) fn remove(link: &Path, dev: &Path) {
    if std::fs::read_link(link)
        .is_ok_and(|t| t.file_name().is_some() && t.file_name() == dev.file_name())
    {
        let _ = std::fs::remove_file(link);
    }
    if let Some(record) = record_path(dev) {
        let _ = std::fs::remove_file(record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_udev_can_link() {
        for ok in ["data", "luks-0b1c", "a.b_c+d:e@f"] {
            assert!(udev_safe(ok), "{ok}");
        }
        for bad in [
            "", ".", "..", "a b", "a/b", "a$b", "a%b", "a\"b", "a\nb", "é",
        ] {
            assert!(!udev_safe(bad), "{bad:?}");
        }
    }

    #[test]
    fn records_are_named_by_the_kernel_name() {
        assert_eq!(
            record_path(Path::new("/dev/ublkb7")).unwrap(),
            Path::new("/run/cryptblk/ublk/ublkb7")
        );
    }
}
