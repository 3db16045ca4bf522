//! The virtio-blk device model behind the vhost-user protocol: features, configuration
//! space, and the per-virtqueue request loop that `vhost-user-backend` runs on one thread
//! per queue.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use cryptblk_dm::device::BlockDevice;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{ShutdownHandle, VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_blk::{
    virtio_blk_config, VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH,
    VIRTIO_BLK_F_MQ, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_WRITE_ZEROES,
};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::QueueOwnedT;
use vm_memory::{
    ByteValued, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryMmap,
    GuestMemoryRegion,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use super::guard::ConnGuard;
use super::request::{self, Target, MAX_RANGES};

/// Largest discard or write-zeroes range, in 512-byte sectors (advertised in the config).
const MAX_DISCARD_SECTORS: u32 = 1 << 22;

/// What every connection's backend shares with the export: the device and its geometry.
pub(crate) struct Shared {
    /// The exported device.
    pub device: Arc<dyn BlockDevice>,
    /// Virtqueues offered.
    pub queues: u16,
    /// Largest virtqueue size offered.
    pub queue_size: u16,
    /// Offer `VIRTIO_BLK_F_RO` and refuse writes.
    pub read_only: bool,
    /// Offer DISCARD and WRITE_ZEROES.
    pub discard: bool,
    /// GET_ID's answer (at most 20 bytes).
    pub serial: Vec<u8>,
    /// Device size in bytes, updated by `Export::resized`.
    pub size: AtomicU64,
}

impl Shared {
    /// The virtio features offered to the frontend.
    pub fn features(&self) -> u64 {
        let mut f = 1 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_RING_F_EVENT_IDX
            | 1 << VIRTIO_RING_F_INDIRECT_DESC
            | 1 << VIRTIO_BLK_F_SEG_MAX
            | 1 << VIRTIO_BLK_F_BLK_SIZE
            | 1 << VIRTIO_BLK_F_FLUSH
            | 1 << VIRTIO_BLK_F_MQ
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        if self.read_only {
            f |= 1 << VIRTIO_BLK_F_RO;
        } else if self.discard {
            f |= 1 << VIRTIO_BLK_F_DISCARD | 1 << VIRTIO_BLK_F_WRITE_ZEROES;
        }
        f
    }

    /// The virtio-blk configuration space, as the frontend reads it.
    pub fn config(&self) -> BlkConfig {
        let block = self.device.logical_block_size();
        let ranges = if self.discard && !self.read_only {
            MAX_RANGES
        } else {
            0
        };
        let limit = if ranges > 0 { MAX_DISCARD_SECTORS } else { 0 };
        BlkConfig(virtio_blk_config {
            capacity: (self.size.load(Ordering::Acquire) >> 9).to_le(),
            // Two descriptors of every chain are the header and the status byte.
            seg_max: u32::from(self.queue_size.saturating_sub(2)).to_le(),
            blk_size: block.to_le(),
            num_queues: self.queues.to_le(),
            max_discard_sectors: limit.to_le(),
            max_discard_seg: ranges.to_le(),
            discard_sector_alignment: (block >> 9).to_le(),
            max_write_zeroes_sectors: limit.to_le(),
            max_write_zeroes_seg: ranges.to_le(),
            ..Default::default()
        })
    }
}

/// `virtio_blk_config` as the bytes of the configuration space.
#[derive(Clone, Copy, Default)]
#[repr(transparent)]
pub(crate) struct BlkConfig(pub virtio_blk_config);

// SAFETY: `virtio_blk_config` is `repr(C, packed)` plain integers: no padding, and every bit
// pattern is a valid value.
unsafe impl ByteValued for BlkConfig {}

/// One frontend connection: its guest memory's SIGBUS guard and the handle that cuts it.
pub(crate) struct Connection {
    guard: ConnGuard,
    shutdown: Mutex<Option<ShutdownHandle>>,
}

impl Connection {
    /// Whether the frontend shrank the guest memory under us ([`ConnGuard::broken`]).
    pub fn broken(&self) -> bool {
        self.guard.broken()
    }

    /// The handle that ends this connection, once the daemon has accepted it.
    pub fn set_shutdown(&self, handle: Option<ShutdownHandle>) {
        *self.shutdown.lock().unwrap_or_else(|e| e.into_inner()) = handle;
    }

    /// Logs the frontend's misbehaviour and cuts the connection: its guest memory is gone.
    fn drop_broken_frontend(&self) -> io::Error {
        log::warn!(
            "vhost-user-blk: the frontend truncated the guest memory it shared (SIGBUS on a guest page, answered with a zero page); failing its request and dropping the frontend"
        );
        if let Some(h) = self
            .shutdown
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            h.shutdown();
        }
        io::Error::other("the frontend truncated its guest memory")
    }
}

/// One frontend connection's device: the vring worker threads each hold a clone.
#[derive(Clone)]
pub(crate) struct BlkBackend {
    shared: Arc<Shared>,
    event_idx: Arc<AtomicBool>,
    /// The memory table in use: our own snapshot of the last one accepted (a refused
    /// table is never used, even though the framework already holds it).
    mem: Arc<RwLock<GuestMemoryAtomic<GuestMemoryMmap>>>,
    conn: Arc<Connection>,
}

impl BlkBackend {
    /// A backend for one new frontend connection.
    pub fn new(shared: Arc<Shared>) -> Self {
        BlkBackend {
            shared,
            event_idx: Arc::new(AtomicBool::new(false)),
            mem: Arc::new(RwLock::new(GuestMemoryAtomic::new(GuestMemoryMmap::new()))),
            conn: Arc::new(Connection {
                guard: ConnGuard::new(),
                shutdown: Mutex::new(None),
            }),
        }
    }

    /// This connection's state, for the serving thread.
    pub fn connection(&self) -> Arc<Connection> {
        self.conn.clone()
    }

    /// Serves every request the queue holds, then answers them with one notification. A
    /// request during which the guest memory faulted fails, and so does the connection.
    fn process_queue(&self, vring: &VringRwLock) -> io::Result<()> {
        let atomic = self.mem.read().unwrap_or_else(|e| e.into_inner()).clone();
        let mem = atomic.memory();
        let chains = vring
            .get_mut()
            .get_queue_mut()
            .iter(mem.clone())
            .map(|chains| chains.collect::<Vec<_>>());
        // A ring read from a page the frontend truncated reads zeros: whatever came of it
        // (often a bad index), the frontend is the fault.
        if self.conn.broken() {
            return Err(self.conn.drop_broken_frontend());
        }
        let chains =
            chains.map_err(|e| io::Error::other(format!("reading the available ring: {e}")))?;
        if chains.is_empty() {
            return Ok(());
        }
        let target = Target {
            device: self.shared.device.as_ref(),
            read_only: self.shared.read_only,
            discard: self.shared.discard,
            serial: &self.shared.serial,
        };
        for chain in chains {
            let head = chain.head_index();
            let descs: Vec<_> = chain.collect();
            let used = request::handle(&mem, &descs, &target).unwrap_or(0);
            if self.conn.broken() {
                return Err(self.conn.drop_broken_frontend());
            }
            vring
                .add_used(head, used)
                .map_err(|e| io::Error::other(format!("adding to the used ring: {e}")))?;
        }
        let notify = vring
            .needs_notification()
            .map_err(|e| io::Error::other(format!("reading the used event: {e}")))?;
        if notify {
            vring.signal_used_queue()?;
        }
        Ok(())
    }
}

impl VhostUserBackend for BlkBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        usize::from(self.shared.queues)
    }

    fn max_queue_size(&self) -> usize {
        usize::from(self.shared.queue_size)
    }

    fn features(&self) -> u64 {
        self.shared.features()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::MQ
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Release);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let config = self.shared.config();
        let bytes = config.as_slice();
        let start = offset as usize;
        let end = start.saturating_add(size as usize);
        bytes
            .get(start..end)
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    }

    /// Takes a new memory table: every region guarded against SIGBUS first (the framework
    /// already publishes the table to the vrings), then checked against its file's size.
    /// A table that maps past a file's end is refused: the error ends the connection (the
    /// frontend sees it closed, or a NACK where it asked for replies).
    fn update_memory(&self, mem: GuestMemoryAtomic<GuestMemoryMmap>) -> io::Result<()> {
        let table = mem.memory().into_inner();
        let checked = self
            .conn
            .guard
            .protect(&table)
            .and_then(|()| check_regions(&table));
        let mut ours = self.mem.write().unwrap_or_else(|e| e.into_inner());
        match checked {
            Ok(()) => {
                *ours = GuestMemoryAtomic::from(table);
                Ok(())
            }
            Err(e) => {
                log::warn!("vhost-user-blk: refusing the frontend's memory table: {e}");
                *ours = GuestMemoryAtomic::new(GuestMemoryMmap::new());
                Err(e)
            }
        }
    }

    /// One worker thread per virtqueue, so queues run their crypt work in parallel.
    fn queues_per_thread(&self) -> Vec<u64> {
        (0..self.shared.queues).map(|q| 1u64 << q).collect()
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        // A fresh pair per worker: the framework keeps the consumer in the worker's epoll and
        // the notifier to stop it when the connection ends.
        match new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC) {
            Ok(pair) => Some(pair),
            Err(e) => {
                log::error!("vhost-user-blk: cannot create a worker exit event: {e}");
                None
            }
        }
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            return Err(io::Error::other(format!("unexpected event set {evset:?}")));
        }
        // The framework numbers a worker's vrings from 0 within that worker.
        let Some(vring) = vrings.get(usize::from(device_event)) else {
            return Err(io::Error::other(format!(
                "no vring for event {device_event}"
            )));
        };
        if self.event_idx.load(Ordering::Acquire) {
            // With EVENT_IDX the driver is not notified again until we re-enable, so drain
            // until no request slipped in between the last pass and re-enabling.
            loop {
                vring
                    .disable_notification()
                    .map_err(|e| io::Error::other(e.to_string()))?;
                self.process_queue(vring)?;
                if !vring
                    .enable_notification()
                    .map_err(|e| io::Error::other(e.to_string()))?
                {
                    break;
                }
            }
        } else {
            self.process_queue(vring)?;
        }
        Ok(())
    }
}

/// Every region of a memory table lies within its file (fstat): a region mapped past its
/// file's end would raise SIGBUS at the first access. Files that are not regular (a DAX
/// character device) have no size to check; the SIGBUS guard still covers them.
fn check_regions(table: &GuestMemoryMmap) -> io::Result<()> {
    for (i, region) in table.iter().enumerate() {
        let Some(fo) = region.file_offset() else {
            continue;
        };
        let meta = fo.file().metadata()?;
        if !meta.file_type().is_file() {
            continue;
        }
        let end = fo.start().checked_add(region.len());
        if end.is_none_or(|end| end > meta.len()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "region {i} (guest address {:#x}, {} bytes at file offset {}) lies past the end of its file ({} bytes)",
                    region.start_addr().0,
                    region.len(),
                    fo.start(),
                    meta.len()
                ),
            ));
        }
    }
    Ok(())
}
