//! One client connection, its reader thread, and the worker pool the connections share.
//!
//! Option haggling runs on the pool, one message per job, as the event loop (in `mod.rs`)
//! sees bytes arrive. Once in transmission a busy connection has a reader thread of its own
//! that blocks in `read` on the socket (its receive timeout set once, never per read): a
//! client at queue depth 1 then costs no thread hand-off at all, since a lone request (none
//! other in flight, no more bytes waiting) runs right on the reader, which replies and reads
//! the next one. When several requests are in flight the reader hands each to the pool, so
//! they execute concurrently and reply in completion order, as the protocol allows (each
//! reply is written whole under the connection's writer lock); it stops reading at
//! `max_in_flight` until a completion makes room. A reader that sees no request for
//! [`PARK_AFTER`] (or the idle timeout, if shorter) gives the connection back to the event
//! loop and ends, so an idle connection costs a file descriptor, not a thread.
//!
//! A lone request that runs long (a slow or stuck backing) must not hold up requests the
//! client sends meanwhile: the event loop checks the readers every [`INLINE_CHECK`] and,
//! once a lone request has run for [`INLINE_HANDOFF`], starts a new reader for the
//! connection; the old one ends after its request. Measured (issue 15, `strace -c -f` of the
//! daemon under fio's nbd engine, rw 4 KiB at queue depth 1): the event-loop design paid
//! 6.7 futex, 3 epoll_ctl and 1.5 setsockopt calls per request.

use std::collections::BTreeSet;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::handshake::{Handshake, Negotiated};
use super::tls::TlsSession;
use super::transmission::{Incoming, Received, Session};
use super::wire::{Patient, Stream, Timed};
use super::{lock, Shared};

/// Once a request has begun to arrive, a stall in the rest of it (header and write payload)
/// may last this long before the connection is closed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A reader thread that sees no request for this long (or the idle timeout, if shorter)
/// gives its connection back to the event loop and ends. It is also the socket's receive
/// timeout, set once per reader.
pub(crate) const PARK_AFTER: Duration = Duration::from_secs(1);

/// A lone request running on its reader this long gets a new reader started beside it, so
/// requests the client sends meanwhile are read and served (see the module notes).
pub(crate) const INLINE_HANDOFF: Duration = Duration::from_millis(2);

/// A connection that had several requests in flight within its last this many requests is
/// taken to be pipelining: its lone requests go to the pool as well. Run on the reader, a
/// lone request of a pipelining client (its others just answered, the next not sent yet)
/// would hold the next ones back, most of all a large read whose reply blocks in `write`
/// until the client takes it; a client at queue depth 1 never has two in flight.
const PIPELINED_WITHIN: u64 = 64;

/// How often the event loop looks for lone requests past [`INLINE_HANDOFF`] while reader
/// threads exist.
pub(crate) const INLINE_CHECK: Duration = Duration::from_millis(5);

/// A reply that cannot be written for this long (the client stopped reading) fails and
/// closes the connection, so such a client cannot pin pool workers.
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// A connection stops taking requests while those in flight hold this much data (write
/// payloads read ahead, read buffers), so a client pipelining large requests cannot make
/// the server buffer `max_in_flight` times the maximum block size.
const MAX_IN_FLIGHT_BYTES: u64 = 64 << 20;

type Job = Box<dyn FnOnce() + Send>;

/// A pool worker that has had no job for this long ends; the next job that finds no idle
/// worker starts one again. An idle server then costs no worker threads (issue 28: a
/// thousand idle volumes must not cost sixteen threads each), while a busy one keeps its
/// workers, since a job arrives well within this time.
pub(crate) const WORKER_IDLE_EXIT: Duration = Duration::from_secs(5);

/// Worker threads started on demand, up to a maximum, taking jobs in submission order.
///
/// First in, first out matters: a FLUSH job waits for the writes received before it, and
/// those were submitted before it, so they are already running when it starts waiting. The
/// hot path is the fixed pool's it replaced: a lock-free channel send, the workers taking
/// turns at the receiver. What is new is on the side: a job that finds more jobs queued than
/// workers free starts a worker (up to the maximum), and a worker that has had no job for
/// [`WORKER_IDLE_EXIT`] ends. Measured: a pool with one mutex for queue and workers cost a
/// third of fio's 4 KiB IOPS at iodepth 16 on this loaded 2-CPU machine (a worker
/// preempted while holding the lock stalls the reader). A hand-written pool rather than a
/// crate's: threadpool and rayon keep a fixed set of threads, and the elastic ones are
/// async runtimes' blocking pools.
pub(crate) struct Pool {
    max: usize,
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    receiver: Arc<Mutex<mpsc::Receiver<Job>>>,
    counts: Arc<PoolCounts>,
    /// Workers alive, changed under this lock only (starting one, or one deciding to end),
    /// so that a worker never ends while a job it could take waits with no other worker.
    live: Arc<Mutex<usize>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// Counters read on the hot path without a lock.
struct PoolCounts {
    /// When the pool was made: `last_job` counts from here.
    epoch: Instant,
    /// When a worker last took a job, in milliseconds since `epoch`. Workers wait for the
    /// receiver in turn, so each one's idle time counts from here, not from when it got to
    /// the receiver: an idle pool's workers then end together rather than 5 s apart.
    last_job: AtomicU64,
    /// Jobs sent and not yet taken by a worker.
    queued: AtomicUsize,
    /// Workers waiting at (or on their way to) the receiver.
    idle: AtomicUsize,
}

impl Pool {
    /// A pool of at most `workers` threads; none runs until a job is submitted.
    pub(crate) fn new(workers: usize) -> Pool {
        let (sender, receiver) = mpsc::channel::<Job>();
        Pool {
            max: workers,
            sender: Mutex::new(Some(sender)),
            receiver: Arc::new(Mutex::new(receiver)),
            counts: Arc::new(PoolCounts {
                epoch: Instant::now(),
                last_job: AtomicU64::new(0),
                queued: AtomicUsize::new(0),
                idle: AtomicUsize::new(0),
            }),
            live: Arc::new(Mutex::new(0)),
            threads: Mutex::new(Vec::new()),
        }
    }

    /// Queues a job, starting a worker when there are more jobs than workers free; after
    /// [`Pool::join`] jobs are dropped.
    pub(crate) fn submit(&self, job: Job) {
        {
            let sender = lock(&self.sender);
            let Some(sender) = sender.as_ref() else {
                return;
            };
            self.counts.queued.fetch_add(1, Ordering::SeqCst);
            if sender.send(job).is_err() {
                self.counts.queued.fetch_sub(1, Ordering::SeqCst);
                return;
            }
        }
        if self.counts.queued.load(Ordering::SeqCst) > self.counts.idle.load(Ordering::SeqCst) {
            self.start_worker();
        }
    }

    /// Starts a worker unless the maximum runs already (the job then waits its turn, as in
    /// a fixed pool).
    fn start_worker(&self) {
        let mut live = lock(&self.live);
        if *live >= self.max {
            return;
        }
        let (receiver, counts, live_count) = (
            Arc::clone(&self.receiver),
            Arc::clone(&self.counts),
            Arc::clone(&self.live),
        );
        let spawned = std::thread::Builder::new()
            .name("nbd-worker".to_string())
            .spawn(move || work(&receiver, &counts, &live_count));
        match spawned {
            Ok(thread) => {
                *live += 1;
                drop(live);
                let mut threads = lock(&self.threads);
                threads.retain(|t| !t.is_finished());
                threads.push(thread);
            }
            // The job stays queued for the workers that exist (a later job tries again).
            Err(e) => log::warn!("NBD: cannot start a worker thread: {e}"),
        }
    }

    /// Number of worker threads alive.
    #[cfg(test)]
    pub(crate) fn live(&self) -> usize {
        *lock(&self.live)
    }

    /// Lets the workers finish the queued jobs, then ends them.
    pub(crate) fn join(&self) {
        drop(lock(&self.sender).take());
        for thread in std::mem::take(&mut *lock(&self.threads)) {
            let _ = thread.join();
        }
    }
}

/// A pool worker: takes jobs until the pool is joined or none came for
/// [`WORKER_IDLE_EXIT`].
fn work(receiver: &Mutex<mpsc::Receiver<Job>>, counts: &PoolCounts, live: &Mutex<usize>) {
    loop {
        counts.idle.fetch_add(1, Ordering::SeqCst);
        let job = {
            let receiver = lock(receiver);
            let last = Duration::from_millis(counts.last_job.load(Ordering::Relaxed));
            let idle_for = counts.epoch.elapsed().saturating_sub(last);
            receiver.recv_timeout(WORKER_IDLE_EXIT.saturating_sub(idle_for))
        };
        counts.idle.fetch_sub(1, Ordering::SeqCst);
        match job {
            Ok(job) => {
                counts.queued.fetch_sub(1, Ordering::SeqCst);
                let now = u64::try_from(counts.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
                counts.last_job.store(now, Ordering::Relaxed);
                job();
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Under the lock a submitter takes to start a worker: a job queued before
                // this check is seen here (and taken), one queued after it finds this
                // worker no longer idle and starts another.
                let mut live = lock(live);
                if counts.queued.load(Ordering::SeqCst) == 0 {
                    *live -= 1;
                    return;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                *lock(live) -= 1;
                return;
            }
        }
    }
}

/// The connections' reader threads, joined when the server stops.
#[derive(Default)]
pub(crate) struct Readers {
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Readers {
    /// Whether a reader thread is running (the event loop then checks on lone requests).
    pub(crate) fn any(&self) -> bool {
        lock(&self.threads).iter().any(|t| !t.is_finished())
    }

    /// Whether a reader thread was started (running or finished, not yet pruned by the next
    /// start or joined): what a test can check without racing the reader's parking.
    #[cfg(test)]
    pub(crate) fn started(&self) -> bool {
        !lock(&self.threads).is_empty()
    }

    /// Joins every reader, including any started meanwhile.
    pub(crate) fn join(&self) {
        loop {
            let threads = std::mem::take(&mut *lock(&self.threads));
            if threads.is_empty() {
                return;
            }
            for thread in threads {
                let _ = thread.join();
            }
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
    /// A worker or the reader thread owns the socket's reading side; the connection is not
    /// armed in the event loop.
    pub(crate) busy: bool,
    /// Which reader thread owns reading (a new reader takes the next number; an old one
    /// finding it changed ends).
    reader: u64,
    /// When the lone request running on the reader started, if one is.
    inline_since: Option<Instant>,
    /// Sequence number of the last request read while another was in flight.
    last_pipelined: Option<u64>,
    /// Threads waiting on `completed` (a FLUSH, a reader at the in-flight cap); completions
    /// signal only when there is one, since a signal is a system call.
    waiters: usize,
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
            (Some(_), Some(idle)) if self.in_flight == 0 => Some(self.last_active + idle),
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
                reader: 0,
                inline_since: None,
                last_pipelined: None,
                waiters: 0,
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
        if state.waiters > 0 {
            self.completed.notify_all();
        }
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
        log::info!("NBD connection {}: closed", self.key);
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
            .and_then(|t| t.server_config())
            .ok_or_else(|| io::Error::other("TLS is not configured"))?;
        let mut server =
            rustls::ServerConnection::new(Arc::clone(tls)).map_err(io::Error::other)?;
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
            return self.wake(shared);
        }
        let event = polling::Event::readable(self.key);
        if let Err(e) = shared.poller.modify(&self.stream, event) {
            // Only fails for a connection closed meanwhile.
            log::debug!("NBD connection {}: cannot re-arm: {e}", self.key);
        }
    }

    /// Serves bytes that arrived on a connection whose `busy` the caller has just set: a
    /// handshake message on the pool, or requests on a new reader thread.
    pub(crate) fn wake(self: &Arc<Self>, shared: &Arc<Shared>) {
        if lock(&self.state).session.is_some() {
            return self.start_reader(shared);
        }
        let conn = Arc::clone(self);
        let job_shared = Arc::clone(shared);
        shared
            .pool
            .submit(Box::new(move || conn.on_readable(&job_shared)));
    }

    /// Starts a reader thread that owns reading from now on (`busy` is set).
    pub(crate) fn start_reader(self: &Arc<Self>, shared: &Arc<Shared>) {
        let epoch = {
            let mut state = lock(&self.state);
            state.reader += 1;
            state.inline_since = None;
            state.reader
        };
        self.spawn_reader(shared, epoch);
    }

    /// A lone request that has run on its reader for [`INLINE_HANDOFF`] by `now` gets a new
    /// reader beside it (decided under the state lock, so the old reader, when its request
    /// ends, sees that it was replaced). Otherwise returns when to look again, if ever.
    pub(crate) fn hand_off_if_overdue(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        now: Instant,
    ) -> Option<Instant> {
        let epoch = {
            let mut state = lock(&self.state);
            let since = state.inline_since?;
            if state.closed || state.reading_done {
                return None;
            }
            let due = since + INLINE_HANDOFF;
            if due > now {
                return Some(due);
            }
            state.reader += 1;
            state.inline_since = None;
            state.reader
        };
        log::debug!(
            "NBD connection {}: a request runs long, reading goes on beside it",
            self.key
        );
        self.spawn_reader(shared, epoch);
        None
    }

    fn spawn_reader(self: &Arc<Self>, shared: &Arc<Shared>, epoch: u64) {
        let conn = Arc::clone(self);
        let thread_shared = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-conn-{}", self.key))
            .spawn(move || conn.read_requests(&thread_shared, epoch));
        match spawned {
            Ok(thread) => {
                let mut threads = lock(&shared.readers.threads);
                threads.retain(|t| !t.is_finished());
                threads.push(thread);
            }
            Err(e) => {
                log::warn!(
                    "NBD connection {}: cannot start its reader thread: {e}",
                    self.key
                );
                self.stream.shutdown_both();
                self.finish_reading(shared);
            }
        }
    }

    /// Runs when the socket has handshake bytes to read (the event loop set `busy`).
    pub(crate) fn on_readable(self: &Arc<Self>, shared: &Arc<Shared>) {
        let (handshake, deadline) = {
            let mut state = lock(&self.state);
            (state.handshake.take(), state.handshake_deadline)
        };
        let Some(mut handshake) = handshake else {
            // In transmission: requests are read on the connection's reader thread.
            return self.start_reader(shared);
        };
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
                {
                    let mut state = lock(&self.state);
                    state.session = Some(session);
                    state.handshake_deadline = None;
                    state.last_active = Instant::now();
                }
                // The first request follows at once: read it on the reader, not through
                // the event loop.
                return self.start_reader(shared);
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
        self.release(shared)
    }

    /// The reader thread of a connection in transmission: reads requests in order, runs a
    /// lone one here and hands the others to the pool; ends when the connection goes quiet
    /// (parked in the event loop), stops reading, or a newer reader took over.
    fn read_requests(self: &Arc<Self>, shared: &Arc<Shared>, epoch: u64) {
        let Some(session) = lock(&self.state).session else {
            return self.finish_reading(shared);
        };
        let park_after = shared
            .config
            .idle_timeout
            .map_or(PARK_AFTER, |idle| idle.min(PARK_AFTER))
            .max(Duration::from_millis(1));
        // Once per reader, not per read: a read that times out with nothing of a request
        // read means the connection is quiet (see Patient).
        if let Err(e) = self.stream.set_read_timeout(Some(park_after)) {
            log::info!("NBD connection {}: {e}", self.key);
            self.stream.shutdown_both();
            return self.finish_reading(shared);
        }
        let max_in_flight = shared.config.max_in_flight.max(1);
        loop {
            {
                let mut state = lock(&self.state);
                // At the cap: a completion makes room (or the connection stops reading).
                let full = |s: &ConnState| {
                    s.in_flight >= max_in_flight || s.in_flight_bytes >= MAX_IN_FLIGHT_BYTES
                };
                if full(&state) && !state.reading_done {
                    state.waiters += 1;
                    state = self
                        .completed
                        .wait_while(state, |s| full(s) && !s.reading_done)
                        .unwrap_or_else(|e| e.into_inner());
                    state.waiters -= 1;
                }
                if state.reading_done {
                    drop(state);
                    return self.finish_reading(shared);
                }
            }
            let mut patient = Patient::new(&self.stream, REQUEST_TIMEOUT);
            let (incoming, then_close) = match session.receive(shared, &mut patient) {
                Ok(Received::Request {
                    incoming,
                    then_close,
                }) => (incoming, then_close),
                Ok(Received::Disconnect) | Ok(Received::Eof) => return self.finish_reading(shared),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !patient.began() => {
                    if self.stream.buffered() {
                        continue;
                    }
                    // Quiet: the event loop watches the socket (and the idle timeout) again.
                    return self.release(shared);
                }
                Err(e) => {
                    log::info!("NBD connection {} closed: {e}", self.key);
                    return self.finish_reading(shared);
                }
            };
            let bytes = incoming.buffer_len();
            let (seq, lone) = {
                let mut state = lock(&self.state);
                state.in_flight_bytes += bytes;
                let seq = state.next_seq;
                state.next_seq += 1;
                if incoming.is_write() {
                    state.pending_writes.insert(seq);
                }
                state.in_flight += 1;
                state.last_active = Instant::now();
                if state.in_flight > 1 {
                    state.last_pipelined = Some(seq);
                }
                let pipelining = state
                    .last_pipelined
                    .is_some_and(|p| seq - p < PIPELINED_WITHIN);
                (seq, state.in_flight == 1 && !pipelining)
            };
            // A lone request with nothing behind it (a client at queue depth 1) runs right
            // here: handing it to another thread would add a wake-up to every round trip,
            // the queueing cost this project exists to avoid. Anything pipelined goes to
            // the pool, so requests still overlap.
            if !then_close && lone && !self.stream.readable_now() {
                lock(&self.state).inline_since = Some(Instant::now());
                self.execute(shared, session, incoming, seq, bytes);
                let mut state = lock(&self.state);
                if state.reader != epoch {
                    // The event loop started a new reader while this request ran long.
                    return;
                }
                state.inline_since = None;
                continue;
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
        }
    }

    /// The reading side goes idle: watch the socket again, or close if the connection
    /// stopped reading meanwhile (server stop) and nothing is in flight.
    fn release(self: &Arc<Self>, shared: &Arc<Shared>) {
        let mut state = lock(&self.state);
        state.busy = false;
        state.inline_since = None;
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
        state.inline_since = None;
        let done = state.in_flight == 0;
        drop(state);
        if done {
            self.close(shared);
        }
    }

    /// Executes one request and sends its reply (on the reader or as a pool job).
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
            let mut state = lock(&self.state);
            if state.pending_writes.range(..seq).next().is_some() {
                state.waiters += 1;
                state = self
                    .completed
                    .wait_while(state, |s| s.pending_writes.range(..seq).next().is_some())
                    .unwrap_or_else(|e| e.into_inner());
                state.waiters -= 1;
            }
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
        if state.waiters > 0 {
            self.completed.notify_all();
        }
        if state.reading_done && state.in_flight == 0 && !state.busy {
            drop(state);
            self.close(shared);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    /// No worker runs before a job arrives; jobs that must run at the same time (a FLUSH
    /// waiting for the writes before it) each get a worker, up to the maximum; once idle
    /// the workers end.
    #[test]
    fn workers_start_on_demand_and_end_when_idle() {
        let pool = Pool::new(4);
        assert_eq!(pool.live(), 0, "an idle pool has no threads");
        // Four jobs that each wait for all four: they finish only if each has a worker.
        let barrier = Arc::new(Barrier::new(4));
        let (done, finished) = mpsc::channel();
        for _ in 0..4 {
            let (barrier, done) = (Arc::clone(&barrier), done.clone());
            pool.submit(Box::new(move || {
                barrier.wait();
                let _ = done.send(());
            }));
        }
        for _ in 0..4 {
            finished
                .recv_timeout(Duration::from_secs(30))
                .expect("every job that waits for the others got a worker");
        }
        assert!(pool.live() <= 4, "never more than the maximum");
        // More jobs than workers: queued in order, all run.
        let order = Arc::new(Mutex::new(Vec::new()));
        for i in 0..20 {
            let (order, done) = (Arc::clone(&order), done.clone());
            pool.submit(Box::new(move || {
                lock(&order).push(i);
                let _ = done.send(());
            }));
        }
        for _ in 0..20 {
            finished
                .recv_timeout(Duration::from_secs(30))
                .expect("queued jobs run");
        }
        assert_eq!(lock(&order).len(), 20);
        assert!(pool.live() <= 4);
        let deadline = Instant::now() + WORKER_IDLE_EXIT * 4;
        while pool.live() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(pool.live(), 0, "idle workers ended");
        // And the pool starts workers again for the next job.
        let done2 = done.clone();
        pool.submit(Box::new(move || {
            let _ = done2.send(());
        }));
        finished
            .recv_timeout(Duration::from_secs(30))
            .expect("a job after the idle exit runs");
        pool.join();
        assert_eq!(pool.live(), 0);
    }
}
