//! The vhost-user-blk export driven by a test frontend (rust-vmm's `vhost` frontend side,
//! guest memory in a memfd shared with the export, split virtqueues laid out here as a
//! virtio driver lays them out): the protocol without a VM. A real guest (QEMU, the Linux
//! virtio-blk driver) is the lab's test.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::{pattern, require_tool, run, MemDisk, TempDir};
use cryptblk_dm::{BlockDevice, Registry};
use cryptblk_export::{ExportConfig, ExportDescription, VhostUserConfig, VhostUserExport};
use std::sync::atomic::Ordering;
use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                   f0e0d0c0b0a090807060504030201000ffeeddccbbaa99887766554433221100";
const MIB: u64 = 1 << 20;

mod vhost_frontend;
use vhost_frontend::*;

fn has(features: u64, bit: u32) -> bool {
    features & (1 << bit) != 0
}

fn crypt(reg: &Registry, name: &str, file: &Path, size: u64, extra: &str) -> Arc<dyn BlockDevice> {
    std::fs::write(file, vec![0u8; size as usize]).unwrap();
    let table = format!(
        "0 {} crypt aes-xts-plain64 {KEY} 0 {} 0{extra}",
        size / 512,
        file.display()
    );
    reg.create(name, &table).unwrap()
}

/// Decrypts `len` bytes at `offset` of a dm-crypt aes-xts-plain64 image with pyca
/// `cryptography` (tweak: the 512-byte sector number, little-endian; one XTS data unit per
/// `sector_size` bytes): an implementation that shares nothing with cryptblk.
fn independent_decrypt(image: &Path, offset: u64, len: usize, sector_size: u32) -> Option<Vec<u8>> {
    const PY: &str = r#"
import sys
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
path, off, n, key, ss = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), bytes.fromhex(sys.argv[4]), int(sys.argv[5])
f = open(path, "rb"); f.seek(off); data = f.read(n)
out = bytearray()
for i in range(0, n, ss):
    d = Cipher(algorithms.AES(key), modes.XTS(((off + i) // 512).to_bytes(16, "little"))).decryptor()
    out += d.update(data[i:i + ss]) + d.finalize()
sys.stdout.buffer.write(out)
"#;
    if !require_tool("python3", "PYTHON3") {
        return None;
    }
    let probe = Command::new("python3")
        .args(["-c", "import cryptography.hazmat.primitives.ciphers"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !probe {
        if std::env::var("CRYPTBLK_SKIP_PYCRYPTOGRAPHY").as_deref() == Ok("1") {
            eprintln!("SKIPPED: independent decryption (python3 cryptography missing)");
            return None;
        }
        panic!("python3 with pyca cryptography is required (or CRYPTBLK_SKIP_PYCRYPTOGRAPHY=1)");
    }
    let out = run(Command::new("python3").args(["-c", PY]).arg(image).args([
        &offset.to_string(),
        &len.to_string(),
        KEY,
        &sector_size.to_string(),
    ]));
    Some(out.stdout)
}

#[test]
fn protocol_requests_and_data_dm_crypt_reads() {
    let dir = TempDir::new("vhost-basic");
    let reg = Registry::new();
    let backing = dir.join("cipher.img");
    let dev = crypt(&reg, "vu", &backing, 16 * MIB, "");
    let socket = dir.join("vu.sock");
    let export =
        cryptblk_export::start(ExportConfig::VhostUser(VhostUserConfig::new(&socket)), dev)
            .unwrap();
    assert_eq!(
        export.describe(),
        ExportDescription::VhostUser(cryptblk_export::VhostUserDescription {
            socket: socket.clone(),
            queues: 1,
        })
    );
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "only the owner may attach the disk");

    let mut g = connect(&socket, 1);
    for bit in [
        VIRTIO_F_VERSION_1,
        VIRTIO_BLK_F_BLK_SIZE,
        VIRTIO_BLK_F_SEG_MAX,
        VIRTIO_BLK_F_FLUSH,
        VIRTIO_BLK_F_MQ,
    ] {
        assert!(has(g.features, bit), "feature bit {bit} offered");
    }
    for bit in [
        VIRTIO_BLK_F_RO,
        VIRTIO_BLK_F_DISCARD,
        VIRTIO_BLK_F_WRITE_ZEROES,
    ] {
        assert!(!has(g.features, bit), "feature bit {bit} not offered");
    }
    let c = g.config;
    assert_eq!({ c.capacity }, 16 * MIB / 512);
    assert_eq!({ c.blk_size }, 512);
    assert_eq!({ c.num_queues }, 1);
    assert_eq!({ c.seg_max }, u32::from(QUEUE_SIZE) - 2);

    let q = &mut g.queues[0];
    let data = pattern(7, 256 << 10);
    // Whole-block buffers (served in place) and odd splits (through the bounce buffer).
    assert_eq!(
        q.write_split(8, &data, &[64 << 10, 128 << 10, 64 << 10]),
        VIRTIO_BLK_S_OK
    );
    let odd = pattern(8, 8192);
    assert_eq!(
        q.write_split(4096, &odd, &[1000, 3096, 4096]),
        VIRTIO_BLK_S_OK
    );
    let (st, back) = q.read_split(8, &[4096, 200 << 10, 52 << 10]);
    assert_eq!(st, VIRTIO_BLK_S_OK);
    assert!(back == data, "read back what was written");
    // Many page-sized buffers: one device call through the queue's bounce buffer.
    let (st, back) = q.read_split(8, &[4096; 64]);
    assert_eq!(st, VIRTIO_BLK_S_OK);
    assert!(back == data);
    let pages = pattern(12, 64 << 10);
    assert_eq!(q.write_split(2048, &pages, &[4096; 16]), VIRTIO_BLK_S_OK);
    assert!(q.read(2048, pages.len()).1 == pages);
    let (st, back) = q.read_split(4096, &[100, 8092]);
    assert_eq!(st, VIRTIO_BLK_S_OK);
    assert!(back == odd);

    assert_eq!(q.bare(VIRTIO_BLK_T_FLUSH), VIRTIO_BLK_S_OK);
    let (st, id) = q.get_id();
    assert_eq!(st, VIRTIO_BLK_S_OK);
    assert_eq!(&id[..7], b"vu.sock");
    assert!(id[7..].iter().all(|&b| b == 0));
    assert_eq!(q.bare(99), VIRTIO_BLK_S_UNSUPP);
    // The table has no allow_discards: discard is refused as unsupported.
    assert_eq!(q.ranged(VIRTIO_BLK_T_DISCARD, 0, 8), VIRTIO_BLK_S_UNSUPP);
    // Past the end, and a length that is not whole sectors.
    assert_eq!(q.read(16 * MIB / 512, 512).0, VIRTIO_BLK_S_IOERR);
    assert_eq!(q.read(0, 100).0, VIRTIO_BLK_S_IOERR);

    drop(g);
    export.stop().unwrap();
    assert!(!socket.exists(), "stop removes the socket");
    reg.remove("vu").unwrap();

    let raw = std::fs::read(&backing).unwrap();
    assert!(
        raw[4096..8192] != data[..4096],
        "the backing holds ciphertext"
    );
    if let Some(plain) = independent_decrypt(&backing, 8 * 512, data.len(), 512) {
        assert!(
            plain == data,
            "dm-crypt's aes-xts-plain64 reads what the guest wrote"
        );
    }
    if let Some(plain) = independent_decrypt(&backing, 4096 * 512, odd.len(), 512) {
        assert!(plain == odd);
    }
}

#[test]
fn blk_size_is_the_volume_sector_size() {
    let dir = TempDir::new("vhost-4k");
    let reg = Registry::new();
    let backing = dir.join("cipher.img");
    let dev = crypt(&reg, "vu4k", &backing, 8 * MIB, " 1 sector_size:4096");
    let socket = dir.join("vu.sock");
    let export = VhostUserExport::start(dev, VhostUserConfig::new(&socket)).unwrap();
    let mut g = connect(&socket, 1);
    assert_eq!({ g.config.blk_size }, 4096);
    let q = &mut g.queues[0];
    let data = pattern(9, 64 << 10);
    assert_eq!(q.write(16, &data), VIRTIO_BLK_S_OK);
    // Half a logical block: refused, as the kernel would never send it.
    assert_eq!(q.write(0, &data[..2048]), VIRTIO_BLK_S_IOERR);
    assert_eq!(
        q.read(1, 4096).0,
        VIRTIO_BLK_S_IOERR,
        "unaligned start sector"
    );
    assert!(q.read(16, data.len()).1 == data);
    drop(g);
    export.stop().unwrap();
    reg.remove("vu4k").unwrap();
    if let Some(plain) = independent_decrypt(&backing, 16 * 512, data.len(), 4096) {
        assert!(
            plain == data,
            "4096-byte XTS units, as dm-crypt sector_size:4096"
        );
    }
}

#[test]
fn every_queue_serves_requests_concurrently() {
    let dir = TempDir::new("vhost-mq");
    let disk = MemDisk::new(32 * MIB, 512);
    let socket = dir.join("vu.sock");
    let mut cfg = VhostUserConfig::new(&socket);
    cfg.queues = 4;
    let export = VhostUserExport::start(disk.clone(), cfg).unwrap();
    let g = connect(&socket, 4);
    assert_eq!({ g.config.num_queues }, 4);
    let handles: Vec<_> = g
        .queues
        .into_iter()
        .enumerate()
        .map(|(i, mut q)| {
            std::thread::spawn(move || {
                let base = i as u64 * 8 * MIB / 512;
                for round in 0..32u64 {
                    let data = pattern(i as u64 * 100 + round, 64 << 10);
                    let sector = base + round * 128;
                    assert_eq!(q.write(sector, &data), VIRTIO_BLK_S_OK);
                    let (st, back) = q.read(sector, data.len());
                    assert_eq!(st, VIRTIO_BLK_S_OK);
                    assert!(back == data, "queue {i} round {round}");
                }
                q
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    export.stop().unwrap();
    let snap = disk.snapshot();
    for i in 0..4u64 {
        let at = (i * 8 * MIB + 31 * 128 * 512) as usize;
        assert!(snap[at..at + (64 << 10)] == pattern(i * 100 + 31, 64 << 10)[..]);
    }
}

#[test]
fn read_only_export_refuses_writes() {
    let dir = TempDir::new("vhost-ro");
    let disk = MemDisk::new(4 * MIB, 512);
    disk.fill(&pattern(3, 4 * MIB as usize));
    let socket = dir.join("vu.sock");
    let mut cfg = VhostUserConfig::new(&socket);
    cfg.read_only = true;
    let export = VhostUserExport::start(disk.clone(), cfg).unwrap();
    let mut g = connect(&socket, 1);
    assert!(has(g.features, VIRTIO_BLK_F_RO));
    let q = &mut g.queues[0];
    assert_eq!(q.write(0, &[0u8; 4096]), VIRTIO_BLK_S_IOERR);
    assert_eq!(
        q.ranged(VIRTIO_BLK_T_WRITE_ZEROES, 0, 8),
        VIRTIO_BLK_S_UNSUPP
    );
    let (st, back) = q.read(0, 4096);
    assert_eq!(st, VIRTIO_BLK_S_OK);
    assert!(back[..] == pattern(3, 4096)[..]);
    drop(g);
    export.stop().unwrap();
    assert!(
        disk.snapshot() == pattern(3, 4 * MIB as usize),
        "nothing was written"
    );
}

#[test]
fn discard_and_write_zeroes_when_the_table_allows_them() {
    let dir = TempDir::new("vhost-discard");
    let reg = Registry::new();
    let dev = crypt(
        &reg,
        "vud",
        &dir.join("c.img"),
        4 * MIB,
        " 1 allow_discards",
    );
    let socket = dir.join("vu.sock");
    let export = VhostUserExport::start(dev, VhostUserConfig::new(&socket)).unwrap();
    let mut g = connect(&socket, 1);
    assert!(has(g.features, VIRTIO_BLK_F_DISCARD) && has(g.features, VIRTIO_BLK_F_WRITE_ZEROES));
    assert_eq!({ g.config.max_discard_seg }, 1);
    let q = &mut g.queues[0];
    assert_eq!(q.write(0, &pattern(4, 16384)), VIRTIO_BLK_S_OK);
    assert_eq!(q.ranged(VIRTIO_BLK_T_WRITE_ZEROES, 8, 16), VIRTIO_BLK_S_OK);
    let (_, back) = q.read(0, 16384);
    assert!(back[..4096] == pattern(4, 4096)[..]);
    assert!(
        back[4096..12288].iter().all(|&b| b == 0),
        "write-zeroes reads as zeros"
    );
    assert_eq!(q.ranged(VIRTIO_BLK_T_DISCARD, 0, 8), VIRTIO_BLK_S_OK);
    drop(g);
    export.stop().unwrap();
    reg.remove("vud").unwrap();
}

#[test]
fn a_new_frontend_is_served_after_the_first_disconnects() {
    let dir = TempDir::new("vhost-reconnect");
    let disk = MemDisk::new(4 * MIB, 512);
    let socket = dir.join("vu.sock");
    let mut cfg = VhostUserConfig::new(&socket);
    cfg.queues = 2;
    let export = VhostUserExport::start(disk.clone(), cfg).unwrap();
    let first = pattern(11, 32 << 10);
    {
        let mut g = connect(&socket, 2);
        assert_eq!(g.queues[1].write(64, &first), VIRTIO_BLK_S_OK);
        // The frontend goes away without any goodbye, as a killed QEMU does.
    }
    for round in 0..3u64 {
        let mut g = connect(&socket, 2);
        let (st, back) = g.queues[0].read(64, first.len());
        assert_eq!(st, VIRTIO_BLK_S_OK);
        assert!(
            back == first,
            "round {round}: the data survived the reconnect"
        );
        let more = pattern(20 + round, 4096);
        assert_eq!(g.queues[1].write(1024 + round * 8, &more), VIRTIO_BLK_S_OK);
    }
    // A connection left open is cut by stop.
    let g = connect(&socket, 2);
    export.stop().unwrap();
    drop(g);
    let snap = disk.snapshot();
    assert!(snap[64 * 512..64 * 512 + first.len()] == first[..]);
    for round in 0..3u64 {
        let at = ((1024 + round * 8) * 512) as usize;
        assert!(snap[at..at + 4096] == pattern(20 + round, 4096)[..]);
    }
    assert!(
        disk.flushes.load(Ordering::SeqCst) >= 4,
        "flushed after each frontend"
    );
}

/// Waits (5 s at most) until `export` reports `users` users: the serving thread notices a
/// frontend's arrival and departure on its own time.
fn wait_users(export: &VhostUserExport, users: usize, what: &str) {
    use cryptblk_export::Export;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while export.users() != users {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {} users, expected {users}",
            export.users()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn an_attached_frontend_is_a_user_until_it_leaves() {
    let dir = TempDir::new("vhost-users");
    let disk = MemDisk::new(4 * MIB, 512);
    let socket = dir.join("vu.sock");
    let export = VhostUserExport::start(disk.clone(), VhostUserConfig::new(&socket)).unwrap();
    wait_users(&export, 0, "no frontend yet");
    for round in 0..2u64 {
        let mut g = connect(&socket, 1);
        wait_users(&export, 1, "a frontend attached");
        assert_eq!(
            g.queues[0].write(8 * round, &pattern(30 + round, 4096)),
            VIRTIO_BLK_S_OK
        );
        assert_eq!(
            cryptblk_export::Export::users(&export),
            1,
            "still attached after I/O"
        );
        drop(g);
        wait_users(&export, 0, "the frontend left");
    }
    export.stop().unwrap();
}

#[test]
fn bad_settings_and_a_live_socket_are_refused() {
    let dir = TempDir::new("vhost-bad");
    let disk = MemDisk::new(MIB, 512);
    let socket = dir.join("vu.sock");
    let mut cfg = VhostUserConfig::new(&socket);
    cfg.queues = 0;
    assert!(VhostUserExport::start(disk.clone(), cfg).is_err());
    let mut cfg = VhostUserConfig::new(&socket);
    cfg.queue_size = 100;
    assert!(VhostUserExport::start(disk.clone(), cfg).is_err());
    let export = VhostUserExport::start(disk.clone(), VhostUserConfig::new(&socket)).unwrap();
    let err = VhostUserExport::start(disk.clone(), VhostUserConfig::new(&socket))
        .err()
        .expect("a second server on a live socket");
    assert!(err.to_string().contains("in use"), "{err}");
    export.stop().unwrap();
    std::fs::write(dir.join("file"), b"x").unwrap();
    let err = VhostUserExport::start(disk, VhostUserConfig::new(dir.join("file")))
        .err()
        .expect("a regular file is not replaced");
    assert!(err.to_string().contains("not a socket"), "{err}");
}

/// A good frontend after a hostile one: data written reads back.
fn serves_the_next_frontend(socket: &Path, sector: u64, seed: u64) {
    let s = socket.to_path_buf();
    within(30, "the next frontend", move || {
        let mut g = connect(&s, 1);
        let data = pattern(seed, 8192);
        assert_eq!(g.queues[0].write(sector, &data), VIRTIO_BLK_S_OK);
        let (st, back) = g.queues[0].read(sector, data.len());
        assert_eq!(st, VIRTIO_BLK_S_OK);
        assert!(back == data, "the next frontend reads its data back");
    });
}

/// A memory table whose region starts past the end of its memfd (mmap_offset = the file's
/// size) is refused: the connection is closed on the table itself (no queue is ever set
/// up, so no access to that memory, and no SIGBUS, is involved), the process lives, and the
/// next frontend is served.
#[test]
fn a_memory_table_past_the_end_of_its_file_is_refused() {
    let dir = TempDir::new("vhost-hostile-table");
    let disk = MemDisk::new(4 * MIB, 512);
    let socket = dir.join("vu.sock");
    let export = VhostUserExport::start(disk.clone(), VhostUserConfig::new(&socket)).unwrap();
    let s = socket.clone();
    within(30, "the hostile table", move || {
        let mut g = connect_with(&s, 1, |r| r.mmap_offset = MEM_SIZE, false);
        wait_closed(&mut g.frontend);
    });
    serves_the_next_frontend(&socket, 8, 31);
    export.stop().unwrap();
}

/// A frontend that truncates its memfd after SET_MEM_TABLE and then kicks a request: the
/// export's accesses fault (SIGBUS), the request fails and the frontend is dropped, and the
/// process — every other volume it serves — lives on: the next frontend is served and
/// finds the data written before.
#[test]
fn a_frontend_that_shrinks_its_memory_is_dropped_and_the_export_lives_on() {
    let dir = TempDir::new("vhost-hostile-shrink");
    let disk = MemDisk::new(4 * MIB, 512);
    let socket = dir.join("vu.sock");
    let export = VhostUserExport::start(disk.clone(), VhostUserConfig::new(&socket)).unwrap();
    let before = pattern(41, 4096);
    let s = socket.clone();
    let written = before.clone();
    within(30, "the shrinking frontend", move || {
        let mut g = connect(&s, 1);
        assert_eq!(g.queues[0].write(0, &written), VIRTIO_BLK_S_OK);
        // The next request laid out (rings, header, buffers), then the memory cut to
        // nothing, then the kick. The test does not touch its own mapping after the cut.
        let q = &mut g.queues[0];
        let chain = [
            q.header(VIRTIO_BLK_T_IN, 0),
            (q.buf(), 4096, true),
            q.status_buf(),
        ];
        q.place(&chain);
        memfd(&q.mem).set_len(0).unwrap();
        q.kick.write(1).unwrap();
        wait_closed(&mut g.frontend);
    });
    let s = socket.clone();
    within(30, "the next frontend", move || {
        let mut g = connect(&s, 1);
        let (st, back) = g.queues[0].read(0, 4096);
        assert_eq!(st, VIRTIO_BLK_S_OK);
        assert!(back == before, "the data written before survived");
    });
    serves_the_next_frontend(&socket, 16, 43);
    export.stop().unwrap();
}
