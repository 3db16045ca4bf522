//! The transmission phase: requests, validation, device I/O and replies.

use std::io::{self, Read, Write};

use cryptblk_dm::device::WriteFlags;

use super::proto::*;
use super::wire::{skip, Stream};
use super::Shared;

/// Payloads of rejected writes up to this size are read and dropped to keep the
/// connection in sync; larger ones close the connection (deemed a denial of service).
const MAX_SKIPPED_PAYLOAD: u64 = 128 << 20;
/// Reads are executed in steps of this size so a failure can be reported with its offset.
const READ_STEP: usize = 4 << 20;

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
struct Failure {
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

pub(crate) struct Transmission<'a> {
    stream: Stream,
    shared: &'a Shared,
    structured: bool,
    strict: bool,
    block_status: bool,
    buf: Vec<u8>,
}

impl<'a> Transmission<'a> {
    pub(crate) fn new(
        stream: Stream,
        shared: &'a Shared,
        structured: bool,
        strict: bool,
        block_status: bool,
    ) -> Self {
        Transmission {
            stream,
            shared,
            structured,
            strict,
            block_status,
            buf: Vec::new(),
        }
    }

    pub(crate) fn run(&mut self) -> io::Result<()> {
        loop {
            let mut header = [0u8; 28];
            match self.stream.read_exact(&mut header) {
                Ok(()) => {}
                // A client going away between requests is a normal end.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
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
                return Ok(());
            }
            self.handle(&req)?;
        }
    }

    fn handle(&mut self, req: &Request) -> io::Result<()> {
        match req.kind {
            CMD_READ => self.read(req),
            CMD_WRITE => self.write(req),
            CMD_BLOCK_STATUS if self.block_status => self.block_status(req),
            _ => {
                let result = self.execute(req);
                self.reply_status(req.handle, result)
            }
        }
    }

    /// Checks flags and range of a request; `beyond_end` is the error for out-of-range.
    fn validate(
        &self,
        req: &Request,
        allowed_flags: u16,
        beyond_end: u32,
        check_max: bool,
    ) -> Result<(), Failure> {
        if req.flags & !allowed_flags != 0 {
            return Err(Failure::new(
                EINVAL,
                format!(
                    "command flags {:#x} not valid for command {}",
                    req.flags, req.kind
                ),
            ));
        }
        let len = u64::from(req.length);
        if check_max && req.length > self.shared.block_sizes.2 {
            return Err(Failure::new(
                EINVAL,
                format!(
                    "length {len} exceeds the maximum block size {}",
                    self.shared.block_sizes.2
                ),
            ));
        }
        match req.offset.checked_add(len) {
            Some(end) if end <= self.shared.io.size() => {}
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
        if self.strict && !self.shared.io.is_aligned(req.offset, len) {
            return Err(Failure::new(
                EINVAL,
                format!(
                    "request {}+{len} is not aligned to the agreed minimum block size {}",
                    req.offset,
                    self.shared.io.block_size()
                ),
            ));
        }
        Ok(())
    }

    fn check_writable(&self) -> Result<(), Failure> {
        if self.shared.config.read_only {
            return Err(Failure::new(EPERM, "export is read-only"));
        }
        Ok(())
    }

    fn fua(&self, req: &Request) -> WriteFlags {
        WriteFlags {
            fua: req.flags & CMD_FLAG_FUA != 0,
        }
    }

    /// Commands without payload in either direction.
    fn execute(&mut self, req: &Request) -> Result<(), Failure> {
        let io = &self.shared.io;
        let len = u64::from(req.length);
        match req.kind {
            CMD_FLUSH => {
                self.validate_flags(req, CMD_FLAG_FUA)?;
                io.flush().map_err(|e| Failure::device(e, "flush"))
            }
            CMD_TRIM => {
                self.check_writable()?;
                self.validate(req, CMD_FLAG_FUA, EINVAL, false)?;
                io.discard(req.offset, len)
                    .map_err(|e| Failure::device(e, "trim"))?;
                if self.fua(req).fua {
                    io.flush()
                        .map_err(|e| Failure::device(e, "flush after trim"))?;
                }
                Ok(())
            }
            CMD_WRITE_ZEROES => {
                self.check_writable()?;
                self.validate(req, CMD_FLAG_FUA | CMD_FLAG_NO_HOLE, ENOSPC, false)?;
                // Zeroes are always written out (the device provisions them), so NO_HOLE
                // needs no special handling.
                io.write_zeroes(req.offset, len, self.fua(req))
                    .map_err(|e| Failure::device(e, "write zeroes"))
            }
            CMD_CACHE => {
                // There is no server-side cache to populate; a validated request succeeds.
                self.validate(req, CMD_FLAG_FUA, EINVAL, true)
            }
            CMD_BLOCK_STATUS => Err(Failure::new(
                EINVAL,
                "no metadata context was selected with NBD_OPT_SET_META_CONTEXT",
            )),
            other => Err(Failure::new(EINVAL, format!("unknown command {other}"))),
        }
    }

    fn validate_flags(&self, req: &Request, allowed: u16) -> Result<(), Failure> {
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

    fn write(&mut self, req: &Request) -> io::Result<()> {
        let len = u64::from(req.length);
        let verdict = self
            .check_writable()
            .and_then(|()| self.validate(req, CMD_FLAG_FUA, ENOSPC, true));
        if let Err(failure) = verdict {
            // Keep the stream in sync by consuming the payload, unless it is absurdly large.
            if len > MAX_SKIPPED_PAYLOAD {
                self.reply_status(req.handle, Err(failure))?;
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("write payload of {len} bytes is too large to skip"),
                ));
            }
            skip(&mut self.stream, len)?;
            return self.reply_status(req.handle, Err(failure));
        }
        self.buf.resize(req.length as usize, 0);
        // A client vanishing mid-payload aborts here, before anything reaches the device.
        self.stream.read_exact(&mut self.buf)?;
        let flags = self.fua(req);
        let result = self
            .shared
            .io
            .write_at_scratch(req.offset, &mut self.buf, flags)
            .map_err(|e| Failure::device(e, "write"));
        self.reply_status(req.handle, result)
    }

    fn read(&mut self, req: &Request) -> io::Result<()> {
        if let Err(failure) = self.validate(req, CMD_FLAG_FUA, EINVAL, true) {
            return self.reply_status(req.handle, Err(failure));
        }
        let len = req.length as usize;
        self.buf.resize(len, 0);
        // Read step by step; remember the first failure and how much data precedes it.
        let mut good = 0usize;
        let mut failure = None;
        while good < len {
            let step = (len - good).min(READ_STEP);
            let at = req.offset + good as u64;
            match self.shared.io.read_at(at, &mut self.buf[good..good + step]) {
                Ok(()) => good += step,
                Err(e) => {
                    let mut f = Failure::device(e, "read");
                    f.offset = Some(at);
                    failure = Some(f);
                    break;
                }
            }
        }
        if !self.structured {
            return match failure {
                Some(f) => self.simple_reply(req.handle, f.error, &[]),
                None => {
                    let Transmission { stream, buf, .. } = self;
                    write_simple(stream, req.handle, 0, &buf[..len])
                }
            };
        }
        match failure {
            None if len == 0 => self.chunk(req.handle, REPLY_FLAG_DONE, REPLY_TYPE_NONE, &[], &[]),
            None => {
                let Transmission { stream, buf, .. } = self;
                write_chunk(
                    stream,
                    req.handle,
                    REPLY_FLAG_DONE,
                    REPLY_TYPE_OFFSET_DATA,
                    &req.offset.to_be_bytes(),
                    &buf[..len],
                )
            }
            Some(f) => {
                if good > 0 {
                    let Transmission { stream, buf, .. } = self;
                    write_chunk(
                        stream,
                        req.handle,
                        0,
                        REPLY_TYPE_OFFSET_DATA,
                        &req.offset.to_be_bytes(),
                        &buf[..good],
                    )?;
                }
                self.error_chunk(req.handle, &f)
            }
        }
    }

    /// `base:allocation` status: every byte of a device is allocated and its contents are
    /// not known to be zero, so the whole range is one extent with status 0 (which the
    /// protocol says is always safe to report).
    fn block_status(&mut self, req: &Request) -> io::Result<()> {
        let checked = self.validate(req, CMD_FLAG_FUA | CMD_FLAG_REQ_ONE, EINVAL, false);
        let checked = checked.and_then(|()| {
            if req.length == 0 {
                Err(Failure::new(EINVAL, "block status of an empty range"))
            } else {
                Ok(())
            }
        });
        if let Err(f) = checked {
            return self.reply_status(req.handle, Err(f));
        }
        let mut payload = Vec::with_capacity(12);
        payload.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
        payload.extend_from_slice(&req.length.to_be_bytes());
        payload.extend_from_slice(&0u32.to_be_bytes());
        self.chunk(
            req.handle,
            REPLY_FLAG_DONE,
            REPLY_TYPE_BLOCK_STATUS,
            &payload,
            &[],
        )
    }

    fn reply_status(&mut self, handle: u64, result: Result<(), Failure>) -> io::Result<()> {
        match (result, self.structured) {
            (Ok(()), false) => self.simple_reply(handle, 0, &[]),
            (Ok(()), true) => self.chunk(handle, REPLY_FLAG_DONE, REPLY_TYPE_NONE, &[], &[]),
            (Err(f), false) => {
                log::debug!("NBD request failed: {}", f.message);
                self.simple_reply(handle, f.error, &[])
            }
            (Err(f), true) => self.error_chunk(handle, &f),
        }
    }

    fn simple_reply(&mut self, handle: u64, error: u32, data: &[u8]) -> io::Result<()> {
        write_simple(&mut self.stream, handle, error, data)
    }

    fn chunk(
        &mut self,
        handle: u64,
        flags: u16,
        kind: u16,
        prefix: &[u8],
        data: &[u8],
    ) -> io::Result<()> {
        write_chunk(&mut self.stream, handle, flags, kind, prefix, data)
    }

    fn error_chunk(&mut self, handle: u64, f: &Failure) -> io::Result<()> {
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
        self.chunk(handle, REPLY_FLAG_DONE, kind, &payload, &[])
    }
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
