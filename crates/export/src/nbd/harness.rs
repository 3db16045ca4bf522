//! The protocol code driven from memory instead of a socket: what the fuzz targets run.
//! Requests execute one after the other on the calling thread, through the same handshake,
//! request parsing, execution and reply code as the server.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use cryptblk_dm::device::BlockDevice;
use polling::Poller;

use super::conn::{serve_requests, serve_sequential, Pool};
use super::transmission::Session;
use super::{validate_block_sizes, NbdConfig, Shared};
use crate::aligned::AlignedIo;
use crate::error::ExportError;

/// An NBD server without sockets or threads: client bytes in, the count of reply bytes out.
pub struct NbdHarness {
    shared: Arc<Shared>,
}

/// Client bytes from a slice; what the server writes is counted and dropped.
struct Duplex<'a> {
    input: &'a [u8],
    written: u64,
}

impl Read for Duplex<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Duplex<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.written += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl NbdHarness {
    /// Serves `device` with `config`'s export settings (its listen address is not used).
    pub fn new(device: Arc<dyn BlockDevice>, mut config: NbdConfig) -> Result<Self, ExportError> {
        // Requests in pieces hand work to the pool, which has no workers here.
        config.overlap_min = 0;
        let io = AlignedIo::new(device);
        let block_sizes = validate_block_sizes(&config, io.block_size(), io.size())?;
        let shared = Shared {
            io,
            config,
            stopping: AtomicBool::new(false),
            block_sizes,
            conns: Mutex::new(HashMap::new()),
            poller: Poller::new().map_err(|e| ExportError::io("creating a poller", e))?,
            // No workers: nothing is submitted on this path.
            pool: Pool::new(0),
            readers: Default::default(),
        };
        Ok(NbdHarness {
            shared: Arc::new(shared),
        })
    }

    /// A whole client session from `input`: greeting, option haggling, then requests.
    /// Returns how many bytes the server wrote, or the error that ended the session.
    pub fn session(&self, input: &[u8]) -> io::Result<u64> {
        let mut duplex = Duplex { input, written: 0 };
        serve_sequential(&mut duplex, &self.shared)?;
        Ok(duplex.written)
    }

    /// The transmission phase alone, as negotiated with structured replies, the block-size
    /// agreement and the `base:allocation` context as given.
    pub fn requests(
        &self,
        structured: bool,
        strict: bool,
        block_status: bool,
        input: &[u8],
    ) -> io::Result<u64> {
        let mut duplex = Duplex { input, written: 0 };
        let session = Session {
            structured,
            strict,
            block_status,
        };
        serve_requests(&mut duplex, &self.shared, session)?;
        Ok(duplex.written)
    }
}
