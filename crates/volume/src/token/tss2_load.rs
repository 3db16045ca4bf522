//! tpm2-tss loaded when a TPM2 token is used, not when the process starts.
//!
//! `tss-esapi` links libtss2-esys, -tctildr and -mu, and they bring OpenSSL's libcrypto:
//! mapped and relocated at start-up, they cost every cryptblk process (every served
//! volume's daemon among them) about 0.5 MB of private memory although only a TPM2 token's
//! unlock or enrollment calls them (issue 28). No crate loads tpm2-tss lazily, so this
//! module does what a lazy-loading import library (Implib.so) does: it defines each libtss2
//! function the binary calls as a jump through a table, which [`load`] fills by `dlopen`
//! and `dlsym` (`libloading`). The definitions resolve tss-esapi's calls at link time, so
//! the linker (`--as-needed`, rustc's default) records no dependency on the libraries.
//!
//! The table lists exactly the functions tss-esapi's code used here calls (`nm -D
//! --undefined-only`); a use of one more leaves it to the linker, which links libtss2 again:
//! crates/cli/tests/features.rs (`ldd` of the binary) fails then, and the function belongs
//! in [`FUNCTIONS`]. Every path into tss-esapi calls [`load`] first (`systemd_tpm2::connect`, the
//! unmarshalling of a sealed object);
//! a call through an unfilled slot aborts with a message instead of jumping to nowhere.
//! Other architectures than x86_64 and aarch64 link libtss2 as before.

use crate::error::{Result, VolumeError};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

const ESYS: &str = "libtss2-esys.so.0";
const MU: &str = "libtss2-mu.so.0";
const TCTILDR: &str = "libtss2-tctildr.so.0";

/// Where a call lands before [`load`] filled its slot: a bug (a path into tss-esapi without
/// `load`), reported instead of jumping to address 0.
extern "C" fn not_loaded() {
    eprintln!("cryptblk: internal error: a tpm2-tss function called before libtss2 was loaded");
    std::process::abort();
}

/// The address of each function of [`FUNCTIONS`], read by its trampoline.
static TABLE: [AtomicPtr<()>; FUNCTIONS.len()] =
    [const { AtomicPtr::new(not_loaded as *mut ()) }; FUNCTIONS.len()];

/// Loads the three libraries and fills the table, once per process; later calls return the
/// first outcome. The libraries stay loaded (tss-esapi keeps pointers into them).
pub fn load() -> Result<()> {
    static LOADED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            if !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
                return Ok(()); // linked at build time
            }
            let mut libs: Vec<(&str, libloading::Library)> = Vec::new();
            for (slot, (soname, name)) in TABLE.iter().zip(FUNCTIONS) {
                if !libs.iter().any(|(s, _)| *s == soname) {
                    // SAFETY: runs the library's initialisers, as linking it did.
                    let lib = unsafe { libloading::Library::new(soname) }
                        .map_err(|e| format!("cannot load {soname} (tpm2-tss): {e}"))?;
                    libs.push((soname, lib));
                }
                let lib = &libs.iter().find(|(s, _)| *s == soname).expect("loaded").1;
                // SAFETY: only the address is taken; the trampoline calls it with the
                // signature tss-esapi-sys declares for this very symbol.
                let f = unsafe { lib.get::<*mut ()>(name.as_bytes()) }
                    .map_err(|e| format!("{soname} lacks {name}: {e}"))?;
                slot.store(*f, Ordering::Release);
            }
            for (_, lib) in libs {
                std::mem::forget(lib);
            }
            Ok(())
        })
        .clone()
        .map_err(VolumeError::usage)
}

/// Lists each function (its table slot, library and name) in [`FUNCTIONS`] and defines it
/// as a jump through its slot: arguments and return value pass through untouched, whatever
/// the signature.
macro_rules! tss2_functions {
    ($($slot:literal $lib:ident $name:ident)*) => {
        /// Each table slot's library and function.
        const FUNCTIONS: [(&str, &str); [$($slot),*].len()] = [$(($lib, stringify!($name))),*];
        // The slots are numbered in order (the trampolines use the numbers).
        const _: () = {
            let mut next = 0;
            $(assert!($slot == next); next += 1;)*
            let _ = next;
        };
        $(
            #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
            #[unsafe(naked)]
            #[no_mangle]
            #[doc(hidden)]
            pub extern "C" fn $name() {
                #[cfg(target_arch = "x86_64")]
                core::arch::naked_asm!(
                    "jmp qword ptr [rip + {table} + {offset}]",
                    table = sym TABLE,
                    offset = const $slot * 8,
                );
                #[cfg(target_arch = "aarch64")]
                core::arch::naked_asm!(
                    "adrp x16, {table}",
                    "add x16, x16, :lo12:{table}",
                    "ldr x16, [x16, #{offset}]",
                    "br x16",
                    table = sym TABLE,
                    offset = const $slot * 8,
                );
            }
        )*
    };
}

// Sonames of Debian's tpm2-tss 2.4 to 4.x.
tss2_functions! {
    0 ESYS Esys_Create
    1 ESYS Esys_CreatePrimary
    2 ESYS Esys_Finalize
    3 ESYS Esys_FlushContext
    4 ESYS Esys_Initialize
    5 ESYS Esys_Load
    6 ESYS Esys_PolicyAuthValue
    7 ESYS Esys_PolicyGetDigest
    8 ESYS Esys_PolicyPCR
    9 ESYS Esys_StartAuthSession
    10 ESYS Esys_TRSess_SetAttributes
    11 ESYS Esys_TR_Close
    12 ESYS Esys_TR_SetAuth
    13 ESYS Esys_Unseal
    14 MU Tss2_MU_TPMT_PUBLIC_Marshal
    15 MU Tss2_MU_TPMT_PUBLIC_Unmarshal
    16 TCTILDR Tss2_TctiLdr_Finalize
    17 TCTILDR Tss2_TctiLdr_Initialize
}
