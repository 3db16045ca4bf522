//! A hand-written raw-socket NBD client for the protocol tests (constants taken from the
//! protocol document independently of the server's own definitions).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

pub const NBDMAGIC: u64 = 0x4e42444d41474943;
pub const IHAVEOPT: u64 = 0x49484156454F5054;
pub const REPLY_MAGIC: u64 = 0x3e889045565a9;
pub const REQUEST_MAGIC: u32 = 0x25609513;
pub const SIMPLE_MAGIC: u32 = 0x67446698;
pub const STRUCTURED_MAGIC: u32 = 0x668e33ef;

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const REP_META_CONTEXT: u32 = 4;
pub const TYPE_BLOCK_STATUS: u16 = 5;
pub const FLAG_REQ_ONE: u16 = 8;
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_ERR_UNSUP: u32 = 0x8000_0001;
pub const REP_ERR_INVALID: u32 = 0x8000_0003;
pub const REP_ERR_UNKNOWN: u32 = 0x8000_0006;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;
pub const FLAG_FUA: u16 = 1;
pub const FLAG_DF: u16 = 4;

pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;

pub const TYPE_NONE: u16 = 0;
pub const TYPE_OFFSET_DATA: u16 = 1;
pub const TYPE_ERROR: u16 = 0x8001;
pub const TYPE_ERROR_OFFSET: u16 = 0x8002;

pub const MIB: u64 = 1 << 20;

pub struct Client {
    pub s: UnixStream,
    pub structured: bool,
    pub size: u64,
    pub flags: u16,
}

/// What the server answered to one request.
#[derive(Debug, Default)]
pub struct Reply {
    pub error: u32,
    /// Data chunks as (offset, bytes).
    pub data: Vec<(u64, Vec<u8>)>,
    /// Structured chunk types in arrival order.
    pub types: Vec<u16>,
    pub error_offset: Option<u64>,
    pub message: String,
    /// Block status chunks as (context id, [(length, flags)]).
    pub extents: Vec<(u32, Vec<(u32, u32)>)>,
}

impl Client {
    /// Connects and completes the initial handshake with the given client flags.
    pub fn connect_raw(path: &Path, client_flags: u32) -> Client {
        let mut s = UnixStream::connect(path).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(
            u64::from_be_bytes(hello[0..8].try_into().unwrap()),
            NBDMAGIC
        );
        assert_eq!(
            u64::from_be_bytes(hello[8..16].try_into().unwrap()),
            IHAVEOPT
        );
        let hflags = u16::from_be_bytes([hello[16], hello[17]]);
        assert_eq!(hflags, 0b11, "FIXED_NEWSTYLE | NO_ZEROES expected");
        s.write_all(&client_flags.to_be_bytes()).unwrap();
        Client {
            s,
            structured: false,
            size: 0,
            flags: 0,
        }
    }

    pub fn u16(&mut self) -> u16 {
        let mut b = [0u8; 2];
        self.s.read_exact(&mut b).unwrap();
        u16::from_be_bytes(b)
    }
    pub fn u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        self.s.read_exact(&mut b).unwrap();
        u32::from_be_bytes(b)
    }
    pub fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        self.s.read_exact(&mut b).unwrap();
        u64::from_be_bytes(b)
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.s.read_exact(&mut v).unwrap();
        v
    }

    pub fn send_option(&mut self, option: u32, data: &[u8]) {
        let mut m = IHAVEOPT.to_be_bytes().to_vec();
        m.extend_from_slice(&option.to_be_bytes());
        m.extend_from_slice(&(data.len() as u32).to_be_bytes());
        m.extend_from_slice(data);
        self.s.write_all(&m).unwrap();
    }

    /// Reads option replies until a final one (ACK or error); returns all of them.
    pub fn option_replies(&mut self, option: u32) -> Vec<(u32, Vec<u8>)> {
        let mut out = Vec::new();
        loop {
            assert_eq!(self.u64(), REPLY_MAGIC);
            assert_eq!(self.u32(), option);
            let kind = self.u32();
            let len = self.u32() as usize;
            let data = self.bytes(len);
            out.push((kind, data));
            if kind == REP_ACK || kind & 0x8000_0000 != 0 {
                return out;
            }
        }
    }

    pub fn option(&mut self, option: u32, data: &[u8]) -> Vec<(u32, Vec<u8>)> {
        self.send_option(option, data);
        self.option_replies(option)
    }

    pub fn info_data(name: &str, requests: &[u16]) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(requests.len() as u16).to_be_bytes());
        for r in requests {
            d.extend_from_slice(&r.to_be_bytes());
        }
        d
    }

    /// Full negotiation: optional structured replies, then NBD_OPT_GO.
    pub fn open(path: &Path, structured: bool, request_block_size: bool) -> Client {
        let mut c = Client::connect_raw(path, 0b11);
        if structured {
            let r = c.option(OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(r, vec![(REP_ACK, vec![])]);
            c.structured = true;
        }
        let reqs: &[u16] = if request_block_size { &[3] } else { &[] };
        let replies = c.option(OPT_GO, &Client::info_data("", reqs));
        assert_eq!(replies.last().unwrap().0, REP_ACK, "{replies:?}");
        for (kind, data) in &replies {
            if *kind == REP_INFO && u16::from_be_bytes([data[0], data[1]]) == 0 {
                c.size = u64::from_be_bytes(data[2..10].try_into().unwrap());
                c.flags = u16::from_be_bytes([data[10], data[11]]);
            }
        }
        c
    }

    pub fn send_request(
        &mut self,
        flags: u16,
        kind: u16,
        handle: u64,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) {
        let mut m = REQUEST_MAGIC.to_be_bytes().to_vec();
        m.extend_from_slice(&flags.to_be_bytes());
        m.extend_from_slice(&kind.to_be_bytes());
        m.extend_from_slice(&handle.to_be_bytes());
        m.extend_from_slice(&offset.to_be_bytes());
        m.extend_from_slice(&len.to_be_bytes());
        self.s.write_all(&m).unwrap();
        self.s.write_all(payload).unwrap();
    }

    /// Reads the reply to `handle`; `read_len` is the payload expected in a successful
    /// simple read reply.
    pub fn reply(&mut self, handle: u64, read_len: usize) -> Reply {
        let mut r = Reply::default();
        let magic = self.u32();
        if magic == SIMPLE_MAGIC {
            r.error = self.u32();
            assert_eq!(self.u64(), handle);
            if r.error == 0 && read_len > 0 {
                r.data.push((0, self.bytes(read_len)));
            }
            return r;
        }
        assert!(self.structured, "structured reply without negotiation");
        assert_eq!(magic, STRUCTURED_MAGIC, "bad reply magic");
        loop {
            let flags = self.u16();
            let kind = self.u16();
            assert_eq!(self.u64(), handle);
            let len = self.u32() as usize;
            let payload = self.bytes(len);
            r.types.push(kind);
            match kind {
                TYPE_NONE => assert_eq!(len, 0),
                TYPE_OFFSET_DATA => {
                    let off = u64::from_be_bytes(payload[0..8].try_into().unwrap());
                    r.data.push((off, payload[8..].to_vec()));
                }
                TYPE_ERROR | TYPE_ERROR_OFFSET => {
                    r.error = u32::from_be_bytes(payload[0..4].try_into().unwrap());
                    let mlen = u16::from_be_bytes([payload[4], payload[5]]) as usize;
                    r.message = String::from_utf8_lossy(&payload[6..6 + mlen]).into_owned();
                    if kind == TYPE_ERROR_OFFSET {
                        r.error_offset = Some(u64::from_be_bytes(
                            payload[6 + mlen..14 + mlen].try_into().unwrap(),
                        ));
                    }
                }
                TYPE_BLOCK_STATUS => {
                    let id = u32::from_be_bytes(payload[0..4].try_into().unwrap());
                    let descs = payload[4..]
                        .chunks_exact(8)
                        .map(|d| {
                            (
                                u32::from_be_bytes(d[0..4].try_into().unwrap()),
                                u32::from_be_bytes(d[4..8].try_into().unwrap()),
                            )
                        })
                        .collect();
                    r.extents.push((id, descs));
                }
                other => panic!("unexpected chunk type {other}"),
            }
            if flags & 1 != 0 {
                return r;
            }
            assert_eq!(self.u32(), STRUCTURED_MAGIC);
        }
    }

    pub fn read(&mut self, offset: u64, len: u32) -> Reply {
        self.send_request(0, CMD_READ, 7, offset, len, &[]);
        self.reply(7, len as usize)
    }

    pub fn write(&mut self, offset: u64, data: &[u8], flags: u16) -> Reply {
        self.send_request(flags, CMD_WRITE, 8, offset, data.len() as u32, data);
        self.reply(8, 0)
    }

    pub fn cmd(&mut self, kind: u16, flags: u16, offset: u64, len: u32) -> Reply {
        self.send_request(flags, kind, 9, offset, len, &[]);
        self.reply(9, 0)
    }

    /// The contents of a successful read reply, reassembled.
    pub fn read_ok(&mut self, offset: u64, len: u32) -> Vec<u8> {
        let r = self.read(offset, len);
        assert_eq!(r.error, 0, "read {offset}+{len} failed: {r:?}");
        let mut out = vec![0u8; len as usize];
        let mut covered = 0;
        for (off, d) in &r.data {
            let at = if self.structured {
                (off - offset) as usize
            } else {
                0
            };
            out[at..at + d.len()].copy_from_slice(d);
            covered += d.len();
        }
        assert_eq!(covered, len as usize);
        out
    }
}
