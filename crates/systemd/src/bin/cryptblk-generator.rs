//! `cryptblk-generator NORMAL_DIR [EARLY_DIR LATE_DIR]`: the systemd generator for crypttab
//! lines served by cryptblk (see `cryptblk_systemd::generator`). Installed in
//! /usr/lib/systemd/system-generators/; systemd runs it at boot and on `daemon-reload`.
//! Messages go to stderr, which systemd sends to the kernel log; the generator exits 0 even
//! when lines are skipped, so that one bad line never takes the others' units away.

use cryptblk_systemd::{generator, unit::Paths};
use std::path::PathBuf;

fn main() {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let args: Vec<&std::path::Path> = args.iter().map(|p| p.as_path()).collect();
    if args.is_empty() || args.len() > 3 || args[0].as_os_str().is_empty() {
        eprintln!("usage: cryptblk-generator NORMAL_DIR [EARLY_DIR LATE_DIR]");
        std::process::exit(1);
    }
    let normal = args[0];
    let paths = Paths {
        crypttab: generator::crypttab_path(),
        ..Paths::default()
    };
    let text = match std::fs::read(&paths.crypttab) {
        Ok(t) => String::from_utf8_lossy(&t).into_owned(),
        // As systemd-cryptsetup-generator: no crypttab, nothing to do.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            eprintln!("cryptblk-generator: cannot read {}: {e}", paths.crypttab);
            std::process::exit(1);
        }
    };
    match generator::generate(&text, normal, args.get(1).copied(), &paths) {
        Ok(warnings) => {
            for w in warnings {
                eprintln!("cryptblk-generator: {w}");
            }
        }
        Err(e) => {
            eprintln!(
                "cryptblk-generator: cannot write units into {}: {e}",
                normal.display()
            );
            std::process::exit(1);
        }
    }
}
