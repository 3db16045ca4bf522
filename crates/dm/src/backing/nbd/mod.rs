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
//! Failures: a request that the server answers with an error, or that meets a broken
//! connection, a short reply or no reply within [`REQUEST_TIMEOUT`], fails with `EIO` (a
//! server's EPERM, ENOSPC or EINVAL keep their code) and is counted ([`NbdStats`]). A write
//! succeeds only after the server acknowledged it. A broken connection is dropped and the
//! next request connects again (at most one attempt per [`RECONNECT_EVERY`]), so the device
//! comes back with its server; requests in flight on the lost connection are failed, never
//! retried, since the caller must learn that their fate is unknown.

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
use tls::TlsSession;
use tls_files::TlsFile;
pub use uri::{is_nbd_uri, NbdAddress, NbdUri};

/// A request without a reply this long fails and its connection is dropped.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Connecting and negotiating must finish within this time.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// After a failed connection attempt, requests fail at once for this long instead of
/// trying again each.
pub const RECONNECT_EVERY: Duration = Duration::from_secs(1);
/// The environment variable naming the TLS certificate directory of `nbds` URIs without
/// `tls-certificates=`.
pub const TLS_ENV: &str = "CRYPTBLK_NBD_TLS_CERTIFICATES";

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
const FLAG_FIXED_NEWSTYLE: u16 = 1;
const FLAG_NO_ZEROES: u16 = 2;
const OPT_STARTTLS: u32 = 5;
const OPT_GO: u32 = 7;
const OPT_STRUCTURED_REPLY: u32 = 8;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const INFO_EXPORT: u16 = 0;
const INFO_BLOCK_SIZE: u16 = 3;
const TFLAG_READ_ONLY: u16 = 1 << 1;
const TFLAG_SEND_FLUSH: u16 = 1 << 2;
const TFLAG_SEND_FUA: u16 = 1 << 3;
const TFLAG_SEND_TRIM: u16 = 1 << 5;
const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_FLUSH: u16 = 3;
const CMD_TRIM: u16 = 4;
const CMD_WRITE_ZEROES: u16 = 6;
const CMD_FLAG_FUA: u16 = 1;
const REPLY_FLAG_DONE: u16 = 1;
const REPLY_TYPE_NONE: u16 = 0;
const REPLY_TYPE_OFFSET_DATA: u16 = 1;
const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
const REPLY_TYPE_ERROR_BIT: u16 = 1 << 15;
/// The protocol's default maximum request when the server names none.
const DEFAULT_MAX_REQUEST: u32 = 32 << 20;
/// Trims and write-zeroes are split into requests of at most this length.
const MAX_RANGE_REQUEST: u64 = 1 << 30;

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
    size: u64,
    block_size: u32,
    max_request: u32,
    flags: u16,
    conn: Mutex<Option<Arc<Conn>>>,
    last_failure: Mutex<Option<Instant>>,
    stats: NbdStats,
}

impl NbdBacking {
    /// Connects to the export `spec` names (an NBD URI) and negotiates; fails with what the
    /// server or the network said.
    pub fn open(spec: &str) -> io::Result<Arc<NbdBacking>> {
        let uri =
            NbdUri::parse(spec).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let tls = if uri.tls {
            Some(client_tls_config(uri.tls_certificates.as_deref())?)
        } else {
            None
        };
        let name = spec.split('?').next().unwrap_or(spec).to_string();
        let (conn, info) = Conn::connect(&uri, tls.as_ref())?;
        let backing = Arc::new(NbdBacking {
            uri,
            name,
            tls,
            size: info.size,
            block_size: info.min_block.clamp(512, 65536),
            max_request: info.max_block.clamp(1 << 16, DEFAULT_MAX_REQUEST),
            flags: info.flags,
            conn: Mutex::new(Some(conn)),
            last_failure: Mutex::new(None),
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

    /// A snapshot for `status`.
    pub fn report(&self) -> NbdBackingReport {
        NbdBackingReport {
            uri: self.name.clone(),
            connected: lock(&self.conn).as_ref().is_some_and(|c| !c.is_dead()),
            errors: self.stats.errors.load(Ordering::Relaxed),
            reconnects: self.stats.reconnects.load(Ordering::Relaxed),
        }
    }

    /// The live connection, making a new one if the last one broke.
    fn connection(&self) -> io::Result<Arc<Conn>> {
        let mut current = lock(&self.conn);
        if let Some(c) = current.as_ref().filter(|c| !c.is_dead()) {
            return Ok(Arc::clone(c));
        }
        *current = None;
        let mut last_failure = lock(&self.last_failure);
        if last_failure.is_some_and(|t| t.elapsed() < RECONNECT_EVERY) {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!("{}: not connected", self.name),
            ));
        }
        match Conn::connect(&self.uri, self.tls.as_ref()) {
            Ok((conn, info)) if info.size == self.size => {
                *last_failure = None;
                self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
                log::warn!("{}: connected again", self.name);
                *current = Some(Arc::clone(&conn));
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
        let result = self
            .connection()
            .and_then(|conn| conn.call(cmd, flags, offset, len, payload, read_into));
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

    fn set_timeouts(&self, read: Option<Duration>, write: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => {
                s.set_read_timeout(read)?;
                s.set_write_timeout(write)
            }
            Socket::Unix(s) => {
                s.set_read_timeout(read)?;
                s.set_write_timeout(write)
            }
        }
    }
}

impl Read for &Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => (&*s).read(buf),
            Socket::Unix(s) => (&*s).read(buf),
        }
    }
}

impl Write for &Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => (&*s).write(buf),
            Socket::Unix(s) => (&*s).write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Read for &Channel {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &self.tls {
            Some(tls) => tls.read(&self.socket, buf),
            None => (&self.socket).read(buf),
        }
    }
}

impl Write for &Channel {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &self.tls {
            Some(tls) => tls.write(&self.socket, &[io::IoSlice::new(buf)]),
            None => (&self.socket).write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One request waiting for its reply.
struct Slot {
    offset: u64,
    state: Mutex<SlotState>,
    done: Condvar,
}

struct SlotState {
    finished: bool,
    /// The read's data, filled by the reader thread.
    data: Vec<u8>,
    /// The server's error, or the connection's failure.
    error: Option<io::Error>,
}

/// One connection: requests go out under `send`, the reader thread answers the slots.
struct Conn {
    channel: Channel,
    structured: bool,
    send: Mutex<()>,
    pending: Mutex<HashMap<u64, Arc<Slot>>>,
    next_handle: AtomicU64,
    dead: AtomicBool,
}

impl Conn {
    fn connect(
        uri: &NbdUri,
        tls: Option<&Arc<ClientConfig>>,
    ) -> io::Result<(Arc<Conn>, ExportInfo)> {
        let socket = match &uri.address {
            NbdAddress::Tcp { host, port } => {
                let mut last =
                    io::Error::new(io::ErrorKind::NotFound, format!("{host}: no address"));
                let mut found = None;
                for addr in (host.as_str(), *port).to_socket_addrs()? {
                    match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
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
        socket.set_timeouts(Some(CONNECT_TIMEOUT), Some(CONNECT_TIMEOUT))?;
        let mut channel = Channel { socket, tls: None };
        let (structured, info) = handshake(&mut channel, uri, tls)?;
        // The reader waits for replies without a bound (requests time out themselves); a
        // server that stops reading fails the write after REQUEST_TIMEOUT.
        channel.socket.set_timeouts(None, Some(REQUEST_TIMEOUT))?;
        let conn = Arc::new(Conn {
            channel,
            structured,
            send: Mutex::new(()),
            pending: Mutex::new(HashMap::new()),
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

    fn call(
        &self,
        cmd: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
        read_into: Option<&mut [u8]>,
    ) -> io::Result<()> {
        let slot = Arc::new(Slot {
            offset,
            state: Mutex::new(SlotState {
                finished: false,
                data: if read_into.is_some() {
                    vec![0u8; len as usize]
                } else {
                    Vec::new()
                },
                error: None,
            }),
            done: Condvar::new(),
        });
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        lock(&self.pending).insert(handle, Arc::clone(&slot));
        if self.is_dead() {
            // The reader may have failed the pending requests before this one was added.
            lock(&self.pending).remove(&handle);
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
            let _send = lock(&self.send);
            let mut w = &self.channel;
            w.write_all(&header).and_then(|()| w.write_all(payload))
        };
        if let Err(e) = sent {
            self.kill();
            lock(&self.pending).remove(&handle);
            return Err(e);
        }
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let mut state = lock(&slot.state);
        while !state.finished {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(state);
                lock(&self.pending).remove(&handle);
                self.kill();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no reply within {REQUEST_TIMEOUT:?}"),
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
            buf.copy_from_slice(&state.data);
        }
        Ok(())
    }

    /// The reader thread: answers slots until the connection fails, then fails the rest.
    fn read_replies(self: Arc<Self>) {
        let why = loop {
            if let Err(e) = self.read_reply() {
                break e;
            }
        };
        self.dead.store(true, Ordering::SeqCst);
        self.channel.socket.shutdown();
        let pending: Vec<Arc<Slot>> = lock(&self.pending).drain().map(|(_, s)| s).collect();
        for slot in pending {
            finish(
                &slot,
                Some(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    format!("connection lost: {why}"),
                )),
            );
        }
    }

    fn read_reply(&self) -> io::Result<()> {
        let mut r = &self.channel;
        let magic = read_u32(&mut r)?;
        match magic {
            SIMPLE_REPLY_MAGIC => {
                let error = read_u32(&mut r)?;
                let handle = read_u64(&mut r)?;
                let slot = self.take_slot(handle)?;
                let result = if error != 0 {
                    Some(server_error(error))
                } else {
                    let mut state = lock(&slot.state);
                    // A read's data follows a successful simple reply.
                    r.read_exact(&mut state.data)?;
                    None
                };
                finish(&slot, result);
                Ok(())
            }
            STRUCTURED_REPLY_MAGIC if self.structured => {
                let flags = read_u16(&mut r)?;
                let kind = read_u16(&mut r)?;
                let handle = read_u64(&mut r)?;
                let len = read_u32(&mut r)?;
                let slot = lock(&self.pending)
                    .get(&handle)
                    .cloned()
                    .ok_or_else(|| protocol(format!("reply to unknown handle {handle}")))?;
                self.read_chunk(&slot, kind, len, &mut r)?;
                if flags & REPLY_FLAG_DONE != 0 {
                    lock(&self.pending).remove(&handle);
                    let error = lock(&slot.state).error.take();
                    finish(&slot, error);
                }
                Ok(())
            }
            _ => Err(protocol(format!("bad reply magic {magic:#x}"))),
        }
    }

    fn take_slot(&self, handle: u64) -> io::Result<Arc<Slot>> {
        lock(&self.pending)
            .remove(&handle)
            .ok_or_else(|| protocol(format!("reply to unknown handle {handle}")))
    }

    fn read_chunk(&self, slot: &Slot, kind: u16, len: u32, r: &mut &Channel) -> io::Result<()> {
        match kind {
            REPLY_TYPE_NONE if len == 0 => Ok(()),
            REPLY_TYPE_OFFSET_DATA | REPLY_TYPE_OFFSET_HOLE if len >= 8 => {
                let offset = read_u64(r)?;
                let mut state = lock(&slot.state);
                let (start, n) = if kind == REPLY_TYPE_OFFSET_DATA {
                    (offset.wrapping_sub(slot.offset), u64::from(len - 8))
                } else {
                    if len != 12 {
                        return Err(protocol("bad hole chunk".to_string()));
                    }
                    (offset.wrapping_sub(slot.offset), u64::from(read_u32(r)?))
                };
                let end = start
                    .checked_add(n)
                    .filter(|e| *e <= state.data.len() as u64);
                let Some(end) = end else {
                    return Err(protocol(format!("chunk at {offset} outside the request")));
                };
                let range = start as usize..end as usize;
                if kind == REPLY_TYPE_OFFSET_DATA {
                    r.read_exact(&mut state.data[range])?;
                } else {
                    state.data[range].fill(0);
                }
                Ok(())
            }
            k if k & REPLY_TYPE_ERROR_BIT != 0 && len >= 6 => {
                let error = read_u32(r)?;
                let msg_len = read_u16(r)?;
                let mut rest = vec![0u8; len as usize - 6];
                r.read_exact(&mut rest)?;
                let msg = rest.get(..usize::from(msg_len)).unwrap_or(&rest);
                let e = server_error(error);
                let e = io::Error::new(e.kind(), format!("{e}: {}", String::from_utf8_lossy(msg)));
                // Keep the code for the caller (the message is logged by the request).
                let code = server_errno(error);
                lock(&slot.state).error = Some(io::Error::from_raw_os_error(code));
                log::warn!("NBD server error: {e}");
                Ok(())
            }
            k if k & REPLY_TYPE_ERROR_BIT == 0 => {
                // A chunk type we did not ask for (block status): skip it.
                io::copy(&mut r.take(u64::from(len)), &mut io::sink())?;
                Ok(())
            }
            _ => Err(protocol(format!("malformed reply chunk type {kind}"))),
        }
    }
}

fn finish(slot: &Slot, error: Option<io::Error>) {
    let mut state = lock(&slot.state);
    state.finished = true;
    if error.is_some() {
        state.error = error;
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
        1 | 5 | 12 | 22 | 28 | 75 | 95 | 108 => code as i32,
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
        0x8000_0001 => "not supported",
        0x8000_0002 => "refused by the server's policy",
        0x8000_0005 => "TLS is required (use nbds://)",
        0x8000_0006 => "no such export",
        0x8000_0007 => "the server is shutting down",
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

/// The fixed newstyle handshake up to `NBD_OPT_GO`: (structured replies, export info).
fn handshake(
    channel: &mut Channel,
    uri: &NbdUri,
    tls: Option<&Arc<ClientConfig>>,
) -> io::Result<(bool, ExportInfo)> {
    let mut s = &channel.socket;
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
    let client_flags: u32 = 1 | if no_zeroes { 2 } else { 0 };
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
    let mut c = &*channel;
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
    loop {
        let (kind, data) = read_option_reply(&mut c, OPT_GO)?;
        match kind {
            REP_ACK => break,
            REP_INFO if data.len() >= 2 => {
                let which = u16::from_be_bytes([data[0], data[1]]);
                if which == INFO_EXPORT && data.len() == 12 {
                    info.size = u64::from_be_bytes(data[2..10].try_into().unwrap_or_default());
                    info.flags = u16::from_be_bytes([data[10], data[11]]);
                } else if which == INFO_BLOCK_SIZE && data.len() == 14 {
                    let field = |i: usize| {
                        u32::from_be_bytes(data[i..i + 4].try_into().unwrap_or_default())
                    };
                    info.min_block = field(2);
                    info.max_block = field(10);
                }
            }
            k if k & 0x8000_0000 != 0 => return Err(option_error("GO", k, &data)),
            _ => {}
        }
    }
    if info.size == u64::MAX {
        return Err(protocol(
            "the server did not send the export's size".to_string(),
        ));
    }
    if !info.size.is_multiple_of(512) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("the export's size {} is not a multiple of 512", info.size),
        ));
    }
    Ok((structured, info))
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
