//! The byte level below the protocol phases: the client socket and the big-endian integer
//! readers that the handshake and the transmission phase share.
//!
//! Kept apart from `conn` (which drives a connection through both phases) so that the phases
//! import these helpers from below rather than from the module that calls them.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// A connected client socket. Reading and writing go through `&Stream` so that one file
/// descriptor serves the connection's reader and its reply writers at the same time.
pub(crate) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    /// Closes both directions, even while other references to the socket exist.
    pub(crate) fn shutdown_both(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }

    /// Makes pending and future reads return end-of-file; replies can still be sent.
    pub(crate) fn shutdown_read(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(Shutdown::Read),
            Stream::Tcp(s) => s.shutdown(Shutdown::Read),
        };
    }

    /// Clears O_NONBLOCK (accepted sockets may inherit it from the listener).
    pub(crate) fn set_blocking(&self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_nonblocking(false),
            Stream::Tcp(s) => s.set_nonblocking(false),
        }
    }

    /// Bounds every blocking write (`None`: no bound); a write that times out fails.
    pub(crate) fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_write_timeout(timeout),
            Stream::Tcp(s) => s.set_write_timeout(timeout),
        }
    }

    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(timeout),
            Stream::Tcp(s) => s.set_read_timeout(timeout),
        }
    }

    /// Whether bytes (or end-of-file) can be read right now without blocking.
    pub(crate) fn readable_now(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: pfd is a valid pollfd for the duration of the call; timeout 0.
        unsafe { libc::poll(&mut pfd, 1, 0) > 0 }
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Unix(s) => s.as_fd(),
            Stream::Tcp(s) => s.as_fd(),
        }
    }
}

impl Read for &Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => (&*s).read(buf),
            Stream::Tcp(s) => (&*s).read(buf),
        }
    }
}

impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => (&*s).write(buf),
            Stream::Tcp(s) => (&*s).write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => (&*s).write_vectored(bufs),
            Stream::Tcp(s) => (&*s).write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The socket seen through a deadline: every read and write waits at most until
/// `deadline`, then fails with `TimedOut`. This is what bounds a client that starts a message and stalls
/// (it holds a pool worker, so it must not hold it for long).
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
