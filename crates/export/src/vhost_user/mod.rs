//! A vhost-user-blk export: a hypervisor (QEMU, Cloud Hypervisor, crosvm...) attaches the
//! device as a virtio-blk disk through a Unix socket, and its guest's requests are served
//! from the guest's own memory, which the hypervisor shares with this process.
//!
//! Built on rust-vmm's `vhost-user-backend` (the protocol and memory table, one worker
//! thread per virtqueue), `virtio-queue` and `vm-memory`.
//!
//! Threading ("inline model", as ublk and NBD): each virtqueue has its own worker thread,
//! which takes a request from the ring, runs it through the [`BlockDevice`] and answers it,
//! with no hand-off to other threads. Reads go straight into guest memory (crypt decrypts
//! in place there); writes are read from guest memory and encrypted into the crypt
//! target's own scratch buffer, as the guest's buffer must stay unchanged. A request whose
//! buffers are not whole logical blocks goes through one bounce buffer.
//!
//! The configuration space gives the capacity, the device's logical block size as
//! `blk_size`, `seg_max` (queue size - 2) and `num_queues`; `VIRTIO_BLK_F_RO` when read-only;
//! DISCARD and WRITE_ZEROES only when the device takes them. FLUSH maps to
//! [`BlockDevice::flush`], GET_ID answers the socket's file name (at most 20 bytes).
//!
//! One frontend at a time: when it disconnects (the VM stops or its vhost-user device is
//! unplugged), in-flight requests finish, the device is flushed, and the socket accepts the
//! next frontend, which negotiates from scratch (QEMU's `reconnect=` option relies on this).
//!
//! A frontend is not trusted with the daemon's life: a memory table whose regions lie past
//! their files' ends is refused (the connection ends, a warning names the region), and a
//! frontend that shrinks its memory file later gets its request failed and its connection
//! dropped instead of a SIGBUS that ends the daemon ([`guard`] says how and why).

mod backend;
mod guard;
mod request;

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use cryptblk_dm::device::BlockDevice;
use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::{ShutdownHandle, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use crate::error::ExportError;
use crate::export::{check_resize, Export, StartExport};
use crate::ExportDescription;

use backend::{BlkBackend, Shared};

/// Default number of virtqueues (and worker threads).
pub const DEFAULT_QUEUES: u16 = 1;

/// Default (and largest) virtqueue size the frontend may choose.
pub const DEFAULT_QUEUE_SIZE: u16 = 256;

/// Most virtqueues one export offers (the framework's queue masks are 64 bits).
pub const MAX_QUEUES: u16 = 64;

/// Settings of a [`VhostUserExport`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VhostUserConfig {
    /// The Unix socket the frontend connects to (created 0600; a stale one is replaced).
    pub socket: PathBuf,
    /// Virtqueues offered (1..=64), each served by its own thread.
    pub queues: u16,
    /// Largest virtqueue size (a power of two, 2..=32768).
    pub queue_size: u16,
    /// Export read-only (`VIRTIO_BLK_F_RO`; writes fail with an I/O error).
    pub read_only: bool,
}

impl VhostUserConfig {
    /// One queue of [`DEFAULT_QUEUE_SIZE`], read-write, on `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        VhostUserConfig {
            socket: socket.into(),
            queues: DEFAULT_QUEUES,
            queue_size: DEFAULT_QUEUE_SIZE,
            read_only: false,
        }
    }
}

/// Where clients find a [`VhostUserExport`]: what its [`Export::describe`] answers.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VhostUserDescription {
    /// The vhost-user socket (QEMU: `-chardev socket,path=...`).
    pub socket: PathBuf,
    /// Virtqueues offered (QEMU's `num-queues` may not exceed it).
    pub queues: u16,
}

/// Connection state the serving thread and `stop` share.
#[derive(Default)]
struct Control {
    stopping: bool,
    /// The connected frontend's connection, to cut it on stop.
    connection: Option<ShutdownHandle>,
    /// A frontend is connected (from its accept until its connection's workers are gone).
    attached: bool,
}

/// A running vhost-user-blk export. Dropping it stops it like [`VhostUserExport::stop`],
/// ignoring errors.
pub struct VhostUserExport {
    shared: Arc<Shared>,
    socket: PathBuf,
    control: Arc<Mutex<Control>>,
    wake: Arc<EventFd>,
    server: Option<JoinHandle<()>>,
}

impl VhostUserExport {
    /// Binds the socket and starts accepting frontends; ready when this returns.
    pub fn start(
        device: Arc<dyn BlockDevice>,
        config: VhostUserConfig,
    ) -> Result<VhostUserExport, ExportError> {
        let block = device.logical_block_size();
        if !block.is_power_of_two() || !(512..=4096).contains(&block) {
            return Err(ExportError::Config(format!(
                "logical block size {block} cannot be exported over vhost-user-blk (512..4096)"
            )));
        }
        let size = device.size();
        if size == 0 || !size.is_multiple_of(u64::from(block)) {
            return Err(ExportError::Config(format!(
                "device size {size} is not a positive multiple of its logical block size {block}"
            )));
        }
        if config.queues == 0 || config.queues > MAX_QUEUES {
            return Err(ExportError::Config(format!(
                "queue count {} out of range (1..{MAX_QUEUES})",
                config.queues
            )));
        }
        if !config.queue_size.is_power_of_two() || config.queue_size < 2 {
            return Err(ExportError::Config(format!(
                "queue size {} is not a power of two of at least 2",
                config.queue_size
            )));
        }
        let serial = config
            .socket
            .file_name()
            .map(|n| n.as_encoded_bytes().iter().copied().take(20).collect())
            .unwrap_or_default();
        let shared = Arc::new(Shared {
            discard: device.supports_discard() && !config.read_only,
            device,
            queues: config.queues,
            queue_size: config.queue_size,
            read_only: config.read_only,
            serial,
            size: size.into(),
        });

        let listener = bind(&config.socket)?;
        let wake = Arc::new(
            EventFd::new(libc::EFD_CLOEXEC)
                .map_err(|e| ExportError::io("creating the vhost-user stop event", e))?,
        );
        let control = Arc::new(Mutex::new(Control::default()));
        let server = {
            let (shared, control, wake) = (shared.clone(), control.clone(), wake.clone());
            std::thread::Builder::new()
                .name("vhost-user".into())
                .spawn(move || serve(listener, &shared, &control, &wake))
                .map_err(|e| ExportError::io("starting the vhost-user thread", e))?
        };
        Ok(VhostUserExport {
            shared,
            socket: config.socket,
            control,
            wake,
            server: Some(server),
        })
    }

    /// The socket frontends connect to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Disconnects the frontend (its requests in flight finish first), stops listening,
    /// removes the socket and flushes the device.
    pub fn stop(mut self) -> Result<(), ExportError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), ExportError> {
        let Some(server) = self.server.take() else {
            return Ok(());
        };
        {
            let mut control = self.control.lock().unwrap_or_else(|e| e.into_inner());
            control.stopping = true;
            if let Some(conn) = control.connection.take() {
                conn.shutdown();
            }
        }
        let _ = self.wake.write(1);
        // The serving thread may sit in a blocking accept (a client that connected and left
        // before it was accepted makes the framework wait for the next one): a connection of
        // our own ends that wait, and the thread then sees `stopping`.
        drop(UnixStream::connect(&self.socket));
        let _ = server.join();
        let _ = fs::remove_file(&self.socket);
        self.shared
            .device
            .flush()
            .map_err(|e| ExportError::io("flushing the device on vhost-user stop", e))
    }
}

impl StartExport for VhostUserConfig {
    fn start(self, device: Arc<dyn BlockDevice>) -> Result<Box<dyn Export>, ExportError> {
        Ok(Box::new(VhostUserExport::start(device, self)?))
    }
}

impl Export for VhostUserExport {
    fn describe(&self) -> ExportDescription {
        ExportDescription::VhostUser(VhostUserDescription {
            socket: self.socket.clone(),
            queues: self.shared.queues,
        })
    }

    /// Updates the capacity in the configuration space. The vhost-user crates have no
    /// config-change message to the frontend yet, so a running guest sees the new size
    /// only when its frontend reads the configuration again (on reconnect).
    fn resized(&self, new_size: u64) -> Result<(), ExportError> {
        check_resize(self.shared.device.as_ref(), new_size)?;
        self.shared.size.store(new_size, Ordering::Release);
        log::warn!(
            "vhost-user-blk {}: capacity is now {new_size} bytes; the guest sees it after its frontend reconnects",
            self.socket.display()
        );
        Ok(())
    }

    /// 1 while a frontend (a VM's disk) is attached: one frontend at a time.
    fn users(&self) -> usize {
        usize::from(
            self.control
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .attached,
        )
    }

    fn stop(self: Box<Self>) -> Result<(), ExportError> {
        VhostUserExport::stop(*self)
    }
}

impl Drop for VhostUserExport {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Binds `path` as a socket only its owner may connect to (the guest's whole disk is
/// behind it), replacing a stale socket file but not a live one.
fn bind(path: &Path) -> Result<Listener, ExportError> {
    if let Ok(meta) = fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(ExportError::Config(format!(
                "{} exists and is not a socket",
                path.display()
            )));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(ExportError::Config(format!(
                "{} is in use by a running server",
                path.display()
            )));
        }
        fs::remove_file(path)
            .map_err(|e| ExportError::io(format!("removing stale socket {}", path.display()), e))?;
    }
    // Mode 0600 from the first instant the socket is reachable (see unix_socket).
    let listener = crate::unix_socket::bind_owner_only(path)
        .map_err(|e| ExportError::io(format!("binding vhost-user socket {}", path.display()), e))?;
    Ok(Listener::from(listener))
}

/// Waits until a frontend connects (true) or the export stops (false).
fn wait_for_frontend(listener: &Listener, wake: &EventFd) -> bool {
    let mut fds = [
        libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfd for the duration of the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
        if fds[1].revents != 0 {
            return false;
        }
        if fds[0].revents != 0 {
            return true;
        }
    }
}

/// The serving thread: one frontend connection after another until stopped.
fn serve(mut listener: Listener, shared: &Arc<Shared>, control: &Mutex<Control>, wake: &EventFd) {
    while wait_for_frontend(&listener, wake) {
        // A fresh daemon per connection: the frontend negotiates everything again, and the
        // previous connection's vring workers are gone.
        let backend = BlkBackend::new(shared.clone());
        let conn = backend.connection();
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let mut daemon = match VhostUserDaemon::new("vhost-user-blk".into(), backend, mem) {
            Ok(d) => d,
            Err(e) => {
                log::error!("vhost-user-blk: cannot set up a connection: {e}");
                break;
            }
        };
        if let Err(e) = daemon.start(&mut listener) {
            log::error!("vhost-user-blk: cannot accept the frontend: {e}");
            // A persistent failure (out of descriptors) would otherwise spin on a listener
            // that stays readable.
            std::thread::sleep(std::time::Duration::from_millis(100));
            continue;
        }
        {
            let mut c = control.lock().unwrap_or_else(|e| e.into_inner());
            c.attached = true;
            if c.stopping {
                daemon.request_shutdown();
            } else {
                c.connection = daemon.shutdown_handle();
            }
        }
        conn.set_shutdown(daemon.shutdown_handle());
        log::info!("vhost-user-blk: frontend connected");
        match daemon.wait() {
            Ok(())
            | Err(vhost_user_backend::Error::HandleRequest(
                VhostUserError::Disconnected | VhostUserError::PartialMessage,
            )) => log::info!("vhost-user-blk: frontend disconnected"),
            Err(e) => log::warn!("vhost-user-blk: connection ended: {e}"),
        }
        if conn.broken() {
            log::warn!(
                "vhost-user-blk: the frontend truncated the guest memory it shared; its connection is closed"
            );
        }
        control.lock().unwrap_or_else(|e| e.into_inner()).connection = None;
        // Dropping the daemon stops and joins its vring workers: no request is in flight
        // once it is gone.
        drop(daemon);
        control.lock().unwrap_or_else(|e| e.into_inner()).attached = false;
        if let Err(e) = shared.device.flush() {
            log::error!("vhost-user-blk: flushing after the frontend left: {e}");
        }
        if control.lock().unwrap_or_else(|e| e.into_inner()).stopping {
            break;
        }
    }
}
