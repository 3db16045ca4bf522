//! `nbd://`, `nbds://` and `nbd+unix://` backings: an NBD client as a [`BlockDevice`], so
//! cryptblk encrypts on this side of storage served by nbdkit, qemu-storage-daemon or
//! another cryptblk.
//!
//! The client speaks the fixed newstyle handshake, STARTTLS for `nbds` (rustls on the
//! AWS-LC provider; the CA from the URI's `tls-certificates=DIR` or
//! `CRYPTBLK_NBD_TLS_CERTIFICATES`, `DIR/ca-cert.pem`, and a client certificate from
//! `DIR/client-cert.pem` and `DIR/client-key.pem` when present, as libnbd reads them),
//! `NBD_OPT_GO` with block sizes, and structured replies when the server offers them.
//! Requests from many threads go out on one connection at once; a reader thread matches
//! replies to requests by handle.
//!
//! Deadlines: the handshake as a whole must finish within [`CONNECT_TIMEOUT`] (every read
//! and write waits at most what is left of it), and a request within [`REQUEST_TIMEOUT`]
//! from when it is sent ([`NbdTimeouts`] sets both). The reader thread assembles a reply in
//! its own buffers and takes a request's lock only to hand over a finished reply, so a
//! server that stalls mid-reply cannot keep a waiting request past its deadline: the
//! request gives up, drops the connection and the reader's blocked read ends with it. A
//! connection attempt never holds the lock `status` reads.
//!
//! Replies are checked as the protocol demands: a successful structured READ reply covers
//! the requested range exactly once (data and hole chunks inside the range, none
//! overlapping, nothing missing), error chunks carry at most [`proto::MAX_STRING`] bytes
//! of message, and chunk types the client did not ask for are protocol errors. A violation
//! drops the connection and fails the requests on it; it is never returned as data.
//!
//! Failures: a request that the server answers with an error, or that meets a broken
//! connection, a bad or short reply or no reply in time, fails with `EIO` (a server's
//! EPERM, ENOSPC or EINVAL keep their code) and is counted ([`NbdStats`]). A write succeeds
//! only after the server acknowledged it. A broken connection is dropped and the next
//! request connects again (at most one attempt per [`RECONNECT_EVERY`]), so the device
//! comes back with its server; requests in flight on the lost connection are failed at
//! once, never retried, since the caller must learn that their fate is unknown.

pub mod proto;
pub mod tls;
pub mod tls_files;
pub mod uri;

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};

use crate::device::{check_range, BlockDevice, WriteFlags};
use proto::*;
use tls::TlsSession;
use tls_files::TlsFile;
pub use uri::{is_nbd_uri, NbdAddress, NbdUri};

/// A request without a reply this long after it was sent fails and its connection is
/// dropped.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Connecting and negotiating, all of it, must finish within this time.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// After a failed connection attempt, requests fail at once for this long instead of
/// trying again each.
pub const RECONNECT_EVERY: Duration = Duration::from_secs(1);
/// The environment variable naming the TLS certificate directory of `nbds` URIs without
/// `tls-certificates=`.
pub const TLS_ENV: &str = "CRYPTBLK_NBD_TLS_CERTIFICATES";

/// The protocol's default maximum request when the server names none.
const DEFAULT_MAX_REQUEST: u32 = 32 << 20;
/// Trims and write-zeroes are split into requests of at most this length.
const MAX_RANGE_REQUEST: u64 = 1 << 30;
/// The largest error chunk read: error value (4), message length (2), a message of at most
/// the protocol's longest string, and the offset of `NBD_REPLY_TYPE_ERROR_OFFSET` (8).
/// Anything longer breaks the protocol, and is refused before it is buffered.
const MAX_ERROR_CHUNK: u32 = 6 + MAX_STRING as u32 + 8;

/// The deadlines of one NBD backing ([`NbdTimeouts::default`] is what `open` uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NbdTimeouts {
    /// A request must be answered within this long after it was sent.
    pub request: Duration,
    /// A connection attempt (connect, TLS, options, `NBD_OPT_GO`) must finish within this.
    pub connect: Duration,
    /// After a failed connection attempt, requests fail at once for this long.
    pub reconnect_every: Duration,
}

impl Default for NbdTimeouts {
    fn default() -> Self {
        NbdTimeouts {
            request: REQUEST_TIMEOUT,
            connect: CONNECT_TIMEOUT,
            reconnect_every: RECONNECT_EVERY,
        }
    }
}

/// Failures of an NBD backing, for `status`.
#[derive(Debug, Default)]
pub struct NbdStats {
    /// Requests that failed (server error, lost connection, timeout).
    pub errors: AtomicU64,
    /// Connections made after the first.
    pub reconnects: AtomicU64,
}

/// A snapshot of one NBD backing's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdBackingReport {
    /// The URI without its query.
    pub uri: String,
    /// Connected right now.
    pub connected: bool,
    /// [`NbdStats::errors`].
    pub errors: u64,
    /// [`NbdStats::reconnects`].
    pub reconnects: u64,
}

/// Every NBD backing this process has open, for [`nbd_backings`].
fn open_backings() -> &'static Mutex<Vec<Weak<NbdBacking>>> {
    static OPEN: OnceLock<Mutex<Vec<Weak<NbdBacking>>>> = OnceLock::new();
    OPEN.get_or_init(|| Mutex::new(Vec::new()))
}

/// The NBD backings open in this process and their failure counts.
pub fn nbd_backings() -> Vec<NbdBackingReport> {
    lock(open_backings())
        .iter()
        .filter_map(Weak::upgrade)
        .map(|b| b.report())
        .collect()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An NBD export used as a block device.
pub struct NbdBacking {
    uri: NbdUri,
    /// What messages call it.
    name: String,
    tls: Option<Arc<ClientConfig>>,
    timeouts: NbdTimeouts,
    size: u64,
    block_size: u32,
    max_request: u32,
    flags: u16,
    /// The current connection; held only to look at or replace it, never across I/O.
    conn: Mutex<Option<Arc<Conn>>>,
    /// Held across a connection attempt (so one thread connects and the others wait for
    /// it, at most its handshake deadline); the time of the last failed attempt.
    connecting: Mutex<Option<Instant>>,
    stats: NbdStats,
}

impl NbdBacking {
    /// Connects to the export `spec` names (an NBD URI) and negotiates; fails with what the
    /// server or the network said.
    pub fn open(spec: &str) -> io::Result<Arc<NbdBacking>> {
        NbdBacking::open_with(spec, NbdTimeouts::default())
    }

    /// [`NbdBacking::open`] with other deadlines (tests use short ones).
    pub fn open_with(spec: &str, timeouts: NbdTimeouts) -> io::Result<Arc<NbdBacking>> {
        let uri =
            NbdUri::parse(spec).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let tls = if uri.tls {
            Some(client_tls_config(uri.tls_certificates.as_deref())?)
        } else {
            None
        };
        let name = spec.split('?').next().unwrap_or(spec).to_string();
        let (conn, info) = Conn::connect(&uri, tls.as_ref(), timeouts.connect)?;
        let backing = Arc::new(NbdBacking {
            uri,
            name,
            tls,
            timeouts,
            size: info.size,
            block_size: info.min_block.clamp(512, 65536),
            max_request: info.max_block.clamp(1 << 16, DEFAULT_MAX_REQUEST),
            flags: info.flags,
            conn: Mutex::new(Some(conn)),
            connecting: Mutex::new(None),
            stats: NbdStats::default(),
        });
        let mut open = lock(open_backings());
        open.retain(|w| w.strong_count() > 0);
        open.push(Arc::downgrade(&backing));
        Ok(backing)
    }

    /// The failure counters.
    pub fn stats(&self) -> &NbdStats {
        &self.stats
    }

    /// A snapshot for `status`; never waits for a connection attempt.
    pub fn report(&self) -> NbdBackingReport {
        NbdBackingReport {
            uri: self.name.clone(),
            connected: self.live().is_some(),
            errors: self.stats.errors.load(Ordering::Relaxed),
            reconnects: self.stats.reconnects.load(Ordering::Relaxed),
        }
    }

    fn live(&self) -> Option<Arc<Conn>> {
        lock(&self.conn).as_ref().filter(|c| !c.is_dead()).cloned()
    }

    /// The live connection, making a new one if the last one broke.
    fn connection(&self) -> io::Result<Arc<Conn>> {
        if let Some(c) = self.live() {
            return Ok(c);
        }
        let mut last_failure = lock(&self.connecting);
        // Another thread may have connected while this one waited.
        if let Some(c) = self.live() {
            return Ok(c);
        }
        if last_failure.is_some_and(|t| t.elapsed() < self.timeouts.reconnect_every) {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!("{}: not connected", self.name),
            ));
        }
        match Conn::connect(&self.uri, self.tls.as_ref(), self.timeouts.connect) {
            Ok((conn, info)) if info.size == self.size => {
                *last_failure = None;
                self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
                log::warn!("{}: connected again", self.name);
                *lock(&self.conn) = Some(Arc::clone(&conn));
                Ok(conn)
            }
            Ok((conn, info)) => {
                conn.kill();
                *last_failure = Some(Instant::now());
                Err(io::Error::other(format!(
                    "{}: the export's size changed from {} to {} bytes",
                    self.name, self.size, info.size
                )))
            }
            Err(e) => {
                *last_failure = Some(Instant::now());
                Err(e)
            }
        }
    }

    /// Sends one request and waits for its reply; failures are counted and logged.
    fn request(
        &self,
        cmd: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
        read_into: Option<&mut [u8]>,
    ) -> io::Result<()> {
        let result = self.connection().and_then(|conn| {
            let deadline = Instant::now() + self.timeouts.request;
            conn.call(cmd, flags, offset, len, payload, read_into, deadline)
        });
        if let Err(e) = &result {
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
            log::warn!("{}: request at {offset} failed: {e}", self.name);
        }
        result.map_err(|e| match e.raw_os_error() {
            Some(code) => io::Error::from_raw_os_error(code),
            None => io::Error::from_raw_os_error(libc::EIO),
        })
    }

    fn range_command(&self, cmd: u16, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len)?;
        let mut done = 0;
        while done < len {
            let n = (len - done).min(MAX_RANGE_REQUEST) as u32;
            self.request(cmd, 0, offset + done, n, &[], None)?;
            done += u64::from(n);
        }
        Ok(())
    }
}

impl BlockDevice for NbdBacking {
    fn size(&self) -> u64 {
        self.size
    }

    fn logical_block_size(&self) -> u32 {
        self.block_size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        let max = self.max_request as usize;
        for (i, piece) in buf.chunks_mut(max).enumerate() {
            let at = offset + (i * max) as u64;
            self.request(CMD_READ, 0, at, piece.len() as u32, &[], Some(piece))?;
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        if self.flags & TFLAG_READ_ONLY != 0 {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        let fua = flags.fua && self.flags & TFLAG_SEND_FUA != 0;
        let max = self.max_request as usize;
        for (i, piece) in buf.chunks(max).enumerate() {
            let at = offset + (i * max) as u64;
            let f = if fua { CMD_FLAG_FUA } else { 0 };
            self.request(CMD_WRITE, f, at, piece.len() as u32, piece, None)?;
        }
        if flags.fua && !fua {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        if self.flags & TFLAG_SEND_FLUSH == 0 {
            // The server says it has no volatile cache to flush.
            return Ok(());
        }
        self.request(CMD_FLUSH, 0, 0, 0, &[], None)
    }

    fn supports_discard(&self) -> bool {
        self.flags & TFLAG_SEND_TRIM != 0 && self.flags & TFLAG_READ_ONLY == 0
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.supports_discard() {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        }
        self.range_command(CMD_TRIM, offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.flags & TFLAG_SEND_WRITE_ZEROES == 0 || self.flags & TFLAG_READ_ONLY != 0 {
            check_range(self.size, offset, len)?;
            let zeros = vec![0u8; (len.min(u64::from(self.max_request))) as usize];
            let mut done = 0;
            while done < len {
                let n = (len - done).min(zeros.len() as u64) as usize;
                self.write_at(offset + done, &zeros[..n], WriteFlags::default())?;
                done += n as u64;
            }
            return Ok(());
        }
        self.range_command(CMD_WRITE_ZEROES, offset, len)
    }
}

/// What `NBD_OPT_GO` told.
struct ExportInfo {
    size: u64,
    flags: u16,
    min_block: u32,
    max_block: u32,
}

/// The socket, and the TLS session over it once STARTTLS is done.
struct Channel {
    socket: Socket,
    tls: Option<TlsSession>,
}

enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Socket {
    fn shutdown(&self) {
        let _ = match self {
            Socket::Tcp(s) => s.shutdown(Shutdown::Both),
            Socket::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }

    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.set_read_timeout(t),
            Socket::Unix(s) => s.set_read_timeout(t),
        }
    }

    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.set_write_timeout(t),
            Socket::Unix(s) => s.set_write_timeout(t),
        }
    }
}

/// The socket seen through a deadline: each read or write waits at most what is left of
/// it (the socket timeouts are set from it before each call), and once it has passed,
/// fails with `TimedOut` saying what timed out. Without a deadline (the reader thread,
/// which requests time out for) reads wait for ever.
///
/// Socket timeouts are per call, so a peer that trickles a byte now and then would keep a
/// plain timeout from ever firing; recomputing them from one deadline bounds the whole.
/// The read timeout is only set where one thread reads (the handshake), the write timeout
/// only under the connection's send lock.
#[derive(Clone, Copy)]
struct Bounded<'a> {
    socket: &'a Socket,
    deadline: Option<Instant>,
    what: &'a str,
}

impl Bounded<'_> {
    fn left(&self) -> io::Result<Option<Duration>> {
        match self.deadline {
            None => Ok(None),
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    Err(self.timed_out())
                } else {
                    Ok(Some(left))
                }
            }
        }
    }

    fn timed_out(&self) -> io::Error {
        io::Error::new(io::ErrorKind::TimedOut, format!("{} timed out", self.what))
    }

    /// A socket timeout is reported as `WouldBlock` (EAGAIN): name it.
    fn map(&self, e: io::Error) -> io::Error {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => self.timed_out(),
            _ => e,
        }
    }
}

impl Read for Bounded<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(left) = self.left()? {
            self.socket.set_read_timeout(Some(left))?;
        }
        let r = match self.socket {
            Socket::Tcp(s) => (&*s).read(buf),
            Socket::Unix(s) => (&*s).read(buf),
        };
        r.map_err(|e| self.map(e))
    }
}

impl Write for Bounded<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(left) = self.left()? {
            self.socket.set_write_timeout(Some(left))?;
        }
        let r = match self.socket {
            Socket::Tcp(s) => (&*s).write(buf),
            Socket::Unix(s) => (&*s).write(buf),
        };
        r.map_err(|e| self.map(e))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The channel (plain or TLS) through a [`Bounded`] socket.
struct Link<'a> {
    channel: &'a Channel,
    socket: Bounded<'a>,
}

impl<'a> Link<'a> {
    fn new(channel: &'a Channel, deadline: Option<Instant>, what: &'a str) -> Link<'a> {
        Link {
            channel,
            socket: Bounded {
                socket: &channel.socket,
                deadline,
                what,
            },
        }
    }
}

impl Read for Link<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &self.channel.tls {
            Some(tls) => tls.read(self.socket, buf),
            None => self.socket.read(buf),
        }
    }
}

impl Write for Link<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &self.channel.tls {
            Some(tls) => tls.write(self.socket, &[io::IoSlice::new(buf)]),
            None => self.socket.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One request waiting for its reply. The reader thread builds the reply in its own
/// buffer ([`Reply`]) and locks `state` only to hand it over.
struct Slot {
    cmd: u16,
    offset: u64,
    len: u32,
    state: Mutex<SlotState>,
    done: Condvar,
}

impl Slot {
    /// A request waiting for its reply.
    fn new(cmd: u16, offset: u64, len: u32) -> Arc<Slot> {
        Arc::new(Slot {
            cmd,
            offset,
            len,
            state: Mutex::new(SlotState {
                finished: false,
                data: Vec::new(),
                error: None,
            }),
            done: Condvar::new(),
        })
    }
}

struct SlotState {
    finished: bool,
    /// A read's data, once finished.
    data: Vec<u8>,
    /// The server's error, or the connection's failure.
    error: Option<io::Error>,
}

/// A structured reply being assembled by the reader thread.
struct Reply {
    data: Vec<u8>,
    /// Which bytes of the range a chunk has covered.
    covered: Coverage,
    /// The first error chunk's errno.
    error: Option<i32>,
}

/// One bit per byte of a read's range: which bytes data and hole chunks have covered, to
/// refuse overlapping chunks and replies that leave bytes out. A bitmap rather than a list
/// of ranges because its size is fixed by the request (an eighth of the data buffer), not
/// by how many chunks a server chooses to send.
struct Coverage {
    bits: Vec<u64>,
    count: u64,
}

impl Coverage {
    fn new(len: usize) -> Coverage {
        Coverage {
            bits: vec![0; len.div_ceil(64)],
            count: 0,
        }
    }

    /// Marks `start..end` covered; false (and nothing marked) if any of it already was.
    fn mark(&mut self, start: usize, end: usize) -> bool {
        let words = |f: &mut dyn FnMut(usize, u64) -> bool| {
            let mut i = start;
            while i < end {
                let w = i / 64;
                let lo = i % 64;
                let hi = (end - w * 64).min(64);
                let mask = if hi - lo == 64 {
                    u64::MAX
                } else {
                    ((1u64 << (hi - lo)) - 1) << lo
                };
                if !f(w, mask) {
                    return false;
                }
                i = w * 64 + hi;
            }
            true
        };
        if !words(&mut |w, mask| self.bits[w] & mask == 0) {
            return false;
        }
        words(&mut |w, mask| {
            self.bits[w] |= mask;
            true
        });
        self.count += (end - start) as u64;
        true
    }
}

/// The requests of one connection waiting for replies, by handle.
struct Book {
    /// Structured replies were negotiated.
    structured: bool,
    pending: Mutex<HashMap<u64, Arc<Slot>>>,
}

impl Book {
    /// The slot of `handle`, left pending until its reply is complete (so that a
    /// connection failing mid-reply fails it too).
    fn slot(&self, handle: u64) -> io::Result<Arc<Slot>> {
        lock(&self.pending)
            .get(&handle)
            .cloned()
            .ok_or_else(|| protocol(format!("reply to unknown handle {handle}")))
    }

    fn complete(&self, handle: u64, slot: &Slot, result: io::Result<Vec<u8>>) {
        lock(&self.pending).remove(&handle);
        finish(slot, result);
    }
}

/// One connection: requests go out under `send`, the reader thread answers the slots.
struct Conn {
    channel: Channel,
    book: Book,
    send: Mutex<()>,
    next_handle: AtomicU64,
    dead: AtomicBool,
}

impl Conn {
    fn connect(
        uri: &NbdUri,
        tls: Option<&Arc<ClientConfig>>,
        timeout: Duration,
    ) -> io::Result<(Arc<Conn>, ExportInfo)> {
        let deadline = Instant::now() + timeout;
        let socket = match &uri.address {
            NbdAddress::Tcp { host, port } => {
                let mut last =
                    io::Error::new(io::ErrorKind::NotFound, format!("{host}: no address"));
                let mut found = None;
                for addr in (host.as_str(), *port).to_socket_addrs()? {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        last = io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("connecting to {host} timed out"),
                        );
                        break;
                    }
                    match TcpStream::connect_timeout(&addr, left) {
                        Ok(s) => {
                            found = Some(s);
                            break;
                        }
                        Err(e) => last = e,
                    }
                }
                let s = found.ok_or(last)?;
                s.set_nodelay(true)?;
                Socket::Tcp(s)
            }
            NbdAddress::Unix(path) => Socket::Unix(
                UnixStream::connect(path)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?,
            ),
        };
        let mut channel = Channel { socket, tls: None };
        let (structured, info) = handshake(&mut channel, uri, tls, deadline)?;
        // The reader waits for replies without a bound: requests time out themselves and
        // drop the connection, which ends the reader's wait.
        channel.socket.set_read_timeout(None)?;
        let conn = Arc::new(Conn {
            channel,
            book: Book {
                structured,
                pending: Mutex::new(HashMap::new()),
            },
            send: Mutex::new(()),
            next_handle: AtomicU64::new(1),
            dead: AtomicBool::new(false),
        });
        let reader = Arc::clone(&conn);
        std::thread::Builder::new()
            .name("nbd-client".to_string())
            .spawn(move || reader.read_replies())?;
        Ok((conn, info))
    }

    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    /// Drops the connection: the reader sees the socket close and fails what is pending.
    fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
        self.channel.socket.shutdown();
    }

    /// Sends one request and waits for its reply until `deadline`.
    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        cmd: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
        read_into: Option<&mut [u8]>,
        deadline: Instant,
    ) -> io::Result<()> {
        let slot = Slot::new(cmd, offset, len);
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        lock(&self.book.pending).insert(handle, Arc::clone(&slot));
        if self.is_dead() {
            // The reader may have failed the pending requests before this one was added.
            lock(&self.book.pending).remove(&handle);
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "connection lost",
            ));
        }
        let mut header = [0u8; 28];
        header[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        header[4..6].copy_from_slice(&flags.to_be_bytes());
        header[6..8].copy_from_slice(&cmd.to_be_bytes());
        header[8..16].copy_from_slice(&handle.to_be_bytes());
        header[16..24].copy_from_slice(&offset.to_be_bytes());
        header[24..28].copy_from_slice(&len.to_be_bytes());
        let sent = {
            // Whoever holds this lock gives up by its own deadline, which is no later than
            // this request's (it started first), and drops the connection.
            let _send = lock(&self.send);
            let mut w = Link::new(&self.channel, Some(deadline), "sending the request");
            w.write_all(&header).and_then(|()| w.write_all(payload))
        };
        if let Err(e) = sent {
            self.kill();
            lock(&self.book.pending).remove(&handle);
            return Err(e);
        }
        let mut state = lock(&slot.state);
        while !state.finished {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(state);
                lock(&self.book.pending).remove(&handle);
                self.kill();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "timed out waiting for the reply",
                ));
            }
            state = slot
                .done
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if let Some(e) = state.error.take() {
            return Err(e);
        }
        if let Some(buf) = read_into {
            if state.data.len() != buf.len() {
                return Err(protocol("a read's reply has the wrong length".to_string()));
            }
            buf.copy_from_slice(&state.data);
        }
        Ok(())
    }

    /// The reader thread: answers slots until the connection fails, then fails the rest
    /// (including the one whose reply broke off).
    fn read_replies(self: Arc<Self>) {
        let mut replies = HashMap::new();
        let why = loop {
            if let Err(e) = self.read_reply(&mut replies) {
                break e;
            }
        };
        self.fail_all(&why);
    }

    fn fail_all(&self, why: &io::Error) {
        self.dead.store(true, Ordering::SeqCst);
        self.channel.socket.shutdown();
        let pending: Vec<Arc<Slot>> = lock(&self.book.pending).drain().map(|(_, s)| s).collect();
        for slot in pending {
            finish(
                &slot,
                Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    format!("connection lost: {why}"),
                )),
            );
        }
    }

    /// Reads one simple reply or one structured reply chunk.
    fn read_reply(&self, replies: &mut HashMap<u64, Reply>) -> io::Result<()> {
        let mut r = Link::new(&self.channel, None, "reading the reply");
        read_reply_from(&mut r, &self.book, replies)
    }
}

/// Reads one simple reply or one structured reply chunk from `r` for the requests in
/// `conn`.
fn read_reply_from(
    r: &mut impl Read,
    conn: &Book,
    replies: &mut HashMap<u64, Reply>,
) -> io::Result<()> {
    let magic = read_u32(r)?;
    match magic {
        SIMPLE_REPLY_MAGIC => {
            let error = read_u32(r)?;
            let handle = read_u64(r)?;
            if replies.contains_key(&handle) {
                return Err(protocol(format!(
                    "simple reply to handle {handle} amid its structured reply"
                )));
            }
            let slot = conn.slot(handle)?;
            if error != 0 {
                conn.complete(handle, &slot, Err(server_error(error)));
            } else if slot.cmd == CMD_READ {
                // A read's data follows a successful simple reply; it is read into this
                // thread's buffer, without the request's lock.
                let mut data = vec![0u8; slot.len as usize];
                r.read_exact(&mut data)?;
                conn.complete(handle, &slot, Ok(data));
            } else {
                conn.complete(handle, &slot, Ok(Vec::new()));
            }
            Ok(())
        }
        STRUCTURED_REPLY_MAGIC if conn.structured => {
            let flags = read_u16(r)?;
            let kind = read_u16(r)?;
            let handle = read_u64(r)?;
            let len = read_u32(r)?;
            let slot = conn.slot(handle)?;
            let reply = replies.entry(handle).or_insert_with(|| Reply {
                data: if slot.cmd == CMD_READ {
                    vec![0u8; slot.len as usize]
                } else {
                    Vec::new()
                },
                covered: Coverage::new(if slot.cmd == CMD_READ {
                    slot.len as usize
                } else {
                    0
                }),
                error: None,
            });
            read_chunk(r, &slot, reply, kind, flags, len)?;
            if flags & REPLY_FLAG_DONE != 0 {
                let reply = replies.remove(&handle).unwrap_or_else(|| unreachable!());
                let result = if let Some(code) = reply.error {
                    Err(io::Error::from_raw_os_error(code))
                } else if slot.cmd == CMD_READ && reply.covered.count != u64::from(slot.len) {
                    // Bytes no chunk covered would be returned as zeros (garbage once
                    // decrypted): the protocol requires a successful read to cover all.
                    return Err(protocol(format!(
                        "the reply to the read at {} covers {} of its {} bytes",
                        slot.offset, reply.covered.count, slot.len
                    )));
                } else {
                    Ok(reply.data)
                };
                conn.complete(handle, &slot, result);
            }
            Ok(())
        }
        _ => Err(protocol(format!("bad reply magic {magic:#x}"))),
    }
}

/// Reads one chunk's payload into `reply`, checking it against the protocol.
fn read_chunk(
    r: &mut impl Read,
    slot: &Slot,
    reply: &mut Reply,
    kind: u16,
    flags: u16,
    len: u32,
) -> io::Result<()> {
    let is_read = slot.cmd == CMD_READ;
    match kind {
        REPLY_TYPE_NONE => {
            if len != 0 || flags & REPLY_FLAG_DONE == 0 {
                return Err(protocol("a NONE chunk must be empty and final".to_string()));
            }
            Ok(())
        }
        REPLY_TYPE_OFFSET_DATA | REPLY_TYPE_OFFSET_HOLE if is_read => {
            let (offset, n) = if kind == REPLY_TYPE_OFFSET_DATA {
                if len <= 8 {
                    return Err(protocol(format!("data chunk of length {len}")));
                }
                (read_u64(r)?, u64::from(len - 8))
            } else {
                if len != 12 {
                    return Err(protocol(format!("hole chunk of length {len}")));
                }
                let offset = read_u64(r)?;
                let n = read_u32(r)?;
                if n == 0 {
                    return Err(protocol("empty hole chunk".to_string()));
                }
                (offset, u64::from(n))
            };
            let start = offset
                .checked_sub(slot.offset)
                .filter(|s| s.checked_add(n).is_some_and(|e| e <= u64::from(slot.len)));
            let Some(start) = start else {
                return Err(protocol(format!(
                    "chunk of {n} bytes at {offset} outside the read of {} at {}",
                    slot.len, slot.offset
                )));
            };
            let range = start as usize..(start + n) as usize;
            if !reply.covered.mark(range.start, range.end) {
                return Err(protocol(format!(
                    "chunk of {n} bytes at {offset} overlaps an earlier one"
                )));
            }
            if kind == REPLY_TYPE_OFFSET_DATA {
                r.read_exact(&mut reply.data[range])?;
            }
            // A hole's bytes are the zeros the buffer was made with.
            Ok(())
        }
        k if k & REPLY_TYPE_ERROR_BIT != 0 => {
            if !(6..=MAX_ERROR_CHUNK).contains(&len) {
                return Err(protocol(format!("error chunk of length {len}")));
            }
            let error = read_u32(r)?;
            let msg_len = read_u16(r)?;
            let mut rest = vec![0u8; len as usize - 6];
            r.read_exact(&mut rest)?;
            let msg_len = usize::from(msg_len);
            let fits = match k {
                REPLY_TYPE_ERROR => rest.len() == msg_len,
                REPLY_TYPE_ERROR_OFFSET => rest.len() == msg_len + 8,
                // Error types this client does not know still start with error and
                // message (the protocol says so, for this very purpose).
                _ => rest.len() >= msg_len,
            };
            if !fits || msg_len > MAX_STRING || error == 0 {
                return Err(protocol(format!("malformed error chunk (type {k:#x})")));
            }
            if k == REPLY_TYPE_ERROR_OFFSET && is_read {
                let at = u64::from_be_bytes(rest[msg_len..].try_into().unwrap_or_default());
                let inside = at
                    .checked_sub(slot.offset)
                    .is_some_and(|s| s < u64::from(slot.len));
                if !inside {
                    return Err(protocol(format!(
                        "error offset {at} outside the read of {} at {}",
                        slot.len, slot.offset
                    )));
                }
            }
            log::warn!(
                "NBD server error: {}: {}",
                server_error(error),
                String::from_utf8_lossy(&rest[..msg_len])
            );
            // The first error is what the request fails with.
            reply.error.get_or_insert(server_errno(error));
            Ok(())
        }
        // Block status or anything else this client never asked for.
        _ => Err(protocol(format!(
            "unexpected chunk type {kind} in the reply to command {}",
            slot.cmd
        ))),
    }
}

/// What [`parse_replies`] made of a server's bytes.
#[derive(Debug)]
pub struct ParsedReplies {
    /// Per request: `None` while no complete reply came, else its outcome (a read's data).
    pub outcomes: Vec<Option<io::Result<Vec<u8>>>>,
    /// How reading stopped: the protocol error or end of input that ended it.
    pub stopped: io::Error,
}

/// Runs the client's reply reader over `bytes` as if a server had sent them in answer to
/// `requests` (command, offset, length), which get handles 1, 2, ...; for the fuzz target
/// and the hostile-reply tests, which exercise exactly the code a connection uses.
#[doc(hidden)]
pub fn parse_replies(
    structured: bool,
    requests: &[(u16, u64, u32)],
    bytes: &[u8],
) -> ParsedReplies {
    let book = Book {
        structured,
        pending: Mutex::new(HashMap::new()),
    };
    let slots: Vec<Arc<Slot>> = requests
        .iter()
        .enumerate()
        .map(|(i, &(cmd, offset, len))| {
            let slot = Slot::new(cmd, offset, len);
            lock(&book.pending).insert(i as u64 + 1, Arc::clone(&slot));
            slot
        })
        .collect();
    let mut replies = HashMap::new();
    let mut r = bytes;
    let stopped = loop {
        if let Err(e) = read_reply_from(&mut r, &book, &mut replies) {
            break e;
        }
    };
    let outcomes = slots
        .iter()
        .map(|slot| {
            let mut state = lock(&slot.state);
            state.finished.then(|| match state.error.take() {
                Some(e) => Err(e),
                None => Ok(std::mem::take(&mut state.data)),
            })
        })
        .collect();
    ParsedReplies { outcomes, stopped }
}

fn finish(slot: &Slot, result: io::Result<Vec<u8>>) {
    let mut state = lock(&slot.state);
    state.finished = true;
    match result {
        Ok(data) => state.data = data,
        Err(e) => state.error = Some(e),
    }
    slot.done.notify_all();
}

fn protocol(msg: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("NBD protocol error: {msg}"),
    )
}

/// The errno for an NBD error code (the protocol's values are Linux's).
fn server_errno(code: u32) -> i32 {
    match code {
        EPERM | EIO | ENOMEM | EINVAL | ENOSPC | EOVERFLOW | ENOTSUP | ESHUTDOWN => code as i32,
        _ => libc::EIO,
    }
}

fn server_error(code: u32) -> io::Error {
    io::Error::from_raw_os_error(server_errno(code))
}

fn read_u16(r: &mut impl Read) -> io::Result<u16> {
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn send_option(w: &mut impl Write, option: u32, data: &[u8]) -> io::Result<()> {
    let mut msg = Vec::with_capacity(16 + data.len());
    msg.extend_from_slice(&IHAVEOPT.to_be_bytes());
    msg.extend_from_slice(&option.to_be_bytes());
    msg.extend_from_slice(&(data.len() as u32).to_be_bytes());
    msg.extend_from_slice(data);
    w.write_all(&msg)
}

/// One option reply: (type, data).
fn read_option_reply(r: &mut impl Read, option: u32) -> io::Result<(u32, Vec<u8>)> {
    if read_u64(r)? != OPTION_REPLY_MAGIC {
        return Err(protocol("bad option reply magic".to_string()));
    }
    if read_u32(r)? != option {
        return Err(protocol("reply to another option".to_string()));
    }
    let kind = read_u32(r)?;
    let len = read_u32(r)?;
    if len > 64 << 10 {
        return Err(protocol("option reply too large".to_string()));
    }
    let mut data = vec![0u8; len as usize];
    r.read_exact(&mut data)?;
    Ok((kind, data))
}

fn option_error(option: &str, kind: u32, data: &[u8]) -> io::Error {
    let why = match kind {
        REP_ERR_UNSUP => "not supported",
        REP_ERR_POLICY => "refused by the server's policy",
        REP_ERR_TLS_REQD => "TLS is required (use nbds://)",
        REP_ERR_UNKNOWN => "no such export",
        REP_ERR_SHUTDOWN => "the server is shutting down",
        _ => "failed",
    };
    let text = String::from_utf8_lossy(data);
    io::Error::new(
        io::ErrorKind::ConnectionRefused,
        if text.is_empty() {
            format!("NBD {option}: {why}")
        } else {
            format!("NBD {option}: {why} ({text})")
        },
    )
}

/// The fixed newstyle handshake up to `NBD_OPT_GO`, all of it before `deadline`:
/// (structured replies, export info).
fn handshake(
    channel: &mut Channel,
    uri: &NbdUri,
    tls: Option<&Arc<ClientConfig>>,
    deadline: Instant,
) -> io::Result<(bool, ExportInfo)> {
    const WHAT: &str = "the NBD handshake";
    let mut s = Bounded {
        socket: &channel.socket,
        deadline: Some(deadline),
        what: WHAT,
    };
    if read_u64(&mut s)? != NBDMAGIC || read_u64(&mut s)? != IHAVEOPT {
        return Err(protocol("not a newstyle NBD server".to_string()));
    }
    let server_flags = read_u16(&mut s)?;
    if server_flags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(protocol(
            "the server does not speak fixed newstyle".to_string(),
        ));
    }
    let no_zeroes = server_flags & FLAG_NO_ZEROES != 0;
    let client_flags = FLAG_C_FIXED_NEWSTYLE | if no_zeroes { FLAG_C_NO_ZEROES } else { 0 };
    s.write_all(&client_flags.to_be_bytes())?;
    if let Some(config) = tls {
        send_option(&mut s, OPT_STARTTLS, &[])?;
        let (kind, data) = read_option_reply(&mut s, OPT_STARTTLS)?;
        if kind != REP_ACK {
            return Err(option_error("STARTTLS", kind, &data));
        }
        let host = match &uri.address {
            NbdAddress::Tcp { host, .. } => host.clone(),
            NbdAddress::Unix(_) => "localhost".to_string(),
        };
        let name = ServerName::try_from(host.clone())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{host}: {e}")))?;
        let mut client = ClientConnection::new(Arc::clone(config), name)
            .map_err(|e| io::Error::other(format!("TLS: {e}")))?;
        while client.is_handshaking() {
            client
                .complete_io(&mut s)
                .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake: {e}")))?;
        }
        channel.tls = Some(TlsSession::new(rustls::Connection::Client(client)));
    }
    let mut c = Link::new(channel, Some(deadline), WHAT);
    send_option(&mut c, OPT_STRUCTURED_REPLY, &[])?;
    let (kind, _) = read_option_reply(&mut c, OPT_STRUCTURED_REPLY)?;
    let structured = kind == REP_ACK;
    let name = uri.export.as_bytes();
    let mut go = Vec::with_capacity(8 + name.len());
    go.extend_from_slice(&(name.len() as u32).to_be_bytes());
    go.extend_from_slice(name);
    go.extend_from_slice(&1u16.to_be_bytes());
    go.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    send_option(&mut c, OPT_GO, &go)?;
    let mut info = ExportInfo {
        size: u64::MAX,
        flags: 0,
        min_block: 512,
        max_block: DEFAULT_MAX_REQUEST,
    };
    let mut got_size = false;
    loop {
        let (kind, data) = read_option_reply(&mut c, OPT_GO)?;
        match kind {
            REP_ACK => break,
            REP_INFO if data.len() >= 2 => {
                let which = u16::from_be_bytes([data[0], data[1]]);
                if which == INFO_EXPORT && data.len() == 12 {
                    info.size = u64::from_be_bytes(data[2..10].try_into().unwrap_or_default());
                    info.flags = u16::from_be_bytes([data[10], data[11]]);
                    got_size = true;
                } else if which == INFO_BLOCK_SIZE && data.len() == 14 {
                    let field = |i: usize| {
                        u32::from_be_bytes(data[i..i + 4].try_into().unwrap_or_default())
                    };
                    info.min_block = field(2);
                    info.max_block = field(10);
                }
            }
            k if k & REP_ERR != 0 => return Err(option_error("GO", k, &data)),
            _ => {}
        }
    }
    if !got_size {
        return Err(protocol(
            "the server did not send the export's size".to_string(),
        ));
    }
    check_export_size(info.size)?;
    Ok((structured, info))
}

/// The export sizes this client takes: whole 512-byte sectors, and no more than the
/// largest offset a file or block device can have (`off_t` is signed), since the layers
/// above address the device in those.
pub fn check_export_size(size: u64) -> io::Result<()> {
    if !size.is_multiple_of(512) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("the export's size {size} is not a multiple of 512"),
        ));
    }
    if size > i64::MAX as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "the export's size {size} is larger than the largest device ({} bytes)",
                i64::MAX as u64 - 511
            ),
        ));
    }
    Ok(())
}

/// The TLS configuration of `nbds` URIs: the CA and optional client certificate in `dir`
/// (or the directory [`TLS_ENV`] names).
fn client_tls_config(dir: Option<&Path>) -> io::Result<Arc<ClientConfig>> {
    let dir: PathBuf =
        match dir {
            Some(d) => d.to_path_buf(),
            None => std::env::var_os(TLS_ENV)
                .map(PathBuf::from)
                .ok_or_else(|| {
                    io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("nbds needs the CA: add ?tls-certificates=DIR to the URI or set {TLS_ENV}"),
            )
                })?,
        };
    let bad = |what: &Path, e: String| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: {e}", what.display()),
        )
    };
    let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidInput, msg);
    tls_files::check_tls_dir(&dir).map_err(invalid)?;
    let ca = dir.join("ca-cert.pem");
    let mut roots = RootCertStore::empty();
    let pem = tls_files::read_tls_file(&ca, TlsFile::Certificate).map_err(invalid)?;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| bad(&ca, e.to_string()))?;
        roots.add(cert).map_err(|e| bad(&ca, e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(bad(&ca, "no certificate in it".to_string()));
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| io::Error::other(format!("TLS setup: {e}")))?
        .with_root_certificates(roots);
    let cert = dir.join("client-cert.pem");
    let key = dir.join("client-key.pem");
    let config = if cert.exists() && key.exists() {
        let pem = tls_files::read_tls_file(&cert, TlsFile::Certificate).map_err(invalid)?;
        let chain = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(&cert, e.to_string()))?;
        let key_pem = tls_files::read_tls_file(&key, TlsFile::PrivateKey).map_err(invalid)?;
        let key_der =
            PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| bad(&key, e.to_string()))?;
        builder
            .with_client_auth_cert(chain, key_der)
            .map_err(|e| bad(&cert, e.to_string()))?
    } else {
        builder.with_no_client_auth()
    };
    Ok(Arc::new(config))
}
