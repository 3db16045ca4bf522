//! One client connection and the worker pool that serves all of them.
//!
//! A connection holds no thread of its own. The event loop (in `mod.rs`) watches its socket
//! and, when bytes arrive, hands it to the pool for one step: a handshake message, or the
//! transmission requests that are ready. Each request then runs as its own pool job, so a
//! connection has up to `max_in_flight` requests executing at once and their replies go out
//! in completion order, as the protocol allows (each reply is written whole under the
//! connection's writer lock). The exception is a lone request (none other in flight, no
//! more bytes waiting): the worker that read it executes it, so a queue-depth-1 client pays
//! one thread wake-up per round trip, not two. While a step or the in-flight cap keeps the connection busy
//! it is not armed in the event loop, which keeps a connection's requests read in order by
//! one worker at a time.

use std::collections::BTreeSet;
use std::io::{self, Read, Write};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::handshake::{Handshake, Negotiated};
use super::tls::TlsSession;
use super::transmission::{Incoming, Received, Session};
use super::wire::{Stream, Timed};
use super::{lock, Shared};

/// Once a request has begun to arrive, the rest of it (header and write payload) must
/// arrive within this time: a client stalling mid-request holds a pool worker.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A reply that cannot be written for this long (the client stopped reading) fails and
/// closes the connection, so such a client cannot pin pool workers.
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// A connection stops taking requests while those in flight hold this much data (write
/// payloads read ahead, read buffers), so a client pipelining large requests cannot make
/// the server buffer `max_in_flight` times the maximum block size.
const MAX_IN_FLIGHT_BYTES: u64 = 64 << 20;

type Job = Box<dyn FnOnce() + Send>;

/// A fixed set of worker threads taking jobs in submission order.
///
/// First in, first out matters: a FLUSH job waits for the writes received before it, and
/// those were submitted before it, so they are already running when it starts waiting.
pub(crate) struct Pool {
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Pool {
    pub(crate) fn new(workers: usize) -> io::Result<Pool> {
        let (sender, receiver) = mpsc::channel::<Job>();
        let receiver = Arc::new(Mutex::new(receiver));
        let mut threads = Vec::with_capacity(workers);
        for i in 0..workers {
            let receiver = Arc::clone(&receiver);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("nbd-worker-{i}"))
                    .spawn(move || loop {
                        let job = lock(&receiver).recv();
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    })?,
            );
        }
        Ok(Pool {
            sender: Mutex::new(Some(sender)),
            threads: Mutex::new(threads),
        })
    }

    /// Queues a job; after [`Pool::join`] jobs are dropped.
    pub(crate) fn submit(&self, job: Job) {
        if let Some(sender) = lock(&self.sender).as_ref() {
            let _ = sender.send(job);
        }
    }

    /// Lets the workers finish the queued jobs, then ends them.
    pub(crate) fn join(&self) {
        drop(lock(&self.sender).take());
        for thread in std::mem::take(&mut *lock(&self.threads)) {
            let _ = thread.join();
        }
    }
}

/// A client connection.
pub(crate) struct Conn {
    /// The event loop's key for this connection.
    pub(crate) key: usize,
    pub(crate) stream: Stream,
    /// Held while one reply is written, so replies never interleave.
    writer: Mutex<()>,
    pub(crate) state: Mutex<ConnState>,
    /// Signalled whenever a request completes (FLUSH waits on it).
    completed: Condvar,
}

/// What the event loop and the workers know about a connection.
pub(crate) struct ConnState {
    /// The handshake in progress (taken out while a worker runs a step).
    handshake: Option<Handshake>,
    /// Set once the transmission phase began.
    session: Option<Session>,
    /// A worker is reading from the socket; the connection is not armed.
    pub(crate) busy: bool,
    /// Not armed because `max_in_flight` requests are executing; the next completion
    /// re-arms it.
    throttled: bool,
    /// No more requests will be read (end-of-file, disconnect, error, stop): the connection
    /// closes when the last request in flight has replied.
    reading_done: bool,
    pub(crate) closed: bool,
    in_flight: usize,
    /// Data held by the requests in flight (see `MAX_IN_FLIGHT_BYTES`).
    in_flight_bytes: u64,
    next_seq: u64,
    /// Sequence numbers of writes (WRITE, WRITE_ZEROES, TRIM) still executing.
    pending_writes: BTreeSet<u64>,
    /// When the handshake must be finished.
    pub(crate) handshake_deadline: Option<Instant>,
    /// When the last request was received or answered.
    pub(crate) last_active: Instant,
}

impl ConnState {
    /// When the event loop should close this connection if nothing happens: at the end of
    /// the handshake time, or after `idle` without requests in transmission.
    pub(crate) fn deadline(&self, idle: Option<Duration>) -> Option<Instant> {
        if self.closed || self.busy {
            return None;
        }
        if self.handshake.is_some() {
            return self.handshake_deadline;
        }
        match (self.session, idle) {
            (Some(_), Some(idle)) if self.in_flight == 0 && !self.throttled => {
                Some(self.last_active + idle)
            }
            _ => None,
        }
    }

    /// Whether the connection is still negotiating.
    pub(crate) fn in_handshake(&self) -> bool {
        self.session.is_none()
    }
}

impl Conn {
    /// A new connection whose greeting has been sent.
    pub(crate) fn new(key: usize, stream: Stream, handshake: Handshake, deadline: Instant) -> Conn {
        Conn {
            key,
            stream,
            writer: Mutex::new(()),
            state: Mutex::new(ConnState {
                handshake: Some(handshake),
                session: None,
                busy: false,
                throttled: false,
                reading_done: false,
                closed: false,
                in_flight: 0,
                in_flight_bytes: 0,
                next_seq: 0,
                pending_writes: BTreeSet::new(),
                handshake_deadline: Some(deadline),
                last_active: Instant::now(),
            }),
            completed: Condvar::new(),
        }
    }

    /// Stops reading (server stop): requests in flight still reply, then it closes.
    pub(crate) fn stop_reading(self: &Arc<Self>, shared: &Shared) {
        self.stream.shutdown_read();
        let mut state = lock(&self.state);
        state.reading_done = true;
        let idle = !state.busy && state.in_flight == 0;
        drop(state);
        if idle {
            self.close(shared);
        }
    }

    /// Closes the connection: forgets it, stops watching it and shuts the socket down (the
    /// descriptor itself closes when the last job holding the connection ends).
    pub(crate) fn close(&self, shared: &Shared) {
        {
            let mut state = lock(&self.state);
            if state.closed {
                return;
            }
            state.closed = true;
        }
        lock(&shared.conns).remove(&self.key);
        let _ = shared.poller.delete(&self.stream);
        self.stream.shutdown_both();
    }

    /// Runs the server's side of the TLS handshake (within the option haggling's deadline)
    /// and switches the stream to it.
    fn start_tls(&self, shared: &Shared, deadline: Instant) -> io::Result<()> {
        let tls = shared
            .config
            .tls
            .as_ref()
            .ok_or_else(|| io::Error::other("TLS is not configured"))?;
        let mut server =
            rustls::ServerConnection::new(Arc::clone(&tls.config)).map_err(io::Error::other)?;
        let mut timed = Timed {
            stream: &self.stream,
            deadline,
        };
        while server.is_handshaking() {
            server.complete_io(&mut timed)?;
        }
        while server.wants_write() {
            server.write_tls(&mut timed)?;
        }
        self.stream
            .start_tls(TlsSession::new(rustls::Connection::Server(server)));
        Ok(())
    }

    /// Watches the socket again for the next message. Bytes already decrypted by TLS do
    /// not make the socket readable, so they are served at once instead.
    fn rearm(self: &Arc<Self>, shared: &Arc<Shared>) {
        if self.stream.buffered() {
            let mut state = lock(&self.state);
            if state.closed || state.busy {
                return;
            }
            state.busy = true;
            drop(state);
            let conn = Arc::clone(self);
            let job_shared = Arc::clone(shared);
            shared
                .pool
                .submit(Box::new(move || conn.on_readable(&job_shared)));
            return;
        }
        let event = polling::Event::readable(self.key);
        if let Err(e) = shared.poller.modify(&self.stream, event) {
            // Only fails for a connection closed meanwhile.
            log::debug!("NBD connection {}: cannot re-arm: {e}", self.key);
        }
    }

    /// Runs when the socket has bytes to read (the event loop set `busy`).
    pub(crate) fn on_readable(self: &Arc<Self>, shared: &Arc<Shared>) {
        let (handshake, session, deadline) = {
            let mut state = lock(&self.state);
            (
                state.handshake.take(),
                state.session,
                state.handshake_deadline,
            )
        };
        if let Some(mut handshake) = handshake {
            let mut timed = Timed {
                stream: &self.stream,
                deadline: deadline.unwrap_or_else(Instant::now),
            };
            match handshake.step(&mut timed, shared) {
                Ok(None) => lock(&self.state).handshake = Some(handshake),
                Ok(Some(Negotiated::Transmission(session))) => {
                    // Replies are written without the handshake's deadline from now on.
                    if let Err(e) = self.stream.set_write_timeout(Some(REPLY_TIMEOUT)) {
                        log::info!("NBD connection {}: {e}", self.key);
                        return self.close(shared);
                    }
                    let mut state = lock(&self.state);
                    state.session = Some(session);
                    state.handshake_deadline = None;
                    state.last_active = Instant::now();
                }
                Ok(Some(Negotiated::Close)) => return self.close(shared),
                Ok(Some(Negotiated::StartTls)) => {
                    if let Err(e) = self.start_tls(shared, timed.deadline) {
                        log::info!("NBD connection {}: TLS handshake failed: {e}", self.key);
                        return self.close(shared);
                    }
                    handshake.tls_started();
                    lock(&self.state).handshake = Some(handshake);
                }
                Err(e) => {
                    log::info!("NBD connection {} closed in the handshake: {e}", self.key);
                    return self.close(shared);
                }
            }
            return self.release(shared);
        }
        let Some(session) = session else {
            return self.close(shared);
        };
        loop {
            let mut timed = Timed {
                stream: &self.stream,
                deadline: Instant::now() + REQUEST_TIMEOUT,
            };
            let (incoming, then_close) = match session.receive(shared, &mut timed) {
                Ok(Received::Request {
                    incoming,
                    then_close,
                }) => (incoming, then_close),
                Ok(Received::Disconnect) | Ok(Received::Eof) => return self.finish_reading(shared),
                Err(e) => {
                    log::info!("NBD connection {} closed: {e}", self.key);
                    return self.finish_reading(shared);
                }
            };
            let bytes = incoming.buffer_len();
            let seq = {
                let mut state = lock(&self.state);
                state.in_flight_bytes += bytes;
                let seq = state.next_seq;
                state.next_seq += 1;
                if incoming.is_write() {
                    state.pending_writes.insert(seq);
                }
                state.in_flight += 1;
                state.last_active = Instant::now();
                seq
            };
            // A lone request with nothing behind it (a client at queue depth 1) runs right
            // here: handing it to another worker would add a thread wake-up to every round
            // trip, the queueing cost this project exists to avoid. Anything pipelined goes
            // to the pool, so requests still overlap.
            let lone =
                !then_close && lock(&self.state).in_flight == 1 && !self.stream.readable_now();
            if lone {
                // Watch the socket first: a request that arrives while this one runs (a slow
                // backing, a pipelining client) is read by another worker, not held behind it.
                self.release(shared);
                return self.execute(shared, session, incoming, seq, bytes);
            }
            // Submitted before anything else is read, so jobs queue in request order.
            let conn = Arc::clone(self);
            let job_shared = Arc::clone(shared);
            shared.pool.submit(Box::new(move || {
                conn.execute(&job_shared, session, incoming, seq, bytes)
            }));
            if then_close {
                return self.finish_reading(shared);
            }
            {
                let mut state = lock(&self.state);
                let full = state.in_flight >= shared.config.max_in_flight.max(1)
                    || state.in_flight_bytes >= MAX_IN_FLIGHT_BYTES;
                if full && !state.reading_done {
                    // The completion that brings it under the cap re-arms it.
                    state.throttled = true;
                    state.busy = false;
                    return;
                }
            }
            // Take every request that is already there before going back to the event loop.
            if !self.stream.readable_now() {
                break;
            }
        }
        self.release(shared);
    }

    /// A worker is done reading: watch the socket again, or close if the connection stopped
    /// reading meanwhile (server stop) and nothing is in flight.
    fn release(self: &Arc<Self>, shared: &Arc<Shared>) {
        let mut state = lock(&self.state);
        state.busy = false;
        if state.reading_done {
            let done = state.in_flight == 0;
            drop(state);
            if done {
                self.close(shared);
            }
            return;
        }
        drop(state);
        self.rearm(shared);
    }

    /// No more requests: close now, or when the last request in flight has replied.
    fn finish_reading(&self, shared: &Shared) {
        let mut state = lock(&self.state);
        state.reading_done = true;
        state.busy = false;
        let done = state.in_flight == 0;
        drop(state);
        if done {
            self.close(shared);
        }
    }

    /// Executes one request and sends its reply (a pool job).
    fn execute(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        session: Session,
        incoming: Incoming,
        seq: u64,
        bytes: u64,
    ) {
        if incoming.is_flush() {
            // NBD's flush covers every write completed before it was received; waiting for
            // all writes received before it (possibly still executing) covers at least that.
            let state = lock(&self.state);
            let state = self
                .completed
                .wait_while(state, |s| s.pending_writes.range(..seq).next().is_some())
                .unwrap_or_else(|e| e.into_inner());
            drop(state);
        }
        if let Some(pieces) = session.read_in_pieces(shared, &incoming) {
            // A large read: each piece goes out as its own chunk as soon as it is ready,
            // while helpers read and decrypt the later ones; other replies may go out
            // between the chunks (structured replies allow it).
            let handle = incoming.handle();
            drop(incoming);
            for k in 0..pieces.count() {
                let result = pieces.wait(&shared.io, k);
                let _writer = lock(&self.writer);
                match session.send_read_piece(handle, &pieces, k, result, &mut &self.stream) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        log::info!("NBD connection {}: reply failed: {e}", self.key);
                        self.stream.shutdown_both();
                        break;
                    }
                }
            }
        } else {
            let reply = session.process(shared, incoming);
            {
                let _writer = lock(&self.writer);
                if let Err(e) = session.send(&reply, &mut &self.stream) {
                    log::info!("NBD connection {}: reply failed: {e}", self.key);
                    // Unblocks the reader too; the connection closes when its requests end.
                    self.stream.shutdown_both();
                }
            }
            drop(reply);
        }
        let mut state = lock(&self.state);
        state.in_flight -= 1;
        state.in_flight_bytes -= bytes;
        state.pending_writes.remove(&seq);
        state.last_active = Instant::now();
        self.completed.notify_all();
        if state.reading_done && state.in_flight == 0 && !state.busy {
            drop(state);
            return self.close(shared);
        }
        let full = state.in_flight >= shared.config.max_in_flight.max(1)
            || state.in_flight_bytes >= MAX_IN_FLIGHT_BYTES;
        if state.throttled && !full && !state.reading_done {
            state.throttled = false;
            drop(state);
            self.rearm(shared);
        }
    }
}

/// Serves one client over any stream, one request after the other on the calling thread,
/// with the same handshake, request and reply code as the server. Used to drive the
/// protocol code from memory (fuzzing); ends at end of input, an error or a disconnect.
pub(crate) fn serve_sequential<S: Read + Write>(
    stream: &mut S,
    shared: &Arc<Shared>,
) -> io::Result<()> {
    let mut handshake = Handshake::start(stream)?;
    let session = loop {
        match handshake.step(stream, shared)? {
            None => {}
            // No TLS without a socket: the fuzzed sessions end there.
            Some(Negotiated::Close) | Some(Negotiated::StartTls) => return Ok(()),
            Some(Negotiated::Transmission(session)) => break session,
        }
    };
    serve_requests(stream, shared, session)
}

/// The transmission phase of [`serve_sequential`].
pub(crate) fn serve_requests<S: Read + Write>(
    stream: &mut S,
    shared: &Arc<Shared>,
    session: Session,
) -> io::Result<()> {
    loop {
        match session.receive(shared, stream)? {
            Received::Request {
                incoming,
                then_close,
            } => {
                let reply = session.process(shared, incoming);
                session.send(&reply, stream)?;
                if then_close {
                    return Ok(());
                }
            }
            Received::Disconnect | Received::Eof => return Ok(()),
        }
    }
}
