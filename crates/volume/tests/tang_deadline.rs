//! The tang exchange has one deadline for all of it: a fake tang server on 127.0.0.1 that
//! stays silent, or drips its answer a byte at a time, makes the exchange fail within the
//! deadline (1 s here, through `tang::set_timeout`) with "timed out" in the message. Each
//! case runs under a watchdog.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cryptblk_volume::token::clevis::tang;

const WATCHDOG: Duration = Duration::from_secs(15);

/// Serves one connection with `script`; the URL to reach it.
fn fake_tang(script: impl FnOnce(TcpStream) + Send + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        if let Ok((s, _)) = listener.accept() {
            script(s);
        }
    });
    format!("http://{addr}")
}

/// Reads the request's head, so the client is waiting for the answer.
fn read_request(s: &mut TcpStream) {
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).unwrap_or(0) == 0 {
            return;
        }
        got.push(b[0]);
    }
}

/// GET /adv under the watchdog: the error text and how long it took.
fn exchange(url: String) -> (String, Duration) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        tang::set_timeout(Duration::from_secs(1));
        let t0 = Instant::now();
        let r = tang::get(&url, "/adv");
        let _ = tx.send((r.map(|_| ()), t0.elapsed()));
    });
    let (r, took) = rx
        .recv_timeout(WATCHDOG)
        .expect("the tang exchange still waits after the watchdog");
    let e = r.expect_err("the exchange succeeded");
    (e.to_string(), took)
}

#[test]
fn silent_server_times_out() {
    let url = fake_tang(|mut s| {
        read_request(&mut s);
        // Say nothing until the client hangs up.
        let _ = std::io::copy(&mut s, &mut std::io::sink());
    });
    let (msg, took) = exchange(url);
    assert!(msg.contains("timed out"), "{msg}");
    assert!(took < WATCHDOG, "took {took:?}");
}

#[test]
fn dripping_server_times_out() {
    let url = fake_tang(|mut s| {
        read_request(&mut s);
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/jose+json\r\nContent-Length: \
             1000\r\n\r\n{}",
            "x".repeat(1000)
        );
        // A byte every 100 ms: every read gets something, the answer takes 100 s.
        for b in answer.bytes() {
            if s.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let (msg, took) = exchange(url);
    assert!(msg.contains("timed out"), "{msg}");
    assert!(took < WATCHDOG, "took {took:?}");
}
