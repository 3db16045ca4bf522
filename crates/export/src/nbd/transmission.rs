//! The transmission phase: requests, validation, device I/O and replies.
//!
//! Split in three steps so that requests can run concurrently: [`Session::receive`] reads
//! one request (with a write's payload) from the stream, in order; [`Session::process`]
//! executes it against the device and produces the reply (any thread, any order);
//! [`Session::send`] writes that reply, whole, to the stream (the caller serialises
//! replies so that one reply's header and payload are never interleaved with another's).

use std::io::{self, Read, Write};
use std::sync::Arc;

use cryptblk_dm::device::WriteFlags;

use super::pieces::{PieceOp, Pieces, PIECE};
use super::proto::*;
use super::wire::skip;
use super::Shared;

/// Payloads of rejected writes up to this size are read and dropped to keep the
/// connection in sync; larger ones close the connection (deemed a denial of service).
const MAX_SKIPPED_PAYLOAD: u64 = 128 << 20;
/// Reads are executed in steps of this size so a failure can be reported with its offset.
const READ_STEP: usize = 4 << 20;

/// What a client negotiated for the transmission phase.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Session {
    /// Structured replies were negotiated.
    pub(crate) structured: bool,
    /// The client agreed to the advertised block sizes (asked for `NBD_INFO_BLOCK_SIZE`).
    pub(crate) strict: bool,
    /// The client selected the `base:allocation` metadata context.
    pub(crate) block_status: bool,
}

/// A request header of the transmission phase.
struct Request {
    flags: u16,
    kind: u16,
    handle: u64,
    offset: u64,
    length: u32,
}

/// A failed request: the protocol error value, a message for humans and, when known, the
/// offset where the failure happened.
pub(crate) struct Failure {
    error: u32,
    message: String,
    offset: Option<u64>,
}

impl Failure {
    fn new(error: u32, message: impl Into<String>) -> Self {
        Failure {
            error,
            message: message.into(),
            offset: None,
        }
    }

    fn device(err: io::Error, what: &str) -> Self {
        Failure::new(error_value(&err), format!("{what} failed: {err}"))
    }
}

/// One request read from the stream, ready to be processed.
pub(crate) struct Incoming {
    req: Request,
    /// A write's payload.
    payload: Vec<u8>,
    /// A large write's payload instead, received in pieces that helpers already write
    /// while later ones arrive (see [`super::pieces`]).
    pieces: Option<Arc<Pieces>>,
    /// Set when the request was refused while its payload was read (a write that is not
    /// allowed or out of range); processing then only replies with it.
    refused: Option<Failure>,
}

impl Incoming {
    /// Whether the request changes the device: a FLUSH received after it must wait for it.
    pub(crate) fn is_write(&self) -> bool {
        self.refused.is_none() && matches!(self.req.kind, CMD_WRITE | CMD_WRITE_ZEROES | CMD_TRIM)
    }

    /// Bytes of memory the request holds until it has replied (a write's payload, a read's
    /// data).
    pub(crate) fn buffer_len(&self) -> u64 {
        match (&self.pieces, self.req.kind) {
            (_, CMD_READ) => u64::from(self.req.length),
            (Some(p), _) => p.len() as u64,
            _ => self.payload.len() as u64,
        }
    }

    /// The client's handle of the request.
    pub(crate) fn handle(&self) -> u64 {
        self.req.handle
    }

    /// Whether the request is a FLUSH.
    pub(crate) fn is_flush(&self) -> bool {
        self.req.kind == CMD_FLUSH
    }
}

/// What [`Session::receive`] read.
pub(crate) enum Received {
    /// A request to process; with `then_close` the stream is out of sync after it (a refused
    /// write whose payload is too large to skip): reply to it, then read no more.
    Request {
        incoming: Incoming,
        then_close: bool,
    },
    /// `NBD_CMD_DISC`: reply to what is in flight, then close.
    Disconnect,
    /// The client closed its side between requests (a normal end).
    Eof,
}

/// A reply ready to be sent.
pub(crate) struct Outgoing {
    handle: u64,
    body: Body,
}

enum Body {
    Status(Result<(), Failure>),
    /// A read: `buf[..good]` was read successfully; `failure` stopped it if set.
    Read {
        offset: u64,
        buf: Vec<u8>,
        good: usize,
        failure: Option<Failure>,
    },
    /// One `base:allocation` extent of this length.
    BlockStatus(u32),
}

impl Session {
    /// Reads the next request, and a write's payload, from `stream`.
    pub(crate) fn receive(
        &self,
        shared: &Arc<Shared>,
        stream: &mut impl Read,
    ) -> io::Result<Received> {
        let mut header = [0u8; 28];
        let got = loop {
            match stream.read(&mut header) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        };
        // A client going away between requests is a normal end.
        if got == 0 {
            return Ok(Received::Eof);
        }
        stream.read_exact(&mut header[got..])?;
        let magic = u32::from_be_bytes(header[0..4].try_into().unwrap_or_default());
        if magic != REQUEST_MAGIC {
            // Without a valid header the stream cannot be resynchronised.
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad request magic {magic:#x}"),
            ));
        }
        let req = Request {
            flags: u16::from_be_bytes([header[4], header[5]]),
            kind: u16::from_be_bytes([header[6], header[7]]),
            handle: u64::from_be_bytes(header[8..16].try_into().unwrap_or_default()),
            offset: u64::from_be_bytes(header[16..24].try_into().unwrap_or_default()),
            length: u32::from_be_bytes(header[24..28].try_into().unwrap_or_default()),
        };
        if req.kind == CMD_DISC {
            return Ok(Received::Disconnect);
        }
        if req.kind != CMD_WRITE {
            return Ok(Received::Request {
                incoming: Incoming {
                    req,
                    payload: Vec::new(),
                    pieces: None,
                    refused: None,
                },
                then_close: false,
            });
        }
        let len = u64::from(req.length);
        let verdict = self
            .check_writable(shared)
            .and_then(|()| self.validate(shared, &req, CMD_FLAG_FUA, ENOSPC, true));
        if let Err(failure) = verdict {
            // Keep the stream in sync by consuming the payload, unless it is absurdly large.
            let then_close = len > MAX_SKIPPED_PAYLOAD;
            if !then_close {
                skip(stream, len)?;
            }
            return Ok(Received::Request {
                incoming: Incoming {
                    req,
                    payload: Vec::new(),
                    pieces: None,
                    refused: Some(failure),
                },
                then_close,
            });
        }
        if overlaps(shared, req.length) {
            let pieces = self.receive_in_pieces(shared, &req, stream)?;
            return Ok(Received::Request {
                incoming: Incoming {
                    req,
                    payload: Vec::new(),
                    pieces: Some(pieces),
                    refused: None,
                },
                then_close: false,
            });
        }
        // A client vanishing mid-payload aborts here, before anything reaches the device.
        let mut payload = vec![0u8; req.length as usize];
        stream.read_exact(&mut payload)?;
        Ok(Received::Request {
            incoming: Incoming {
                req,
                payload,
                pieces: None,
                refused: None,
            },
            then_close: false,
        })
    }

    /// A large write's payload, piece by piece: once the first piece is in, a helper job
    /// encrypts and writes each piece as it arrives while this thread reads the next.
    /// A client vanishing mid-payload leaves the pieces before it written (as a crash
    /// would leave an unacknowledged write), never a partial piece.
    fn receive_in_pieces(
        &self,
        shared: &Arc<Shared>,
        req: &Request,
        stream: &mut impl Read,
    ) -> io::Result<Arc<Pieces>> {
        let pieces = Arc::new(Pieces::new(
            req.offset,
            req.length as usize,
            PieceOp::Write(fua(req)),
        ));
        for k in 0..pieces.count() {
            // SAFETY: piece k is not available yet, so no other thread touches it.
            if let Err(e) = stream.read_exact(unsafe { pieces.piece_mut(k) }) {
                pieces.abort();
                return Err(e);
            }
            pieces.arrived(k + 1);
            if k == 0 {
                submit_helper(shared, &pieces);
            }
        }
        Ok(pieces)
    }

    /// A large structured read to send in pieces as they are read and decrypted (a helper
    /// job starts on them now), or `None` for a request that takes the ordinary path.
    pub(crate) fn read_in_pieces(
        &self,
        shared: &Arc<Shared>,
        incoming: &Incoming,
    ) -> Option<Arc<Pieces>> {
        let req = &incoming.req;
        let eligible = self.structured
            && incoming.refused.is_none()
            && req.kind == CMD_READ
            && overlaps(shared, req.length)
            && self
                .validate(shared, req, CMD_FLAG_FUA, EINVAL, true)
                .is_ok();
        if !eligible {
            return None;
        }
        let pieces = Arc::new(Pieces::new(req.offset, req.length as usize, PieceOp::Read));
        submit_helper(shared, &pieces);
        Some(pieces)
    }

    /// Sends piece `k` of a read in pieces as one data chunk (the last with the DONE flag),
    /// or the error that stopped the read at that piece. True while more pieces follow.
    pub(crate) fn send_read_piece(
        &self,
        handle: u64,
        pieces: &Pieces,
        k: usize,
        result: io::Result<()>,
        w: &mut impl Write,
    ) -> io::Result<bool> {
        let at = pieces.offset_of(k);
        match result {
            Ok(()) => {
                let last = k + 1 == pieces.count();
                let flags = if last { REPLY_FLAG_DONE } else { 0 };
                let data = pieces.done_piece(k);
                write_chunk(
                    w,
                    handle,
                    flags,
                    REPLY_TYPE_OFFSET_DATA,
                    &at.to_be_bytes(),
                    data,
                )?;
                Ok(!last)
            }
            Err(e) => {
                let mut f = Failure::device(e, "read");
                f.offset = Some(at);
                error_chunk(w, handle, &f)?;
                Ok(false)
            }
        }
    }

    /// Executes a request against the device and returns its reply.
    pub(crate) fn process(&self, shared: &Shared, incoming: Incoming) -> Outgoing {
        let Incoming {
            req,
            mut payload,
            pieces,
            refused,
        } = incoming;
        let body = if let Some(failure) = refused {
            Body::Status(Err(failure))
        } else {
            match req.kind {
                CMD_READ => self.read(shared, &req),
                CMD_WRITE if pieces.is_some() => {
                    let finished = pieces.as_deref().map(|p| p.finish(&shared.io));
                    Body::Status(finished.unwrap_or(Ok(())).map_err(|(at, e)| {
                        let mut f = Failure::device(e, "write");
                        f.offset = Some(at);
                        f
                    }))
                }
                CMD_WRITE => Body::Status(
                    shared
                        .io
                        .write_at_scratch(req.offset, &mut payload, fua(&req))
                        .map_err(|e| Failure::device(e, "write")),
                ),
                CMD_BLOCK_STATUS if self.block_status => self.block_status(shared, &req),
                _ => Body::Status(self.execute(shared, &req)),
            }
        };
        Outgoing {
            handle: req.handle,
            body,
        }
    }

    /// Writes a reply (all its chunks) to `w`.
    pub(crate) fn send(&self, out: &Outgoing, w: &mut impl Write) -> io::Result<()> {
        let handle = out.handle;
        match &out.body {
            Body::Status(result) => self.reply_status(w, handle, result),
            Body::BlockStatus(length) => {
                let mut payload = Vec::with_capacity(12);
                payload.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
                payload.extend_from_slice(&length.to_be_bytes());
                payload.extend_from_slice(&0u32.to_be_bytes());
                write_chunk(
                    w,
                    handle,
                    REPLY_FLAG_DONE,
                    REPLY_TYPE_BLOCK_STATUS,
                    &payload,
                    &[],
                )
            }
            Body::Read {
                offset,
                buf,
                good,
                failure,
            } => {
                if !self.structured {
                    return match failure {
                        Some(f) => write_simple(w, handle, f.error, &[]),
                        None => write_simple(w, handle, 0, buf),
                    };
                }
                match failure {
                    None if buf.is_empty() => {
                        write_chunk(w, handle, REPLY_FLAG_DONE, REPLY_TYPE_NONE, &[], &[])
                    }
                    None => write_chunk(
                        w,
                        handle,
                        REPLY_FLAG_DONE,
                        REPLY_TYPE_OFFSET_DATA,
                        &offset.to_be_bytes(),
                        buf,
                    ),
                    Some(f) => {
                        if *good > 0 {
                            write_chunk(
                                w,
                                handle,
                                0,
                                REPLY_TYPE_OFFSET_DATA,
                                &offset.to_be_bytes(),
                                &buf[..*good],
                            )?;
                        }
                        error_chunk(w, handle, f)
                    }
                }
            }
        }
    }

    /// Checks flags and range of a request; `beyond_end` is the error for out-of-range.
    fn validate(
        &self,
        shared: &Shared,
        req: &Request,
        allowed_flags: u16,
        beyond_end: u32,
        check_max: bool,
    ) -> Result<(), Failure> {
        validate_flags(req, allowed_flags)?;
        let len = u64::from(req.length);
        if check_max && req.length > shared.block_sizes.2 {
            return Err(Failure::new(
                EINVAL,
                format!(
                    "length {len} exceeds the maximum block size {}",
                    shared.block_sizes.2
                ),
            ));
        }
        match req.offset.checked_add(len) {
            Some(end) if end <= shared.io.size() => {}
            _ => {
                return Err(Failure::new(
                    beyond_end,
                    format!(
                        "request {}+{len} reaches past the end of the export",
                        req.offset
                    ),
                ))
            }
        }
        if self.strict && !shared.io.is_aligned(req.offset, len) {
            return Err(Failure::new(
                EINVAL,
                format!(
                    "request {}+{len} is not aligned to the agreed minimum block size {}",
                    req.offset,
                    shared.io.block_size()
                ),
            ));
        }
        Ok(())
    }

    fn check_writable(&self, shared: &Shared) -> Result<(), Failure> {
        if shared.config.read_only {
            return Err(Failure::new(EPERM, "export is read-only"));
        }
        Ok(())
    }

    /// Commands without payload in either direction.
    fn execute(&self, shared: &Shared, req: &Request) -> Result<(), Failure> {
        let io = &shared.io;
        let len = u64::from(req.length);
        match req.kind {
            CMD_FLUSH => {
                validate_flags(req, CMD_FLAG_FUA)?;
                io.flush().map_err(|e| Failure::device(e, "flush"))
            }
            CMD_TRIM => {
                self.check_writable(shared)?;
                self.validate(shared, req, CMD_FLAG_FUA, EINVAL, false)?;
                io.discard(req.offset, len)
                    .map_err(|e| Failure::device(e, "trim"))?;
                if fua(req).fua {
                    io.flush()
                        .map_err(|e| Failure::device(e, "flush after trim"))?;
                }
                Ok(())
            }
            CMD_WRITE_ZEROES => {
                self.check_writable(shared)?;
                self.validate(shared, req, CMD_FLAG_FUA | CMD_FLAG_NO_HOLE, ENOSPC, false)?;
                // Zeroes are always written out (the device provisions them), so NO_HOLE
                // needs no special handling.
                io.write_zeroes(req.offset, len, fua(req))
                    .map_err(|e| Failure::device(e, "write zeroes"))
            }
            CMD_CACHE => {
                // There is no server-side cache to populate; a validated request succeeds.
                self.validate(shared, req, CMD_FLAG_FUA, EINVAL, true)
            }
            CMD_BLOCK_STATUS => Err(Failure::new(
                EINVAL,
                "no metadata context was selected with NBD_OPT_SET_META_CONTEXT",
            )),
            other => Err(Failure::new(EINVAL, format!("unknown command {other}"))),
        }
    }

    fn read(&self, shared: &Shared, req: &Request) -> Body {
        if let Err(failure) = self.validate(shared, req, CMD_FLAG_FUA, EINVAL, true) {
            return Body::Status(Err(failure));
        }
        let len = req.length as usize;
        let mut buf = vec![0u8; len];
        // Read step by step; remember the first failure and how much data precedes it.
        let mut good = 0usize;
        let mut failure = None;
        while good < len {
            let step = (len - good).min(READ_STEP);
            let at = req.offset + good as u64;
            match shared.io.read_at(at, &mut buf[good..good + step]) {
                Ok(()) => good += step,
                Err(e) => {
                    let mut f = Failure::device(e, "read");
                    f.offset = Some(at);
                    failure = Some(f);
                    break;
                }
            }
        }
        Body::Read {
            offset: req.offset,
            buf,
            good,
            failure,
        }
    }

    /// `base:allocation` status: every byte of a device is allocated and its contents are
    /// not known to be zero, so the whole range is one extent with status 0 (which the
    /// protocol says is always safe to report).
    fn block_status(&self, shared: &Shared, req: &Request) -> Body {
        let checked = self.validate(shared, req, CMD_FLAG_FUA | CMD_FLAG_REQ_ONE, EINVAL, false);
        let checked = checked.and_then(|()| {
            if req.length == 0 {
                Err(Failure::new(EINVAL, "block status of an empty range"))
            } else {
                Ok(())
            }
        });
        match checked {
            Ok(()) => Body::BlockStatus(req.length),
            Err(f) => Body::Status(Err(f)),
        }
    }

    fn reply_status(
        &self,
        w: &mut impl Write,
        handle: u64,
        result: &Result<(), Failure>,
    ) -> io::Result<()> {
        match (result, self.structured) {
            (Ok(()), false) => write_simple(w, handle, 0, &[]),
            (Ok(()), true) => write_chunk(w, handle, REPLY_FLAG_DONE, REPLY_TYPE_NONE, &[], &[]),
            (Err(f), false) => {
                log::debug!("NBD request failed: {}", f.message);
                write_simple(w, handle, f.error, &[])
            }
            (Err(f), true) => error_chunk(w, handle, f),
        }
    }
}

/// Whether a READ or WRITE of `length` bytes is done in pieces (see [`super::pieces`]).
fn overlaps(shared: &Shared, length: u32) -> bool {
    let min = shared.config.overlap_min;
    let len = length as usize;
    min > 0 && len >= min && len > PIECE
}

/// Queues a helper job on the server's pool for `pieces`; the request's own thread does
/// every piece the helper has not claimed, so the job may start late or find nothing.
fn submit_helper(shared: &Arc<Shared>, pieces: &Arc<Pieces>) {
    let (p, s) = (Arc::clone(pieces), Arc::clone(shared));
    shared.pool.submit(Box::new(move || p.help(&s.io)));
}

fn fua(req: &Request) -> WriteFlags {
    WriteFlags {
        fua: req.flags & CMD_FLAG_FUA != 0,
    }
}

fn validate_flags(req: &Request, allowed: u16) -> Result<(), Failure> {
    if req.flags & !allowed != 0 {
        return Err(Failure::new(
            EINVAL,
            format!(
                "command flags {:#x} not valid for command {}",
                req.flags, req.kind
            ),
        ));
    }
    Ok(())
}

fn error_chunk(w: &mut impl Write, handle: u64, f: &Failure) -> io::Result<()> {
    let message = &f.message.as_bytes()[..f.message.len().min(4096)];
    let mut payload = Vec::with_capacity(14 + message.len());
    payload.extend_from_slice(&f.error.to_be_bytes());
    payload.extend_from_slice(&(message.len() as u16).to_be_bytes());
    payload.extend_from_slice(message);
    let kind = match f.offset {
        Some(offset) => {
            payload.extend_from_slice(&offset.to_be_bytes());
            REPLY_TYPE_ERROR_OFFSET
        }
        None => REPLY_TYPE_ERROR,
    };
    write_chunk(w, handle, REPLY_FLAG_DONE, kind, &payload, &[])
}

fn write_simple(w: &mut impl Write, handle: u64, error: u32, data: &[u8]) -> io::Result<()> {
    let mut header = [0u8; 16];
    header[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    header[4..8].copy_from_slice(&error.to_be_bytes());
    header[8..16].copy_from_slice(&handle.to_be_bytes());
    write_two(w, &header, data)
}

/// Writes a structured reply chunk whose payload is `prefix` followed by `data`.
fn write_chunk(
    w: &mut impl Write,
    handle: u64,
    flags: u16,
    kind: u16,
    prefix: &[u8],
    data: &[u8],
) -> io::Result<()> {
    let mut header = Vec::with_capacity(20 + prefix.len());
    header.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    header.extend_from_slice(&flags.to_be_bytes());
    header.extend_from_slice(&kind.to_be_bytes());
    header.extend_from_slice(&handle.to_be_bytes());
    header.extend_from_slice(&((prefix.len() + data.len()) as u32).to_be_bytes());
    header.extend_from_slice(prefix);
    write_two(w, &header, data)
}

/// Writes a header and a payload with one system call where the socket takes them whole.
fn write_two(w: &mut impl Write, header: &[u8], data: &[u8]) -> io::Result<()> {
    let mut parts = [io::IoSlice::new(header), io::IoSlice::new(data)];
    let mut slices = &mut parts[..];
    while !slices.is_empty() {
        match w.write_vectored(slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => io::IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
