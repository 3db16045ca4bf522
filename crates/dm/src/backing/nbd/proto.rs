//! Wire constants of the NBD protocol (fixed newstyle handshake, simple and structured
//! replies), as given by the protocol document of the NetworkBlockDevice project.
//! All integers travel big-endian. Used by the client backing here and by the server in
//! `cryptblk-export` (which re-exports this module), so both speak from one definition.

/// First magic of the handshake: ASCII `NBDMAGIC`.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// Second handshake magic and prefix of every option request: ASCII `IHAVEOPT`.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic that opens every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flag: the server speaks fixed newstyle.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag: the server can omit the 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag: the client speaks fixed newstyle.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: the client wants no zero padding after `NBD_OPT_EXPORT_NAME`.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flags.
pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TFLAG_SEND_CACHE: u16 = 1 << 10;

/// Option types.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

/// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
/// The bit every option error reply type has set.
pub const REP_ERR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERR + 1;
pub const REP_ERR_POLICY: u32 = REP_ERR + 2;
pub const REP_ERR_INVALID: u32 = REP_ERR + 3;
pub const REP_ERR_TLS_REQD: u32 = REP_ERR + 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERR + 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_ERR + 7;
pub const REP_ERR_TOO_BIG: u32 = REP_ERR + 9;

/// Information types inside `NBD_REP_INFO`.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;

/// Structured reply flag marking the final chunk.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
/// Structured reply chunk types.
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) + 2;
/// The bit every error chunk type has set.
pub const REPLY_TYPE_ERROR_BIT: u16 = 1 << 15;

/// The longest string the protocol allows (export names, error messages): "MUST be no
/// longer than 4096 bytes".
pub const MAX_STRING: usize = 4096;

/// The only metadata context served, and the id it gets.
pub const BASE_ALLOCATION: &str = "base:allocation";
pub const BASE_ALLOCATION_ID: u32 = 1;

/// Error values of the transmission phase (fixed by the protocol, not the host's errno).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// Maps a device error onto the protocol's restricted set of error values.
pub fn error_value(err: &std::io::Error) -> u32 {
    match err.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) | Some(libc::EROFS) => EPERM,
        Some(libc::ENOMEM) => ENOMEM,
        Some(libc::EINVAL) => EINVAL,
        Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => ENOSPC,
        Some(libc::EOVERFLOW) => EOVERFLOW,
        Some(libc::EOPNOTSUPP) => ENOTSUP,
        Some(libc::ESHUTDOWN) => ESHUTDOWN,
        _ => EIO,
    }
}
