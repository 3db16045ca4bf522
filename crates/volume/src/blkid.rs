//! Foreign on-disk signatures, found (and wiped) by util-linux's libblkid, as cryptsetup built
//! with libblkid does: `luksFormat` reports and wipes what the device held, `reencrypt
//! --new` refuses a device with broken LUKS metadata, and a LUKS2 header needing recovery
//! beside another signature is ambiguous.
//!
//! libblkid is loaded with `dlopen` (`libloading`) on first use rather than linked: the
//! maintained Rust bindings do not fit here (`libblkid-rs` has no
//! `blkid_probe_set_partitions_flags`, which wiping partition tables needs, and hides its raw
//! probe; its `-sys` crate needs libblkid-dev and a second bindgen at build time), and a
//! loaded library keeps the binary's link dependencies as they were. The few functions used
//! are declared below with the signatures of `<blkid/blkid.h>`; libblkid.so.1 has kept them
//! stable since util-linux 2.2x. Without the `blkid` feature, or when libblkid.so.1 cannot be
//! loaded, [`supported`] is false and every probe finds nothing, as cryptsetup built without
//! libblkid.

use crate::error::{Result, VolumeError};
use std::path::Path;

/// Which signatures a probe looks for (cryptsetup's `tools_probe_filter_info`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    /// Every partition table and superblock.
    All,
    /// All but `crypto_LUKS` (a LUKS header is expected there).
    NotLuks,
    /// Only `crypto_LUKS` (a LUKS magic that the LUKS loader did not accept).
    OnlyLuks,
}

/// One signature found on a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// True for a partition table (`PTTYPE`), false for a superblock (`TYPE`).
    pub partition: bool,
    /// blkid's name for it: `ext4`, `LVM2_member`, `gpt`, `crypto_LUKS`, ...
    pub name: String,
}

impl Signature {
    /// cryptsetup's sentence for it, without the "WARNING: " prefix.
    pub fn describe(&self, device: &Path) -> String {
        format!(
            "Device {} already contains a '{}' {} signature.",
            device.display(),
            self.name,
            if self.partition {
                "partition"
            } else {
                "superblock"
            }
        )
    }
}

/// What a safe probe of a LUKS2 header's device found besides LUKS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Foreign {
    /// No other signature (or no libblkid).
    None,
    /// Another signature (its name).
    Found(String),
    /// Several signatures blkid cannot decide between, or a failed probe.
    Ambiguous,
}

/// True when libblkid is built in and loads (cryptsetup's `BLKID` flag).
pub fn supported() -> bool {
    imp::lib().is_some()
}

/// The signatures on `path` that `filter` lets through, in blkid's order (cryptsetup's
/// `tools_detect_signatures`). Read only.
pub fn detect(path: &Path, filter: Filter) -> Result<Vec<Signature>> {
    let Some(lib) = imp::lib() else {
        log::debug!("Blkid support disabled.");
        return Ok(Vec::new());
    };
    let probe = imp::Probe::from_path(lib, path)?;
    match filter {
        Filter::All => probe.chains_for_wipes(),
        Filter::NotLuks => {
            log::debug!("Blkid check (filter LUKS).");
            probe.filter_luks(false)?;
            probe.chains_for_wipes();
        }
        Filter::OnlyLuks => {
            log::debug!("Blkid check (LUKS only).");
            probe.chains_for_fast_detection();
            probe.filter_luks(true)?;
        }
    }
    let mut found = Vec::new();
    while let Some(sig) = probe.next()? {
        found.push(sig);
    }
    Ok(found)
}

/// Probes the device of a LUKS2 header for anything else, as libcryptsetup does before it
/// recovers a damaged header copy: `crypto_LUKS` filtered out, one safe probe.
pub fn foreign(path: &Path) -> Result<Foreign> {
    let Some(lib) = imp::lib() else {
        log::debug!("Blkid probing of device signatures disabled.");
        return Ok(Foreign::None);
    };
    let probe = imp::Probe::from_path(lib, path)?;
    probe.chains_for_fast_detection();
    probe.filter_luks(false)?;
    Ok(match probe.safeprobe() {
        1 => {
            log::debug!("Blkid probe detected no foreign device signature.");
            Foreign::None
        }
        0 => match probe.signature() {
            Some(s) => {
                log::debug!(
                    "Blkid probe detected {} type '{}'",
                    if s.partition {
                        "partition"
                    } else {
                        "superblock"
                    },
                    s.name
                );
                Foreign::Found(s.name)
            }
            None => Foreign::Ambiguous,
        },
        _ => {
            log::debug!("Blkid probe couldn't decide device type unambiguously.");
            Foreign::Ambiguous
        }
    })
}

/// Wipes the magic of every signature on `path` (only `crypto_LUKS` ones with `only_luks`)
/// with `blkid_do_wipe`, as cryptsetup's `tools_wipe_all_signatures`: a block device is
/// opened `O_EXCL` when `exclusive`. Returns what was wiped; `verbose` prints cryptsetup's
/// "Existing ... will be wiped." line for each.
pub fn wipe_all(
    path: &Path,
    exclusive: bool,
    only_luks: bool,
    verbose: bool,
) -> Result<Vec<Signature>> {
    let Some(lib) = imp::lib() else {
        log::debug!("Blkid support disabled.");
        return Ok(Vec::new());
    };
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let is_block = std::fs::metadata(path)
        .map_err(|_| VolumeError::usage(format!("Failed to stat device {}.", path.display())))?
        .file_type()
        .is_block_device();
    let mut oo = std::fs::OpenOptions::new();
    oo.read(true).write(true);
    if is_block && exclusive {
        oo.custom_flags(libc::O_EXCL);
    }
    let file = oo.open(path).map_err(|e| {
        VolumeError::usage(if e.raw_os_error() == Some(libc::EBUSY) {
            format!("Cannot exclusively open {}, device in use.", path.display())
        } else {
            format!("Failed to open file {} in read/write mode.", path.display())
        })
    })?;
    let probe = imp::Probe::from_file(lib, &file)?;
    probe.chains_for_wipes();
    if only_luks {
        probe.filter_luks(true)?;
    }
    log::debug!("Blkid wipe.");
    let mut wiped = Vec::new();
    while let Some(sig) = probe.next().map_err(|_| {
        VolumeError::usage(format!(
            "Failed to probe device {} for a signature.",
            path.display()
        ))
    })? {
        if verbose {
            println!(
                "Existing '{}' {} signature on device {} will be wiped.",
                sig.name,
                if sig.partition {
                    "partition"
                } else {
                    "superblock"
                },
                path.display()
            );
        }
        if !probe.wipe() || file.sync_all().is_err() {
            return Err(VolumeError::usage("Failed to wipe device signature."));
        }
        wiped.push(sig);
    }
    Ok(wiped)
}

#[cfg(feature = "blkid")]
mod imp {
    use super::Signature;
    use crate::error::{Result, VolumeError};
    use std::ffi::{c_char, c_int, c_void, CStr, CString};
    use std::os::fd::AsRawFd;
    use std::path::Path;
    use std::sync::OnceLock;

    type RawProbe = *mut c_void;

    // Values of <blkid/blkid.h>.
    const SUBLKS_LABEL: c_int = 1 << 1;
    const SUBLKS_UUID: c_int = 1 << 3;
    const SUBLKS_TYPE: c_int = 1 << 5;
    const SUBLKS_USAGE: c_int = 1 << 7;
    const SUBLKS_VERSION: c_int = 1 << 8;
    const SUBLKS_MAGIC: c_int = 1 << 9;
    const SUBLKS_BADCSUM: c_int = 1 << 10;
    const PARTS_MAGIC: c_int = 1 << 3;
    const FLTR_NOTIN: c_int = 1;
    const FLTR_ONLYIN: c_int = 2;

    /// The functions of libblkid.so.1 used here, with `<blkid/blkid.h>`'s signatures.
    pub struct Lib {
        new_probe: unsafe extern "C" fn() -> RawProbe,
        new_probe_from_filename: unsafe extern "C" fn(*const c_char) -> RawProbe,
        set_device: unsafe extern "C" fn(RawProbe, c_int, i64, i64) -> c_int,
        free_probe: unsafe extern "C" fn(RawProbe),
        enable_partitions: unsafe extern "C" fn(RawProbe, c_int) -> c_int,
        set_partitions_flags: unsafe extern "C" fn(RawProbe, c_int) -> c_int,
        enable_superblocks: unsafe extern "C" fn(RawProbe, c_int) -> c_int,
        set_superblocks_flags: unsafe extern "C" fn(RawProbe, c_int) -> c_int,
        filter_superblocks_type: unsafe extern "C" fn(RawProbe, c_int, *mut *mut c_char) -> c_int,
        do_probe: unsafe extern "C" fn(RawProbe) -> c_int,
        do_safeprobe: unsafe extern "C" fn(RawProbe) -> c_int,
        has_value: unsafe extern "C" fn(RawProbe, *const c_char) -> c_int,
        lookup_value:
            unsafe extern "C" fn(RawProbe, *const c_char, *mut *const c_char, *mut usize) -> c_int,
        do_wipe: unsafe extern "C" fn(RawProbe, c_int) -> c_int,
    }

    /// libblkid, loaded once per process (`None` when it cannot be).
    pub fn lib() -> Option<&'static Lib> {
        static LIB: OnceLock<Option<Lib>> = OnceLock::new();
        LIB.get_or_init(|| match load() {
            Ok(l) => Some(l),
            Err(e) => {
                log::debug!("libblkid not available: {e}");
                None
            }
        })
        .as_ref()
    }

    fn load() -> std::result::Result<Lib, libloading::Error> {
        // SAFETY: runs libblkid's initialisers, as linking it would.
        let lib = unsafe { libloading::Library::new("libblkid.so.1") }?;
        // SAFETY: each symbol is given the type <blkid/blkid.h> declares for it.
        let l = unsafe {
            Lib {
                new_probe: *lib.get(b"blkid_new_probe\0")?,
                new_probe_from_filename: *lib.get(b"blkid_new_probe_from_filename\0")?,
                set_device: *lib.get(b"blkid_probe_set_device\0")?,
                free_probe: *lib.get(b"blkid_free_probe\0")?,
                enable_partitions: *lib.get(b"blkid_probe_enable_partitions\0")?,
                set_partitions_flags: *lib.get(b"blkid_probe_set_partitions_flags\0")?,
                enable_superblocks: *lib.get(b"blkid_probe_enable_superblocks\0")?,
                set_superblocks_flags: *lib.get(b"blkid_probe_set_superblocks_flags\0")?,
                filter_superblocks_type: *lib.get(b"blkid_probe_filter_superblocks_type\0")?,
                do_probe: *lib.get(b"blkid_do_probe\0")?,
                do_safeprobe: *lib.get(b"blkid_do_safeprobe\0")?,
                has_value: *lib.get(b"blkid_probe_has_value\0")?,
                lookup_value: *lib.get(b"blkid_probe_lookup_value\0")?,
                do_wipe: *lib.get(b"blkid_do_wipe\0")?,
            }
        };
        // The function pointers above point into the library: it stays loaded.
        std::mem::forget(lib);
        Ok(l)
    }

    /// One `blkid_probe`, freed on drop.
    pub struct Probe {
        lib: &'static Lib,
        raw: RawProbe,
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            // SAFETY: `raw` came from blkid_new_probe* and is freed once.
            unsafe { (self.lib.free_probe)(self.raw) }
        }
    }

    fn init_failed() -> VolumeError {
        VolumeError::usage("Failed to initialize device signature probes.")
    }

    impl Probe {
        /// A probe reading `path` (opened read-only by libblkid).
        pub fn from_path(lib: &'static Lib, path: &Path) -> Result<Probe> {
            use std::os::unix::ffi::OsStrExt;
            let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| init_failed())?;
            // SAFETY: a valid C string; the result is checked.
            let raw = unsafe { (lib.new_probe_from_filename)(c.as_ptr()) };
            if raw.is_null() {
                return Err(init_failed());
            }
            Ok(Probe { lib, raw })
        }

        /// A probe on an open file (for wiping: libblkid writes through this descriptor).
        /// `file` must outlive the probe.
        pub fn from_file(lib: &'static Lib, file: &std::fs::File) -> Result<Probe> {
            // SAFETY: no arguments; the result is checked.
            let raw = unsafe { (lib.new_probe)() };
            if raw.is_null() {
                return Err(init_failed());
            }
            let p = Probe { lib, raw };
            // SAFETY: a live probe and an open descriptor; 0/0 means the whole device.
            if unsafe { (lib.set_device)(p.raw, file.as_raw_fd(), 0, 0) } != 0 {
                return Err(init_failed());
            }
            Ok(p)
        }

        /// Partition tables and superblocks with everything a wipe needs (their magic).
        pub fn chains_for_wipes(&self) {
            // SAFETY: a live probe; flags of <blkid/blkid.h>.
            unsafe {
                (self.lib.enable_partitions)(self.raw, 1);
                (self.lib.set_partitions_flags)(self.raw, PARTS_MAGIC);
                (self.lib.enable_superblocks)(self.raw, 1);
                (self.lib.set_superblocks_flags)(
                    self.raw,
                    SUBLKS_LABEL
                        | SUBLKS_UUID
                        | SUBLKS_TYPE
                        | SUBLKS_USAGE
                        | SUBLKS_VERSION
                        | SUBLKS_MAGIC
                        | SUBLKS_BADCSUM,
                );
            }
        }

        /// Partition tables and superblock types only.
        pub fn chains_for_fast_detection(&self) {
            // SAFETY: a live probe; flags of <blkid/blkid.h>.
            unsafe {
                (self.lib.enable_partitions)(self.raw, 1);
                (self.lib.set_partitions_flags)(self.raw, 0);
                (self.lib.enable_superblocks)(self.raw, 1);
                (self.lib.set_superblocks_flags)(self.raw, SUBLKS_TYPE);
            }
        }

        /// Only `crypto_LUKS` superblocks (`only`), or all but them.
        pub fn filter_luks(&self, only: bool) -> Result<()> {
            let mut luks = *b"crypto_LUKS\0";
            let mut names = [luks.as_mut_ptr() as *mut c_char, std::ptr::null_mut()];
            let flag = if only { FLTR_ONLYIN } else { FLTR_NOTIN };
            // SAFETY: a NULL-terminated array of C strings that outlives the call (libblkid
            // compares the names during the call and keeps none).
            if unsafe { (self.lib.filter_superblocks_type)(self.raw, flag, names.as_mut_ptr()) }
                != 0
            {
                return Err(VolumeError::usage(
                    "Failed to initialize device signature probes.",
                ));
            }
            Ok(())
        }

        /// The next signature (`blkid_do_probe`), `None` when there are no more.
        pub fn next(&self) -> Result<Option<Signature>> {
            // SAFETY: a live probe.
            match unsafe { (self.lib.do_probe)(self.raw) } {
                0 => match self.signature() {
                    Some(s) => Ok(Some(s)),
                    None => Err(VolumeError::usage("Blkid probe failed.")),
                },
                1 => Ok(None),
                _ => Err(VolumeError::usage("Blkid probe failed.")),
            }
        }

        /// `blkid_do_safeprobe`: 0 one signature, 1 none, -2 ambiguous, -1 error.
        pub fn safeprobe(&self) -> c_int {
            // SAFETY: a live probe.
            unsafe { (self.lib.do_safeprobe)(self.raw) }
        }

        /// The signature the last probe step found.
        pub fn signature(&self) -> Option<Signature> {
            for (key, partition) in [(c"PTTYPE", true), (c"TYPE", false)] {
                // SAFETY: a live probe and a C string.
                if unsafe { (self.lib.has_value)(self.raw, key.as_ptr()) } == 0 {
                    continue;
                }
                let mut data: *const c_char = std::ptr::null();
                // SAFETY: as above; `data` receives a string owned by the probe, copied
                // before the probe changes.
                let r = unsafe {
                    (self.lib.lookup_value)(self.raw, key.as_ptr(), &mut data, std::ptr::null_mut())
                };
                if r != 0 || data.is_null() {
                    return None;
                }
                // SAFETY: libblkid's values are NUL-terminated.
                let name = unsafe { CStr::from_ptr(data) }
                    .to_string_lossy()
                    .into_owned();
                return Some(Signature { partition, name });
            }
            None
        }

        /// Wipes the magic the last probe step found (`blkid_do_wipe`); true on success.
        pub fn wipe(&self) -> bool {
            // SAFETY: a live probe set on a read-write descriptor.
            unsafe { (self.lib.do_wipe)(self.raw, 0) == 0 }
        }
    }
}

#[cfg(not(feature = "blkid"))]
mod imp {
    use super::Signature;
    use crate::error::Result;
    use std::path::Path;

    /// Stands for libblkid in a build without it: never available.
    pub enum Lib {}

    /// Always `None`: this build has no libblkid.
    pub fn lib() -> Option<&'static Lib> {
        None
    }

    /// Never built: [`lib`] is `None`.
    pub enum Probe {}

    impl Probe {
        pub fn from_path(lib: &'static Lib, _: &Path) -> Result<Probe> {
            match *lib {}
        }
        pub fn from_file(lib: &'static Lib, _: &std::fs::File) -> Result<Probe> {
            match *lib {}
        }
        pub fn chains_for_wipes(&self) {
            match *self {}
        }
        pub fn chains_for_fast_detection(&self) {
            match *self {}
        }
        pub fn filter_luks(&self, _: bool) -> Result<()> {
            match *self {}
        }
        pub fn next(&self) -> Result<Option<Signature>> {
            match *self {}
        }
        pub fn safeprobe(&self) -> i32 {
            match *self {}
        }
        pub fn signature(&self) -> Option<Signature> {
            match *self {}
        }
        pub fn wipe(&self) -> bool {
            match *self {}
        }
    }
}
