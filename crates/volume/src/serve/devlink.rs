//! The stable name of a ublk export: `/dev/cryptblk/NAME`, a symbolic link to the
//! `/dev/ublkbN` the kernel numbered, for fstab, crypttab units and scripts (the number
//! changes from one open to the next). The daemon makes it when the device appears and
//! removes it on close; only as root, since only root may write in `/dev`.

use std::path::{Path, PathBuf};

/// The directory of the links.
pub const DIR: &str = "/dev/cryptblk";

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
        Ok(()) => Some(link),
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

/// Removes `link` if it still points to `dev` (a later daemon of the same name may own it).
pub(super) fn remove(link: &Path, dev: &Path) {
    if std::fs::read_link(link).is_ok_and(|t| t == dev) {
        let _ = std::fs::remove_file(link);
    }
}
