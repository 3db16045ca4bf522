//! A ublk export: the device appears as the kernel block device `/dev/ublkbN`, served by
//! this process through the kernel's ublk driver (`ublk_drv`, Linux 6.0+) and io_uring.
//!
//! Built on the `libublk` crate (behind the `ublk` cargo feature, on by default), which
//! wraps the control device `/dev/ublk-control`, the per-device char device and the
//! io_uring command protocol.
//!
//! Threading ("inline model", as the NBD server): one thread per hardware queue (one queue
//! per CPU by default), pinned by libublk to the queue's CPU affinity. A request is executed
//! on its queue's thread, from the io_uring completion that delivered it to the commit that
//! answers it: there is no hand-off to other threads, so crypt work runs where the
//! submitter's queue is (the crypt pipeline below may still queue, if its table asks for it).
//!
//! Requests arrive aligned to the logical block size we advertise (the device's), so they go
//! straight to the [`BlockDevice`] without read-modify-write. `VOLATILE_CACHE` and `FUA` are
//! advertised so the kernel sends FLUSH (mapped to [`BlockDevice::flush`]) and FUA writes
//! (written with [`WriteFlags::fua`]); DISCARD and WRITE_ZEROES map to the device's
//! `discard` and `write_zeroes`.
//!
//! Stopping deletes the kernel device (`STOP_DEV` then `DEL_DEV`) and flushes the device.
//! If the process dies instead (SIGKILL), the kernel aborts the device's outstanding
//! requests with errors and removes `/dev/ublkbN`; writes acknowledged before a completed
//! flush are on the backing store already, because acknowledgement happens only after the
//! [`BlockDevice`] call returned.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cryptblk_dm::device::{BlockDevice, WriteFlags};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::{BufDescList, UblkDev, UblkIOCtx, UblkQueue};
use libublk::{sys, BufDesc, UblkError, UblkFlags, UblkIORes};

use crate::error::ExportError;
use crate::export::{check_resize, Export, StartExport};
use crate::ExportDescription;

/// The control device the kernel's ublk driver creates when loaded.
pub const UBLK_CONTROL: &str = "/dev/ublk-control";

/// Default queue depth (requests in flight per queue).
pub const DEFAULT_QUEUE_DEPTH: u16 = 64;

/// Default largest request in bytes (also the per-tag buffer size).
pub const DEFAULT_MAX_IO_BYTES: u32 = 512 << 10;

/// Settings of a [`UblkExport`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UblkConfig {
    /// Hardware queues, each served by its own thread; `None` means one per CPU.
    pub queues: Option<u16>,
    /// Requests in flight per queue (1..=4096).
    pub queue_depth: u16,
    /// Largest request in bytes (a multiple of 4096; each tag gets a buffer this big).
    pub max_io_bytes: u32,
    /// Export read-only (the kernel refuses writes).
    pub read_only: bool,
}

impl Default for UblkConfig {
    fn default() -> Self {
        UblkConfig {
            queues: None,
            queue_depth: DEFAULT_QUEUE_DEPTH,
            max_io_bytes: DEFAULT_MAX_IO_BYTES,
            read_only: false,
        }
    }
}

impl UblkConfig {
    /// Number of queues this configuration gives on this machine.
    pub fn queue_count(&self) -> u16 {
        self.queues.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| u16::try_from(n.get()).unwrap_or(u16::MAX))
                .unwrap_or(1)
        })
    }
}

/// Where clients find a [`UblkExport`]: what its [`Export::describe`] answers.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UblkDescription {
    /// The kernel block device, `/dev/ublkbN`.
    pub dev: PathBuf,
    /// Number of hardware queues (and serving threads).
    pub queues: u16,
    /// Requests in flight per queue.
    pub depth: u16,
}

/// A running ublk export. Dropping it stops it like [`UblkExport::stop`], ignoring errors.
pub struct UblkExport {
    ctrl: Arc<UblkCtrl>,
    device: Arc<dyn BlockDevice>,
    dev_id: u32,
    queues: u16,
    depth: u16,
    runner: Option<JoinHandle<()>>,
}

impl UblkExport {
    /// Creates the kernel device and starts serving `device` on it. When this returns,
    /// `/dev/ublkbN` ([`UblkExport::dev_path`]) exists and accepts I/O.
    pub fn start(
        device: Arc<dyn BlockDevice>,
        config: UblkConfig,
    ) -> Result<UblkExport, ExportError> {
        if !Path::new(UBLK_CONTROL).exists() {
            return Err(ExportError::Config(format!(
                "the kernel lacks ublk (modprobe ublk_drv): {UBLK_CONTROL} does not exist"
            )));
        }
        let params = DeviceParams::new(device.as_ref(), &config)?;
        let queues = config.queue_count().max(1);
        let ctrl = UblkCtrlBuilder::default()
            .name("cryptblk")
            .id(-1)
            .nr_queues(queues)
            .depth(config.queue_depth)
            .io_buf_bytes(config.max_io_bytes)
            .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
            .build()
            .map_err(|e| ublk_error("creating the ublk device", e))?;
        let ctrl = Arc::new(ctrl);
        let dev_id = ctrl.dev_info().dev_id;

        let (ready_tx, ready_rx) = mpsc::channel::<()>();
        let run_ctrl = Arc::clone(&ctrl);
        let run_device = Arc::clone(&device);
        let runner = std::thread::Builder::new()
            .name(format!("ublk{dev_id}-ctrl"))
            .spawn(move || {
                ensure_ctrl_ring();
                let result = run_ctrl.run_target(
                    move |dev: &mut UblkDev| {
                        params.apply(dev);
                        Ok(())
                    },
                    move |qid: u16, dev: &UblkDev| serve_queue(qid, dev, &run_device),
                    move |_ctrl: &UblkCtrl| {
                        let _ = ready_tx.send(());
                    },
                );
                if let Err(e) = result {
                    log::warn!("ublk device {dev_id} stopped with an error: {e}");
                }
            })
            .map_err(|e| ExportError::io("spawning the ublk control thread", e))?;

        // The ready sender is dropped without a message if run_target fails first.
        if ready_rx.recv().is_err() {
            let _ = runner.join();
            return Err(ExportError::Config(format!(
                "the ublk device {dev_id} could not be started (see the log)"
            )));
        }
        let export = UblkExport {
            ctrl,
            device,
            dev_id,
            queues,
            depth: config.queue_depth,
            runner: Some(runner),
        };
        // devtmpfs creates the node when the disk is added; give a udev-managed /dev a moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !export.dev_path().exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(export)
    }

    /// The kernel block device, `/dev/ublkbN`.
    pub fn dev_path(&self) -> PathBuf {
        PathBuf::from(format!("/dev/ublkb{}", self.dev_id))
    }

    /// The ublk device number N.
    pub fn dev_id(&self) -> u32 {
        self.dev_id
    }

    /// Number of hardware queues (and serving threads).
    pub fn queues(&self) -> u16 {
        self.queues
    }

    /// Requests in flight per queue.
    pub fn queue_depth(&self) -> u16 {
        self.depth
    }

    /// Whether the queue threads are still serving (false after the device was stopped,
    /// also from outside, e.g. by another ublk tool deleting it).
    pub fn is_active(&self) -> bool {
        self.runner.as_ref().is_some_and(|r| !r.is_finished())
    }

    /// Stops the kernel device (pending requests finish first), waits for the queue
    /// threads, deletes the device and flushes the [`BlockDevice`].
    pub fn stop(mut self) -> Result<(), ExportError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), ExportError> {
        let Some(runner) = self.runner.take() else {
            return Ok(());
        };
        ensure_ctrl_ring();
        // STOP_DEV: the kernel removes the disk (after draining it) and aborts the queues'
        // fetch commands, which ends the queue threads and then run_target.
        let _ = self.ctrl.kill_dev();
        let _ = runner.join();
        // DEL_DEV: frees the device number; the device may already be gone (ENOENT).
        let _ = self.ctrl.del_dev();
        self.device
            .flush()
            .map_err(|e| ExportError::io("flushing the device on ublk stop", e))
    }
}

impl StartExport for UblkConfig {
    fn start(self, device: Arc<dyn BlockDevice>) -> Result<Box<dyn Export>, ExportError> {
        Ok(Box::new(UblkExport::start(device, self)?))
    }
}

impl Export for UblkExport {
    fn describe(&self) -> ExportDescription {
        ExportDescription::Ublk(UblkDescription {
            dev: self.dev_path(),
            queues: self.queues,
            depth: self.depth,
        })
    }

    /// Sets the kernel device's capacity (`UPDATE_SIZE`, Linux 6.16 and later; older
    /// kernels refuse the command and the error says so).
    fn resized(&self, new_size: u64) -> Result<(), ExportError> {
        check_resize(self.device.as_ref(), new_size)?;
        ensure_ctrl_ring();
        self.ctrl
            .update_size(new_size)
            .map(drop)
            .map_err(|e| ublk_error("updating the ublk device's size (needs Linux 6.16+)", e))
    }

    /// Users of `/dev/ublkbN` as [`crate::block_users::block_device_users`] finds them
    /// (mounts, stacked and loop devices, other processes' descriptors); a device that
    /// cannot be inspected counts as used, so `close` errs on the side of the data.
    fn users(&self) -> usize {
        crate::block_users::block_device_users(&self.dev_path()).unwrap_or(1)
    }

    fn stop(self: Box<Self>) -> Result<(), ExportError> {
        UblkExport::stop(*self)
    }
}

impl Drop for UblkExport {
    fn drop(&mut self) {
        // Dropping the last UblkCtrl reference deletes the device: a control command.
        ensure_ctrl_ring();
        let _ = self.shutdown();
    }
}

/// The kernel-visible geometry of the device, checked before anything is created.
#[derive(Clone, Copy, Debug)]
struct DeviceParams {
    size: u64,
    logical_shift: u8,
    max_io_bytes: u32,
    read_only: bool,
    /// Whether discard (and write-zeroes) is advertised: only when the device takes it, or
    /// every mkfs would see its discards fail.
    discard: bool,
}

impl DeviceParams {
    fn new(device: &dyn BlockDevice, config: &UblkConfig) -> Result<Self, ExportError> {
        let logical = device.logical_block_size();
        if !logical.is_power_of_two() || !(512..=4096).contains(&logical) {
            return Err(ExportError::Config(format!(
                "logical block size {logical} cannot be exported over ublk (512..4096)"
            )));
        }
        let size = device.size();
        if size == 0 || !size.is_multiple_of(u64::from(logical)) {
            return Err(ExportError::Config(format!(
                "device size {size} is not a positive multiple of its logical block size {logical}"
            )));
        }
        if config.queue_depth == 0 || config.queue_depth > 4096 {
            return Err(ExportError::Config(format!(
                "queue depth {} out of range (1..4096)",
                config.queue_depth
            )));
        }
        if config.max_io_bytes < 4096 || !config.max_io_bytes.is_multiple_of(4096) {
            return Err(ExportError::Config(format!(
                "maximum request size {} must be a multiple of 4096",
                config.max_io_bytes
            )));
        }
        if config.queues == Some(0) {
            return Err(ExportError::Config("at least one queue is needed".into()));
        }
        Ok(DeviceParams {
            size,
            logical_shift: logical.trailing_zeros() as u8,
            max_io_bytes: config.max_io_bytes,
            read_only: config.read_only,
            discard: device.supports_discard() && !config.read_only,
        })
    }

    fn apply(&self, dev: &mut UblkDev) {
        let max_sectors = self.max_io_bytes >> 9;
        let mut attrs = sys::UBLK_ATTR_VOLATILE_CACHE | sys::UBLK_ATTR_FUA;
        if self.read_only {
            attrs |= sys::UBLK_ATTR_READ_ONLY;
        }
        let io_shift = self.logical_shift.max(12);
        dev.tgt.dev_size = self.size;
        dev.tgt.params = sys::ublk_params {
            types: if self.discard {
                sys::UBLK_PARAM_TYPE_BASIC | sys::UBLK_PARAM_TYPE_DISCARD
            } else {
                sys::UBLK_PARAM_TYPE_BASIC
            },
            basic: sys::ublk_param_basic {
                attrs,
                logical_bs_shift: self.logical_shift,
                physical_bs_shift: io_shift,
                io_opt_shift: io_shift,
                io_min_shift: io_shift,
                max_sectors,
                dev_sectors: self.size >> 9,
                ..Default::default()
            },
            discard: sys::ublk_param_discard {
                discard_alignment: 0,
                discard_granularity: 1 << self.logical_shift,
                max_discard_sectors: max_sectors,
                max_write_zeroes_sectors: max_sectors,
                max_discard_segments: 1,
                ..Default::default()
            },
            ..Default::default()
        };
    }
}

/// Body of one queue thread: fetch requests, execute each inline, commit, until the device
/// stops.
fn serve_queue(qid: u16, dev: &UblkDev, device: &Arc<dyn BlockDevice>) {
    let bufs = RefCell::new(dev.alloc_queue_io_bufs());
    let queue = match UblkQueue::new(qid, dev) {
        Ok(q) => q,
        Err(e) => {
            log::error!("ublk queue {qid}: cannot set up: {e}");
            return;
        }
    };
    let queue = {
        let list = bufs.borrow();
        match queue.submit_fetch_commands_unified(BufDescList::Slices(Some(&list))) {
            Ok(q) => q,
            Err(e) => {
                log::error!("ublk queue {qid}: cannot submit fetch commands: {e}");
                return;
            }
        }
    };
    let device = Arc::clone(device);
    queue.wait_and_handle_io(move |q: &UblkQueue, tag: u16, _io: &UblkIOCtx| {
        let iod = q.get_iod(tag);
        let mut list = bufs.borrow_mut();
        let buf = list[usize::from(tag)].as_mut_slice();
        let res = execute(
            device.as_ref(),
            iod.op_flags,
            iod.start_sector,
            iod.nr_sectors,
            buf,
        );
        if let Err(e) =
            q.complete_io_cmd_unified(tag, BufDesc::Slice(buf), Ok(UblkIORes::Result(res)))
        {
            log::error!("ublk queue {qid}: cannot commit tag {tag}: {e}");
        }
    });
}

/// Executes one request; returns the byte count on success or a negative errno, as the ublk
/// protocol wants.
fn execute(
    device: &dyn BlockDevice,
    op_flags: u32,
    start_sector: u64,
    nr_sectors: u32,
    buf: &mut [u8],
) -> i32 {
    let op = op_flags & 0xff;
    let offset = start_sector << 9;
    let len = u64::from(nr_sectors) << 9;
    let data_len = usize::try_from(len).unwrap_or(usize::MAX);
    let result = match op {
        sys::UBLK_IO_OP_READ | sys::UBLK_IO_OP_WRITE if data_len > buf.len() => {
            Err(std::io::Error::from_raw_os_error(libc::EINVAL))
        }
        sys::UBLK_IO_OP_READ => device.read_at(offset, &mut buf[..data_len]),
        sys::UBLK_IO_OP_WRITE => {
            let flags = WriteFlags {
                fua: op_flags & sys::UBLK_IO_F_FUA != 0,
            };
            device.write_at_scratch(offset, &mut buf[..data_len], flags)
        }
        sys::UBLK_IO_OP_FLUSH => device.flush(),
        sys::UBLK_IO_OP_DISCARD => device.discard(offset, len),
        sys::UBLK_IO_OP_WRITE_ZEROES => device.write_zeroes(offset, len),
        _ => Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP)),
    };
    match result {
        // Flush carries no data; its success value is 0.
        Ok(()) if op == sys::UBLK_IO_OP_FLUSH => 0,
        Ok(()) => i32::try_from(len).unwrap_or(i32::MAX),
        Err(e) => -e.raw_os_error().filter(|&n| n > 0).unwrap_or(libc::EIO),
    }
}

/// libublk sends control commands through a thread-local io_uring that only the thread
/// which built the `UblkCtrl` has; every other thread that issues a control command (the
/// control thread, `stop`, the final drop that deletes the device) needs its own.
fn ensure_ctrl_ring() {
    let result = libublk::ublk_init_ctrl_task_ring(|ring| {
        if ring.is_none() {
            *ring = Some(
                io_uring::IoUring::<io_uring::squeue::Entry128>::builder()
                    .build(16)
                    .map_err(UblkError::IOError)?,
            );
        }
        Ok(())
    });
    if let Err(e) = result {
        log::warn!("cannot set up a ublk control ring on this thread: {e}");
    }
}

fn ublk_error(context: &str, e: UblkError) -> ExportError {
    let source = match e {
        UblkError::IOError(io) => io,
        UblkError::OtherError(n) | UblkError::UringIOError(n) if n < 0 => {
            std::io::Error::from_raw_os_error(-n)
        }
        other => std::io::Error::other(other.to_string()),
    };
    ExportError::io(context, source)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A RAM device that records the calls it gets.
    struct Ram {
        data: Mutex<Vec<u8>>,
        calls: Mutex<Vec<String>>,
        block: u32,
    }

    impl Ram {
        fn new(size: usize, block: u32) -> Self {
            Ram {
                data: Mutex::new(vec![0; size]),
                calls: Mutex::new(Vec::new()),
                block,
            }
        }
    }

    impl BlockDevice for Ram {
        fn size(&self) -> u64 {
            self.data.lock().unwrap().len() as u64
        }
        fn logical_block_size(&self) -> u32 {
            self.block
        }
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
            cryptblk_dm::device::check_range(self.size(), offset, buf.len() as u64)?;
            let d = self.data.lock().unwrap();
            buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
            Ok(())
        }
        fn write_at(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> std::io::Result<()> {
            cryptblk_dm::device::check_range(self.size(), offset, buf.len() as u64)?;
            self.calls.lock().unwrap().push(format!(
                "write {offset} {} fua={}",
                buf.len(),
                flags.fua
            ));
            let mut d = self.data.lock().unwrap();
            d[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            self.calls.lock().unwrap().push("flush".into());
            Ok(())
        }
        fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("discard {offset} {len}"));
            Ok(())
        }
    }

    #[test]
    fn requests_map_to_device_calls() {
        let ram = Ram::new(1 << 20, 512);
        let mut buf = vec![0xabu8; 8192];
        assert_eq!(execute(&ram, sys::UBLK_IO_OP_WRITE, 8, 8, &mut buf), 4096);
        assert_eq!(
            execute(
                &ram,
                sys::UBLK_IO_OP_WRITE | sys::UBLK_IO_F_FUA,
                16,
                1,
                &mut buf
            ),
            512
        );
        let mut out = vec![0u8; 8192];
        assert_eq!(execute(&ram, sys::UBLK_IO_OP_READ, 8, 8, &mut out), 4096);
        assert!(out[..4096].iter().all(|&b| b == 0xab));
        assert_eq!(execute(&ram, sys::UBLK_IO_OP_FLUSH, 0, 0, &mut out), 0);
        assert_eq!(
            execute(&ram, sys::UBLK_IO_OP_DISCARD, 0, 16, &mut out),
            8192
        );
        assert_eq!(
            execute(&ram, sys::UBLK_IO_OP_WRITE_ZEROES, 8, 8, &mut out),
            4096
        );
        let mut check = vec![1u8; 4096];
        ram.read_at(4096, &mut check).unwrap();
        assert!(check.iter().all(|&b| b == 0));
        assert_eq!(
            *ram.calls.lock().unwrap(),
            vec![
                "write 4096 4096 fua=false",
                "write 8192 512 fua=true",
                "flush",
                "discard 0 8192",
                "write 4096 4096 fua=false",
            ]
        );
    }

    #[test]
    fn errors_become_negative_errnos() {
        let ram = Ram::new(1 << 20, 512);
        let mut buf = vec![0u8; 4096];
        // Past the end: the device says EIO.
        assert_eq!(
            execute(&ram, sys::UBLK_IO_OP_READ, 2048, 8, &mut buf),
            -libc::EIO
        );
        // Larger than the tag buffer.
        assert_eq!(
            execute(&ram, sys::UBLK_IO_OP_READ, 0, 16, &mut buf),
            -libc::EINVAL
        );
        assert_eq!(execute(&ram, 99, 0, 1, &mut buf), -libc::EOPNOTSUPP);
    }

    #[test]
    fn geometry_is_checked_before_creating_anything() {
        let ok = Ram::new(1 << 20, 4096);
        let p = DeviceParams::new(&ok, &UblkConfig::default()).unwrap();
        assert_eq!(p.logical_shift, 12);
        let odd = Ram::new(1 << 20, 1024 + 512);
        assert!(DeviceParams::new(&odd, &UblkConfig::default()).is_err());
        let cfg = UblkConfig {
            queue_depth: 0,
            ..UblkConfig::default()
        };
        assert!(DeviceParams::new(&ok, &cfg).is_err());
        let cfg = UblkConfig {
            queues: Some(0),
            ..UblkConfig::default()
        };
        assert!(DeviceParams::new(&ok, &cfg).is_err());
    }

    #[test]
    fn discard_is_advertised_only_when_the_table_allows_it() {
        let key = "00".repeat(64);
        let registry = cryptblk_dm::Registry::new();
        for (name, flags, want) in [
            ("plain", "", false),
            ("allowing", " 1 allow_discards", true),
        ] {
            let table = format!("0 2048 crypt aes-xts-plain64 {key} 0 ram:1M#{name} 0{flags}");
            let m = registry.create(name, &table).unwrap();
            let p = DeviceParams::new(m.as_ref(), &UblkConfig::default()).unwrap();
            assert_eq!(p.discard, want, "{table}");
            let ro = UblkConfig {
                read_only: true,
                ..UblkConfig::default()
            };
            assert!(!DeviceParams::new(m.as_ref(), &ro).unwrap().discard);
        }
        // A linear mapping passes discards down, so it keeps advertising them.
        let m = registry
            .create("lin", "0 2048 linear ram:1M#lin 0")
            .unwrap();
        assert!(
            DeviceParams::new(m.as_ref(), &UblkConfig::default())
                .unwrap()
                .discard
        );
    }

    #[test]
    fn missing_driver_is_a_clear_error() {
        if Path::new(UBLK_CONTROL).exists() {
            eprintln!("skipping: this kernel has ublk; the lab tests cover the real device");
            return;
        }
        let dev: Arc<dyn BlockDevice> = Arc::new(Ram::new(1 << 20, 512));
        let err = UblkExport::start(dev, UblkConfig::default())
            .err()
            .expect("start must fail without /dev/ublk-control");
        assert!(
            err.to_string().contains("modprobe ublk_drv"),
            "unexpected error: {err}"
        );
    }
}
