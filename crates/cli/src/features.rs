//! The optional parts built into this binary (Cargo features), as `--version` names them.

/// `--version`'s text: the package version and the optional features built in, as
/// `0.1.0 (+rbd +tpm2)` or `0.1.0 (-rbd -tpm2)` for a build that can use neither librbd
/// nor tpm2-tss (container images). No build links them: with the features they are
/// loaded when an RBD image or a TPM2 token is used. Then cryptsetup's `flags:` words for
/// what scripts probe (`--version | grep KEYRING`): KEYRING, since cryptblk reads keys from
/// the kernel keyring (luks2-keyring tokens) and keeps cryptsetup's keyring contract for
/// LUKS2 volumes (`key location: keyring`, resize needing the key).
pub const VERSION: &str = match (cfg!(feature = "rbd"), cfg!(feature = "tpm2")) {
    (true, true) => concat!(env!("CARGO_PKG_VERSION"), " (+rbd +tpm2) flags: KEYRING"),
    (true, false) => concat!(env!("CARGO_PKG_VERSION"), " (+rbd -tpm2) flags: KEYRING"),
    (false, true) => concat!(env!("CARGO_PKG_VERSION"), " (-rbd +tpm2) flags: KEYRING"),
    (false, false) => concat!(env!("CARGO_PKG_VERSION"), " (-rbd -tpm2) flags: KEYRING"),
};
