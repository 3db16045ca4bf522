//! The NBD server's concurrency and bounds: several requests in flight on one connection
//! with replies out of order, FLUSH and NBD_CMD_DISC waiting for the writes before them,
//! the connection cap, and the handshake timeout for a client that stalls mid-option.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::nbd_client::*;
use common::{pattern, MemDisk, TempDir};
use cryptblk_dm::device::{BlockDevice, WriteFlags};
use cryptblk_export::{NbdConfig, NbdServer};

/// A MemDisk whose requests touching `gated` block until the test opens the gate (or ten
/// seconds pass), and which logs when writes and flushes complete.
struct GatedDisk {
    inner: Arc<MemDisk>,
    gated: u64,
    /// (the gate is open, requests that reached it)
    gate: Mutex<(bool, usize)>,
    changed: Condvar,
    log: Mutex<Vec<&'static str>>,
}

impl GatedDisk {
    fn new(inner: Arc<MemDisk>, gated: u64) -> Arc<GatedDisk> {
        Arc::new(GatedDisk {
            inner,
            gated,
            gate: Mutex::new((false, 0)),
            changed: Condvar::new(),
            log: Mutex::new(Vec::new()),
        })
    }

    fn wait_gate(&self, offset: u64) {
        if offset != self.gated {
            return;
        }
        let mut gate = self.gate.lock().unwrap();
        gate.1 += 1;
        self.changed.notify_all();
        let _unused = self
            .changed
            .wait_timeout_while(gate, Duration::from_secs(10), |g| !g.0)
            .unwrap();
    }

    /// Waits until `n` requests have reached the gate (they are blocked in the backing
    /// now); fails after 10 s.
    fn wait_arrived(&self, n: usize) {
        let gate = self.gate.lock().unwrap();
        let (gate, _) = self
            .changed
            .wait_timeout_while(gate, Duration::from_secs(10), |g| g.1 < n)
            .unwrap();
        assert!(
            gate.1 >= n,
            "only {} of {n} requests reached the gate",
            gate.1
        );
    }

    fn open_gate(&self) {
        self.gate.lock().unwrap().0 = true;
        self.changed.notify_all();
    }

    fn log(&self) -> Vec<&'static str> {
        self.log.lock().unwrap().clone()
    }
}

impl BlockDevice for GatedDisk {
    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn logical_block_size(&self) -> u32 {
        self.inner.logical_block_size()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.wait_gate(offset);
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> std::io::Result<()> {
        self.wait_gate(offset);
        self.inner.write_at(offset, buf, flags)?;
        self.log.lock().unwrap().push("write");
        Ok(())
    }

    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()?;
        self.log.lock().unwrap().push("flush");
        Ok(())
    }
}

fn serve(device: Arc<dyn BlockDevice>, config: NbdConfig) -> NbdServer {
    NbdServer::start(device, config).expect("start server")
}

fn config(dir: &TempDir) -> NbdConfig {
    NbdConfig::unix(dir.join("nbd.sock"))
}

/// Reads the next reply of any handle: (handle, error, read data of `read_len` bytes for
/// simple replies). Structured replies are reassembled into (offset, data) chunks.
fn any_reply(c: &mut Client, read_len: usize) -> (u64, Reply) {
    let mut header = [0u8; 16];
    c.s.read_exact(&mut header[..4]).unwrap();
    let magic = u32::from_be_bytes(header[0..4].try_into().unwrap());
    if magic == SIMPLE_MAGIC {
        c.s.read_exact(&mut header[4..16]).unwrap();
        let error = u32::from_be_bytes(header[4..8].try_into().unwrap());
        let handle = u64::from_be_bytes(header[8..16].try_into().unwrap());
        let mut r = Reply {
            error,
            ..Reply::default()
        };
        if error == 0 && read_len > 0 {
            r.data.push((0, c.bytes(read_len)));
        }
        return (handle, r);
    }
    assert_eq!(magic, STRUCTURED_MAGIC);
    // Peek the handle (flags u16, type u16, handle u64) and let the client parse the rest.
    let flags = c.u16();
    let kind = c.u16();
    let handle = c.u64();
    let len = c.u32() as usize;
    let payload = c.bytes(len);
    let mut r = Reply::default();
    r.types.push(kind);
    match kind {
        TYPE_OFFSET_DATA => {
            let off = u64::from_be_bytes(payload[0..8].try_into().unwrap());
            r.data.push((off, payload[8..].to_vec()));
        }
        TYPE_NONE => {}
        TYPE_ERROR | TYPE_ERROR_OFFSET => {
            r.error = u32::from_be_bytes(payload[0..4].try_into().unwrap());
        }
        other => panic!("unexpected chunk type {other}"),
    }
    assert_ne!(
        flags & 1,
        0,
        "these replies are single chunks (reads without errors)"
    );
    (handle, r)
}

fn reads_in_flight_answer_with_their_handles(structured: bool) {
    const MIB: u64 = 1 << 20;
    let disk = MemDisk::new(8 * MIB, 512);
    disk.fill(&pattern(41, 8 * MIB as usize));
    let expected = disk.snapshot();
    // Reads of offset 0 wait until the test opens the gate: a server that executed one
    // request after the other could never answer the later reads first.
    let gated = GatedDisk::new(disk, 0);
    let dir = TempDir::new(if structured { "ooo-s" } else { "ooo" });
    let server = serve(gated.clone(), config(&dir));
    let mut c = Client::open(&dir.join("nbd.sock"), structured, true);
    let len = 64 << 10;
    // Handle 100 is the gated read; 101..=115 read other places.
    c.send_request(0, CMD_READ, 100, 0, len as u32, &[]);
    for h in 101..116u64 {
        c.send_request(0, CMD_READ, h, (h - 100) * 256 * 1024, len as u32, &[]);
    }
    let mut seen = Vec::new();
    for i in 0..16 {
        if i == 15 {
            // Everything but the gated read has been answered: let it finish.
            gated.open_gate();
        }
        let (handle, reply) = any_reply(&mut c, len);
        assert_eq!(reply.error, 0, "read {handle} failed");
        let offset = (handle - 100) * 256 * 1024;
        let (chunk_offset, data) = &reply.data[0];
        if structured {
            assert_eq!(*chunk_offset, offset, "chunk offset of handle {handle}");
        }
        assert!(
            data[..] == expected[offset as usize..offset as usize + len],
            "data of handle {handle}"
        );
        seen.push(handle);
    }
    assert_eq!(
        *seen.last().unwrap(),
        100,
        "the blocked read is answered last: {seen:?}"
    );
    seen.sort();
    assert_eq!(seen, (100..116).collect::<Vec<_>>());
    // The connection is still in sync afterwards.
    assert_eq!(c.read_ok(512, 512), expected[512..1024]);
    server.stop().unwrap();
}

#[test]
fn reads_in_flight_are_answered_out_of_order_simple_replies() {
    reads_in_flight_answer_with_their_handles(false);
}

#[test]
fn reads_in_flight_are_answered_out_of_order_structured_replies() {
    reads_in_flight_answer_with_their_handles(true);
}

/// A lone request runs on the connection's reader thread; one that blocks on the backing
/// must not hold up a request the client sends after it (the server starts a new reader
/// beside it).
#[test]
fn a_blocked_lone_request_does_not_hold_up_the_next() {
    let disk = MemDisk::new(1 << 20, 512);
    disk.fill(&pattern(44, 1 << 20));
    let expected = disk.snapshot();
    let gated = GatedDisk::new(disk, 0);
    let dir = TempDir::new("lone");
    let server = serve(gated.clone(), config(&dir));
    let mut c = Client::open(&dir.join("nbd.sock"), true, true);
    c.send_request(0, CMD_READ, 1, 0, 512, &[]);
    // The server took the first read alone and is blocked in it.
    gated.wait_arrived(1);
    c.send_request(0, CMD_READ, 2, 65536, 512, &[]);
    let (handle, reply) = any_reply(&mut c, 512);
    assert_eq!(
        (handle, reply.error),
        (2, 0),
        "the later read is answered while the first is blocked"
    );
    assert_eq!(reply.data[0].1[..], expected[65536..65536 + 512]);
    gated.open_gate();
    let (handle, reply) = any_reply(&mut c, 512);
    assert_eq!((handle, reply.error), (1, 0));
    assert_eq!(reply.data[0].1[..], expected[..512]);
    // Still in sync, and served again from one reader.
    assert_eq!(c.read_ok(4096, 512), expected[4096..4608]);
    server.stop().unwrap();
}

/// Whether a reply arrives within `wait` (without consuming it).
fn reply_pending(c: &Client, wait: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd: c.s.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: pfd is a valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut pfd, 1, wait.as_millis() as i32) > 0 }
}

#[test]
fn flush_waits_for_the_writes_received_before_it() {
    let disk = MemDisk::new(1 << 20, 512);
    let gated = GatedDisk::new(disk.clone(), 4096);
    let dir = TempDir::new("flush");
    let server = serve(gated.clone(), config(&dir));
    let mut c = Client::open(&dir.join("nbd.sock"), true, true);
    let data = pattern(42, 4096);
    c.send_request(0, CMD_WRITE, 1, 4096, 4096, &data);
    c.send_request(0, CMD_FLUSH, 2, 0, 0, &[]);
    // A read after them is not held up by either.
    c.send_request(0, CMD_READ, 3, 65536, 512, &[]);
    let (handle, reply) = any_reply(&mut c, 512);
    assert_eq!((handle, reply.error), (3, 0));
    gated.wait_arrived(1);
    // While the write is blocked, the flush must not be answered.
    assert!(
        !reply_pending(&c, Duration::from_millis(300)),
        "a reply arrived while the write before the flush was still executing"
    );
    gated.open_gate();
    let mut order = Vec::new();
    for _ in 0..2 {
        let (handle, reply) = any_reply(&mut c, 0);
        assert_eq!(reply.error, 0);
        order.push(handle);
    }
    assert_eq!(order, vec![1, 2], "the write completes before the flush");
    assert_eq!(gated.log(), vec!["write", "flush"]);
    assert_eq!(disk.snapshot()[4096..8192], data[..]);
    server.stop().unwrap();
}

#[test]
fn disconnect_waits_for_requests_in_flight() {
    let disk = MemDisk::new(1 << 20, 512);
    let gated = GatedDisk::new(disk.clone(), 0);
    let dir = TempDir::new("disc");
    let server = serve(gated.clone(), config(&dir));
    let mut c = Client::open(&dir.join("nbd.sock"), false, true);
    let data = pattern(43, 8192);
    c.send_request(0, CMD_WRITE, 5, 0, 8192, &data);
    c.send_request(0, CMD_DISC, 6, 0, 0, &[]);
    // The write is blocked in the backing and the server has read the disconnect.
    gated.wait_arrived(1);
    wait_read_by_server(&c);
    gated.open_gate();
    let (handle, reply) = any_reply(&mut c, 0);
    assert_eq!((handle, reply.error), (5, 0), "the write still replies");
    let mut rest = Vec::new();
    c.s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "nothing follows but the close");
    assert_eq!(disk.snapshot()[..8192], data[..]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.connection_count() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(server.connection_count(), 0);
    server.stop().unwrap();
}

/// Waits until the server has read everything the client sent (the socket's send queue,
/// SIOCOUTQ, is empty); fails after 10 s.
fn wait_read_by_server(c: &Client) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut queued: libc::c_int = 0;
        // SAFETY: TIOCOUTQ writes one int to the valid pointer.
        let rc = unsafe { libc::ioctl(c.s.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
        assert_eq!(rc, 0, "SIOCOUTQ: {}", std::io::Error::last_os_error());
        if queued == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the server left {queued} bytes unread"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Reads the 18-byte greeting; false if the server closed the connection instead.
fn greeted(s: &mut UnixStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hello = [0u8; 18];
    match s.read(&mut hello) {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::ConnectionReset => false,
        Err(e) => panic!("reading the greeting: {e}"),
    }
}

#[test]
fn connections_over_the_cap_are_refused() {
    let disk = MemDisk::new(1 << 20, 512);
    let dir = TempDir::new("cap");
    let server = serve(disk, config(&dir).with_max_clients(2));
    let sock = dir.join("nbd.sock");
    let mut first = UnixStream::connect(&sock).unwrap();
    let mut second = UnixStream::connect(&sock).unwrap();
    assert!(greeted(&mut first) && greeted(&mut second));
    let mut third = UnixStream::connect(&sock).unwrap();
    assert!(!greeted(&mut third), "a third client is over the cap");
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.connection_count() > 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        server.connection_count(),
        1,
        "the first client's place was not freed"
    );
    // A place is free again: a full client is served.
    let mut c = Client::open(&sock, true, true);
    assert_eq!(c.read_ok(0, 4096), vec![0u8; 4096]);
    drop(second);
    server.stop().unwrap();
}

#[test]
fn a_client_stalling_mid_option_is_dropped_after_the_handshake_timeout() {
    let disk = MemDisk::new(1 << 20, 512);
    let dir = TempDir::new("stall");
    let server = serve(
        disk,
        config(&dir).with_handshake_timeout(Duration::from_secs(1)),
    );
    let sock = dir.join("nbd.sock");
    let mut staller = UnixStream::connect(&sock).unwrap();
    assert!(greeted(&mut staller));
    staller.write_all(&3u32.to_be_bytes()).unwrap();
    // Half an option header, then nothing.
    staller.write_all(&IHAVEOPT.to_be_bytes()).unwrap();
    // Meanwhile another client negotiates and is served.
    let mut c = Client::open(&sock, false, true);
    assert_eq!(c.read_ok(0, 512), vec![0u8; 512]);
    let started = Instant::now();
    let mut rest = Vec::new();
    staller
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let end = staller.read_to_end(&mut rest);
    assert!(
        matches!(&end, Ok(0)) || matches!(&end, Err(e) if e.kind() == ErrorKind::ConnectionReset),
        "the server closes the stalled handshake: {end:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "closed by the timeout"
    );
    // The negotiated client is not subject to the handshake timeout: let more than that
    // timeout (1 s) pass. (Not synchronization: the time is what is tested.)
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(c.read_ok(512, 512), vec![0u8; 512]);
    server.stop().unwrap();
}

#[test]
fn an_idle_timeout_closes_quiet_connections() {
    let disk = MemDisk::new(1 << 20, 512);
    let dir = TempDir::new("idle");
    let server = serve(
        disk,
        config(&dir).with_idle_timeout(Some(Duration::from_millis(500))),
    );
    let mut c = Client::open(&dir.join("nbd.sock"), true, true);
    assert_eq!(c.read_ok(0, 512), vec![0u8; 512]);
    let mut rest = Vec::new();
    let end = c.s.read_to_end(&mut rest);
    assert!(matches!(end, Ok(0)), "idle connection closed: {end:?}");
    server.stop().unwrap();
}

#[test]
fn a_client_not_reading_its_option_replies_is_dropped_after_the_handshake_timeout() {
    let disk = MemDisk::new(1 << 20, 512);
    let dir = TempDir::new("noread");
    let server = serve(
        disk,
        config(&dir).with_handshake_timeout(Duration::from_secs(1)),
    );
    let mut s = UnixStream::connect(dir.join("nbd.sock")).unwrap();
    assert!(greeted(&mut s));
    s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&3u32.to_be_bytes()).unwrap();
    // NBD_OPT_LIST over and over, never reading the replies: the server's writes block
    // once the socket buffers are full.
    let mut list = IHAVEOPT.to_be_bytes().to_vec();
    list.extend_from_slice(&OPT_LIST.to_be_bytes());
    list.extend_from_slice(&0u32.to_be_bytes());
    let writer = std::thread::spawn(move || {
        let batch = list.repeat(1024);
        for _ in 0..4096 {
            if s.write_all(&batch).is_err() {
                return true;
            }
        }
        false
    });
    assert!(
        writer.join().unwrap(),
        "the server closed the connection instead of buffering replies forever"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.connection_count() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(server.connection_count(), 0);
    server.stop().unwrap();
}
