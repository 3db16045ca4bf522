//! Random and mutated server replies through the NBD client's reply reader
//! (`parse_replies`, the code a connection's reader thread runs), compared with a plain
//! reference reading of the protocol's rules written here (byte-by-byte coverage instead
//! of the client's bitmap). Valid replies are generated (random chunking, order, holes,
//! errors) and then often damaged (flipped, dropped, duplicated or truncated bytes and
//! chunks); for every stream both readings must agree on each request's outcome, and a
//! successful read must never carry data the stream did not deliver for it. Runs a fixed
//! number of seeded iterations (seconds), as a stand-in where libFuzzer cannot run; the
//! cargo-fuzz target `nbd_client_replies` drives the same function.

use cryptblk_dm::backing::nbd::parse_replies;
use cryptblk_dm::backing::nbd::proto::*;

const REQUESTS: [(u16, u64, u32); 3] = [
    (CMD_READ, 4096, 4096),
    (CMD_WRITE, 0, 512),
    (CMD_READ, 0, 512),
];
const ITERATIONS: u64 = 20_000;

/// xorshift64*: a tiny seeded generator, so failures reproduce from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn chunk(flags: u16, kind: u16, handle: u64, payload: &[u8]) -> Vec<u8> {
    let mut c = STRUCTURED_REPLY_MAGIC.to_be_bytes().to_vec();
    c.extend_from_slice(&flags.to_be_bytes());
    c.extend_from_slice(&kind.to_be_bytes());
    c.extend_from_slice(&handle.to_be_bytes());
    c.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    c.extend_from_slice(payload);
    c
}

fn simple(handle: u64, error: u32, data: &[u8]) -> Vec<u8> {
    let mut c = SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
    c.extend_from_slice(&error.to_be_bytes());
    c.extend_from_slice(&handle.to_be_bytes());
    c.extend_from_slice(data);
    c
}

const ERRORS: [u32; 10] = [
    EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP, ESHUTDOWN, 99, 0,
];

/// The chunks of one valid structured reply to request `i` (handle `i + 1`).
fn structured_reply(rng: &mut Rng, i: usize) -> Vec<Vec<u8>> {
    let (cmd, offset, len) = REQUESTS[i];
    let h = i as u64 + 1;
    let mut chunks = Vec::new();
    if rng.chance(15) {
        let code = ERRORS[rng.below(8) as usize];
        let msg = vec![b'm'; rng.below(40) as usize];
        let mut p = code.to_be_bytes().to_vec();
        p.extend_from_slice(&(msg.len() as u16).to_be_bytes());
        p.extend_from_slice(&msg);
        if cmd == CMD_READ && rng.chance(50) {
            p.extend_from_slice(&(offset + rng.below(u64::from(len))).to_be_bytes());
            chunks.push(chunk(0, REPLY_TYPE_ERROR_OFFSET, h, &p));
        } else {
            chunks.push(chunk(0, REPLY_TYPE_ERROR, h, &p));
        }
    } else if cmd == CMD_READ {
        let mut at = 0u64;
        while at < u64::from(len) {
            let n = (1 + rng.below(1500)).min(u64::from(len) - at);
            let mut p = (offset + at).to_be_bytes().to_vec();
            if rng.chance(30) {
                p.extend_from_slice(&(n as u32).to_be_bytes());
                chunks.push(chunk(0, REPLY_TYPE_OFFSET_HOLE, h, &p));
            } else {
                p.extend((0..n).map(|_| rng.next() as u8));
                chunks.push(chunk(0, REPLY_TYPE_OFFSET_DATA, h, &p));
            }
            at += n;
        }
        // Any order.
        for k in (1..chunks.len()).rev() {
            chunks.swap(k, rng.below(k as u64 + 1) as usize);
        }
    }
    if chunks.is_empty() || rng.chance(40) {
        chunks.push(chunk(REPLY_FLAG_DONE, REPLY_TYPE_NONE, h, &[]));
    } else {
        let last = chunks.last_mut().unwrap();
        last[5] |= REPLY_FLAG_DONE as u8;
    }
    chunks
}

/// A server stream: valid replies, then damaged with some probability.
fn stream(rng: &mut Rng, structured: bool) -> Vec<u8> {
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    for (i, &(cmd, _, len)) in REQUESTS.iter().enumerate() {
        if structured && rng.chance(85) {
            chunks.extend(structured_reply(rng, i));
        } else {
            let error = if rng.chance(20) {
                ERRORS[rng.below(10) as usize]
            } else {
                0
            };
            let data: Vec<u8> = if error == 0 && cmd == CMD_READ {
                (0..len).map(|_| rng.next() as u8).collect()
            } else {
                Vec::new()
            };
            chunks.push(simple(i as u64 + 1, error, &data));
        }
    }
    // Damage at the chunk level: drop, duplicate, swap.
    if rng.chance(30) && chunks.len() > 1 {
        let k = rng.below(chunks.len() as u64) as usize;
        match rng.below(3) {
            0 => {
                chunks.remove(k);
            }
            1 => {
                let c = chunks[k].clone();
                chunks.insert(k, c);
            }
            _ => {
                let j = rng.below(chunks.len() as u64) as usize;
                chunks.swap(k, j);
            }
        }
    }
    let mut bytes: Vec<u8> = chunks.concat();
    // Damage at the byte level, mostly in headers where it matters.
    if rng.chance(40) {
        for _ in 0..1 + rng.below(4) {
            if bytes.is_empty() {
                break;
            }
            let at = rng.below(bytes.len() as u64) as usize;
            match rng.below(4) {
                0 => bytes[at] ^= 1 << rng.below(8),
                1 => bytes[at] = rng.next() as u8,
                2 => bytes.truncate(at),
                _ => bytes.insert(at, rng.next() as u8),
            }
        }
    }
    bytes
}

/// The reference: each request's outcome as (errno or data), None while unanswered.
type Outcome = Option<Result<Vec<u8>, i32>>;

fn errno(code: u32) -> i32 {
    match code {
        1 | 5 | 12 | 22 | 28 | 75 | 95 | 108 => code as i32,
        _ => libc::EIO,
    }
}

struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Option<Vec<u8>> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a.to_vec())
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_be_bytes(b.try_into().unwrap()))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_be_bytes(b.try_into().unwrap()))
    }
}

/// A structured reply under assembly: data, covered bytes, first error.
type Assembly = (Vec<u8>, Vec<bool>, Option<i32>);

/// Reads replies by the protocol's rules until the end of the stream or the first
/// violation (after which nothing more is answered).
fn reference(structured: bool, bytes: &[u8]) -> Vec<Outcome> {
    let mut out: Vec<Outcome> = vec![None; REQUESTS.len()];
    let mut open: Vec<Option<Assembly>> = vec![None; REQUESTS.len()];
    let mut c = Cursor(bytes);
    let pending = |out: &Vec<Outcome>, h: u64| -> Option<usize> {
        let i = usize::try_from(h).ok()?.checked_sub(1)?;
        (i < REQUESTS.len() && out[i].is_none()).then_some(i)
    };
    loop {
        let Some(magic) = c.u32() else { return out };
        if magic == SIMPLE_REPLY_MAGIC {
            let (Some(error), Some(h)) = (c.u32(), c.u64()) else {
                return out;
            };
            let Some(i) = pending(&out, h) else {
                return out;
            };
            if open[i].is_some() {
                return out;
            }
            let (cmd, _, len) = REQUESTS[i];
            out[i] = Some(if error != 0 {
                Err(errno(error))
            } else if cmd == CMD_READ {
                match c.take(len as usize) {
                    Some(d) => Ok(d),
                    None => return out,
                }
            } else {
                Ok(Vec::new())
            });
            continue;
        }
        if magic != STRUCTURED_REPLY_MAGIC || !structured {
            return out;
        }
        let (Some(flags), Some(kind), Some(h), Some(len)) = (c.u16(), c.u16(), c.u64(), c.u32())
        else {
            return out;
        };
        let Some(i) = pending(&out, h) else {
            return out;
        };
        let (cmd, offset, rlen) = REQUESTS[i];
        let is_read = cmd == CMD_READ;
        let size = if is_read { rlen as usize } else { 0 };
        let entry = open[i].get_or_insert_with(|| (vec![0; size], vec![false; size], None));
        let done = flags & REPLY_FLAG_DONE != 0;
        match kind {
            REPLY_TYPE_NONE if len == 0 && done => {}
            REPLY_TYPE_OFFSET_DATA | REPLY_TYPE_OFFSET_HOLE if is_read => {
                let (at, n, data) = if kind == REPLY_TYPE_OFFSET_DATA {
                    if len <= 8 {
                        return out;
                    }
                    let Some(at) = c.u64() else { return out };
                    (at, u64::from(len - 8), true)
                } else {
                    if len != 12 {
                        return out;
                    }
                    let (Some(at), Some(n)) = (c.u64(), c.u32()) else {
                        return out;
                    };
                    if n == 0 {
                        return out;
                    }
                    (at, u64::from(n), false)
                };
                if at < offset || at - offset + n > u64::from(rlen) {
                    return out;
                }
                let s = (at - offset) as usize;
                for b in s..s + n as usize {
                    if entry.1[b] {
                        return out;
                    }
                    entry.1[b] = true;
                }
                if data {
                    let Some(d) = c.take(n as usize) else {
                        return out;
                    };
                    entry.0[s..s + n as usize].copy_from_slice(&d);
                }
            }
            k if k & REPLY_TYPE_ERROR_BIT != 0 => {
                if !(6..=6 + 4096 + 8).contains(&len) {
                    return out;
                }
                let (Some(error), Some(ml)) = (c.u32(), c.u16()) else {
                    return out;
                };
                let Some(rest) = c.take(len as usize - 6) else {
                    return out;
                };
                let ml = ml as usize;
                let ok = match k {
                    REPLY_TYPE_ERROR => rest.len() == ml,
                    REPLY_TYPE_ERROR_OFFSET => rest.len() == ml + 8,
                    _ => rest.len() >= ml,
                };
                if !ok || ml > 4096 || error == 0 {
                    return out;
                }
                if k == REPLY_TYPE_ERROR_OFFSET && is_read {
                    let at = u64::from_be_bytes(rest[ml..].try_into().unwrap());
                    if at < offset || at - offset >= u64::from(rlen) {
                        return out;
                    }
                }
                entry.2.get_or_insert(errno(error));
            }
            _ => return out,
        }
        if done {
            let (data, covered, error) = open[i].take().unwrap();
            out[i] = Some(match error {
                Some(e) => Err(e),
                None if covered.iter().all(|&b| b) => Ok(data),
                None => return out,
            });
        }
    }
}

#[test]
fn random_and_damaged_replies_agree_with_the_reference() {
    let mut failures = 0u64;
    let mut successes = 0u64;
    for seed in 1..=ITERATIONS {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let structured = rng.chance(80);
        let bytes = stream(&mut rng, structured);
        let got = parse_replies(structured, &REQUESTS, &bytes);
        let want = reference(structured, &bytes);
        for (i, (g, w)) in got.outcomes.iter().zip(&want).enumerate() {
            let g: Outcome = g.as_ref().map(|r| match r {
                Ok(d) => Ok(d.clone()),
                Err(e) => Err(e.raw_os_error().unwrap_or(-1)),
            });
            assert_eq!(
                g.as_ref().map(|r| r.as_ref().map(|d| d.len())),
                w.as_ref().map(|r| r.as_ref().map(|d| d.len())),
                "seed {seed}, request {i}: client and reference disagree (stopped: {})",
                got.stopped
            );
            assert!(g == *w, "seed {seed}, request {i}: different data");
            match w {
                Some(Ok(_)) => successes += 1,
                Some(Err(_)) | None => failures += 1,
            }
        }
    }
    // The generator must exercise both sides.
    assert!(
        successes > ITERATIONS / 2 && failures > ITERATIONS / 2,
        "{successes} ok, {failures} not"
    );
}
