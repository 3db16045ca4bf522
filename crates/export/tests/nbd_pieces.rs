//! Large READs and WRITEs done in pieces (crypto of one piece overlapped with the transfer of
//! another): byte-unaligned and piece-unaligned requests through the hand-written raw client
//! (simple and structured replies), checked against the plain backing's bytes, with the
//! pieces path on and off.

mod common;

use std::sync::Arc;

use common::nbd_client::*;
use common::{pattern, MemDisk, TempDir};
use cryptblk_export::{NbdConfig, NbdServer};

fn serve(disk: &Arc<MemDisk>, dir: &TempDir, overlap_min: usize) -> NbdServer {
    let config = NbdConfig::unix(dir.join("nbd.sock")).with_overlap_min(overlap_min);
    NbdServer::start(disk.clone(), config).expect("start server")
}

/// (offset, length) pairs: piece-aligned, byte-unaligned at both ends, starting just
/// before a 128 KiB boundary, exactly the threshold, and one spanning many pieces.
const CASES: &[(u64, usize)] = &[
    (0, 1 << 20),
    (1000, (1 << 20) + 333),
    ((128 << 10) - 7, 700 << 10),
    (3 * MIB + 512, 256 << 10),
    (5 * MIB - 1, (2 << 20) + 1),
];

#[test]
fn large_unaligned_requests_match_the_plain_backing() {
    let dir = TempDir::new("pieces");
    for overlap_min in [256usize << 10, 0] {
        let disk = MemDisk::new(8 * MIB, 512);
        let server = serve(&disk, &dir, overlap_min);
        let sock = dir.join("nbd.sock");
        disk.fill(&pattern(70, 8 * MIB as usize));
        for structured in [true, false] {
            // No block-size agreement: the server accepts byte-granular requests.
            let mut c = Client::open(&sock, structured, false);
            for (i, &(offset, len)) in CASES.iter().enumerate() {
                let before = disk.snapshot();
                let r = c.read(offset, len as u32);
                assert_eq!(r.error, 0, "read {offset}+{len}: {r:?}");
                if structured {
                    let chunks = r.data.len();
                    // The pieces path sends one chunk per 128 KiB piece; off, one chunk.
                    if overlap_min == 0 {
                        assert_eq!(chunks, 1, "read {offset}+{len} with pieces off");
                    } else {
                        assert!(chunks > 1, "read {offset}+{len}: {chunks} chunk(s)");
                    }
                }
                let mut got = vec![0u8; len];
                let mut covered = 0;
                for (off, d) in &r.data {
                    let at = if structured {
                        (off - offset) as usize
                    } else {
                        0
                    };
                    got[at..at + d.len()].copy_from_slice(d);
                    covered += d.len();
                }
                assert_eq!(covered, len, "read {offset}+{len} coverage");
                assert!(
                    got[..] == before[offset as usize..offset as usize + len],
                    "read {offset}+{len} (structured {structured}, overlap {overlap_min}) differs"
                );

                let data = pattern(100 + i as u64 + 10 * u64::from(structured), len);
                let w = c.write(offset, &data, 0);
                assert_eq!(w.error, 0, "write {offset}+{len}: {w:?}");
                let after = disk.snapshot();
                let (o, e) = (offset as usize, offset as usize + len);
                assert!(after[o..e] == data[..], "write {offset}+{len} landed wrong");
                assert!(
                    after[..o] == before[..o] && after[e..] == before[e..],
                    "write {offset}+{len} touched bytes outside its range"
                );
                assert!(
                    c.read_ok(offset, len as u32) == data,
                    "read back {offset}+{len}"
                );
            }
            c.send_request(0, CMD_DISC, 1, 0, 0, &[]);
        }
        server.stop().unwrap();
    }
}

/// A FUA write in pieces reaches the device whole and a failed read piece reports its own
/// offset after the good pieces' data.
#[test]
fn fua_write_and_failing_piece() {
    let dir = TempDir::new("pieces-fail");
    let disk = MemDisk::new(8 * MIB, 512);
    let server = serve(&disk, &dir, 256 << 10);
    let sock = dir.join("nbd.sock");
    let mut c = Client::open(&sock, true, true);
    let data = pattern(77, 1 << 20);
    assert_eq!(c.write(MIB, &data, FLAG_FUA).error, 0);
    assert!(disk.snapshot()[MIB as usize..2 * MIB as usize] == data[..]);

    *disk.fail_reads.write().unwrap() = Some((MIB + (384 << 10), 512));
    let r = c.read(MIB, 1 << 20);
    assert_eq!(r.error, EIO);
    assert_eq!(r.error_offset, Some(MIB + (384 << 10)));
    let mut at = MIB;
    let mut chunks = r.data.clone();
    chunks.sort_by_key(|(off, _)| *off);
    for (off, d) in &chunks {
        assert_eq!(*off, at);
        assert!(d[..] == data[(at - MIB) as usize..(at - MIB) as usize + d.len()]);
        at += d.len() as u64;
    }
    assert_eq!(at, MIB + (384 << 10), "the good pieces before the failure");
    *disk.fail_reads.write().unwrap() = None;
    assert!(c.read_ok(MIB, 1 << 20) == data);
    server.stop().unwrap();
}
