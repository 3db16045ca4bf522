//! Protocol-level tests with a hand-written raw-socket NBD client (constants taken from the
//! protocol document independently of the server's own definitions): option haggling,
//! malformed and hostile requests, error mapping, disconnects and shutdown.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use common::nbd_client::*;
use common::{pattern, MemDisk, TempDir};
use cryptblk_export::{NbdConfig, NbdListen, NbdServer};

fn serve(disk: &Arc<MemDisk>, dir: &TempDir, read_only: bool) -> NbdServer {
    let mut config = NbdConfig::unix(dir.join("nbd.sock"));
    config.export_name = "crypt0".to_string();
    config.read_only = read_only;
    NbdServer::start(disk.clone(), config).expect("start server")
}

#[test]
fn option_haggling_follows_the_protocol() {
    let disk = MemDisk::new(8 * MIB, 512);
    let dir = TempDir::new("opts");
    let server = serve(&disk, &dir, false);
    let sock = dir.join("nbd.sock");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let mut c = Client::connect_raw(&sock, 0b11);

    // Unknown options are refused with ERR_UNSUP and negotiation goes on.
    assert_eq!(c.option(0x4242, b"junk")[0].0, REP_ERR_UNSUP);
    // Options defined to carry no data reject data.
    assert_eq!(c.option(OPT_LIST, b"x")[0].0, REP_ERR_INVALID);
    assert_eq!(c.option(OPT_STRUCTURED_REPLY, b"x")[0].0, REP_ERR_INVALID);
    // NBD_OPT_LIST: one server entry naming the export, then ACK.
    let list = c.option(OPT_LIST, &[]);
    assert_eq!(list.len(), 2);
    assert_eq!(list[0].0, REP_SERVER);
    let name_len = u32::from_be_bytes(list[0].1[0..4].try_into().unwrap()) as usize;
    assert_eq!(&list[0].1[4..4 + name_len], b"crypt0");
    assert_eq!(list[1].0, REP_ACK);
    // INFO on an unknown export.
    assert_eq!(
        c.option(OPT_INFO, &Client::info_data("nope", &[]))[0].0,
        REP_ERR_UNKNOWN
    );
    // Truncated INFO data.
    assert_eq!(
        c.option(OPT_INFO, &[0, 0, 0, 9, b'a'])[0].0,
        REP_ERR_INVALID
    );
    // INFO by name with block size and name requests.
    let info = c.option(OPT_INFO, &Client::info_data("crypt0", &[3, 1]));
    assert_eq!(info.last().unwrap().0, REP_ACK);
    let mut saw_export = false;
    let mut saw_sizes = false;
    for (kind, d) in &info[..info.len() - 1] {
        assert_eq!(*kind, REP_INFO);
        match u16::from_be_bytes([d[0], d[1]]) {
            0 => {
                assert_eq!(d.len(), 12);
                assert_eq!(u64::from_be_bytes(d[2..10].try_into().unwrap()), 8 * MIB);
                let flags = u16::from_be_bytes([d[10], d[11]]);
                // HAS_FLAGS, SEND_FLUSH, SEND_FUA, SEND_TRIM, SEND_WRITE_ZEROES, CAN_MULTI_CONN
                for bit in [0, 2, 3, 5, 6, 8] {
                    assert!(
                        flags & (1 << bit) != 0,
                        "flag bit {bit} missing in {flags:#x}"
                    );
                }
                assert!(flags & 2 == 0, "read-write export must not be READ_ONLY");
                saw_export = true;
            }
            3 => {
                assert_eq!(d.len(), 14);
                let min = u32::from_be_bytes(d[2..6].try_into().unwrap());
                let pref = u32::from_be_bytes(d[6..10].try_into().unwrap());
                let max = u32::from_be_bytes(d[10..14].try_into().unwrap());
                assert_eq!((min, pref, max), (512, 4096, 32 << 20));
                saw_sizes = true;
            }
            1 => assert_eq!(&d[2..], b"crypt0"),
            _ => {}
        }
    }
    assert!(saw_export && saw_sizes);
    // ABORT is acknowledged, then the server closes.
    assert_eq!(c.option(OPT_ABORT, &[])[0].0, REP_ACK);
    let mut rest = Vec::new();
    c.s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());

    // Unknown client flags: the server must drop the connection.
    let mut bad = UnixStream::connect(&sock).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hello = [0u8; 18];
    bad.read_exact(&mut hello).unwrap();
    bad.write_all(&0x8000_0000u32.to_be_bytes()).unwrap();
    let mut rest = Vec::new();
    let _ = bad.read_to_end(&mut rest);
    assert!(rest.is_empty());
    server.stop().unwrap();
}

#[test]
fn export_name_option_with_and_without_zero_padding() {
    let disk = MemDisk::new(4 * MIB, 512);
    disk.fill(&pattern(1, 4 * MIB as usize));
    let dir = TempDir::new("expname");
    let server = serve(&disk, &dir, false);
    let sock = dir.join("nbd.sock");
    for (client_flags, padding) in [(0b11u32, 0usize), (0b01, 124)] {
        let mut c = Client::connect_raw(&sock, client_flags);
        c.send_option(OPT_EXPORT_NAME, b"crypt0");
        assert_eq!(c.u64(), 4 * MIB);
        let flags = c.u16();
        assert!(flags & 1 != 0);
        assert_eq!(c.bytes(padding), vec![0u8; padding]);
        let got = c.read_ok(4096, 8192);
        assert_eq!(got, disk.snapshot()[4096..4096 + 8192]);
        c.send_request(0, CMD_DISC, 1, 0, 0, &[]);
    }
    // An unknown name cannot be refused politely: the server hangs up.
    let mut c = Client::connect_raw(&sock, 0b11);
    c.send_option(OPT_EXPORT_NAME, b"other");
    let mut rest = Vec::new();
    let _ = c.s.read_to_end(&mut rest);
    assert!(rest.is_empty());
    server.stop().unwrap();
}

/// Malformed requests get the spec's error and the connection stays usable and in sync.
fn malformed_requests(structured: bool) {
    let disk = MemDisk::new(16 * MIB, 512);
    let dir = TempDir::new("malformed");
    let server = serve(&disk, &dir, false);
    let mut c = Client::open(&dir.join("nbd.sock"), structured, true);
    assert_eq!(c.size, 16 * MIB);
    let good = pattern(2, 65536);
    assert_eq!(c.write(MIB, &good, FLAG_FUA).error, 0);

    let before = disk.snapshot();
    // Reads past the end: EINVAL. Writes past the end: ENOSPC (payload still consumed).
    assert_eq!(c.read(16 * MIB - 512, 1024).error, EINVAL);
    assert_eq!(c.read(u64::MAX - 511, 1024).error, EINVAL);
    assert_eq!(c.write(16 * MIB - 512, &[1u8; 1024], 0).error, ENOSPC);
    assert_eq!(c.cmd(CMD_WRITE_ZEROES, 0, 16 * MIB, 512).error, ENOSPC);
    assert_eq!(c.cmd(CMD_TRIM, 0, 16 * MIB - 512, 4096).error, EINVAL);
    // Misaligned to the agreed minimum block size: EINVAL.
    assert_eq!(c.read(100, 512).error, EINVAL);
    assert_eq!(c.write(512, &[7u8; 100], 0).error, EINVAL);
    // Longer than the advertised maximum: EINVAL (a write's 40 MiB payload is skipped).
    assert_eq!(c.read(0, 33 << 20).error, EINVAL);
    let huge = vec![0x55u8; 40 << 20];
    assert_eq!(c.write(0, &huge, 0).error, EINVAL);
    // Unknown command, invalid flag, block status without a metadata context.
    assert_eq!(c.cmd(99, 0, 0, 512).error, EINVAL);
    assert_eq!(c.cmd(CMD_READ, FLAG_DF, 0, 0).error, EINVAL);
    assert_eq!(c.cmd(CMD_FLUSH, 0x100, 0, 0).error, EINVAL);
    assert_eq!(c.cmd(CMD_BLOCK_STATUS, 0, 0, 4096).error, EINVAL);
    if structured {
        let r = c.read(16 * MIB, 512);
        assert_eq!(r.types, vec![TYPE_ERROR]);
        assert!(r.message.contains("end"), "{}", r.message);
    }
    // Nothing above touched the device.
    assert_eq!(disk.snapshot(), before);

    // The connection is still in sync and serves valid requests.
    assert_eq!(c.cmd(CMD_CACHE, 0, 0, 65536).error, 0);
    assert_eq!(c.read_ok(MIB, 65536), good);
    assert_eq!(c.cmd(CMD_WRITE_ZEROES, FLAG_FUA, MIB + 4096, 8192).error, 0);
    assert_eq!(c.cmd(CMD_TRIM, 0, 8 * MIB, 65536).error, 0);
    assert_eq!(c.cmd(CMD_FLUSH, 0, 0, 0).error, 0);
    let snap = disk.snapshot();
    let mut expect = good.clone();
    expect[4096..12288].fill(0);
    assert_eq!(&snap[MIB as usize..MIB as usize + 65536], &expect[..]);
    assert!(
        snap[8 * MIB as usize..8 * MIB as usize + 65536]
            .iter()
            .all(|&b| b == 0xdd),
        "trim reached the device"
    );
    assert!(disk.flushes.load(std::sync::atomic::Ordering::SeqCst) >= 2);
    // A zero-length read succeeds.
    let r = c.read(0, 0);
    assert_eq!(r.error, 0);
    c.send_request(0, CMD_DISC, 1, 0, 0, &[]);
    server.stop().unwrap();
}

#[test]
fn malformed_requests_structured_replies() {
    malformed_requests(true);
}

#[test]
fn malformed_requests_simple_replies() {
    malformed_requests(false);
}

#[test]
fn read_errors_map_to_eio_with_offset() {
    let disk = MemDisk::new(16 * MIB, 512);
    disk.fill(&pattern(3, 16 * MIB as usize));
    *disk.fail_reads.write().unwrap() = Some((6 * MIB, 512));
    let dir = TempDir::new("eio");
    let server = serve(&disk, &dir, false);
    let sock = dir.join("nbd.sock");

    let mut c = Client::open(&sock, true, true);
    let r = c.read(6 * MIB, 4096);
    assert_eq!(r.error, EIO);
    assert_eq!(r.types, vec![TYPE_ERROR_OFFSET]);
    assert_eq!(r.error_offset, Some(6 * MIB));
    // A large read goes out in pieces: the good data before the failure arrives as data
    // chunks (one or several), then the error with its offset ends the reply.
    let r = c.read(2 * MIB, 8 << 20);
    assert_eq!(r.error, EIO);
    let (last, data_types) = r.types.split_last().unwrap();
    assert_eq!(*last, TYPE_ERROR_OFFSET);
    assert!(!data_types.is_empty() && data_types.iter().all(|&t| t == TYPE_OFFSET_DATA));
    let mut good = r.data.clone();
    good.sort_by_key(|(off, _)| *off);
    let mut at = 2 * MIB;
    for (off, d) in &good {
        assert_eq!(*off, at, "data chunks must be contiguous");
        assert_eq!(d[..], disk.snapshot()[at as usize..at as usize + d.len()]);
        at += d.len() as u64;
    }
    assert_eq!(at, 6 * MIB, "all data before the failure arrives");
    assert_eq!(r.error_offset, Some(6 * MIB));
    assert_eq!(c.read_ok(0, 4096), disk.snapshot()[..4096]);

    let mut s = Client::open(&sock, false, true);
    assert_eq!(s.read(6 * MIB, 4096).error, EIO);
    assert_eq!(s.read_ok(0, 4096), disk.snapshot()[..4096]);
    server.stop().unwrap();
}

#[test]
fn unaligned_requests_without_block_size_agreement_use_read_modify_write() {
    // 4096-byte logical blocks, client did not ask for NBD_INFO_BLOCK_SIZE: the protocol's
    // default minimum block size of 1 applies, so byte-granular requests must work.
    let disk = MemDisk::new(4 * MIB, 4096);
    let initial = pattern(4, 4 * MIB as usize);
    disk.fill(&initial);
    let mut model = initial.clone();
    let dir = TempDir::new("rmw");
    let server = serve(&disk, &dir, false);
    let mut c = Client::open(&dir.join("nbd.sock"), true, false);
    let mut rng = pattern(5, 4096);
    for i in 0..200 {
        let r = u64::from_le_bytes(
            rng[(i % 500) * 8..(i % 500) * 8 + 8]
                .try_into()
                .unwrap_or([1; 8]),
        );
        let offset = r % (4 * MIB - 20000);
        let len = 1 + (r >> 32) % 19999;
        if i % 3 == 0 {
            let got = c.read_ok(offset, len as u32);
            assert_eq!(got, model[offset as usize..(offset + len) as usize]);
        } else {
            let data = pattern(i as u64 + 100, len as usize);
            assert_eq!(c.write(offset, &data, 0).error, 0);
            model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
        }
        if i == 100 {
            rng = pattern(6, 4096);
        }
    }
    assert_eq!(c.cmd(CMD_WRITE_ZEROES, 0, 1000, 10000).error, 0);
    model[1000..11000].fill(0);
    assert_eq!(disk.snapshot(), model);
    // The same client mistakes are refused once block sizes were agreed on.
    let mut strict = Client::open(&dir.join("nbd.sock"), true, true);
    assert_eq!(strict.read(512, 4096).error, EINVAL);
    assert_eq!(strict.read_ok(8192, 4096), model[8192..12288]);
    server.stop().unwrap();
}

#[test]
fn read_only_export_refuses_writes_with_eperm() {
    let disk = MemDisk::new(4 * MIB, 512);
    disk.fill(&pattern(7, 4 * MIB as usize));
    let dir = TempDir::new("ro");
    let server = serve(&disk, &dir, true);
    let mut c = Client::open(&dir.join("nbd.sock"), true, true);
    assert!(c.flags & 2 != 0, "READ_ONLY flag expected");
    let before = disk.snapshot();
    assert_eq!(c.write(0, &[0u8; 4096], 0).error, EPERM);
    assert_eq!(c.cmd(CMD_TRIM, 0, 0, 4096).error, EPERM);
    assert_eq!(c.cmd(CMD_WRITE_ZEROES, 0, 0, 4096).error, EPERM);
    assert_eq!(c.read_ok(0, 4096), before[..4096]);
    assert_eq!(disk.snapshot(), before);
    server.stop().unwrap();
}

#[test]
fn client_killed_mid_write_leaves_device_untouched_and_server_serving() {
    let disk = MemDisk::new(8 * MIB, 512);
    disk.fill(&pattern(8, 8 * MIB as usize));
    let before = disk.snapshot();
    let dir = TempDir::new("kill");
    let server = serve(&disk, &dir, false);
    let sock = dir.join("nbd.sock");
    let mut other = Client::open(&sock, true, true);
    {
        let mut victim = Client::open(&sock, true, true);
        // Header promises 1 MiB but only 100 KiB arrive before the client dies.
        victim.send_request(0, CMD_WRITE, 1, 0, MIB as u32, &vec![0xee; 100 << 10]);
        victim.s.shutdown(std::net::Shutdown::Both).unwrap();
    }
    // A client killed in the middle of reading a large reply.
    {
        let mut victim = Client::open(&sock, false, true);
        victim.send_request(0, CMD_READ, 2, 0, 8 << 20, &[]);
        let mut some = [0u8; 100];
        victim.s.read_exact(&mut some).unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while server.connection_count() > 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        server.connection_count(),
        1,
        "dead clients' connections must end"
    );
    assert_eq!(
        disk.snapshot(),
        before,
        "a partial write payload must not reach the device"
    );
    assert_eq!(other.read_ok(0, 65536), before[..65536]);
    let data = pattern(9, 65536);
    assert_eq!(other.write(0, &data, 0).error, 0);
    assert_eq!(disk.snapshot()[..65536], data[..]);
    // New clients are still accepted.
    let mut late = Client::open(&sock, true, true);
    assert_eq!(late.read_ok(0, 65536), data);
    server.stop().unwrap();
}

#[test]
fn concurrent_clients_see_each_others_writes() {
    let disk = MemDisk::new(16 * MIB, 512);
    let dir = TempDir::new("multi");
    let server = serve(&disk, &dir, false);
    let sock = dir.join("nbd.sock");
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let sock = sock.clone();
            std::thread::spawn(move || {
                let mut c = Client::open(&sock, t % 2 == 0, true);
                for i in 0..32u64 {
                    let off = t * 4 * MIB + i * 128 * 1024;
                    let data = pattern(t * 1000 + i, 128 * 1024);
                    assert_eq!(c.write(off, &data, 0).error, 0);
                    assert_eq!(c.read_ok(off, 128 * 1024), data);
                }
                assert_eq!(c.cmd(CMD_FLUSH, 0, 0, 0).error, 0);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let snap = disk.snapshot();
    let mut reader = Client::open(&sock, true, true);
    for t in 0..4u64 {
        for i in 0..32u64 {
            let off = (t * 4 * MIB + i * 128 * 1024) as usize;
            assert_eq!(
                snap[off..off + 128 * 1024],
                pattern(t * 1000 + i, 128 * 1024)[..]
            );
        }
    }
    assert_eq!(reader.read_ok(0, 65536), snap[..65536]);
    server.stop().unwrap();
}

#[test]
fn stop_is_graceful_with_clients_connected() {
    let disk = MemDisk::new(4 * MIB, 512);
    let dir = TempDir::new("stop");
    let server = serve(&disk, &dir, false);
    let sock = dir.join("nbd.sock");
    let mut c = Client::open(&sock, true, true);
    assert_eq!(c.write(0, &[3u8; 4096], 0).error, 0);
    let flushes = disk.flushes.load(std::sync::atomic::Ordering::SeqCst);
    server.stop().unwrap();
    assert!(
        disk.flushes.load(std::sync::atomic::Ordering::SeqCst) > flushes,
        "stop flushes"
    );
    let mut rest = Vec::new();
    let _ = c.s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "the connection is closed after stop");
    assert!(!sock.exists(), "socket file removed");
    assert!(UnixStream::connect(&sock).is_err());
}

#[test]
fn tcp_listener_on_localhost() {
    let disk = MemDisk::new(MIB, 512);
    disk.fill(&pattern(10, MIB as usize));
    let server = NbdServer::start(disk.clone(), NbdConfig::localhost(0)).unwrap();
    let NbdListen::Tcp(addr) = server.address().clone() else {
        panic!("tcp expected")
    };
    assert!(addr.ip().is_loopback());
    assert_ne!(addr.port(), 0);
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    assert_eq!(
        u64::from_be_bytes(hello[0..8].try_into().unwrap()),
        NBDMAGIC
    );
    s.write_all(&3u32.to_be_bytes()).unwrap();
    let mut m = IHAVEOPT.to_be_bytes().to_vec();
    m.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
    m.extend_from_slice(&0u32.to_be_bytes());
    s.write_all(&m).unwrap();
    let mut info = [0u8; 10];
    s.read_exact(&mut info).unwrap();
    assert_eq!(u64::from_be_bytes(info[0..8].try_into().unwrap()), MIB);
    let mut req = REQUEST_MAGIC.to_be_bytes().to_vec();
    req.extend_from_slice(&0u16.to_be_bytes());
    req.extend_from_slice(&CMD_READ.to_be_bytes());
    req.extend_from_slice(&5u64.to_be_bytes());
    req.extend_from_slice(&512u64.to_be_bytes());
    req.extend_from_slice(&512u32.to_be_bytes());
    s.write_all(&req).unwrap();
    let mut reply = [0u8; 16 + 512];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(
        u32::from_be_bytes(reply[0..4].try_into().unwrap()),
        SIMPLE_MAGIC
    );
    assert_eq!(u32::from_be_bytes(reply[4..8].try_into().unwrap()), 0);
    assert_eq!(reply[16..], disk.snapshot()[512..1024]);
    server.stop().unwrap();
}

fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

#[test]
fn base_allocation_metadata_context_and_block_status() {
    let disk = MemDisk::new(8 * MIB, 512);
    let dir = TempDir::new("meta");
    let server = serve(&disk, &dir, false);
    let sock = dir.join("nbd.sock");
    let mut c = Client::connect_raw(&sock, 0b11);
    // Metadata contexts need structured replies first.
    assert_eq!(
        c.option(OPT_SET_META_CONTEXT, &meta_data("", &["base:allocation"]))[0].0,
        REP_ERR_INVALID
    );
    assert_eq!(c.option(OPT_STRUCTURED_REPLY, &[])[0].0, REP_ACK);
    c.structured = true;
    assert_eq!(
        c.option(OPT_LIST_META_CONTEXT, &[0, 0, 0, 1])[0].0,
        REP_ERR_INVALID
    );
    for queries in [
        &[][..],
        &["base:"][..],
        &["base:allocation", "x-other:thing"][..],
    ] {
        let list = c.option(OPT_LIST_META_CONTEXT, &meta_data("crypt0", queries));
        assert_eq!(list.len(), 2, "{queries:?}: {list:?}");
        assert_eq!(list[0].0, REP_META_CONTEXT);
        assert_eq!(&list[0].1[4..], b"base:allocation");
        assert_eq!(list[1].0, REP_ACK);
    }
    // Unknown namespaces select nothing.
    assert_eq!(
        c.option(
            OPT_SET_META_CONTEXT,
            &meta_data("", &["qemu:dirty-bitmap:x"])
        ),
        vec![(REP_ACK, vec![])]
    );
    let set = c.option(OPT_SET_META_CONTEXT, &meta_data("", &["base:allocation"]));
    assert_eq!(set.len(), 2);
    assert_eq!(set[0].0, REP_META_CONTEXT);
    let id = u32::from_be_bytes(set[0].1[0..4].try_into().unwrap());
    let replies = c.option(OPT_GO, &Client::info_data("", &[3]));
    assert_eq!(replies.last().unwrap().0, REP_ACK);
    let r = c.cmd(CMD_BLOCK_STATUS, 0, 4096, 65536);
    assert_eq!(r.error, 0, "{r:?}");
    assert_eq!(r.types, vec![TYPE_BLOCK_STATUS]);
    assert_eq!(r.extents, vec![(id, vec![(65536, 0)])]);
    let r = c.cmd(CMD_BLOCK_STATUS, FLAG_REQ_ONE, 0, 8 * MIB as u32);
    assert_eq!(r.extents, vec![(id, vec![(8 * MIB as u32, 0)])]);
    assert_eq!(
        c.cmd(CMD_BLOCK_STATUS, 0, 8 * MIB - 512, 1024).error,
        EINVAL
    );
    assert_eq!(c.read_ok(0, 512), vec![0u8; 512]);
    server.stop().unwrap();
}

#[test]
fn stop_does_not_hang_on_a_client_that_stopped_reading() {
    let disk = MemDisk::new(64 * MIB, 512);
    let dir = TempDir::new("stuck");
    let server = serve(&disk, &dir, false);
    let mut c = Client::open(&dir.join("nbd.sock"), false, true);
    // Ask for far more reply data than socket buffers hold, and never read it.
    for h in 0..4u64 {
        c.send_request(0, CMD_READ, h, h * 16 * MIB, 16 << 20, &[]);
    }
    std::thread::sleep(Duration::from_millis(200));
    let started = std::time::Instant::now();
    server.stop().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "stop hung on a stuck client"
    );
}
