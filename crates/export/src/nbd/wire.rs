//! The byte level below the protocol phases: the client socket and the big-endian integer
//! readers that the handshake and the transmission phase share.
//!
//! Kept apart from `conn` (which drives a connection through both phases) so that the phases
//! import these helpers from below rather than from the module that calls them.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::tls::TlsSession;

/// A connected client socket.
pub(crate) enum Socket {
    Unix(UnixStream),
    Tcp(TcpStream),
}

/// A client connection's byte stream: the socket, and after `NBD_OPT_STARTTLS` the TLS
/// session over it. Reading and writing go through `&Stream` so that one file descriptor
/// serves the connection's reader and its reply writers at the same time.
pub(crate) struct Stream {
    socket: Socket,
    tls: OnceLock<TlsSession>,
}

impl Stream {
    /// A plaintext stream over `socket`.
    pub(crate) fn new(socket: Socket) -> Stream {
        Stream {
            socket,
            tls: OnceLock::new(),
        }
    }

    /// From now on every byte goes through `session` (whose handshake is complete).
    pub(crate) fn start_tls(&self, session: TlsSession) {
        let _ = self.tls.set(session);
    }

    /// The socket itself, below any TLS.
    pub(crate) fn raw(&self) -> RawSocket<'_> {
        RawSocket(&self.socket)
    }

    /// Closes both directions, even while other references to the socket exist.
    pub(crate) fn shutdown_both(&self) {
        let _ = match &self.socket {
            Socket::Unix(s) => s.shutdown(Shutdown::Both),
            Socket::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }

    /// Makes pending and future reads return end-of-file; replies can still be sent.
    pub(crate) fn shutdown_read(&self) {
        let _ = match &self.socket {
            Socket::Unix(s) => s.shutdown(Shutdown::Read),
            Socket::Tcp(s) => s.shutdown(Shutdown::Read),
        };
    }

    /// Clears O_NONBLOCK (accepted sockets may inherit it from the listener).
    pub(crate) fn set_blocking(&self) -> io::Result<()> {
        match &self.socket {
            Socket::Unix(s) => s.set_nonblocking(false),
            Socket::Tcp(s) => s.set_nonblocking(false),
        }
    }

    /// Bounds every blocking write (`None`: no bound); a write that times out fails.
    pub(crate) fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match &self.socket {
            Socket::Unix(s) => s.set_write_timeout(timeout),
            Socket::Tcp(s) => s.set_write_timeout(timeout),
        }
    }

    /// Bounds every blocking read (`None`: no bound); a read that times out fails with
    /// `WouldBlock`.
    pub(crate) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match &self.socket {
            Socket::Unix(s) => s.set_read_timeout(timeout),
            Socket::Tcp(s) => s.set_read_timeout(timeout),
        }
    }

    /// Whether bytes wait in the TLS session, where polling the socket does not see them.
    pub(crate) fn buffered(&self) -> bool {
        self.tls.get().is_some_and(TlsSession::buffered)
    }

    /// Whether bytes (or end-of-file) can be read right now without blocking.
    pub(crate) fn readable_now(&self) -> bool {
        if self.buffered() {
            return true;
        }
        let mut pfd = libc::pollfd {
            fd: self.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: pfd is a valid pollfd for the duration of the call; timeout 0.
        unsafe { libc::poll(&mut pfd, 1, 0) > 0 }
    }
}

/// The socket below any TLS, as a reader and writer.
pub(crate) struct RawSocket<'a>(&'a Socket);

impl Read for RawSocket<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.0 {
            Socket::Unix(s) => (&*s).read(buf),
            Socket::Tcp(s) => (&*s).read(buf),
        }
    }
}

impl Write for RawSocket<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.0 {
            Socket::Unix(s) => (&*s).write(buf),
            Socket::Tcp(s) => (&*s).write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self.0 {
            Socket::Unix(s) => (&*s).write_vectored(bufs),
            Socket::Tcp(s) => (&*s).write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match &self.socket {
            Socket::Unix(s) => s.as_fd(),
            Socket::Tcp(s) => s.as_fd(),
        }
    }
}

impl Read for &Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.tls.get() {
            Some(tls) => tls.read(self.raw(), buf),
            None => self.raw().read(buf),
        }
    }
}

impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.tls.get() {
            Some(tls) => tls.write(self.raw(), &[io::IoSlice::new(buf)]),
            None => self.raw().write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self.tls.get() {
            Some(tls) => tls.write(self.raw(), bufs),
            None => self.raw().write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The socket seen through a deadline: every read and write waits at most until
/// `deadline`, then fails with `TimedOut`. This is what bounds a client that starts a message and stalls
/// (it holds a pool worker, so it must not hold it for long). Used in the handshake; the
/// transmission phase reads through [`Patient`].
pub(crate) struct Timed<'a> {
    pub(crate) stream: &'a Stream,
    pub(crate) deadline: Instant,
}

impl Read for Timed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some(self.remaining()?))?;
        match self.stream.read(buf) {
            // SO_RCVTIMEO expiring shows as EAGAIN.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(timed_out()),
            other => other,
        }
    }
}

impl Timed<'_> {
    fn remaining(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        Ok(left)
    }
}

/// The socket as a connection's reader thread reads it, its receive timeout set once (not
/// per read, which cost a system call each): a read that times out before any byte of a
/// request arrived reports `WouldBlock` (the connection is quiet; [`Patient::began`] is
/// false); once a request has begun, timed-out reads are retried until it has stalled for
/// `limit`, then fail with `TimedOut`.
pub(crate) struct Patient<'a> {
    stream: &'a Stream,
    limit: Duration,
    began: bool,
    deadline: Option<Instant>,
}

impl<'a> Patient<'a> {
    pub(crate) fn new(stream: &'a Stream, limit: Duration) -> Self {
        Patient {
            stream,
            limit,
            began: false,
            deadline: None,
        }
    }

    /// Whether any byte was read through it.
    pub(crate) fn began(&self) -> bool {
        self.began
    }
}

impl Read for Patient<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.stream.read(buf) {
                Ok(n) => {
                    self.began |= n > 0;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.began => {
                    // The deadline starts at the first stall: the clock is read only then.
                    let now = Instant::now();
                    let deadline = *self.deadline.get_or_insert(now + self.limit);
                    if now >= deadline {
                        return Err(timed_out());
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "client did not take part in time")
}

/// Writes are bounded by the deadline as well: a client that does not read its replies
/// must not hold a worker either.
impl Write for Timed<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.remaining()?))?;
        match self.stream.write(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(timed_out()),
            other => other,
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.remaining()?))?;
        match self.stream.write_vectored(bufs) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(timed_out()),
            other => other,
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

pub(crate) fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

pub(crate) fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

/// Reads and drops `len` bytes.
pub(crate) fn skip(r: &mut impl Read, len: u64) -> io::Result<()> {
    let copied = io::copy(&mut r.take(len), &mut io::sink())?;
    if copied < len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}
