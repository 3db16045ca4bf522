//! Lab helper for tests/lab/handover.sh (the kernel lab has ublk; this host may not): serves
//! the dmsetup table TABLE over ublk as volume NAME, prints the device path, then reads one
//! line from standard input: `hand-over` calls [`cryptblk_export::Export::hand_over`],
//! prints `handed over` and exits at the end of its input (an upgrading daemon hands over,
//! then exits); anything else (or end of input) stops the export (deleting the device). A
//! second run with the same NAME takes a handed-over device over, waiting for the first to
//! exit if it started before.
//!
//! usage: ublk_hand_over NAME TABLE

use std::io::BufRead;
use std::sync::Arc;

use cryptblk_export::{ExportDescription, StartExport, UblkConfig};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, name, table] = args.as_slice() else {
        eprintln!("usage: ublk_hand_over NAME TABLE");
        std::process::exit(2);
    };
    let registry = cryptblk_dm::Registry::new();
    let mapping = registry.create(name, table).unwrap_or_else(|e| {
        eprintln!("ublk_hand_over: {e}");
        std::process::exit(1)
    });
    let config = UblkConfig {
        volume: Some(name.clone()),
        ..UblkConfig::default()
    };
    let export = config.start(mapping as Arc<_>).unwrap_or_else(|e| {
        eprintln!("ublk_hand_over: {e}");
        std::process::exit(1)
    });
    if let ExportDescription::Ublk(u) = export.describe() {
        println!("{}", u.dev.display());
    }
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    if line.trim() == "hand-over" {
        if let Err(e) = export.hand_over() {
            eprintln!("ublk_hand_over: {e}");
            std::process::exit(1);
        }
        println!("handed over");
        // Still serving until it exits, as a daemon between hand-over and exit.
        let _ = std::io::stdin().lock().read_line(&mut line);
    } else if let Err(e) = export.stop() {
        eprintln!("ublk_hand_over: {e}");
        std::process::exit(1);
    }
}
