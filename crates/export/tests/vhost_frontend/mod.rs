//! A vhost-user-blk frontend for tests, without a VM: rust-vmm's `vhost` frontend side, guest
//! memory in a memfd shared with the export, split virtqueues laid out as a virtio driver lays
//! them out. Shared by the export's protocol tests and the CLI's hostile-frontend test (the
//! latter includes this file by path), so both drive the export the same way.
#![allow(dead_code)]

use std::fs::File;
use std::os::fd::FromRawFd;
use std::path::Path;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
};
use vmm_sys_util::eventfd::EventFd;

const MIB: u64 = 1 << 20;

/// Guest memory: rings in the first MiB (64 KiB per queue), each queue's buffers in its own
/// 4 MiB after that.
pub(crate) const MEM_SIZE: u64 = 64 * MIB;
pub(crate) const QUEUE_SIZE: u16 = 256;
pub(crate) const VRING_DESC_F_NEXT: u16 = 1;
pub(crate) const VRING_DESC_F_WRITE: u16 = 2;

/// One split virtqueue as a driver sees it; one request in flight at a time.
pub(crate) struct Vq {
    pub(crate) mem: Arc<GuestMemoryMmap>,
    pub(crate) desc: u64,
    pub(crate) avail: u64,
    pub(crate) used: u64,
    pub(crate) data: u64,
    pub(crate) next_avail: u16,
    pub(crate) last_used: u16,
    pub(crate) kick: EventFd,
    pub(crate) call: EventFd,
}

/// A buffer of a request: guest address, length, device-writable.
pub(crate) type Buf = (u64, u32, bool);

impl Vq {
    /// Places the chain, kicks, waits for the answer; returns the used length.
    pub(crate) fn submit(&mut self, chain: &[Buf]) -> u32 {
        self.place(chain);
        self.kick.write(1).unwrap();
        let m = &self.mem;
        loop {
            let idx: u16 = m.read_obj(GuestAddress(self.used + 2)).unwrap();
            if idx != self.last_used {
                break;
            }
            self.call.read().unwrap();
        }
        fence(Ordering::SeqCst);
        let elem = self.used + 4 + 8 * u64::from(self.last_used % QUEUE_SIZE);
        let id: u32 = m.read_obj(GuestAddress(elem)).unwrap();
        let len: u32 = m.read_obj(GuestAddress(elem + 4)).unwrap();
        assert_eq!(id, 0, "the answer names the chain we sent");
        self.last_used = self.last_used.wrapping_add(1);
        len
    }

    /// Places the chain in the descriptor table and makes it available, without a kick.
    pub(crate) fn place(&mut self, chain: &[Buf]) {
        let m = &self.mem;
        for (i, &(addr, len, write)) in chain.iter().enumerate() {
            let d = GuestAddress(self.desc + 16 * i as u64);
            let mut flags = if write { VRING_DESC_F_WRITE } else { 0 };
            if i + 1 < chain.len() {
                flags |= VRING_DESC_F_NEXT;
            }
            m.write_obj(addr, d).unwrap();
            m.write_obj(len, d.unchecked_add_(8)).unwrap();
            m.write_obj(flags, d.unchecked_add_(12)).unwrap();
            m.write_obj((i + 1) as u16, d.unchecked_add_(14)).unwrap();
        }
        let slot = u64::from(self.next_avail % QUEUE_SIZE);
        m.write_obj(0u16, GuestAddress(self.avail + 4 + 2 * slot))
            .unwrap();
        fence(Ordering::SeqCst);
        self.next_avail = self.next_avail.wrapping_add(1);
        m.write_obj(self.next_avail, GuestAddress(self.avail + 2))
            .unwrap();
        fence(Ordering::SeqCst);
    }

    pub(crate) fn header(&self, kind: u32, sector: u64) -> Buf {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&kind.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        self.mem.write_slice(&h, GuestAddress(self.data)).unwrap();
        (self.data, 16, false)
    }

    pub(crate) fn status_buf(&self) -> Buf {
        self.mem
            .write_obj(0xffu8, GuestAddress(self.data + 16))
            .unwrap();
        (self.data + 16, 1, true)
    }

    pub(crate) fn status(&self) -> u32 {
        u32::from(
            self.mem
                .read_obj::<u8>(GuestAddress(self.data + 16))
                .unwrap(),
        )
    }

    /// Buffer area of this queue (after its header and status).
    pub(crate) fn buf(&self) -> u64 {
        self.data + 4096
    }

    /// Writes `data` at `sector`, split into buffers of the given lengths.
    pub(crate) fn write_split(&mut self, sector: u64, data: &[u8], split: &[usize]) -> u32 {
        assert_eq!(split.iter().sum::<usize>(), data.len());
        let mut chain = vec![self.header(VIRTIO_BLK_T_OUT, sector)];
        let (mut pos, mut addr) = (0, self.buf());
        for &n in split {
            self.mem
                .write_slice(&data[pos..pos + n], GuestAddress(addr))
                .unwrap();
            chain.push((addr, n as u32, false));
            // A gap between buffers, so no two are contiguous in guest memory.
            addr += n as u64 + 512;
            pos += n;
        }
        chain.push(self.status_buf());
        assert_eq!(
            self.submit(&chain),
            1,
            "a write returns only its status byte"
        );
        self.status()
    }

    pub(crate) fn write(&mut self, sector: u64, data: &[u8]) -> u32 {
        self.write_split(sector, data, &[data.len()])
    }

    /// Reads `len` bytes at `sector` into buffers of the given lengths.
    pub(crate) fn read_split(&mut self, sector: u64, split: &[usize]) -> (u32, Vec<u8>) {
        let mut chain = vec![self.header(VIRTIO_BLK_T_IN, sector)];
        let mut addr = self.buf();
        let mut places = Vec::new();
        for &n in split {
            self.mem
                .write_slice(&vec![0x5a; n], GuestAddress(addr))
                .unwrap();
            chain.push((addr, n as u32, true));
            places.push((addr, n));
            addr += n as u64 + 512;
        }
        chain.push(self.status_buf());
        let used = self.submit(&chain);
        let mut out = Vec::new();
        for (a, n) in places {
            let mut b = vec![0u8; n];
            self.mem.read_slice(&mut b, GuestAddress(a)).unwrap();
            out.extend_from_slice(&b);
        }
        let status = self.status();
        if status == VIRTIO_BLK_S_OK {
            assert_eq!(used as usize, out.len() + 1, "used length = data + status");
        }
        (status, out)
    }

    pub(crate) fn read(&mut self, sector: u64, len: usize) -> (u32, Vec<u8>) {
        self.read_split(sector, &[len])
    }

    /// A request without data (FLUSH) or of an unknown type.
    pub(crate) fn bare(&mut self, kind: u32) -> u32 {
        let chain = [self.header(kind, 0), self.status_buf()];
        self.submit(&chain);
        self.status()
    }

    pub(crate) fn get_id(&mut self) -> (u32, Vec<u8>) {
        let buf = self.buf();
        self.mem.write_slice(&[0u8; 20], GuestAddress(buf)).unwrap();
        let chain = [
            self.header(VIRTIO_BLK_T_GET_ID, 0),
            (buf, 20, true),
            self.status_buf(),
        ];
        self.submit(&chain);
        let mut id = vec![0u8; 20];
        self.mem.read_slice(&mut id, GuestAddress(buf)).unwrap();
        (self.status(), id)
    }

    /// DISCARD or WRITE_ZEROES of `sectors` sectors at `sector`.
    pub(crate) fn ranged(&mut self, kind: u32, sector: u64, sectors: u32) -> u32 {
        let mut r = [0u8; 16];
        r[0..8].copy_from_slice(&sector.to_le_bytes());
        r[8..12].copy_from_slice(&sectors.to_le_bytes());
        self.mem.write_slice(&r, GuestAddress(self.buf())).unwrap();
        let chain = [
            self.header(kind, 0),
            (self.buf(), 16, false),
            self.status_buf(),
        ];
        self.submit(&chain);
        self.status()
    }
}

/// `GuestAddress + n` without the `Address` trait's name clash in this file.
pub(crate) trait AddN {
    fn unchecked_add_(self, n: u64) -> GuestAddress;
}
impl AddN for GuestAddress {
    fn unchecked_add_(self, n: u64) -> GuestAddress {
        GuestAddress(self.0 + n)
    }
}

/// A connected test frontend: negotiated features, the device's config, its queues.
pub(crate) struct Guest {
    pub(crate) frontend: Frontend,
    pub(crate) features: u64,
    pub(crate) config: virtio_blk_config,
    pub(crate) queues: Vec<Vq>,
}

pub(crate) fn memfd_memory() -> Arc<GuestMemoryMmap> {
    // SAFETY: memfd_create with a valid C string; the fd is owned by the File from here on.
    let fd = unsafe { libc::memfd_create(c"cryptblk-test-guest".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a new descriptor nobody else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(MEM_SIZE).unwrap();
    Arc::new(
        GuestMemoryMmap::<()>::from_ranges_with_files(&[(
            GuestAddress(0),
            MEM_SIZE as usize,
            Some(FileOffset::new(file, 0)),
        )])
        .unwrap(),
    )
}

/// Connects as QEMU does: owner, features (EVENT_IDX left out: this driver never updates
/// `used_event`), protocol features, config, memory table, then each queue.
pub(crate) fn connect(socket: &Path, queues: u16) -> Guest {
    connect_with(socket, queues, |_| {}, true)
}

/// [`connect`], with `edit` applied to the memory table before it is sent (a hostile
/// frontend's table); unless `strict`, nothing follows the table (no queue is set up, so
/// the export has no reason to touch the memory) and its sending may fail.
pub(crate) fn connect_with(
    socket: &Path,
    queues: u16,
    edit: impl FnOnce(&mut VhostUserMemoryRegionInfo),
    strict: bool,
) -> Guest {
    let mem = memfd_memory();
    let mut fe = Frontend::connect(socket, u64::from(queues)).unwrap();
    fe.set_owner().unwrap();
    let offered = fe.get_features().unwrap();
    let features = offered & !(1 << VIRTIO_RING_F_EVENT_IDX);
    fe.set_features(features).unwrap();
    let proto = fe.get_protocol_features().unwrap();
    assert!(proto.contains(VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::MQ));
    fe.set_protocol_features(VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::MQ)
        .unwrap();
    assert_eq!(fe.get_queue_num().unwrap(), u64::from(queues));
    let size = std::mem::size_of::<virtio_blk_config>();
    let (_, bytes) = fe
        .get_config(
            0,
            size as u32,
            VhostUserConfigFlags::empty(),
            &vec![0u8; size],
        )
        .unwrap();
    assert_eq!(bytes.len(), size);
    // SAFETY: `virtio_blk_config` is packed plain integers; `bytes` has exactly its size.
    let config: virtio_blk_config =
        unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<virtio_blk_config>()) };

    let host = mem.get_host_address(GuestAddress(0)).unwrap() as u64;
    let region = mem.find_region(GuestAddress(0)).unwrap();
    let mut info = VhostUserMemoryRegionInfo::from_guest_region(region).unwrap();
    edit(&mut info);
    let sent = fe.set_mem_table(&[info]);
    if !strict {
        return Guest {
            frontend: fe,
            features,
            config,
            queues: Vec::new(),
        };
    }
    sent.unwrap();

    let mut vqs = Vec::new();
    for q in 0..queues {
        let base = u64::from(q) * 0x10000;
        let vq = Vq {
            mem: mem.clone(),
            desc: base,
            avail: base + 0x1000,
            used: base + 0x2000,
            data: MIB + u64::from(q) * 4 * MIB,
            next_avail: 0,
            last_used: 0,
            kick: EventFd::new(0).unwrap(),
            call: EventFd::new(0).unwrap(),
        };
        let i = usize::from(q);
        fe.set_vring_num(i, QUEUE_SIZE).unwrap();
        fe.set_vring_addr(
            i,
            &VringConfigData {
                queue_max_size: QUEUE_SIZE,
                queue_size: QUEUE_SIZE,
                flags: 0,
                desc_table_addr: host + vq.desc,
                used_ring_addr: host + vq.used,
                avail_ring_addr: host + vq.avail,
                log_addr: None,
            },
        )
        .unwrap();
        fe.set_vring_base(i, 0).unwrap();
        fe.set_vring_call(i, &vq.call).unwrap();
        fe.set_vring_kick(i, &vq.kick).unwrap();
        fe.set_vring_enable(i, true).unwrap();
        vqs.push(vq);
    }
    Guest {
        frontend: fe,
        features,
        config,
        queues: vqs,
    }
}

/// Runs `f` on a thread of its own and fails when it has not finished within `secs`: an
/// export that keeps a frontend waiting would otherwise hang the test.
pub(crate) fn within<T: Send + 'static>(
    secs: u64,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|e| panic!("{what}: not done within {secs} s ({e})"))
}

/// Waits until the export has closed `fe`'s connection (a request needing a reply fails).
pub(crate) fn wait_closed(fe: &mut Frontend) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while fe.get_features().is_ok() {
        assert!(
            Instant::now() < deadline,
            "the export kept the hostile frontend's connection"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The memfd behind a test frontend's guest memory.
pub(crate) fn memfd(mem: &GuestMemoryMmap) -> &File {
    mem.find_region(GuestAddress(0))
        .unwrap()
        .file_offset()
        .unwrap()
        .file()
}
