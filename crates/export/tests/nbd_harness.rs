//! The in-memory harness the fuzz targets drive runs the fuzz seed corpus (real sessions
//! written by hand) through the server's protocol code: every seed ends without error and
//! gets the replies it asks for.

mod common;

use std::path::PathBuf;

use common::MemDisk;
use cryptblk_export::nbd::NbdHarness;
use cryptblk_export::NbdConfig;

fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut out: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no seeds in {}", dir.display());
    out
}

fn harness(name: &str) -> NbdHarness {
    let mut config = NbdConfig::unix("/nonexistent.sock");
    config.export_name = name.to_string();
    NbdHarness::new(MemDisk::new(1 << 20, 512), config).unwrap()
}

#[test]
fn handshake_seeds_run_through_the_server_code() {
    for (name, input) in seeds("nbd_handshake") {
        let written = harness("fuzz").session(&input);
        match name.as_str() {
            // Option replies, then a 4 KiB read's data among the replies.
            "go_structured_meta" => assert!(written.unwrap() > 4096 + 18, "{name}"),
            "qemu_like" => assert!(written.unwrap() > 65536 + 18, "{name}"),
            // Refused options, then NBD_OPT_EXPORT_NAME of an unknown export ends the session.
            "bad_options" => assert!(written.is_ok(), "{name}: {written:?}"),
            _ => assert!(written.unwrap() >= 18, "{name}"),
        }
    }
}

#[test]
fn transmission_seeds_run_through_the_server_code() {
    for (name, input) in seeds("nbd_transmission") {
        let (&flags, requests) = input.split_first().unwrap();
        let written =
            harness("").requests(flags & 1 != 0, flags & 2 != 0, flags & 4 != 0, requests);
        match name.as_str() {
            // A write of 1 GiB cannot be skipped: its error reply ends the session.
            "strict_unaligned" => assert!(written.unwrap() >= 2 * 16, "{name}"),
            _ => assert!(written.unwrap() > 4096, "{name}"),
        }
    }
}
