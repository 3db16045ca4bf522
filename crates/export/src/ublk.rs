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
//!
//! Surviving the process: the device is created with user recovery
//! (`UBLK_F_USER_RECOVERY`, and `UBLK_F_USER_RECOVERY_REISSUE` where the driver has it). If
//! the process dies (SIGKILL, a crash) or hands the device over ([`Export::hand_over`]),
//! the kernel keeps `/dev/ublkbN` and quiesces it: new I/O waits, and with reissue the
//! requests the dead process had not answered are queued again rather than failed. The
//! volume's name is part of the device's record (the target data of libublk's
//! `/run/ublksrvd/NNNN.json`, see [`UblkConfig::volume`]), so starting the export of the
//! same volume again finds the waiting device and takes it over (`START_USER_RECOVERY`,
//! serve the queues, `END_USER_RECOVERY`): the same `/dev/ublkbN` carries on and the
//! waiting I/O completes. Writes acknowledged before the death are on the backing store
//! already, because acknowledgement happens only after the [`BlockDevice`] call returned.

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
    /// The volume served, recorded with the device: starting the export of a volume whose
    /// previous process died takes its waiting device over instead of creating one. `None`:
    /// always a new device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
}

impl Default for UblkConfig {
    fn default() -> Self {
        UblkConfig {
            queues: None,
            queue_depth: DEFAULT_QUEUE_DEPTH,
            max_io_bytes: DEFAULT_MAX_IO_BYTES,
            read_only: false,
            volume: None,
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
        ensure_ctrl_ring();
        let waiting = match config.volume.as_deref() {
            Some(volume) => find_waiting_device(Path::new(RECORD_DIR), volume)?,
            None => None,
        };
        let ctrl = match waiting {
            Some(dev_id) => recover_device(dev_id, &params)?,
            None => {
                let queues = config.queue_count().max(1);
                UblkCtrlBuilder::default()
                    .name("cryptblk")
                    .id(-1)
                    .nr_queues(queues)
                    .depth(config.queue_depth)
                    .io_buf_bytes(config.max_io_bytes)
                    .ctrl_flags(recovery_flags())
                    .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
                    .build()
                    .map_err(|e| ublk_error("creating the ublk device", e))?
            }
        };
        let ctrl = Arc::new(ctrl);
        let info = ctrl.dev_info();
        let dev_id = info.dev_id;
        let queues = info.nr_hw_queues;
        let depth = info.queue_depth;
        let record = config.volume.clone();

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
                        if let Some(volume) = record {
                            dev.set_target_json(serde_json::json!({ VOLUME_KEY: volume }));
                        }
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
                "the ublk device {dev_id} could not be {} (see the log)",
                if waiting.is_some() {
                    "taken over"
                } else {
                    "started"
                }
            )));
        }
        if waiting.is_some() {
            log::info!("ublk device {dev_id}: taken over, I/O resumes");
            // The record (kept by libublk) may carry the predecessor's hand-over mark.
            let _ = mark_handed_over(Path::new(RECORD_DIR), dev_id, None);
        }
        let export = UblkExport {
            ctrl,
            device,
            dev_id,
            queues,
            depth,
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

    /// Leaves `/dev/ublkbN` to a successor: the device is flushed and no longer deleted by
    /// this process, whose queue threads keep answering requests until it exits. Then the
    /// kernel quiesces the device (I/O waits) and the successor's start of the same volume
    /// takes it over (its `START_USER_RECOVERY` waits up to 30 s for this process to go).
    /// Stopping the queues without exiting would need the driver's `QUIESCE_DEV` (Linux
    /// 6.15+), and libublk's run loop sends `STOP_DEV` once its queues end, which would
    /// remove the disk; exiting is what the crash path does, and is proven.
    fn hand_over(self: Box<Self>) -> Result<(), ExportError> {
        let mut this = *self;
        if let Err(e) = this.mark_mine() {
            // The successor then waits for this process to exit before taking over.
            log::warn!("{e}");
        }
        this.ctrl.disown();
        // Dropping the handle detaches the control thread: it ends with the process.
        drop(this.runner.take());
        this.device
            .flush()
            .map_err(|e| ExportError::io("flushing the device on ublk hand-over", e))
    }

    /// Marks the device's record as handed over by this process: a successor starting the
    /// same volume then waits for this process to exit (it keeps serving until then) and
    /// takes the device over, instead of leaving a live device alone.
    fn prepare_hand_over(&self) -> Result<(), ExportError> {
        self.mark_mine()
    }

    fn cancel_hand_over(&self) {
        if let Err(e) = mark_handed_over(Path::new(RECORD_DIR), self.dev_id, None) {
            log::warn!(
                "ublk device {}: cannot clear the hand-over mark of its record: {e}",
                self.dev_id
            );
        }
    }

    /// `START_USER_RECOVERY` is refused (EBUSY) while this process holds `/dev/ublkcN`.
    fn successor_needs_exit(&self) -> bool {
        true
    }
}

impl UblkExport {
    /// Marks the device's record as handed over by this process (see
    /// [`Export::prepare_hand_over`]).
    fn mark_mine(&self) -> Result<(), ExportError> {
        mark_handed_over(Path::new(RECORD_DIR), self.dev_id, Some(std::process::id())).map_err(
            |e| {
                ExportError::io(
                    format!(
                        "marking the record of ublk device {} handed over",
                        self.dev_id
                    ),
                    e,
                )
            },
        )
    }
}

impl Drop for UblkExport {
    fn drop(&mut self) {
        // Dropping the last UblkCtrl reference deletes the device: a control command.
        ensure_ctrl_ring();
        let _ = self.shutdown();
    }
}

/// Where libublk records each device it starts (`NNNN.json`, with our target data); the
/// record goes when the device is deleted through libublk, and with the tmpfs at reboot.
const RECORD_DIR: &str = "/run/ublksrvd";

/// The key of the volume's name in a device record's target data.
const VOLUME_KEY: &str = "cryptblk_volume";

/// The key of the pid of a process that handed the device over ([`Export::hand_over`]) and
/// is about to exit: its successor waits for it instead of leaving a live device alone.
const HANDED_OVER_KEY: &str = "handed_over_by";

/// How long a successor waits for a dying or handing-over process to release the device.
const TAKE_OVER_WAIT: Duration = Duration::from_secs(30);

/// The user-recovery flags this driver has: `USER_RECOVERY` keeps the device when its
/// process dies, `REISSUE` requeues the requests the dead process held instead of failing
/// them (without it a write in flight at a crash would fail).
fn recovery_flags() -> u64 {
    let want = u64::from(sys::UBLK_F_USER_RECOVERY | sys::UBLK_F_USER_RECOVERY_REISSUE);
    match UblkCtrl::get_features() {
        Some(features) => want & features,
        // Drivers before 6.5 lack GET_FEATURES; both flags are as old as ublk (6.0).
        None => want,
    }
}

/// A device recorded as serving a volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Record {
    id: u32,
    /// The process that handed the device over, if one did.
    handed_over_by: Option<i32>,
}

/// The path of device `id`'s record in `dir`.
fn record_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("{id:04}.json"))
}

/// The devices recorded in `dir` as serving `volume`, lowest id first. Unreadable or
/// foreign records (other ublk servers write there too) are skipped, and so are records
/// of another user: libublk makes the directory writable by all.
fn recorded_devices(dir: &Path, volume: &str) -> Vec<Record> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut records: Vec<Record> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let id = name.to_str()?.strip_suffix(".json")?.parse::<u32>().ok()?;
            if entry.metadata().ok()?.uid() != me {
                return None;
            }
            let text = std::fs::read_to_string(entry.path()).ok()?;
            let json: serde_json::Value = serde_json::from_str(&text).ok()?;
            let target = &json["target_data"];
            (target[VOLUME_KEY].as_str() == Some(volume)).then(|| Record {
                id,
                handed_over_by: target[HANDED_OVER_KEY]
                    .as_i64()
                    .and_then(|p| i32::try_from(p).ok()),
            })
        })
        .collect();
    records.sort_unstable_by_key(|r| r.id);
    records
}

/// Marks device `id`'s record in `dir` as handed over by process `by`, or clears the mark
/// (written to a temporary file and renamed, so a reader never sees half a record).
fn mark_handed_over(dir: &Path, id: u32, by: Option<u32>) -> std::io::Result<()> {
    let path = record_path(dir, id);
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let target = json
        .get_mut("target_data")
        .and_then(|t| t.as_object_mut())
        .ok_or_else(|| std::io::Error::other("the record has no target data"))?;
    match by {
        Some(pid) => target.insert(HANDED_OVER_KEY.into(), pid.into()),
        None => target.remove(HANDED_OVER_KEY),
    };
    let tmp = dir.join(format!(".{id:04}.json.{}", std::process::id()));
    std::fs::write(&tmp, serde_json::to_vec(&json)?)?;
    std::fs::rename(&tmp, &path)
}

/// What the kernel says of a recorded device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DevState {
    /// Quiesced after its process died: waiting for a successor.
    Waiting,
    /// Served, by a process that is still alive.
    Served(i32),
    /// Marked live, but its process is gone: the kernel has not quiesced it yet.
    Dying,
    /// Some other state (added and never started, or stopped and not deleted).
    Other(u16),
    /// Created by another user.
    Foreign(u32),
    /// No such device.
    Gone,
}

/// What to do with the records of a volume.
#[derive(Debug, Default, PartialEq, Eq)]
struct Decision {
    /// The device to take over, if one waits.
    recover: Option<u32>,
    /// Records of devices that no longer exist, to remove.
    forget: Vec<u32>,
    /// One line each for the devices left alone.
    notes: Vec<String>,
}

/// Decides, from the recorded devices of `volume` and their states, which device (if any)
/// to take over: the first that waits (or whose process is dying, once it waits). A device
/// served by a live process is never taken.
fn decide(volume: &str, records: &[Record], state: impl Fn(Record) -> DevState) -> Decision {
    let mut d = Decision::default();
    for &record in records {
        let id = record.id;
        match state(record) {
            DevState::Waiting | DevState::Dying if d.recover.is_none() => d.recover = Some(id),
            DevState::Waiting | DevState::Dying => d.notes.push(format!(
                "ublk device {id} of volume {volume} also waits for its server; left alone"
            )),
            DevState::Served(pid) => d.notes.push(format!(
                "ublk device {id} recorded for volume {volume} is live, served by process {pid}; left alone"
            )),
            DevState::Other(s) => d.notes.push(format!(
                "ublk device {id} recorded for volume {volume} is in state {s}, not waiting for recovery; left alone"
            )),
            DevState::Foreign(uid) => d.notes.push(format!(
                "ublk device {id} recorded for volume {volume} belongs to user {uid}; left alone"
            )),
            DevState::Gone => d.forget.push(id),
        }
    }
    d
}

/// Whether process `pid` is alive (a zombie has released its files: dead).
fn process_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name, which may hold spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|c| c != 'Z' && c != 'X'),
        Err(_) => false,
    }
}

/// Classifies a recorded device by the kernel's state of it: live is [`DevState::Dying`]
/// when its server is dead or handed it over, [`DevState::Served`] otherwise.
fn classify(state: u16, server: i32, handed_over_by: Option<i32>, alive: bool) -> DevState {
    match u32::from(state) {
        sys::UBLK_S_DEV_QUIESCED => DevState::Waiting,
        sys::UBLK_S_DEV_LIVE if alive && handed_over_by != Some(server) => DevState::Served(server),
        sys::UBLK_S_DEV_LIVE => DevState::Dying,
        _ => DevState::Other(state),
    }
}

fn dev_state(record: Record) -> DevState {
    let Ok(ctrl) = UblkCtrl::new_simple(record.id as i32) else {
        return DevState::Gone;
    };
    let info = ctrl.dev_info();
    // SAFETY: geteuid has no preconditions and cannot fail.
    if info.owner_uid != unsafe { libc::geteuid() } {
        return DevState::Foreign(info.owner_uid);
    }
    let alive = process_alive(info.ublksrv_pid);
    classify(info.state, info.ublksrv_pid, record.handed_over_by, alive)
}

/// The device of `volume` that waits for a successor, if any: reads the records, removes
/// those of devices that are gone, logs one line for each device left alone.
fn find_waiting_device(dir: &Path, volume: &str) -> Result<Option<u32>, ExportError> {
    let records = recorded_devices(dir, volume);
    if records.is_empty() {
        return Ok(None);
    }
    let d = decide(volume, &records, dev_state);
    for &id in &d.forget {
        log::info!(
            "ublk device {id} recorded for volume {volume} no longer exists; record removed"
        );
        let _ = std::fs::remove_file(record_path(dir, id));
    }
    for note in &d.notes {
        log::warn!("{note}");
    }
    Ok(d.recover)
}

/// Takes over device `dev_id`, which waits (or is about to) for a successor: checks that
/// it has the volume's geometry, then starts user recovery; the returned control ends it
/// (`END_USER_RECOVERY`) when its queues are served. The queue count and depth are the
/// device's, whatever the configuration says.
fn recover_device(dev_id: u32, params: &DeviceParams) -> Result<UblkCtrl, ExportError> {
    let context = |what: &str| format!("taking over the ublk device {dev_id}: {what}");
    let probe = UblkCtrl::new_simple(dev_id as i32)
        .map_err(|e| ublk_error(&context("reading its state"), e))?;
    let mut kernel = sys::ublk_params {
        types: sys::UBLK_PARAM_TYPE_BASIC,
        ..Default::default()
    };
    probe
        .get_params(&mut kernel)
        .map_err(|e| ublk_error(&context("reading its parameters"), e))?;
    params.matches(dev_id, &kernel.basic)?;
    // A predecessor that handed the device over may still run (and serve): wait for it to
    // exit before asking the kernel, which refuses (EBUSY) until then. Polled: another
    // process's exit has no waiter here.
    let info = probe.dev_info();
    if u32::from(info.state) == sys::UBLK_S_DEV_LIVE {
        let deadline = Instant::now() + TAKE_OVER_WAIT;
        while process_alive(info.ublksrv_pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // EBUSY until the old process has released the device and the kernel quiesced it;
    // libublk retries for 30 s.
    match probe.start_user_recover() {
        Ok(r) if r >= 0 => {}
        Ok(_) => {
            return Err(ExportError::Config(format!(
                "the ublk device {dev_id} is still held by its previous server after {} s",
                TAKE_OVER_WAIT.as_secs()
            )))
        }
        Err(e) => return Err(ublk_error(&context("START_USER_RECOVERY"), e)),
    }
    let info = probe.dev_info();
    UblkCtrlBuilder::default()
        .name("cryptblk")
        .id(dev_id as i32)
        .nr_queues(info.nr_hw_queues)
        .depth(info.queue_depth)
        .io_buf_bytes(info.max_io_buf_bytes)
        .ctrl_flags(info.flags)
        .dev_flags(UblkFlags::UBLK_DEV_F_RECOVER_DEV)
        .build()
        .map_err(|e| ublk_error(&context("opening it"), e))
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

    /// Checks that a device left by a previous process has this geometry: taking over one
    /// of another size or block size would serve the wrong blocks.
    fn matches(&self, dev_id: u32, basic: &sys::ublk_param_basic) -> Result<(), ExportError> {
        let read_only = basic.attrs & sys::UBLK_ATTR_READ_ONLY != 0;
        if basic.dev_sectors != self.size >> 9
            || basic.logical_bs_shift != self.logical_shift
            || read_only != self.read_only
        {
            return Err(ExportError::Config(format!(
                "the ublk device {dev_id} left by this volume's previous server has {} bytes in \
                 {}-byte blocks{}, the volume {} bytes in {}-byte blocks{}: not taken over",
                basic.dev_sectors << 9,
                1u32 << basic.logical_bs_shift,
                if read_only { ", read-only" } else { "" },
                self.size,
                1u32 << self.logical_shift,
                if self.read_only { ", read-only" } else { "" },
            )));
        }
        Ok(())
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

    fn write_record(dir: &Path, id: u32, target: serde_json::Value) {
        let json = serde_json::json!({ "dev_info": { "dev_id": id }, "target_data": target });
        std::fs::write(record_path(dir, id), json.to_string()).unwrap();
    }

    #[test]
    fn records_name_the_volume_of_each_device() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write_record(d, 3, serde_json::json!({ VOLUME_KEY: "a" }));
        write_record(
            d,
            1,
            serde_json::json!({ VOLUME_KEY: "a", HANDED_OVER_KEY: 77 }),
        );
        write_record(d, 2, serde_json::json!({ VOLUME_KEY: "b" }));
        // Another ublk server's record, a record without target data, junk, other names.
        write_record(d, 4, serde_json::json!({ "dir": "/x" }));
        std::fs::write(record_path(d, 5), r#"{"dev_info":{}}"#).unwrap();
        std::fs::write(record_path(d, 6), "not json").unwrap();
        std::fs::write(
            d.join("a.json"),
            r#"{"target_data":{"cryptblk_volume":"a"}}"#,
        )
        .unwrap();
        std::fs::write(
            d.join("0007.txt"),
            r#"{"target_data":{"cryptblk_volume":"a"}}"#,
        )
        .unwrap();
        assert_eq!(
            recorded_devices(d, "a"),
            vec![
                Record {
                    id: 1,
                    handed_over_by: Some(77)
                },
                Record {
                    id: 3,
                    handed_over_by: None
                },
            ]
        );
        assert_eq!(recorded_devices(d, "b").len(), 1);
        assert!(recorded_devices(d, "c").is_empty());
        assert!(recorded_devices(&d.join("missing"), "a").is_empty());

        mark_handed_over(d, 3, Some(std::process::id())).unwrap();
        let me = i32::try_from(std::process::id()).unwrap();
        assert_eq!(recorded_devices(d, "a")[1].handed_over_by, Some(me));
        mark_handed_over(d, 1, None).unwrap();
        assert_eq!(recorded_devices(d, "a")[0].handed_over_by, None);
        // The rest of the record is kept, and no temporary file is left.
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(record_path(d, 3)).unwrap()).unwrap();
        assert_eq!(json["dev_info"]["dev_id"], 3);
        assert_eq!(std::fs::read_dir(d).unwrap().count(), 8);
        assert!(mark_handed_over(d, 9, None).is_err());

        // A record another user wrote (the directory is writable by all) is not trusted
        // (the tests run as root, which may give the file away).
        std::os::unix::fs::chown(record_path(d, 3), Some(65534), None).unwrap();
        assert_eq!(recorded_devices(d, "a").len(), 1);
    }

    #[test]
    fn a_waiting_device_is_taken_over_and_a_live_one_never() {
        let rec = |id| Record {
            id,
            handed_over_by: None,
        };
        // Nothing recorded, or only devices that are gone: create (and forget the records).
        assert_eq!(decide("v", &[], |_| unreachable!()), Decision::default());
        let d = decide("v", &[rec(1), rec(2)], |_| DevState::Gone);
        assert_eq!((d.recover, d.forget), (None, vec![1, 2]));
        // The first waiting (or dying) device is taken; later ones are only reported.
        let states = [
            DevState::Served(42),
            DevState::Gone,
            DevState::Other(0),
            DevState::Waiting,
            DevState::Dying,
            DevState::Foreign(1000),
        ];
        let records: Vec<Record> = (0..6).map(rec).collect();
        let d = decide("v", &records, |r| states[r.id as usize]);
        assert_eq!(d.recover, Some(3));
        assert_eq!(d.forget, vec![1]);
        assert_eq!(d.notes.len(), 4, "{:?}", d.notes);
        assert!(d.notes[0].contains("device 0") && d.notes[0].contains("process 42"));
        assert!(d.notes[2].contains("device 4") && d.notes[2].contains("also waits"));
        assert!(d.notes[3].contains("device 5") && d.notes[3].contains("user 1000"));
        // A device served by a live process is never taken, even when it is the only one.
        let d = decide("v", &[rec(7)], |_| DevState::Served(1));
        assert_eq!(d.recover, None);
        assert_eq!(d.notes.len(), 1);
    }

    #[test]
    fn a_live_device_is_dying_when_its_server_is_dead_or_handed_it_over() {
        let live = sys::UBLK_S_DEV_LIVE as u16;
        let quiesced = sys::UBLK_S_DEV_QUIESCED as u16;
        let dead = sys::UBLK_S_DEV_DEAD as u16;
        assert_eq!(classify(quiesced, 10, None, false), DevState::Waiting);
        assert_eq!(classify(live, 10, None, true), DevState::Served(10));
        assert_eq!(classify(live, 10, None, false), DevState::Dying);
        assert_eq!(classify(live, 10, Some(10), true), DevState::Dying);
        // A hand-over mark of another process says nothing of the current server.
        assert_eq!(classify(live, 10, Some(9), true), DevState::Served(10));
        assert_eq!(classify(dead, 10, None, false), DevState::Other(dead));
    }

    #[test]
    fn process_liveness() {
        assert!(process_alive(i32::try_from(std::process::id()).unwrap()));
        assert!(!process_alive(0));
        assert!(!process_alive(-1));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        child.wait().unwrap();
        assert!(!process_alive(pid));
    }

    #[test]
    fn a_left_device_must_have_the_volume_geometry() {
        let ram = Ram::new(1 << 20, 4096);
        let p = DeviceParams::new(&ram, &UblkConfig::default()).unwrap();
        let basic = sys::ublk_param_basic {
            dev_sectors: (1 << 20) >> 9,
            logical_bs_shift: 12,
            ..Default::default()
        };
        p.matches(3, &basic).unwrap();
        let smaller = sys::ublk_param_basic {
            dev_sectors: 1024,
            ..basic
        };
        let err = p.matches(3, &smaller).unwrap_err().to_string();
        assert!(
            err.contains("device 3") && err.contains("524288 bytes"),
            "{err}"
        );
        let blocks = sys::ublk_param_basic {
            logical_bs_shift: 9,
            ..basic
        };
        assert!(p.matches(3, &blocks).is_err());
        let ro = sys::ublk_param_basic {
            attrs: sys::UBLK_ATTR_READ_ONLY,
            ..basic
        };
        assert!(p.matches(3, &ro).is_err());
    }

    #[test]
    fn configs_without_a_volume_still_parse() {
        let old = r#"{"queues":null,"queue_depth":64,"max_io_bytes":524288,"read_only":false}"#;
        let cfg: UblkConfig = serde_json::from_str(old).unwrap();
        assert_eq!(cfg, UblkConfig::default());
        let named = UblkConfig {
            volume: Some("v".into()),
            ..UblkConfig::default()
        };
        let back: UblkConfig =
            serde_json::from_str(&serde_json::to_string(&named).unwrap()).unwrap();
        assert_eq!(back, named);
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
