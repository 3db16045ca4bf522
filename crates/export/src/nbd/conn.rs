//! One NBD client connection: handshake, option haggling, then the transmission phase.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;

use cryptblk_dm::device::WriteFlags;

use super::proto::*;
use super::Shared;

/// A connected client socket.
pub(crate) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }

    /// Closes both directions, even while other clones of the socket exist.
    pub(crate) fn shutdown_both(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }

    /// Makes pending and future reads return end-of-file; replies can still be sent.
    pub(crate) fn shutdown_read(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(Shutdown::Read),
            Stream::Tcp(s) => s.shutdown(Shutdown::Read),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Option data beyond this is not buffered (the protocol caps strings at 4096 bytes).
const MAX_OPTION_DATA: u32 = 64 << 10;
/// Payloads of rejected writes up to this size are read and dropped to keep the
/// connection in sync; larger ones close the connection (deemed a denial of service).
const MAX_SKIPPED_PAYLOAD: u64 = 128 << 20;
/// Reads are executed in steps of this size so a failure can be reported with its offset.
const READ_STEP: usize = 4 << 20;

/// How the handshake ended.
enum Negotiated {
    /// Enter transmission; `strict` is true when the client agreed to the block sizes,
    /// `block_status` when it selected the `base:allocation` metadata context.
    Transmission {
        structured: bool,
        strict: bool,
        block_status: bool,
    },
    /// The client aborted or the connection must close.
    Close,
}

/// Serves one client until it disconnects or the server stops, then closes the socket
/// (explicitly: the server keeps a clone of it for stopping, which would keep it open).
pub(crate) fn serve(stream: Stream, shared: &Shared) -> io::Result<()> {
    let control = stream.try_clone();
    let result = serve_inner(stream, shared);
    if let Ok(control) = control {
        control.shutdown_both();
    }
    result
}

fn serve_inner(mut stream: Stream, shared: &Shared) -> io::Result<()> {
    match handshake(&mut stream, shared)? {
        Negotiated::Close => Ok(()),
        Negotiated::Transmission {
            structured,
            strict,
            block_status,
        } => {
            let mut conn = Transmission {
                stream,
                shared,
                structured,
                strict,
                block_status,
                buf: Vec::new(),
            };
            conn.run()
        }
    }
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

/// Reads and drops `len` bytes.
fn skip(r: &mut impl Read, len: u64) -> io::Result<()> {
    let copied = io::copy(&mut r.take(len), &mut io::sink())?;
    if copied < len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

fn transmission_flags(shared: &Shared) -> u16 {
    let mut flags = TFLAG_HAS_FLAGS
        | TFLAG_SEND_FLUSH
        | TFLAG_SEND_FUA
        | TFLAG_SEND_TRIM
        | TFLAG_SEND_WRITE_ZEROES
        | TFLAG_CAN_MULTI_CONN
        | TFLAG_SEND_CACHE;
    if shared.config.read_only {
        flags |= TFLAG_READ_ONLY;
    }
    flags
}

fn send_option_reply(w: &mut impl Write, option: u32, reply: u32, data: &[u8]) -> io::Result<()> {
    let mut msg = Vec::with_capacity(20 + data.len());
    msg.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    msg.extend_from_slice(&option.to_be_bytes());
    msg.extend_from_slice(&reply.to_be_bytes());
    msg.extend_from_slice(&(data.len() as u32).to_be_bytes());
    msg.extend_from_slice(data);
    w.write_all(&msg)
}

fn export_known(shared: &Shared, name: &[u8]) -> bool {
    name.is_empty() || name == shared.config.export_name.as_bytes()
}

fn handshake(stream: &mut Stream, shared: &Shared) -> io::Result<Negotiated> {
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    stream.write_all(&hello)?;
    let client_flags = read_u32(stream)?;
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        // The protocol requires dropping clients that set flags we did not offer.
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("client sent unknown handshake flags {client_flags:#x}"),
        ));
    }
    let no_zeroes = client_flags & FLAG_C_NO_ZEROES != 0;
    let mut structured = false;
    // Whether the last NBD_OPT_SET_META_CONTEXT selected base:allocation.
    let mut meta_selected = false;
    loop {
        let magic = read_u64(stream)?;
        if magic != IHAVEOPT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad option magic {magic:#x}"),
            ));
        }
        let option = read_u32(stream)?;
        let len = read_u32(stream)?;
        if len > MAX_OPTION_DATA {
            skip(stream, u64::from(len))?;
            send_option_reply(stream, option, REP_ERR_TOO_BIG, b"option data too large")?;
            continue;
        }
        let mut data = vec![0u8; len as usize];
        stream.read_exact(&mut data)?;
        if shared.stopping.load(Ordering::SeqCst) && option != OPT_ABORT {
            if option == OPT_EXPORT_NAME {
                return Ok(Negotiated::Close);
            }
            send_option_reply(stream, option, REP_ERR_SHUTDOWN, b"server is shutting down")?;
            continue;
        }
        match option {
            OPT_EXPORT_NAME => {
                if !export_known(shared, &data) {
                    // This option cannot fail politely: the protocol mandates a disconnect.
                    return Ok(Negotiated::Close);
                }
                let mut reply = Vec::with_capacity(134);
                reply.extend_from_slice(&shared.io.size().to_be_bytes());
                reply.extend_from_slice(&transmission_flags(shared).to_be_bytes());
                if !no_zeroes {
                    reply.extend_from_slice(&[0u8; 124]);
                }
                stream.write_all(&reply)?;
                return Ok(Negotiated::Transmission {
                    structured,
                    strict: false,
                    block_status: meta_selected,
                });
            }
            OPT_ABORT => {
                let _ = send_option_reply(stream, option, REP_ACK, &[]);
                return Ok(Negotiated::Close);
            }
            OPT_LIST => {
                if !data.is_empty() {
                    send_option_reply(
                        stream,
                        option,
                        REP_ERR_INVALID,
                        b"NBD_OPT_LIST takes no data",
                    )?;
                    continue;
                }
                let name = shared.config.export_name.as_bytes();
                let mut server = Vec::new();
                server.extend_from_slice(&(name.len() as u32).to_be_bytes());
                server.extend_from_slice(name);
                server.extend_from_slice(shared.config.description.as_bytes());
                send_option_reply(stream, option, REP_SERVER, &server)?;
                send_option_reply(stream, option, REP_ACK, &[])?;
            }
            OPT_INFO | OPT_GO => {
                if let Some(strict) = info_or_go(stream, shared, option, &data)? {
                    if option == OPT_GO {
                        return Ok(Negotiated::Transmission {
                            structured,
                            strict,
                            block_status: meta_selected,
                        });
                    }
                }
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    send_option_reply(
                        stream,
                        option,
                        REP_ERR_INVALID,
                        b"NBD_OPT_STRUCTURED_REPLY takes no data",
                    )?;
                    continue;
                }
                structured = true;
                send_option_reply(stream, option, REP_ACK, &[])?;
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                let set = option == OPT_SET_META_CONTEXT;
                if set {
                    // Every SET replaces the selection, even when it fails.
                    meta_selected = false;
                }
                if !structured {
                    send_option_reply(
                        stream,
                        option,
                        REP_ERR_INVALID,
                        b"metadata contexts need structured replies first",
                    )?;
                    continue;
                }
                let Some((name, queries)) = parse_meta_context(&data) else {
                    send_option_reply(
                        stream,
                        option,
                        REP_ERR_INVALID,
                        b"malformed metadata context request",
                    )?;
                    continue;
                };
                if !export_known(shared, name) {
                    send_option_reply(stream, option, REP_ERR_UNKNOWN, b"no such export")?;
                    continue;
                }
                // LIST with no query lists everything; `base:` is a wildcard for LIST only.
                let matches = queries
                    .iter()
                    .any(|q| *q == BASE_ALLOCATION.as_bytes() || (!set && *q == b"base:"))
                    || (!set && queries.is_empty());
                if matches {
                    let mut ctx = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
                    ctx.extend_from_slice(BASE_ALLOCATION.as_bytes());
                    send_option_reply(stream, option, REP_META_CONTEXT, &ctx)?;
                    meta_selected |= set;
                }
                send_option_reply(stream, option, REP_ACK, &[])?;
            }
            _ => {
                send_option_reply(stream, option, REP_ERR_UNSUP, b"option not supported")?;
            }
        }
    }
}

/// Splits the data of a metadata context option into export name and queries.
fn parse_meta_context(data: &[u8]) -> Option<(&[u8], Vec<&[u8]>)> {
    fn take<'a>(data: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if data.len() < n {
            return None;
        }
        let (head, tail) = data.split_at(n);
        *data = tail;
        Some(head)
    }
    fn take_u32(data: &mut &[u8]) -> Option<usize> {
        take(data, 4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }
    let mut rest = data;
    let name_len = take_u32(&mut rest)?;
    let name = take(&mut rest, name_len)?;
    let count = take_u32(&mut rest)?;
    let mut queries = Vec::new();
    for _ in 0..count {
        let len = take_u32(&mut rest)?;
        queries.push(take(&mut rest, len)?);
    }
    rest.is_empty().then_some((name, queries))
}

/// Answers `NBD_OPT_INFO`/`NBD_OPT_GO`. Returns `Some(block_size_requested)` on success.
fn info_or_go(
    stream: &mut Stream,
    shared: &Shared,
    option: u32,
    data: &[u8],
) -> io::Result<Option<bool>> {
    let invalid =
        |stream: &mut Stream, msg: &[u8]| send_option_reply(stream, option, REP_ERR_INVALID, msg);
    if data.len() < 6 {
        invalid(stream, b"option data too short")?;
        return Ok(None);
    }
    let name_len = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
    if name_len > data.len() - 6 {
        invalid(stream, b"export name length exceeds option data")?;
        return Ok(None);
    }
    let name = &data[4..4 + name_len];
    let rest = &data[4 + name_len..];
    let count = u16::from_be_bytes([rest[0], rest[1]]) as usize;
    if rest.len() != 2 + 2 * count {
        invalid(
            stream,
            b"information request list does not match option length",
        )?;
        return Ok(None);
    }
    let requests: Vec<u16> = rest[2..]
        .chunks_exact(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect();
    if !export_known(shared, name) {
        send_option_reply(stream, option, REP_ERR_UNKNOWN, b"no such export")?;
        return Ok(None);
    }
    let mut export = Vec::with_capacity(12);
    export.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    export.extend_from_slice(&shared.io.size().to_be_bytes());
    export.extend_from_slice(&transmission_flags(shared).to_be_bytes());
    send_option_reply(stream, option, REP_INFO, &export)?;
    // Block sizes are always sent (the server MAY send unrequested information), but only
    // a client that asked for them is held to them.
    let (min, preferred, max) = shared.block_sizes;
    let mut sizes = Vec::with_capacity(14);
    sizes.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    sizes.extend_from_slice(&min.to_be_bytes());
    sizes.extend_from_slice(&preferred.to_be_bytes());
    sizes.extend_from_slice(&max.to_be_bytes());
    send_option_reply(stream, option, REP_INFO, &sizes)?;
    if requests.contains(&INFO_NAME) {
        let mut info = INFO_NAME.to_be_bytes().to_vec();
        info.extend_from_slice(shared.config.export_name.as_bytes());
        send_option_reply(stream, option, REP_INFO, &info)?;
    }
    if requests.contains(&INFO_DESCRIPTION) && !shared.config.description.is_empty() {
        let mut info = INFO_DESCRIPTION.to_be_bytes().to_vec();
        info.extend_from_slice(shared.config.description.as_bytes());
        send_option_reply(stream, option, REP_INFO, &info)?;
    }
    send_option_reply(stream, option, REP_ACK, &[])?;
    Ok(Some(requests.contains(&INFO_BLOCK_SIZE)))
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

struct Transmission<'a> {
    stream: Stream,
    shared: &'a Shared,
    structured: bool,
    strict: bool,
    block_status: bool,
    buf: Vec<u8>,
}

impl Transmission<'_> {
    fn run(&mut self) -> io::Result<()> {
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

/// Writes a header and a payload, coalescing small payloads into one system call.
fn write_two(w: &mut impl Write, header: &[u8], data: &[u8]) -> io::Result<()> {
    if data.len() <= 4096 {
        let mut msg = Vec::with_capacity(header.len() + data.len());
        msg.extend_from_slice(header);
        msg.extend_from_slice(data);
        return w.write_all(&msg);
    }
    w.write_all(header)?;
    w.write_all(data)
}
