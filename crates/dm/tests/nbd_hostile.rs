//! The NBD client backing against hostile servers: a scripted fake server on a Unix socket
//! per case (stalls, drips, replies that cover too little or too much, huge error chunks,
//! endless handshakes, disconnects). Every case must end in an error, never in a hang and
//! never in a successful read of wrong data. Each test runs under a watchdog, and the
//! request and handshake deadlines are short ([`NbdTimeouts`]) so the suite takes seconds.
//! A last case checks that a well-formed multi-chunk reply still reads correctly, so the
//! checks refuse only what breaks the protocol.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cryptblk_dm::backing::nbd::proto::*;
use cryptblk_dm::backing::nbd::{NbdBacking, NbdTimeouts};
use cryptblk_dm::BlockDevice;

const SIZE: u64 = 1 << 20;
/// No case may take longer than this (the deadlines under test are 1 s; the old client
/// waited 30 s or for ever).
const WATCHDOG: Duration = Duration::from_secs(10);

fn short() -> NbdTimeouts {
    NbdTimeouts {
        request: Duration::from_secs(1),
        connect: Duration::from_secs(1),
        reconnect_every: Duration::from_millis(1),
    }
}

/// Runs `f` on its own thread; panics if it does not finish within [`WATCHDOG`].
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(WATCHDOG)
        .unwrap_or_else(|_| panic!("{what}: still waiting after {WATCHDOG:?}"))
}

/// A fake NBD server: each accepted connection runs `script(connection number, stream)`.
struct FakeServer {
    path: PathBuf,
    uri: String,
}

impl FakeServer {
    fn start(script: impl Fn(usize, UnixStream) + Send + Sync + 'static) -> FakeServer {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "cryptblk-nbd-hostile-{}-{}.sock",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("bind the fake server");
        let script = Arc::new(script);
        std::thread::spawn(move || {
            for (i, stream) in listener.incoming().enumerate() {
                let Ok(stream) = stream else { return };
                let script = Arc::clone(&script);
                std::thread::spawn(move || script(i, stream));
            }
        });
        let uri = format!("nbd+unix:///?socket={}", path.display());
        FakeServer { path, uri }
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn read_n(s: &mut UnixStream, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).expect("read from the client");
    b
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}

fn option_reply(s: &mut UnixStream, opt: u32, kind: u32, data: &[u8]) {
    let mut m = Vec::new();
    m.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    m.extend_from_slice(&opt.to_be_bytes());
    m.extend_from_slice(&kind.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m).expect("write to the client");
}

fn info_export(size: u64) -> Vec<u8> {
    let mut d = INFO_EXPORT.to_be_bytes().to_vec();
    d.extend_from_slice(&size.to_be_bytes());
    d.extend_from_slice(&(TFLAG_HAS_FLAGS | TFLAG_SEND_FLUSH).to_be_bytes());
    d
}

/// Reads one option: (option, data).
fn read_option(s: &mut UnixStream) -> (u32, Vec<u8>) {
    let head = read_n(s, 16);
    let (opt, len) = (be32(&head[8..]), be32(&head[12..]));
    (opt, read_n(s, len as usize))
}

/// The server's side of the handshake up to the GO option (whose reply is left to the
/// caller): structured replies accepted.
fn handshake_to_go(s: &mut UnixStream) {
    let mut hello = NBDMAGIC.to_be_bytes().to_vec();
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&hello).unwrap();
    read_n(s, 4);
    loop {
        let (opt, _) = read_option(s);
        match opt {
            OPT_STRUCTURED_REPLY => option_reply(s, opt, REP_ACK, &[]),
            OPT_GO => return,
            _ => option_reply(s, opt, REP_ERR_UNSUP, &[]),
        }
    }
}

/// The whole handshake for an export of `size` bytes.
fn handshake(s: &mut UnixStream, size: u64) {
    handshake_to_go(s);
    option_reply(s, OPT_GO, REP_INFO, &info_export(size));
    option_reply(s, OPT_GO, REP_ACK, &[]);
}

/// One request: (command, handle, offset, length).
fn request(s: &mut UnixStream) -> (u16, u64, u64, u32) {
    let h = read_n(s, 28);
    let cmd = u16::from_be_bytes([h[6], h[7]]);
    let handle = u64::from_be_bytes(h[8..16].try_into().unwrap());
    let offset = u64::from_be_bytes(h[16..24].try_into().unwrap());
    (cmd, handle, offset, be32(&h[24..]))
}

fn chunk_header(flags: u16, kind: u16, handle: u64, len: u32) -> Vec<u8> {
    let mut c = STRUCTURED_REPLY_MAGIC.to_be_bytes().to_vec();
    c.extend_from_slice(&flags.to_be_bytes());
    c.extend_from_slice(&kind.to_be_bytes());
    c.extend_from_slice(&handle.to_be_bytes());
    c.extend_from_slice(&len.to_be_bytes());
    c
}

fn chunk(flags: u16, kind: u16, handle: u64, payload: &[u8]) -> Vec<u8> {
    let mut c = chunk_header(flags, kind, handle, payload.len() as u32);
    c.extend_from_slice(payload);
    c
}

fn data_chunk(flags: u16, handle: u64, offset: u64, data: &[u8]) -> Vec<u8> {
    let mut p = offset.to_be_bytes().to_vec();
    p.extend_from_slice(data);
    chunk(flags, REPLY_TYPE_OFFSET_DATA, handle, &p)
}

fn hole_chunk(flags: u16, handle: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut p = offset.to_be_bytes().to_vec();
    p.extend_from_slice(&len.to_be_bytes());
    chunk(flags, REPLY_TYPE_OFFSET_HOLE, handle, &p)
}

/// Waits until the client closes the connection (it gives up on the request).
fn hold(mut s: UnixStream) {
    let _ = std::io::copy(&mut s, &mut std::io::sink());
}

fn pattern(offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((offset + i) % 251) as u8)
        .collect()
}

/// A server that answers every read with what `reply(handle, offset, len)` returns, then
/// keeps the connection open until the client drops it.
fn replying(reply: impl Fn(u64, u64, u32) -> Vec<u8> + Send + Sync + 'static) -> FakeServer {
    FakeServer::start(move |_, mut s| {
        handshake(&mut s, SIZE);
        loop {
            let mut head = [0u8; 28];
            if s.read_exact(&mut head).is_err() {
                return;
            }
            let handle = u64::from_be_bytes(head[8..16].try_into().unwrap());
            let offset = u64::from_be_bytes(head[16..24].try_into().unwrap());
            let len = be32(&head[24..]);
            if s.write_all(&reply(handle, offset, len)).is_err() {
                return;
            }
        }
    })
}

/// Opens the backing on `server` and reads 4 KiB at 8 KiB: the outcome and how long it
/// took, under the watchdog.
fn read_once(server: &FakeServer, timeouts: NbdTimeouts) -> (std::io::Result<Vec<u8>>, Duration) {
    let uri = server.uri.clone();
    within("read", move || {
        let dev = NbdBacking::open_with(&uri, timeouts).expect("open");
        let t0 = Instant::now();
        let mut buf = vec![0u8; 4096];
        let r = dev.read_at(8192, &mut buf).map(|()| buf);
        (r, t0.elapsed())
    })
}

fn expect_error(what: &str, r: std::io::Result<Vec<u8>>) {
    match r {
        Ok(data) => panic!(
            "{what}: the read succeeded with {} bytes (first {:?})",
            data.len(),
            &data[..8.min(data.len())]
        ),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{what}: {e}"),
    }
}

#[test]
fn reply_without_data_chunk_fails() {
    let server = replying(|h, _, _| chunk(REPLY_FLAG_DONE, REPLY_TYPE_NONE, h, &[]));
    expect_error("NONE+DONE", read_once(&server, short()).0);
}

#[test]
fn reply_covering_part_of_the_range_fails() {
    let server = replying(|h, off, len| {
        let mut r = data_chunk(0, h, off, &pattern(off, len as usize / 2));
        r.extend(chunk(REPLY_FLAG_DONE, REPLY_TYPE_NONE, h, &[]));
        r
    });
    expect_error("half covered", read_once(&server, short()).0);
}

#[test]
fn overlapping_chunks_fail() {
    let server = replying(|h, off, len| {
        // All of the range is covered, but its middle twice.
        let half = len as usize / 2;
        let mut r = data_chunk(0, h, off, &pattern(off, half + 512));
        r.extend(data_chunk(
            0,
            h,
            off + half as u64 - 512,
            &pattern(off, half + 512),
        ));
        r.extend(chunk(REPLY_FLAG_DONE, REPLY_TYPE_NONE, h, &[]));
        r
    });
    expect_error("overlap", read_once(&server, short()).0);
}

#[test]
fn hole_overlapping_data_fails() {
    let server = replying(|h, off, len| {
        let mut r = data_chunk(0, h, off, &pattern(off, len as usize));
        r.extend(hole_chunk(REPLY_FLAG_DONE, h, off + 512, 512));
        r
    });
    expect_error("hole over data", read_once(&server, short()).0);
}

#[test]
fn chunk_outside_the_range_fails() {
    let server = replying(|h, off, len| {
        let mut r = data_chunk(0, h, off, &pattern(off, len as usize - 512));
        r.extend(data_chunk(
            REPLY_FLAG_DONE,
            h,
            off + u64::from(len),
            &[7u8; 512],
        ));
        r
    });
    expect_error("outside", read_once(&server, short()).0);
}

#[test]
fn huge_error_chunk_is_refused_unread() {
    // A 4 GiB error chunk the server never finishes: the client must refuse the length
    // at once, not buffer or wait for it.
    let server = FakeServer::start(|_, mut s| {
        handshake(&mut s, SIZE);
        let (_, h, _, _) = request(&mut s);
        let mut c = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, h, u32::MAX - 15);
        c.extend_from_slice(&EIO.to_be_bytes());
        c.extend_from_slice(&100u16.to_be_bytes());
        s.write_all(&c).unwrap();
        hold(s);
    });
    let timeouts = NbdTimeouts {
        request: Duration::from_secs(30),
        ..short()
    };
    let (r, took) = read_once(&server, timeouts);
    expect_error("huge error chunk", r);
    assert!(took < WATCHDOG, "took {took:?}");
}

#[test]
fn error_chunk_fails_the_read_with_its_code() {
    let server = replying(|h, _, _| {
        let msg = b"no such luck";
        let mut p = ENOSPC.to_be_bytes().to_vec();
        p.extend_from_slice(&(msg.len() as u16).to_be_bytes());
        p.extend_from_slice(msg);
        chunk(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, h, &p)
    });
    let e = read_once(&server, short()).0.unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
}

#[test]
fn stall_mid_reply_times_out_and_status_answers() {
    let (seen_tx, seen_rx) = mpsc::channel::<()>();
    let seen_tx = std::sync::Mutex::new(seen_tx);
    let server = FakeServer::start(move |_, mut s| {
        handshake(&mut s, SIZE);
        let (_, h, off, len) = request(&mut s);
        let mut c = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, h, len + 8);
        c.extend_from_slice(&off.to_be_bytes());
        c.extend_from_slice(&pattern(off, 100));
        s.write_all(&c).unwrap();
        let _ = seen_tx.lock().unwrap().send(());
        hold(s);
    });
    let uri = server.uri.clone();
    let dev = within("open", move || {
        NbdBacking::open_with(&uri, short()).unwrap()
    });
    let done_rx = read_in_background(&dev, 4096);
    seen_rx
        .recv_timeout(WATCHDOG)
        .expect("the server saw the read");
    // status while the reply is stuck: answers (from the watchdog thread).
    let d = Arc::clone(&dev);
    within("status during a stalled reply", move || d.report());
    let r = done_rx
        .recv_timeout(WATCHDOG)
        .expect("the stalled read never failed");
    expect_error("stalled reply", r);
}

#[test]
fn simple_reply_stalled_mid_data_times_out() {
    let server = FakeServer::start(|_, mut s| {
        handshake(&mut s, SIZE);
        let (_, h, off, _) = request(&mut s);
        let mut c = SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
        c.extend_from_slice(&0u32.to_be_bytes());
        c.extend_from_slice(&h.to_be_bytes());
        c.extend_from_slice(&pattern(off, 1000));
        s.write_all(&c).unwrap();
        hold(s);
    });
    expect_error("stalled simple reply", read_once(&server, short()).0);
}

#[test]
fn dripping_reply_times_out() {
    let server = FakeServer::start(|_, mut s| {
        handshake(&mut s, SIZE);
        let (_, h, off, len) = request(&mut s);
        let mut c = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, h, len + 8);
        c.extend_from_slice(&off.to_be_bytes());
        c.extend_from_slice(&pattern(off, len as usize));
        // A byte every 50 ms: each read gets something, the whole never arrives in time.
        for b in c {
            if s.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    expect_error("dripping reply", read_once(&server, short()).0);
}

#[test]
fn disconnect_mid_reply_fails_at_once() {
    // The default 30 s request deadline: the failure must come from the closed
    // connection, not from the deadline.
    let server = FakeServer::start(|_, mut s| {
        handshake(&mut s, SIZE);
        let (_, h, off, len) = request(&mut s);
        let mut c = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, h, len + 8);
        c.extend_from_slice(&off.to_be_bytes());
        c.extend_from_slice(&pattern(off, 100));
        s.write_all(&c).unwrap();
    });
    let (r, took) = read_once(&server, NbdTimeouts::default());
    expect_error("disconnect mid-reply", r);
    assert!(took < WATCHDOG, "took {took:?}");
}

#[test]
fn disconnect_mid_simple_reply_fails_at_once() {
    let server = FakeServer::start(|_, mut s| {
        handshake(&mut s, SIZE);
        let (_, h, off, _) = request(&mut s);
        let mut c = SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
        c.extend_from_slice(&0u32.to_be_bytes());
        c.extend_from_slice(&h.to_be_bytes());
        c.extend_from_slice(&pattern(off, 100));
        s.write_all(&c).unwrap();
    });
    let (r, took) = read_once(&server, NbdTimeouts::default());
    expect_error("disconnect mid simple reply", r);
    assert!(took < WATCHDOG, "took {took:?}");
}

/// Answers GO with an `NBD_REP_INFO` every 100 ms, for ever.
fn info_forever(s: &mut UnixStream) {
    handshake_to_go(s);
    loop {
        option_reply(s, OPT_GO, REP_INFO, &info_export(SIZE));
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn endless_handshake_times_out() {
    let server = FakeServer::start(|_, mut s| info_forever(&mut s));
    let uri = server.uri.clone();
    let r = within("open", move || {
        NbdBacking::open_with(&uri, short()).map(|_| ())
    });
    let e = r.expect_err("open succeeded");
    assert!(e.to_string().contains("timed out"), "{e}");
}

#[test]
fn endless_reconnect_handshake_bounds_requests_and_not_status() {
    let (seen_tx, seen_rx) = mpsc::channel::<()>();
    let seen_tx = std::sync::Mutex::new(seen_tx);
    let server = FakeServer::start(move |i, mut s| {
        if i == 0 {
            // The first connection: a normal handshake, then the server goes away.
            handshake(&mut s, SIZE);
            let _ = request(&mut s);
            return;
        }
        let _ = seen_tx.lock().unwrap().send(());
        info_forever(&mut s);
    });
    let uri = server.uri.clone();
    let timeouts = NbdTimeouts {
        connect: Duration::from_secs(3),
        ..short()
    };
    let dev = within("open", move || {
        NbdBacking::open_with(&uri, timeouts).unwrap()
    });
    let d = Arc::clone(&dev);
    expect_error(
        "lost connection",
        within("read", move || {
            let mut b = vec![0u8; 512];
            d.read_at(0, &mut b).map(|()| b)
        }),
    );
    let done_rx = read_in_background(&dev, 512);
    seen_rx
        .recv_timeout(WATCHDOG)
        .expect("the client reconnected");
    let d = Arc::clone(&dev);
    let report = within("status during a reconnect", move || d.report());
    assert!(!report.connected);
    // status answered while the request is still inside the handshake (3 s deadline).
    assert!(
        done_rx.try_recv().is_err(),
        "the request ended before status answered"
    );
    let r = done_rx
        .recv_timeout(WATCHDOG)
        .expect("the request waited past the handshake deadline");
    expect_error("endless handshake", r);
}

#[test]
fn oversized_export_is_refused_clearly() {
    let server = FakeServer::start(|_, mut s| handshake(&mut s, u64::MAX - 511));
    let uri = server.uri.clone();
    let e = within("open", move || {
        NbdBacking::open_with(&uri, short()).map(|_| ())
    })
    .expect_err("open succeeded");
    let msg = e.to_string();
    assert!(
        msg.contains("18446744073709551104") && msg.contains("larger than"),
        "{msg}"
    );
}

#[test]
fn well_formed_chunks_in_any_order_read_correctly() {
    // Out of order: the tail as data, a hole, then the head as data; DONE on a NONE.
    let server = replying(|h, off, len| {
        let len = len as usize;
        let mut r = data_chunk(0, h, off + 3072, &pattern(off + 3072, len - 3072));
        r.extend(hole_chunk(0, h, off + 1000, 2072));
        r.extend(data_chunk(0, h, off, &pattern(off, 1000)));
        r.extend(chunk(REPLY_FLAG_DONE, REPLY_TYPE_NONE, h, &[]));
        r
    });
    let data = read_once(&server, short()).0.expect("a well-formed reply");
    let mut want = pattern(8192, 4096);
    want[1000..3072].fill(0);
    assert!(data == want, "wrong data");
}

/// A read of `len` bytes at 0 on its own thread; its outcome arrives on the receiver.
fn read_in_background(
    dev: &Arc<NbdBacking>,
    len: usize,
) -> mpsc::Receiver<std::io::Result<Vec<u8>>> {
    let d = Arc::clone(dev);
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut b = vec![0u8; len];
        let _ = done_tx.send(d.read_at(0, &mut b).map(|()| b));
    });
    done_rx
}
