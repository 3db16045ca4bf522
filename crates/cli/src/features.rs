//! The optional parts built into this binary (Cargo features), as `--version` names them.

/// `--version`'s text: the package version and the optional features built in, as
/// `0.1.0 (+rbd +tpm2 +blkid) flags: BLKID KEYRING` or `0.1.0 (-rbd -tpm2 -blkid) flags:
/// KEYRING` for a build that can use none of librbd, tpm2-tss, libblkid (container images).
/// No build links them: with the features they are loaded when used. Then cryptsetup's
/// `flags:` words for what its scripts probe (`--version | grep KEYRING`), in cryptsetup's
/// order: BLKID only when libblkid is built in and loads, so signature probing really
/// happens; KEYRING always, since cryptblk reads keys from the kernel keyring (luks2-keyring
/// tokens) and keeps cryptsetup's keyring contract for LUKS2 volumes (`key location:
/// keyring`, resize needing the key).
pub fn version() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        let sign = |on: bool| if on { '+' } else { '-' };
        let mut v = format!(
            "{} ({}rbd {}tpm2 {}blkid) flags:",
            env!("CARGO_PKG_VERSION"),
            sign(cfg!(feature = "rbd")),
            sign(cfg!(feature = "tpm2")),
            sign(cfg!(feature = "blkid")),
        );
        if cryptblk_volume::blkid::supported() {
            v.push_str(" BLKID");
        }
        v.push_str(" KEYRING");
        v
    })
}
