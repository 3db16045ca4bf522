//! TLS for the NBD server: `NBD_OPT_STARTTLS` with rustls on the AWS-LC provider.
//!
//! Certificates are found as nbdkit finds them with `--tls-certificates DIR`: the server's
//! chain in `DIR/server-cert.pem`, its key in `DIR/server-key.pem`, and the certificate
//! authority that signs client certificates in `DIR/ca-cert.pem` (read only when client
//! certificates are verified).
//!
//! After STARTTLS one connection is read by one worker at a time and written by the reply
//! jobs of its requests at the same time, but a rustls connection is one state machine.
//! [`TlsSession`] therefore keeps the socket I/O outside the state machine's lock: a reader
//! waits on the socket without the lock and feeds what arrived into the state machine; a
//! writer encrypts under the lock and sends the records under a separate send lock that
//! keeps records on the wire in the order they were sealed.

use std::fs;
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};

use super::lock;
use crate::error::ExportError;

/// Whether and how an NBD server offers TLS, with nbdkit's meaning of `--tls`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// No TLS: `NBD_OPT_STARTTLS` is not supported.
    Off,
    /// TLS offered, plaintext clients served too.
    On,
    /// Every client must start TLS before anything else (other options get
    /// `NBD_REP_ERR_TLS_REQD`, `NBD_OPT_EXPORT_NAME` closes the connection).
    Require,
}

impl std::str::FromStr for TlsMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "off" => Ok(TlsMode::Off),
            "on" => Ok(TlsMode::On),
            "require" => Ok(TlsMode::Require),
            _ => Err(format!("invalid TLS mode '{text}': use off, on or require")),
        }
    }
}

/// The TLS an NBD server offers ([`super::NbdConfig::tls`]).
#[derive(Clone, Debug)]
pub struct NbdTls {
    /// Plaintext clients are refused ([`TlsMode::Require`]) or served too ([`TlsMode::On`]).
    pub require: bool,
    /// Client certificates are verified against the CA (nbdkit's `--tls-verify-peer`).
    pub verify_peer: bool,
    /// The rustls server configuration every STARTTLS uses.
    pub config: Arc<ServerConfig>,
}

impl NbdTls {
    /// Loads `dir/server-cert.pem` and `dir/server-key.pem` (and `dir/ca-cert.pem` when
    /// `verify_peer`: then a client without a certificate that CA signed fails the TLS
    /// handshake, before any option is read).
    pub fn from_dir(dir: &Path, require: bool, verify_peer: bool) -> Result<NbdTls, ExportError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let certs = load_certs(&dir.join("server-cert.pem"))?;
        let key_path = dir.join("server-key.pem");
        let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| {
            ExportError::Config(format!("reading TLS key {}: {e}", key_path.display()))
        })?;
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| ExportError::Config(format!("TLS setup: {e}")))?;
        let builder = if verify_peer {
            let ca_path = dir.join("ca-cert.pem");
            let mut roots = RootCertStore::empty();
            for cert in load_certs(&ca_path)? {
                roots.add(cert).map_err(|e| {
                    ExportError::Config(format!("TLS CA {}: {e}", ca_path.display()))
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| ExportError::Config(format!("TLS client verifier: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let config = builder.with_single_cert(certs, key).map_err(|e| {
            ExportError::Config(format!("TLS certificate and key in {}: {e}", dir.display()))
        })?;
        Ok(NbdTls {
            require,
            verify_peer,
            config: Arc::new(config),
        })
    }
}

/// Every certificate in a PEM file (at least one).
pub(crate) fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, ExportError> {
    let bad =
        |e: String| ExportError::Config(format!("reading TLS certificate {}: {e}", path.display()));
    let pem = fs::read(path).map_err(|e| bad(e.to_string()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no certificate in it".to_string()));
    }
    Ok(certs)
}

/// The TLS state of one connection after STARTTLS (see the module's notes on locking).
pub(crate) struct TlsSession {
    conn: Mutex<Sealed>,
    /// Held from sealing records until they are on the socket.
    send: Mutex<()>,
}

struct Sealed {
    conn: ServerConnection,
    /// Received records not yet taken by the state machine (its plaintext buffer was full).
    pending: Vec<u8>,
}

impl TlsSession {
    /// A session whose handshake has completed.
    pub(crate) fn new(mut conn: ServerConnection) -> TlsSession {
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
    pub(crate) fn buffered(&self) -> bool {
        let mut s = lock(&self.conn);
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
    pub(crate) fn read(&self, mut socket: impl Read + Write, buf: &mut [u8]) -> io::Result<usize> {
        let mut raw = vec![0u8; 16 << 10];
        loop {
            let wants_write = {
                let mut s = lock(&self.conn);
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
            let mut s = lock(&self.conn);
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
    pub(crate) fn write(
        &self,
        socket: impl Read + Write,
        bufs: &[io::IoSlice<'_>],
    ) -> io::Result<usize> {
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
    fn send_sealed(
        &self,
        socket: &mut impl Write,
        fill: impl FnOnce(&mut ServerConnection) -> io::Result<()>,
    ) -> io::Result<()> {
        let _send = lock(&self.send);
        let mut out = Vec::new();
        {
            let mut s = lock(&self.conn);
            fill(&mut s.conn)?;
            while s.conn.wants_write() {
                s.conn.write_tls(&mut out)?;
            }
        }
        socket.write_all(&out)
    }
}

fn process(conn: &mut ServerConnection) -> io::Result<()> {
    conn.process_new_packets()
        .map(|_| ())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}")))
}
