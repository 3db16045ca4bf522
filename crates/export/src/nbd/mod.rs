//! An NBD server (fixed newstyle handshake, simple and structured replies) for any
//! [`BlockDevice`].
//!
//! Written here rather than taken from crates.io: the Rust NBD crates are either clients
//! only, unmaintained, or servers tied to async runtimes and file backings without
//! structured replies or `NBD_OPT_GO` block-size negotiation, which qemu and nbdcopy rely
//! on. The protocol is small enough that an own, fully tested implementation is simpler
//! than adapting one.
//!
//! Threading: one event-loop thread watches the listener and every quiet connection; a
//! pool of worker threads, started on demand up to [`NbdConfig::workers`] and ending after
//! a few idle seconds, runs option haggling and the requests that overlap. An idle server
//! is the event-loop thread alone (issue 28: a host serving a thousand volumes must not
//! pay sixteen idle workers for each). A connection in the transmission phase that has requests gets a
//! reader thread of its own, which reads its requests in order with blocking reads and runs
//! a lone request (none other in flight, nothing more waiting on the socket) itself, so a
//! client at queue depth 1 pays no thread hand-off; when several are in flight the reader
//! hands them to the pool, up to [`NbdConfig::max_in_flight`] at once. Replies go out as
//! requests complete, each written whole under the connection's writer lock (the protocol
//! lets replies arrive out of order; clients match them by handle). A reader that sees no
//! request for a second ends and the event loop watches the connection again, so an idle
//! connection costs a file descriptor, not a thread. A FLUSH is answered only after every
//! write received before it on the connection has completed, then the device is flushed.
//! `NBD_CMD_DISC`, and a client closing its side, end reading; the requests in flight still
//! reply before the connection closes. `NBD_FLAG_CAN_MULTI_CONN` is advertised: there is no
//! server-side cache, and every connection flushes the same device.
//!
//! Bounds: a client must finish option haggling within [`NbdConfig::handshake_timeout`]
//! (10 s, qemu-nbd's default) or is dropped (its replies count too: a client that does not
//! read them is dropped as well); once a request starts arriving the rest of it must follow
//! with no stall longer than a minute, and a reply that the client does not take within a
//! minute closes the connection, so no client holds a thread for long; an optional [`NbdConfig::idle_timeout`] closes transmission
//! connections without requests (off by default: the kernel's NBD client legitimately sits
//! idle for hours on an unused device); connections beyond [`NbdConfig::max_clients`] are
//! closed right after accept, with a log line.
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
mod harness;
mod pieces;
pub(crate) mod proto;
mod tls;
mod transmission;
mod wire;

use std::collections::HashMap;
use std::fs;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use polling::{Event, Events, Poller};

use cryptblk_dm::device::BlockDevice;

use crate::aligned::AlignedIo;
use crate::error::ExportError;
use crate::export::{check_resize, Export, StartExport};
use crate::ExportDescription;
pub use harness::NbdHarness;
pub use tls::{NbdTls, TlsMode};

use conn::{Conn, Pool, Readers, INLINE_CHECK};
use handshake::Handshake;
use wire::{Socket, Stream};

/// Default maximum request size advertised in `NBD_INFO_BLOCK_SIZE` (32 MiB).
pub const DEFAULT_MAX_BLOCK_SIZE: u32 = 32 << 20;
/// Default preferred request size advertised in `NBD_INFO_BLOCK_SIZE`.
pub const DEFAULT_PREFERRED_BLOCK_SIZE: u32 = 4096;

/// How long [`NbdServer::stop`] lets connections finish their current request.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Default [`NbdConfig::handshake_timeout`]: qemu-nbd's (10 s).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Default [`NbdConfig::max_clients`]. qemu-nbd serves one client unless `--shared` says
/// more (0 there meaning no limit) and nbdkit sets no limit (its `limit` filter adds one);
/// cryptblk's clients are often many (multi-conn, several VMs), so the default is generous
/// but keeps the server's descriptors (one per client) well below the usual soft
/// `RLIMIT_NOFILE` of 1024.
pub const DEFAULT_MAX_CLIENTS: usize = 512;

/// Default [`NbdConfig::workers`]: enough to keep `DEFAULT_MAX_IN_FLIGHT` requests of one
/// connection executing at once, few enough that the thread count stays small.
pub const DEFAULT_WORKERS: usize = 16;

/// Default [`NbdConfig::max_in_flight`]: requests of one connection executing at once.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 16;

/// Stack of the event-loop thread, the one thread an idle server has: it accepts, sends
/// greetings and polls, and runs no request (those run on readers and pool workers, which
/// end when idle and so keep std's default stack). std's 2 MiB would only reserve address
/// space, but a thousand served volumes' worth of it is 2 GiB of mappings for nothing.
const EVENT_LOOP_STACK: usize = 256 << 10;

/// Shortest interval between two checks of the connections' deadlines.
const EXPIRE_EVERY: Duration = Duration::from_millis(50);

/// The event loop's key for the listening socket (connection keys count up from 0;
/// `polling` reserves `usize::MAX` for its own wake-ups).
const LISTENER_KEY: usize = usize::MAX - 1;

/// Where an [`NbdServer`] listens.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
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
    /// A client that has not finished option haggling this long after connecting is
    /// dropped (default [`DEFAULT_HANDSHAKE_TIMEOUT`]).
    pub handshake_timeout: Duration,
    /// Close a connection in the transmission phase after this long without a request
    /// (none in flight). Off by default: the kernel's NBD client is legitimately idle for
    /// hours.
    pub idle_timeout: Option<Duration>,
    /// Connections served at once; more are closed right after accept
    /// (default [`DEFAULT_MAX_CLIENTS`]).
    pub max_clients: usize,
    /// Most worker threads shared by all connections (default [`DEFAULT_WORKERS`]); they
    /// start as jobs arrive and end after a few seconds without one.
    pub workers: usize,
    /// Requests of one connection executing at once (default [`DEFAULT_MAX_IN_FLIGHT`]).
    pub max_in_flight: usize,
    /// TLS offered through `NBD_OPT_STARTTLS` (`None`: off, nbdkit's `--tls=off`).
    pub tls: Option<NbdTls>,
    /// Serve TCP on an address other than loopback although clients may talk plaintext
    /// (TLS off or not required). Off by default: the export would be readable and
    /// writable by anyone on the network.
    pub allow_insecure_tcp: bool,
    /// READs (with structured replies) and WRITEs of at least this many bytes are done in
    /// 128 KiB pieces, so one piece's crypto overlaps another's transfer; 0 turns it off.
    /// Default 0 (see `pieces::DEFAULT_OVERLAP_MIN` for the measurement), or
    /// `CRYPTBLK_NBD_OVERLAP_MIN` (bytes) from the environment, which
    /// exists for A/B benchmarks.
    pub overlap_min: usize,
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
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            idle_timeout: None,
            max_clients: DEFAULT_MAX_CLIENTS,
            workers: DEFAULT_WORKERS,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            tls: None,
            allow_insecure_tcp: false,
            overlap_min: std::env::var("CRYPTBLK_NBD_OVERLAP_MIN")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(pieces::DEFAULT_OVERLAP_MIN),
        }
    }

    /// Sets [`NbdConfig::overlap_min`] (0: never split requests).
    pub fn with_overlap_min(mut self, bytes: usize) -> Self {
        self.overlap_min = bytes;
        self
    }

    /// Sets [`NbdConfig::tls`].
    pub fn with_tls(mut self, tls: Option<NbdTls>) -> Self {
        self.tls = tls;
        self
    }

    /// Sets [`NbdConfig::handshake_timeout`].
    pub fn with_handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// Sets [`NbdConfig::idle_timeout`] (`None`: never).
    pub fn with_idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Sets [`NbdConfig::max_clients`].
    pub fn with_max_clients(mut self, max_clients: usize) -> Self {
        self.max_clients = max_clients;
        self
    }

    /// Sets [`NbdConfig::workers`].
    pub fn with_workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// Sets [`NbdConfig::max_in_flight`].
    pub fn with_max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.max_in_flight = max_in_flight;
        self
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

/// State shared by the event loop and the workers.
pub(crate) struct Shared {
    pub(crate) io: AlignedIo,
    pub(crate) config: NbdConfig,
    pub(crate) stopping: AtomicBool,
    /// Block sizes actually advertised: (minimum, preferred, maximum).
    pub(crate) block_sizes: (u32, u32, u32),
    /// Open connections by event-loop key.
    pub(crate) conns: Mutex<HashMap<usize, Arc<Conn>>>,
    pub(crate) poller: Poller,
    pub(crate) pool: Pool,
    /// The reader threads of connections in transmission.
    pub(crate) readers: Readers,
}

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Listener {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Listener::Unix(l) => l.as_fd(),
            Listener::Tcp(l) => l.as_fd(),
        }
    }

    fn set_nonblocking(&self) -> std::io::Result<()> {
        match self {
            Listener::Unix(l) => l.set_nonblocking(true),
            Listener::Tcp(l) => l.set_nonblocking(true),
        }
    }
}

/// A running NBD server. Dropping it stops it like [`NbdServer::stop`], ignoring errors.
pub struct NbdServer {
    shared: Arc<Shared>,
    address: NbdListen,
    /// Shared with the event loop; a successor process inherits it on upgrade.
    listener: Arc<Listener>,
    loop_thread: Option<JoinHandle<()>>,
    /// Handed over to a successor: its Unix socket file stays for it.
    keep_socket_file: bool,
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
        let _ = self.shared.poller.notify();
    }
}

impl NbdServer {
    /// Binds the listening socket and starts serving `device`. The socket accepts clients
    /// as soon as this returns (the server is "ready" then).
    pub fn start(
        device: Arc<dyn BlockDevice>,
        mut config: NbdConfig,
    ) -> Result<NbdServer, ExportError> {
        if let Some(tls) = config.tls.as_mut() {
            tls.load()?;
        }
        let io = AlignedIo::new(device);
        let block_sizes = validate_block_sizes(&config, io.block_size(), io.size())?;
        if config.max_clients == 0 || config.workers == 0 || config.max_in_flight == 0 {
            return Err(ExportError::Config(
                "NBD max clients, workers and requests in flight must be at least 1".to_string(),
            ));
        }
        check_insecure_tcp(&config)?;
        let (listener, address) = bind(&config.listen)?;
        let listener = Arc::new(listener);
        let poller =
            Poller::new().map_err(|e| ExportError::io("creating the NBD event loop", e))?;
        let pool = Pool::new(config.workers);
        let shared = Arc::new(Shared {
            io,
            config,
            stopping: AtomicBool::new(false),
            block_sizes,
            conns: Mutex::new(HashMap::new()),
            poller,
            pool,
            readers: Readers::default(),
        });
        let loop_shared = Arc::clone(&shared);
        let loop_listener = Arc::clone(&listener);
        let loop_thread = std::thread::Builder::new()
            .name("nbd-events".to_string())
            .stack_size(EVENT_LOOP_STACK)
            .spawn(move || {
                if let Err(e) = event_loop(&loop_listener, &loop_shared) {
                    log::error!("NBD event loop failed: {e}");
                    loop_shared.stopping.store(true, Ordering::SeqCst);
                }
                let _ = loop_shared.poller.delete(loop_listener.fd());
            });
        let loop_thread = match loop_thread {
            Ok(thread) => thread,
            Err(e) => {
                shared.pool.join();
                return Err(ExportError::io("spawning the NBD event loop thread", e));
            }
        };
        Ok(NbdServer {
            shared,
            address,
            listener,
            loop_thread: Some(loop_thread),
            keep_socket_file: false,
        })
    }

    /// The address actually listened on (with the real port if port 0 was asked for).
    pub fn address(&self) -> &NbdListen {
        &self.address
    }

    /// The NBD URI of the export, e.g. `nbd+unix:///?socket=/run/x.sock`, with the
    /// `nbds` scheme when TLS is offered.
    pub fn uri(&self) -> String {
        let uri = self.address.uri(&self.shared.config.export_name);
        match (&self.shared.config.tls, uri.strip_prefix("nbd")) {
            (Some(_), Some(rest)) => format!("nbds{rest}"),
            _ => uri,
        }
    }

    /// Number of client connections currently open.
    pub fn connection_count(&self) -> usize {
        lock(&self.shared.conns).len()
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

    /// Stops gracefully: no new connections, requests in flight finish and reply (within a
    /// grace period), connections are closed, the device is flushed and a Unix socket file
    /// removed.
    pub fn stop(mut self) -> Result<(), ExportError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), ExportError> {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let _ = self.shared.poller.notify();
        if let Some(thread) = self.loop_thread.take() {
            let _ = thread.join();
        }
        // Stop reading from every client: a worker blocked on the next request sees
        // end-of-file; requests in flight finish and reply, then their connection closes.
        let conns: Vec<Arc<Conn>> = lock(&self.shared.conns).values().cloned().collect();
        for conn in &conns {
            conn.stop_reading(&self.shared);
        }
        // A client that stopped reading could block a worker in a reply forever: after a
        // grace period its socket is shut down completely, which fails that write.
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline && !lock(&self.shared.conns).is_empty() {
            std::thread::sleep(Duration::from_millis(10));
        }
        let rest: Vec<Arc<Conn>> = lock(&self.shared.conns).values().cloned().collect();
        for conn in rest {
            conn.close(&self.shared);
        }
        self.shared.readers.join();
        self.shared.pool.join();
        let flushed = self
            .shared
            .io
            .flush()
            .map_err(|e| ExportError::io("flushing the device on NBD server stop", e));
        if let (NbdListen::Unix(path), false) = (&self.address, self.keep_socket_file) {
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

    /// Every open connection, negotiating ones included: a client mid-handshake is about to
    /// use the device (and one that stalls there is cut by the handshake timeout).
    fn users(&self) -> usize {
        self.connection_count()
    }

    fn stop(self: Box<Self>) -> Result<(), ExportError> {
        NbdServer::stop(*self)
    }

    /// Stops accepting (new clients wait in the listener's backlog for the successor that
    /// inherits it, see [`Export::listener`]), lets requests in flight finish and reply,
    /// closes the connections (their clients reconnect) and flushes; the socket file stays.
    fn hand_over(mut self: Box<Self>) -> Result<(), ExportError> {
        self.keep_socket_file = true;
        self.shutdown()
    }

    fn listener(&self) -> Option<BorrowedFd<'_>> {
        Some(self.listener.fd())
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        if self.loop_thread.is_some() {
            let _ = self.shutdown();
        }
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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

/// Refuses plaintext NBD on TCP beyond loopback unless the configuration says so.
fn check_insecure_tcp(config: &NbdConfig) -> Result<(), ExportError> {
    let NbdListen::Tcp(addr) = &config.listen else {
        return Ok(());
    };
    let tls_required = config.tls.as_ref().is_some_and(|t| t.require);
    if addr.ip().is_loopback() || tls_required || config.allow_insecure_tcp {
        return Ok(());
    }
    Err(ExportError::Config(format!(
        "refusing plaintext NBD on {addr}, which is not a loopback address: anyone on the \
         network could read and write the volume; use --tls require with \
         --tls-certificates, or --allow-insecure-tcp on a trusted network"
    )))
}

fn bind(listen: &NbdListen) -> Result<(Listener, NbdListen), ExportError> {
    // Upgraded from a predecessor: its listener, whose backlog holds the clients that
    // connected meanwhile (a Unix socket file is the predecessor's, still in place).
    match listen {
        NbdListen::Unix(_) => {
            if let Some(fd) = crate::handover::adopt(&[libc::AF_UNIX]) {
                return Ok((Listener::Unix(UnixListener::from(fd)), listen.clone()));
            }
        }
        NbdListen::Tcp(_) => {
            if let Some(fd) = crate::handover::adopt(&[libc::AF_INET, libc::AF_INET6]) {
                let listener = TcpListener::from(fd);
                let actual = listener
                    .local_addr()
                    .map_err(|e| ExportError::io("reading the inherited NBD address", e))?;
                return Ok((Listener::Tcp(listener), NbdListen::Tcp(actual)));
            }
        }
    }
    match listen {
        NbdListen::Unix(path) => {
            remove_stale_socket(path)?;
            // The export is unauthenticated plaintext: only the owner may connect, from the
            // first instant the socket is reachable (see unix_socket).
            let listener = crate::unix_socket::bind_owner_only(path).map_err(|e| {
                ExportError::io(format!("binding NBD socket {}", path.display()), e)
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

/// Watches the listener and every connection; hands readable connections to the pool,
/// accepts new clients and closes connections whose handshake or idle time ran out.
fn event_loop(listener: &Listener, shared: &Arc<Shared>) -> std::io::Result<()> {
    listener.set_nonblocking()?;
    // SAFETY: the listener outlives its registration: it is deleted from the poller before
    // this thread drops it (see NbdServer::start).
    unsafe {
        shared
            .poller
            .add(listener.fd().as_raw_fd(), Event::readable(LISTENER_KEY))?
    };
    let mut events = Events::new();
    let mut next_key = 0usize;
    // Deadlines are checked at most every EXPIRE_EVERY, not on every event: under load the
    // loop wakes per batch of requests, and a check visits every connection.
    let mut next_check = Instant::now();
    while !shared.stopping.load(Ordering::SeqCst) {
        let now = Instant::now();
        if now >= next_check {
            next_check = now + expire(shared).max(EXPIRE_EVERY);
        }
        // While readers run, look at their lone requests often (see conn's notes): a
        // request stuck on the backing must not hold up the ones the client sends after it.
        let mut wake_at = next_check;
        if shared.readers.any() {
            let conns: Vec<Arc<Conn>> = lock(&shared.conns).values().cloned().collect();
            let mut next_look = now + INLINE_CHECK;
            for conn in conns {
                if let Some(due) = conn.hand_off_if_overdue(shared, now) {
                    next_look = next_look.min(due);
                }
            }
            wake_at = wake_at.min(next_look);
        }
        events.clear();
        let timeout = wake_at.saturating_duration_since(now);
        match shared.poller.wait(&mut events, Some(timeout)) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        for event in events.iter() {
            if event.key == LISTENER_KEY {
                accept_all(listener, shared, &mut next_key);
                shared
                    .poller
                    .modify(listener.fd(), Event::readable(LISTENER_KEY))?;
                continue;
            }
            let Some(conn) = lock(&shared.conns).get(&event.key).cloned() else {
                continue;
            };
            {
                let mut state = lock(&conn.state);
                if state.closed || state.busy {
                    continue;
                }
                state.busy = true;
            }
            conn.wake(shared);
        }
    }
    Ok(())
}

/// Closes the connections whose handshake or idle time is over; returns how long the event
/// loop may sleep until the next such deadline.
fn expire(shared: &Shared) -> Duration {
    let now = Instant::now();
    let mut next: Option<Instant> = None;
    let mut expired = Vec::new();
    for conn in lock(&shared.conns).values() {
        let state = lock(&conn.state);
        if let Some(deadline) = state.deadline(shared.config.idle_timeout) {
            if deadline <= now {
                expired.push((Arc::clone(conn), state.in_handshake()));
            } else {
                next = Some(next.map_or(deadline, |n| n.min(deadline)));
            }
        }
    }
    for (conn, in_handshake) in expired {
        if in_handshake {
            log::info!(
                "NBD connection {}: no complete handshake within {:?}, closed",
                conn.key,
                shared.config.handshake_timeout
            );
        } else {
            log::info!("NBD connection {}: idle, closed", conn.key);
        }
        conn.close(shared);
    }
    // Busy connections are bounded by their reads' own deadlines; waking up every second
    // keeps the check of connections that become idle again timely enough.
    let cap = Duration::from_secs(1);
    next.map_or(cap, |n| n.saturating_duration_since(now).min(cap))
}

/// Accepts every pending client: over the cap it is closed at once, else greeted and
/// watched.
fn accept_all(listener: &Listener, shared: &Arc<Shared>, next_key: &mut usize) {
    loop {
        let accepted = match listener {
            Listener::Unix(l) => l.accept().map(|(s, _)| {
                let peer = unix_peer(&s);
                (Stream::new(Socket::Unix(s)), peer)
            }),
            Listener::Tcp(l) => l.accept().map(|(s, peer)| {
                let _ = s.set_nodelay(true);
                (Stream::new(Socket::Tcp(s)), peer.to_string())
            }),
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // E.g. EMFILE: try again on the next event rather than spinning here.
                log::warn!("NBD accept failed: {e}");
                return;
            }
        };
        let count = lock(&shared.conns).len();
        if count >= shared.config.max_clients {
            log::warn!(
                "NBD: refused a client from {peer}: {count} clients connected, the maximum \
                 (--max-clients {})",
                shared.config.max_clients
            );
            stream.shutdown_both();
            continue;
        }
        // Accepted sockets may inherit O_NONBLOCK from the listener on some systems; the
        // workers read with blocking calls bounded by timeouts.
        if let Err(e) = stream.set_blocking() {
            log::warn!("NBD: cannot set up a client socket: {e}");
            continue;
        }
        // The greeting is 18 bytes into an empty socket buffer: it cannot block.
        let handshake = match Handshake::start(&mut &stream) {
            Ok(h) => h,
            Err(e) => {
                log::info!("NBD client from {peer} gone before the greeting: {e}");
                continue;
            }
        };
        let key = *next_key;
        *next_key += 1;
        let deadline = Instant::now() + shared.config.handshake_timeout;
        let conn = Arc::new(Conn::new(key, stream, handshake, deadline));
        lock(&shared.conns).insert(key, Arc::clone(&conn));
        log::info!("NBD connection {key}: client {peer} connected");
        // SAFETY: the socket stays open until the connection is closed, which deletes it
        // from the poller first (Conn::close), or the poller is dropped with the server.
        if let Err(e) = unsafe {
            shared
                .poller
                .add(conn.stream.as_fd().as_raw_fd(), Event::readable(key))
        } {
            log::warn!("NBD: cannot watch a client socket: {e}");
            conn.close(shared);
        }
    }
}

/// Who is on the other end of a Unix socket, for the log: the peer's pid and uid
/// (`SO_PEERCRED`; std's `peer_cred` is not stable yet).
fn unix_peer(s: &std::os::unix::net::UnixStream) -> String {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, which lives across the call.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        format!("unix socket (pid {}, uid {})", cred.pid, cred.uid)
    } else {
        "unix socket".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::proto::*;
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    /// Greeting and `NBD_OPT_EXPORT_NAME` without zero padding: the shortest way into the
    /// transmission phase.
    fn connect(server: &NbdServer) -> TcpStream {
        let NbdListen::Tcp(addr) = server.address() else {
            panic!("TCP server expected");
        };
        let mut s = TcpStream::connect(addr).unwrap();
        let mut greeting = [0u8; 18];
        s.read_exact(&mut greeting).unwrap();
        assert_eq!(greeting[..8], NBDMAGIC.to_be_bytes());
        let mut hello = Vec::new();
        hello.extend_from_slice(&(1u32 | FLAG_C_NO_ZEROES).to_be_bytes());
        hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
        hello.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
        hello.extend_from_slice(&0u32.to_be_bytes());
        s.write_all(&hello).unwrap();
        let mut export = [0u8; 10];
        s.read_exact(&mut export).unwrap();
        s
    }

    fn read_512(s: &mut TcpStream, handle: u64) {
        let mut req = Vec::new();
        req.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        req.extend_from_slice(&0u16.to_be_bytes());
        req.extend_from_slice(&CMD_READ.to_be_bytes());
        req.extend_from_slice(&handle.to_be_bytes());
        req.extend_from_slice(&0u64.to_be_bytes());
        req.extend_from_slice(&512u32.to_be_bytes());
        s.write_all(&req).unwrap();
        let mut reply = [0u8; 16 + 512];
        s.read_exact(&mut reply).unwrap();
        assert_eq!(reply[4..8], [0u8; 4], "read succeeded");
        assert_eq!(reply[8..16], handle.to_be_bytes());
    }

    /// A connection with requests has a reader thread; once quiet for a while the thread
    /// ends and the event loop watches the socket, and the next request is served again.
    #[test]
    fn a_quiet_connection_gives_its_reader_thread_back() {
        let disk = Arc::new(cryptblk_dm::RamDisk::new(1 << 20).unwrap());
        let server = NbdServer::start(disk, NbdConfig::localhost(0)).unwrap();
        let mut s = connect(&server);
        read_512(&mut s, 1);
        // `started`, not `any`: on a loaded machine the reader may already have parked
        // (PARK_AFTER) by the time this line runs.
        assert!(
            server.shared.readers.started(),
            "a reader served the connection"
        );
        let deadline = Instant::now() + conn::PARK_AFTER * 5;
        while server.shared.readers.any() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            !server.shared.readers.any(),
            "the quiet connection's reader ended"
        );
        read_512(&mut s, 2);
        read_512(&mut s, 3);
        assert_eq!(server.connection_count(), 1);
        drop(s);
        server.stop().unwrap();
    }
}
