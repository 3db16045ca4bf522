//! An NBD server (fixed newstyle handshake, simple and structured replies) for any
//! [`BlockDevice`].
//!
//! Written here rather than taken from crates.io: the Rust NBD crates are either clients
//! only, unmaintained, or servers tied to async runtimes and file backings without
//! structured replies or `NBD_OPT_GO` block-size negotiation, which qemu and nbdcopy rely
//! on. The protocol is small enough that an own, fully tested implementation is simpler
//! than adapting one.
//!
//! Threading ("inline model"): one thread per connection; the requests of a connection
//! are executed one after the other on its thread, so parallelism comes from several
//! connections (`NBD_FLAG_CAN_MULTI_CONN` is advertised: there is no server-side cache and
//! every connection flushes the same device).
//!
//! Request validation follows the protocol document's "Error values" section: requests
//! reaching past the end get `NBD_ENOSPC` for writes and write-zeroes and `NBD_EINVAL` for
//! everything else; unknown commands and flags get `NBD_EINVAL`; writes to a read-only
//! export get `NBD_EPERM`. A client that asked for `NBD_INFO_BLOCK_SIZE` in `NBD_OPT_GO`
//! has promised to honour the advertised minimum block size (the device's logical block
//! size), so its misaligned requests get `NBD_EINVAL`; other clients are owed the
//! protocol's default minimum of 1 byte, so their partial blocks are served by
//! read-modify-write. READ, WRITE and CACHE longer than the advertised maximum get
//! `NBD_EINVAL` (a write's payload is read and dropped first, or the connection is closed if
//! the payload is too large to be worth skipping).
//!
//! The one metadata context is `base:allocation`; since every byte of a device is
//! allocated, `NBD_CMD_BLOCK_STATUS` reports the requested range as one extent with status
//! 0 (allocated, contents not known to be zero). Without a selected context the command
//! gets `NBD_EINVAL`, as the protocol asks.

mod conn;
mod handshake;
pub(crate) mod proto;
mod transmission;
mod wire;

use std::fs;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use cryptblk_dm::device::BlockDevice;

use crate::aligned::AlignedIo;
use crate::error::ExportError;
use crate::export::{check_resize, Export, StartExport};
use crate::ExportDescription;
use wire::Stream;

/// Default maximum request size advertised in `NBD_INFO_BLOCK_SIZE` (32 MiB).
pub const DEFAULT_MAX_BLOCK_SIZE: u32 = 32 << 20;
/// Default preferred request size advertised in `NBD_INFO_BLOCK_SIZE`.
pub const DEFAULT_PREFERRED_BLOCK_SIZE: u32 = 4096;

/// How long [`NbdServer::stop`] lets connections finish their current request.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Where an [`NbdServer`] listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NbdListen {
    /// A Unix stream socket at this path (created with mode 0600; a stale socket file left
    /// by a dead server is replaced, a live one is refused).
    Unix(PathBuf),
    /// A TCP address; port 0 picks a free port (see [`NbdServer::address`]).
    Tcp(SocketAddr),
}

impl NbdListen {
    /// TCP on 127.0.0.1 at `port` (10809 is NBD's registered port; 0 picks a free one).
    /// NBD has no authentication here: bind other addresses only on trusted networks.
    pub fn localhost(port: u16) -> Self {
        NbdListen::Tcp(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// The NBD URI a client such as nbdinfo, nbdcopy or qemu uses to reach this address.
    pub fn uri(&self, export_name: &str) -> String {
        match self {
            NbdListen::Unix(path) => {
                format!("nbd+unix:///{}?socket={}", export_name, path.display())
            }
            NbdListen::Tcp(addr) => format!("nbd://{}/{}", addr, export_name),
        }
    }
}

/// Settings of an [`NbdServer`].
#[derive(Clone, Debug)]
pub struct NbdConfig {
    /// Where to listen.
    pub listen: NbdListen,
    /// Name of the single export; the empty name (the protocol's default export) is always
    /// accepted as well.
    pub export_name: String,
    /// Human-readable description sent with `NBD_OPT_LIST` and `NBD_INFO_DESCRIPTION`.
    pub description: String,
    /// Advertise `NBD_FLAG_READ_ONLY` and refuse writes, trims and write-zeroes with EPERM.
    pub read_only: bool,
    /// Preferred block size advertised to clients (a power of two >= the logical block size).
    pub preferred_block_size: u32,
    /// Largest READ/WRITE/CACHE accepted and advertised (a multiple of the logical block size).
    pub max_block_size: u32,
}

impl NbdConfig {
    /// Defaults for listening at `listen`: export name "", read-write, 4 KiB preferred and
    /// 32 MiB maximum block size.
    pub fn new(listen: NbdListen) -> Self {
        NbdConfig {
            listen,
            export_name: String::new(),
            description: "cryptblk export".to_string(),
            read_only: false,
            preferred_block_size: DEFAULT_PREFERRED_BLOCK_SIZE,
            max_block_size: DEFAULT_MAX_BLOCK_SIZE,
        }
    }

    /// Defaults for a Unix socket at `path`.
    pub fn unix(path: impl Into<PathBuf>) -> Self {
        Self::new(NbdListen::Unix(path.into()))
    }

    /// Defaults for TCP on 127.0.0.1 at `port`.
    pub fn localhost(port: u16) -> Self {
        Self::new(NbdListen::localhost(port))
    }
}

/// Where clients find an [`NbdServer`]: what its [`Export::describe`] answers.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NbdDescription {
    /// The NBD URI, e.g. `nbd+unix:///?socket=/run/x.sock` or `nbd://127.0.0.1:10809/`.
    pub uri: String,
}

/// State shared by the accept thread and the connection threads.
pub(crate) struct Shared {
    pub(crate) io: AlignedIo,
    pub(crate) config: NbdConfig,
    pub(crate) stopping: AtomicBool,
    /// Block sizes actually advertised: (minimum, preferred, maximum).
    pub(crate) block_sizes: (u32, u32, u32),
    conns: Mutex<Vec<Connection>>,
    next_id: AtomicU64,
}

struct Connection {
    stream: Option<Stream>,
    thread: Option<JoinHandle<()>>,
}

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

/// A running NBD server. Dropping it stops it like [`NbdServer::stop`], ignoring errors.
pub struct NbdServer {
    shared: Arc<Shared>,
    address: NbdListen,
    accept_thread: Option<JoinHandle<()>>,
}

/// A cloneable, thread-safe trigger that asks an [`NbdServer`] to stop (e.g. from a
/// signal-handling thread); [`NbdServer::wait`] then finishes the shutdown.
#[derive(Clone)]
pub struct NbdStopper {
    shared: Arc<Shared>,
}

impl NbdStopper {
    /// Requests the server to stop accepting and to close its connections.
    pub fn stop(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
    }
}

impl NbdServer {
    /// Binds the listening socket and starts serving `device`. The socket accepts clients
    /// as soon as this returns (the server is "ready" then).
    pub fn start(
        device: Arc<dyn BlockDevice>,
        config: NbdConfig,
    ) -> Result<NbdServer, ExportError> {
        let io = AlignedIo::new(device);
        let block_sizes = validate_block_sizes(&config, io.block_size(), io.size())?;
        let (listener, address) = bind(&config.listen)?;
        let shared = Arc::new(Shared {
            io,
            config,
            stopping: AtomicBool::new(false),
            block_sizes,
            conns: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
        });
        let accept_shared = Arc::clone(&shared);
        let accept_thread = std::thread::Builder::new()
            .name("nbd-accept".to_string())
            .spawn(move || accept_loop(listener, accept_shared))
            .map_err(|e| ExportError::io("spawning the NBD accept thread", e))?;
        Ok(NbdServer {
            shared,
            address,
            accept_thread: Some(accept_thread),
        })
    }

    /// The address actually listened on (with the real port if port 0 was asked for).
    pub fn address(&self) -> &NbdListen {
        &self.address
    }

    /// The NBD URI of the export, e.g. `nbd+unix:///?socket=/run/x.sock`.
    pub fn uri(&self) -> String {
        self.address.uri(&self.shared.config.export_name)
    }

    /// Number of client connections currently open.
    pub fn connection_count(&self) -> usize {
        let mut conns = lock(&self.shared.conns);
        reap_finished(&mut conns);
        conns.len()
    }

    /// A handle that can request the stop from another thread.
    pub fn stopper(&self) -> NbdStopper {
        NbdStopper {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Blocks until a stop is requested through an [`NbdStopper`], then stops gracefully.
    pub fn wait(mut self) -> Result<(), ExportError> {
        while !self.shared.stopping.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(100));
        }
        self.shutdown()
    }

    /// Stops gracefully: no new connections, each connection finishes the request it is
    /// executing and is then closed, the device is flushed and a Unix socket file removed.
    pub fn stop(mut self) -> Result<(), ExportError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), ExportError> {
        self.shared.stopping.store(true, Ordering::SeqCst);
        if let Some(thread) = self.accept_thread.take() {
            let _ = thread.join();
        }
        // Stop reading from every client: a connection thread blocked on the next request
        // sees end-of-file; one executing a request finishes and replies first.
        let conns: Vec<Connection> = std::mem::take(&mut *lock(&self.shared.conns));
        for conn in &conns {
            if let Some(stream) = &conn.stream {
                stream.shutdown_read();
            }
        }
        // A client that stopped reading could block its thread in a reply forever: after
        // a grace period its socket is shut down completely, which fails that write.
        let deadline = std::time::Instant::now() + STOP_GRACE;
        while std::time::Instant::now() < deadline
            && conns
                .iter()
                .any(|c| c.thread.as_ref().is_some_and(|t| !t.is_finished()))
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        for mut conn in conns {
            if let Some(thread) = conn.thread.take() {
                if !thread.is_finished() {
                    if let Some(stream) = &conn.stream {
                        stream.shutdown_both();
                    }
                }
                let _ = thread.join();
            }
        }
        let flushed = self
            .shared
            .io
            .flush()
            .map_err(|e| ExportError::io("flushing the device on NBD server stop", e));
        if let NbdListen::Unix(path) = &self.address {
            let _ = fs::remove_file(path);
        }
        flushed
    }
}

impl StartExport for NbdConfig {
    fn start(self, device: Arc<dyn BlockDevice>) -> Result<Box<dyn Export>, ExportError> {
        Ok(Box::new(NbdServer::start(device, self)?))
    }
}

impl Export for NbdServer {
    fn describe(&self) -> ExportDescription {
        ExportDescription::Nbd(NbdDescription { uri: self.uri() })
    }

    /// Nothing to do beyond checking: each handshake reads the size from the device, so new
    /// connections see the new size, and requests are checked against the device's current
    /// size. NBD cannot tell connected clients; they keep the size they negotiated.
    fn resized(&self, new_size: u64) -> Result<(), ExportError> {
        check_resize(self.shared.io.device().as_ref(), new_size)
    }

    fn stop(self: Box<Self>) -> Result<(), ExportError> {
        NbdServer::stop(*self)
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        if self.accept_thread.is_some() {
            let _ = self.shutdown();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn reap_finished(conns: &mut Vec<Connection>) {
    conns.retain_mut(|c| match &c.thread {
        Some(t) if t.is_finished() => {
            if let Some(t) = c.thread.take() {
                let _ = t.join();
            }
            false
        }
        _ => true,
    });
}

fn validate_block_sizes(
    config: &NbdConfig,
    logical: u64,
    size: u64,
) -> Result<(u32, u32, u32), ExportError> {
    let min = u32::try_from(logical)
        .ok()
        .filter(|m| m.is_power_of_two() && *m <= 65536)
        .ok_or_else(|| {
            ExportError::Config(format!(
                "logical block size {logical} cannot be advertised over NBD"
            ))
        })?;
    let preferred = config.preferred_block_size.max(min).max(512);
    if !preferred.is_power_of_two() {
        return Err(ExportError::Config(format!(
            "preferred block size {} is not a power of two",
            config.preferred_block_size
        )));
    }
    let max = config.max_block_size;
    if max < preferred || !max.is_multiple_of(min) {
        return Err(ExportError::Config(format!(
            "maximum block size {max} must be a multiple of {min} and at least {preferred}"
        )));
    }
    if !size.is_multiple_of(u64::from(min)) {
        return Err(ExportError::Config(format!(
            "device size {size} is not a multiple of its logical block size {min}"
        )));
    }
    Ok((min, preferred, max))
}

fn bind(listen: &NbdListen) -> Result<(Listener, NbdListen), ExportError> {
    match listen {
        NbdListen::Unix(path) => {
            remove_stale_socket(path)?;
            let listener = UnixListener::bind(path).map_err(|e| {
                ExportError::io(format!("binding NBD socket {}", path.display()), e)
            })?;
            // The export is unauthenticated plaintext: only the owner may connect.
            fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(|e| {
                ExportError::io(format!("restricting NBD socket {}", path.display()), e)
            })?;
            Ok((Listener::Unix(listener), listen.clone()))
        }
        NbdListen::Tcp(addr) => {
            let listener = TcpListener::bind(addr)
                .map_err(|e| ExportError::io(format!("binding NBD on {addr}"), e))?;
            let actual = listener
                .local_addr()
                .map_err(|e| ExportError::io("reading the bound NBD address", e))?;
            Ok((Listener::Tcp(listener), NbdListen::Tcp(actual)))
        }
    }
}

/// Removes a socket file left by a dead server; refuses to take over a live one.
fn remove_stale_socket(path: &Path) -> Result<(), ExportError> {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return Ok(());
    };
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
        .map_err(|e| ExportError::io(format!("removing stale socket {}", path.display()), e))
}

fn accept_loop(listener: Listener, shared: Arc<Shared>) {
    let fd = match &listener {
        Listener::Unix(l) => l.as_raw_fd(),
        Listener::Tcp(l) => l.as_raw_fd(),
    };
    while !shared.stopping.load(Ordering::SeqCst) {
        // Poll with a timeout so a stop request is noticed without a wake-up connection.
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: pfd is a valid pollfd for the duration of the call.
        let ready = unsafe { libc::poll(&mut pfd, 1, 100) };
        if ready <= 0 {
            continue;
        }
        let stream = match &listener {
            Listener::Unix(l) => l.accept().map(|(s, _)| Stream::Unix(s)),
            Listener::Tcp(l) => l.accept().map(|(s, _)| {
                let _ = s.set_nodelay(true);
                Stream::Tcp(s)
            }),
        };
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                log::warn!("NBD accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        spawn_connection(&shared, stream);
    }
}

fn spawn_connection(shared: &Arc<Shared>, stream: Stream) {
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let control = stream.try_clone().ok();
    let conn_shared = Arc::clone(shared);
    let thread = std::thread::Builder::new()
        .name(format!("nbd-conn-{id}"))
        .spawn(move || {
            if let Err(e) = conn::serve(stream, &conn_shared) {
                log::info!("NBD connection {id} closed: {e}");
            }
        });
    let mut conns = lock(&shared.conns);
    reap_finished(&mut conns);
    match thread {
        Ok(thread) => conns.push(Connection {
            stream: control,
            thread: Some(thread),
        }),
        Err(e) => log::warn!("cannot spawn a thread for NBD connection {id}: {e}"),
    }
}
