//! The fixed newstyle handshake and option haggling.

use std::io::{self, Read, Write};
use std::sync::atomic::Ordering;

use super::proto::*;
use super::transmission::Session;
use super::wire::{read_u32, read_u64, skip};
use super::Shared;

/// Option data beyond this is not buffered (the protocol caps strings at 4096 bytes).
const MAX_OPTION_DATA: u32 = 64 << 10;

/// How the handshake ended.
pub(crate) enum Negotiated {
    /// Enter transmission with what the client negotiated.
    Transmission(Session),
    /// The client aborted or the connection must close.
    Close,
    /// `NBD_OPT_STARTTLS` was acknowledged: the TLS handshake comes next, then
    /// [`Handshake::tls_started`] and the options go on inside TLS.
    StartTls,
}

pub(crate) fn transmission_flags(shared: &Shared) -> u16 {
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

/// The server's side of the handshake, one client message at a time, so that a connection
/// waiting for its client's next option holds no thread (the event loop re-arms it between
/// steps). Generic over the stream so it can be driven from memory as well as a socket.
pub(crate) struct Handshake {
    /// The client's flags have arrived (the first client message).
    flags_read: bool,
    no_zeroes: bool,
    structured: bool,
    /// Whether the last NBD_OPT_SET_META_CONTEXT selected base:allocation.
    meta_selected: bool,
    /// NBD_OPT_STARTTLS succeeded: everything since went through TLS.
    tls_active: bool,
}

impl Handshake {
    /// Sends the server's greeting and returns the state awaiting the client's flags.
    pub(crate) fn start(stream: &mut impl Write) -> io::Result<Handshake> {
        let mut hello = Vec::with_capacity(18);
        hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
        hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
        hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        stream.write_all(&hello)?;
        Ok(Handshake {
            flags_read: false,
            no_zeroes: false,
            structured: false,
            meta_selected: false,
            tls_active: false,
        })
    }

    /// The TLS handshake after `NBD_OPT_STARTTLS` completed. What was negotiated in
    /// plaintext is forgotten, as the protocol asks (an attacker could have injected it).
    pub(crate) fn tls_started(&mut self) {
        self.tls_active = true;
        self.structured = false;
        self.meta_selected = false;
    }

    /// Reads and answers one client message (its flags, then one option per call).
    /// `None`: the handshake goes on; `Some`: it ended.
    pub(crate) fn step<S: Read + Write>(
        &mut self,
        stream: &mut S,
        shared: &Shared,
    ) -> io::Result<Option<Negotiated>> {
        if !self.flags_read {
            let client_flags = read_u32(stream)?;
            if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
                // The protocol requires dropping clients that set flags we did not offer.
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("client sent unknown handshake flags {client_flags:#x}"),
                ));
            }
            self.no_zeroes = client_flags & FLAG_C_NO_ZEROES != 0;
            self.flags_read = true;
            return Ok(None);
        }
        let no_zeroes = self.no_zeroes;
        let structured = &mut self.structured;
        let meta_selected = &mut self.meta_selected;
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
            return Ok(None);
        }
        let mut data = vec![0u8; len as usize];
        stream.read_exact(&mut data)?;
        if shared.stopping.load(Ordering::SeqCst) && option != OPT_ABORT {
            if option == OPT_EXPORT_NAME {
                return Ok(Some(Negotiated::Close));
            }
            send_option_reply(stream, option, REP_ERR_SHUTDOWN, b"server is shutting down")?;
            return Ok(None);
        }
        let tls = shared.config.tls.as_ref();
        if option == OPT_STARTTLS {
            let (reply, msg): (u32, &[u8]) = match tls {
                None => (REP_ERR_UNSUP, b"TLS is not offered"),
                Some(_) if self.tls_active => (REP_ERR_INVALID, b"TLS is already active"),
                Some(_) if !data.is_empty() => (REP_ERR_INVALID, b"NBD_OPT_STARTTLS takes no data"),
                Some(_) => {
                    send_option_reply(stream, option, REP_ACK, &[])?;
                    return Ok(Some(Negotiated::StartTls));
                }
            };
            send_option_reply(stream, option, reply, msg)?;
            return Ok(None);
        }
        if tls.is_some_and(|t| t.require) && !self.tls_active {
            match option {
                // Cannot fail politely (see below); the client learns nothing.
                OPT_EXPORT_NAME => return Ok(Some(Negotiated::Close)),
                OPT_ABORT => {}
                _ => {
                    send_option_reply(stream, option, REP_ERR_TLS_REQD, b"TLS is required")?;
                    return Ok(None);
                }
            }
        }
        match option {
            OPT_EXPORT_NAME => {
                if !export_known(shared, &data) {
                    // This option cannot fail politely: the protocol mandates a disconnect.
                    return Ok(Some(Negotiated::Close));
                }
                let mut reply = Vec::with_capacity(134);
                reply.extend_from_slice(&shared.io.size().to_be_bytes());
                reply.extend_from_slice(&transmission_flags(shared).to_be_bytes());
                if !no_zeroes {
                    reply.extend_from_slice(&[0u8; 124]);
                }
                stream.write_all(&reply)?;
                return Ok(Some(Negotiated::Transmission(Session {
                    structured: *structured,
                    strict: false,
                    block_status: *meta_selected,
                })));
            }
            OPT_ABORT => {
                let _ = send_option_reply(stream, option, REP_ACK, &[]);
                return Ok(Some(Negotiated::Close));
            }
            OPT_LIST => {
                if !data.is_empty() {
                    send_option_reply(
                        stream,
                        option,
                        REP_ERR_INVALID,
                        b"NBD_OPT_LIST takes no data",
                    )?;
                    return Ok(None);
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
                        return Ok(Some(Negotiated::Transmission(Session {
                            structured: *structured,
                            strict,
                            block_status: *meta_selected,
                        })));
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
                    return Ok(None);
                }
                *structured = true;
                send_option_reply(stream, option, REP_ACK, &[])?;
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                let set = option == OPT_SET_META_CONTEXT;
                if set {
                    // Every SET replaces the selection, even when it fails.
                    *meta_selected = false;
                }
                if !*structured {
                    send_option_reply(
                        stream,
                        option,
                        REP_ERR_INVALID,
                        b"metadata contexts need structured replies first",
                    )?;
                    return Ok(None);
                }
                let Some((name, queries)) = parse_meta_context(&data) else {
                    send_option_reply(
                        stream,
                        option,
                        REP_ERR_INVALID,
                        b"malformed metadata context request",
                    )?;
                    return Ok(None);
                };
                if !export_known(shared, name) {
                    send_option_reply(stream, option, REP_ERR_UNKNOWN, b"no such export")?;
                    return Ok(None);
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
                    *meta_selected |= set;
                }
                send_option_reply(stream, option, REP_ACK, &[])?;
            }
            _ => {
                send_option_reply(stream, option, REP_ERR_UNSUP, b"option not supported")?;
            }
        }
        // Every option that does not end the handshake has been answered.
        Ok(None)
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
fn info_or_go<S: Write>(
    stream: &mut S,
    shared: &Shared,
    option: u32,
    data: &[u8],
) -> io::Result<Option<bool>> {
    let invalid =
        |stream: &mut S, msg: &[u8]| send_option_reply(stream, option, REP_ERR_INVALID, msg);
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
