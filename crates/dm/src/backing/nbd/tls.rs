//! A TLS session shared by one connection's reader and its writers, for the NBD server
//! (`cryptblk-export`) and the NBD client backing.
//!
//! After STARTTLS one NBD connection is read by one thread and written by others at the
//! same time, but a rustls connection is one state machine. [`TlsSession`] keeps the socket
//! I/O outside the state machine's lock: a reader waits on the socket without the lock and
//! feeds what arrived into the state machine; a writer encrypts under the lock and sends the
//! records under a separate send lock that keeps records on the wire in the order they were
//! sealed.

use std::io::{self, Read, Write};
use std::sync::{Mutex, MutexGuard};

use rustls::Connection;

fn lock_ok<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The TLS state of one NBD connection after STARTTLS, client's or server's (see the
/// module's notes on locking).
pub struct TlsSession {
    conn: Mutex<Sealed>,
    /// Held from sealing records until they are on the socket.
    send: Mutex<()>,
}

struct Sealed {
    conn: Connection,
    /// Received records not yet taken by the state machine (its plaintext buffer was full).
    pending: Vec<u8>,
}

impl TlsSession {
    /// A session whose handshake has completed.
    pub fn new(mut conn: Connection) -> TlsSession {
        // Replies are sealed whole and sent outside the lock (see send_sealed), so the
        // state machine must not refuse plaintext for lack of buffer.
        conn.set_buffer_limit(None);
        TlsSession {
            conn: Mutex::new(Sealed {
                conn,
                pending: Vec::new(),
            }),
            send: Mutex::new(()),
        }
    }

    /// Whether decrypted or received bytes wait here, where polling the socket cannot see
    /// them.
    pub fn buffered(&self) -> bool {
        let mut s = lock_ok(&self.conn);
        if !s.pending.is_empty() {
            return true;
        }
        // An error is "buffered" too: the reader must run to see it and close.
        s.conn
            .process_new_packets()
            .map_or(true, |st| st.plaintext_bytes_to_read() > 0)
    }

    /// Reads plaintext, reading records from `socket` when none is decrypted yet. Blocks
    /// (bounded by the socket's timeouts) without holding the state machine's lock.
    pub fn read(&self, mut socket: impl Read + Write, buf: &mut [u8]) -> io::Result<usize> {
        let mut raw = vec![0u8; 16 << 10];
        loop {
            let wants_write = {
                let mut s = lock_ok(&self.conn);
                match s.conn.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if !s.pending.is_empty() {
                    let Sealed { conn, pending } = &mut *s;
                    let taken = conn.read_tls(&mut &pending[..])?;
                    pending.drain(..taken);
                    process(conn)?;
                    continue;
                }
                s.conn.wants_write()
            };
            if wants_write {
                // E.g. the answer to a key update: sent before waiting for more.
                self.send_sealed(&mut socket, |_| Ok(()))?;
            }
            let n = socket.read(&mut raw)?;
            let mut s = lock_ok(&self.conn);
            let Sealed { conn, pending } = &mut *s;
            if n == 0 {
                // End of file: the state machine reports a close without close_notify as
                // UnexpectedEof, and a clean close as Ok(0) from the reader.
                conn.read_tls(&mut io::empty())?;
                process(conn)?;
                continue;
            }
            let mut data = &raw[..n];
            while !data.is_empty() {
                match conn.read_tls(&mut data) {
                    Ok(_) => process(conn)?,
                    // The plaintext buffer is full: keep the rest for after it is read.
                    Err(e) if e.kind() == io::ErrorKind::Other => break,
                    Err(e) => return Err(e),
                }
            }
            pending.extend_from_slice(data);
        }
    }

    /// Encrypts `bufs` and sends the records on `socket`; returns the plaintext length.
    pub fn write(&self, socket: impl Read + Write, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut socket = socket;
        self.send_sealed(&mut socket, |conn| {
            for buf in bufs {
                conn.writer().write_all(buf)?;
            }
            Ok(())
        })?;
        Ok(total)
    }

    /// Seals what `fill` writes (and whatever else the state machine has to send) and sends
    /// it, in order with every other sender.
    pub fn send_sealed(
        &self,
        socket: &mut impl Write,
        fill: impl FnOnce(&mut Connection) -> io::Result<()>,
    ) -> io::Result<()> {
        let _send = lock_ok(&self.send);
        let mut out = Vec::new();
        {
            let mut s = lock_ok(&self.conn);
            fill(&mut s.conn)?;
            while s.conn.wants_write() {
                s.conn.write_tls(&mut out)?;
            }
        }
        socket.write_all(&out)
    }
}

fn process(conn: &mut Connection) -> io::Result<()> {
    conn.process_new_packets()
        .map(|_| ())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}")))
}
