//! One virtio-blk request: its descriptor chain parsed into header, data segments and
//! status byte, executed on the [`BlockDevice`] with the data read from and written to guest
//! memory in place.

use std::io;

use cryptblk_dm::device::{BlockDevice, WriteFlags};
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_DISCARD,
    VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
    VIRTIO_BLK_T_WRITE_ZEROES,
};
use virtio_queue::desc::split::Descriptor;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

/// virtio-blk addresses the device in 512-byte sectors whatever its block size.
const SECTOR_SHIFT: u32 = 9;

/// Size of the request header (`struct virtio_blk_outhdr`: type, reserved, sector).
const HEADER_LEN: u32 = 16;

/// Size of one discard/write-zeroes range (`struct virtio_blk_discard_write_zeroes`).
const RANGE_LEN: usize = 16;

/// Largest data payload one request may carry. Linux sends at most `max_sectors_kb` (1280 KiB
/// by default); the cap bounds the bounce buffer a badly split request can make us allocate.
pub(crate) const MAX_REQUEST_BYTES: usize = 64 << 20;

/// Most ranges one discard or write-zeroes request may carry (advertised as `max_*_seg`).
pub(crate) const MAX_RANGES: u32 = 1;

/// The serial number `VIRTIO_BLK_T_GET_ID` answers is at most this long.
pub(crate) const ID_BYTES: usize = 20;

/// What the request handler needs to know about the export.
pub(crate) struct Target<'a> {
    /// The device requests go to.
    pub device: &'a dyn BlockDevice,
    /// Writes, discards and write-zeroes fail (`VIRTIO_BLK_F_RO` was offered).
    pub read_only: bool,
    /// DISCARD and WRITE_ZEROES were offered (the device takes them).
    pub discard: bool,
    /// What GET_ID answers.
    pub serial: &'a [u8],
}

/// One data segment of a request in guest memory.
#[derive(Clone, Copy, Debug)]
struct Segment {
    addr: GuestAddress,
    len: usize,
    /// Device-writable (the request reads into it).
    writable: bool,
}

/// Executes the request `descs` describes and writes its status byte. Returns the number of
/// bytes written into guest memory (data plus status) for the used ring, or `None` when the
/// chain is malformed and has no status byte to report through.
pub(crate) fn handle(mem: &GuestMemoryMmap, descs: &[Descriptor], target: &Target) -> Option<u32> {
    let (header_desc, rest) = descs.split_first()?;
    let Some((status_desc, middle)) = rest.split_last() else {
        log::warn!("vhost-user-blk: request chain of one descriptor dropped");
        return None;
    };
    if header_desc.is_write_only()
        || header_desc.len() < HEADER_LEN
        || !status_desc.is_write_only()
        || status_desc.len() == 0
    {
        log::warn!("vhost-user-blk: malformed request chain dropped");
        return None;
    }
    let mut header = [0u8; HEADER_LEN as usize];
    mem.read_slice(&mut header, header_desc.addr()).ok()?;
    let kind = u32::from_le_bytes(header[0..4].try_into().ok()?);
    let sector = u64::from_le_bytes(header[8..16].try_into().ok()?);

    // The data: whatever the chain carries between the 16-byte header and the final status
    // byte, whichever descriptors it sits in (the virtio 1.0 layout is free).
    let mut segments = Vec::with_capacity(descs.len());
    if header_desc.len() > HEADER_LEN {
        segments.push(Segment {
            addr: header_desc.addr().checked_add(u64::from(HEADER_LEN))?,
            len: (header_desc.len() - HEADER_LEN) as usize,
            writable: false,
        });
    }
    for d in middle {
        segments.push(Segment {
            addr: d.addr(),
            len: d.len() as usize,
            writable: d.is_write_only(),
        });
    }
    if status_desc.len() > 1 {
        segments.push(Segment {
            addr: status_desc.addr(),
            len: (status_desc.len() - 1) as usize,
            writable: true,
        });
    }
    let status_addr = status_desc
        .addr()
        .checked_add(u64::from(status_desc.len() - 1))?;

    let (status, written) = match execute(mem, kind, sector, &segments, target) {
        Ok(written) => (VIRTIO_BLK_S_OK, written),
        Err(Failure::Unsupported) => (VIRTIO_BLK_S_UNSUPP, 0),
        Err(Failure::Io(e)) => {
            log::debug!("vhost-user-blk: request type {kind} at sector {sector}: {e}");
            (VIRTIO_BLK_S_IOERR, 0)
        }
    };
    mem.write_slice(&[status as u8], status_addr).ok()?;
    Some(u32::try_from(written).unwrap_or(u32::MAX).saturating_add(1))
}

enum Failure {
    Unsupported,
    Io(io::Error),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Io(e)
    }
}

fn einval(what: &str) -> Failure {
    Failure::Io(io::Error::new(io::ErrorKind::InvalidInput, what.to_owned()))
}

/// Runs one request; returns the bytes written into guest memory (not counting the status).
fn execute(
    mem: &GuestMemoryMmap,
    kind: u32,
    sector: u64,
    segments: &[Segment],
    target: &Target,
) -> Result<usize, Failure> {
    match kind {
        VIRTIO_BLK_T_IN | VIRTIO_BLK_T_OUT => {
            let writing = kind == VIRTIO_BLK_T_OUT;
            if writing && target.read_only {
                return Err(Failure::Io(io::Error::from_raw_os_error(libc::EROFS)));
            }
            // IN fills device-writable buffers; OUT reads device-readable ones.
            if segments.iter().any(|s| s.writable == writing) {
                return Err(einval("data buffer of the wrong direction"));
            }
            let total: usize = segments.iter().map(|s| s.len).sum();
            let block = target.device.logical_block_size() as usize;
            let offset = sector
                .checked_mul(1 << SECTOR_SHIFT)
                .ok_or_else(|| einval("sector out of range"))?;
            if total > MAX_REQUEST_BYTES
                || !total.is_multiple_of(block)
                || !offset.is_multiple_of(block as u64)
            {
                return Err(einval("request not aligned to the logical block size"));
            }
            if writing {
                write(mem, offset, segments, total, block, target.device)?;
                Ok(0)
            } else {
                read(mem, offset, segments, total, block, target.device)?;
                Ok(total)
            }
        }
        VIRTIO_BLK_T_FLUSH => {
            target.device.flush()?;
            Ok(0)
        }
        VIRTIO_BLK_T_GET_ID => {
            let Some(seg) = segments.first().filter(|s| s.writable) else {
                return Err(einval("GET_ID without a buffer"));
            };
            let mut id = [0u8; ID_BYTES];
            let n = target.serial.len().min(ID_BYTES);
            id[..n].copy_from_slice(&target.serial[..n]);
            let len = seg.len.min(ID_BYTES);
            mem.write_slice(&id[..len], seg.addr)
                .map_err(|e| Failure::Io(io::Error::other(e)))?;
            Ok(len)
        }
        VIRTIO_BLK_T_DISCARD | VIRTIO_BLK_T_WRITE_ZEROES => {
            if !target.discard {
                return Err(Failure::Unsupported);
            }
            if target.read_only {
                return Err(Failure::Io(io::Error::from_raw_os_error(libc::EROFS)));
            }
            let ranges = gather(mem, segments, false)?;
            if ranges.is_empty()
                || !ranges.len().is_multiple_of(RANGE_LEN)
                || ranges.len() / RANGE_LEN > MAX_RANGES as usize
            {
                return Err(einval("bad discard/write-zeroes range list"));
            }
            for r in ranges.chunks_exact(RANGE_LEN) {
                let first = u64::from_le_bytes(r[0..8].try_into().expect("8 bytes"));
                let count = u32::from_le_bytes(r[8..12].try_into().expect("4 bytes"));
                let offset = first
                    .checked_mul(1 << SECTOR_SHIFT)
                    .ok_or_else(|| einval("sector out of range"))?;
                let len = u64::from(count) << SECTOR_SHIFT;
                if kind == VIRTIO_BLK_T_DISCARD {
                    target.device.discard(offset, len)?;
                } else {
                    target.device.write_zeroes(offset, len)?;
                }
            }
            Ok(0)
        }
        _ => Err(Failure::Unsupported),
    }
}

/// The host bytes of a segment, if it lies in one guest memory region.
///
/// # Safety
/// The slice aliases guest memory, which the guest may change at any time; the caller uses
/// it only as a device DMA buffer (read into it, or write from it), as a hardware disk would:
/// a guest that changes a buffer while its request is in flight gets undefined data, never
/// host memory outside its own.
// Guest memory is shared and mutable behind any `&GuestMemoryMmap` (the guest writes it at
// will), as an `UnsafeCell` is: a mutable view from a shared reference is its nature.
#[allow(clippy::mut_from_ref)]
unsafe fn guest_slice<'m>(mem: &'m GuestMemoryMmap, seg: &Segment) -> Option<&'m mut [u8]> {
    let slice = mem.get_slice(seg.addr, seg.len).ok()?;
    let ptr = slice.ptr_guard_mut().as_ptr();
    // SAFETY: `get_slice` checked that the whole range is mapped in one region; the mapping
    // outlives the request (the memory table is swapped only between requests, and the
    // caller holds a guard of the current one).
    Some(unsafe { std::slice::from_raw_parts_mut(ptr, seg.len) })
}

/// Below this average segment size a request goes to the device in one call through a
/// bounce buffer rather than one call per segment: a guest's 1 MiB request often arrives as
/// 256 separate 4 KiB pages, and each call costs a system call on the backing file and the
/// crypt pipeline's per-call setup, where the bounce costs one memory copy of the data.
const DIRECT_MIN_SEGMENT: usize = 64 << 10;

/// Merges segments that follow each other in guest memory (pages the guest allocated
/// together), so they reach the device as one buffer.
fn coalesce(segments: &[Segment]) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::with_capacity(segments.len());
    for s in segments {
        if let Some(last) = out.last_mut() {
            if last.writable == s.writable && last.addr.checked_add(last.len as u64) == Some(s.addr)
            {
                last.len += s.len;
                continue;
            }
        }
        out.push(*s);
    }
    out
}

/// The guest slices of `segments` if they can go to the device as they are: whole logical
/// blocks each, each in one guest memory region, and few enough to be worth a call each.
#[allow(clippy::mut_from_ref)] // guest memory, as in `guest_slice`
fn direct_slices<'m>(
    mem: &'m GuestMemoryMmap,
    segments: &[Segment],
    total: usize,
    block: usize,
) -> Option<Vec<&'m mut [u8]>> {
    if segments.len() > 1 && total / segments.len() < DIRECT_MIN_SEGMENT {
        return None;
    }
    if !segments.iter().all(|s| s.len.is_multiple_of(block)) {
        return None;
    }
    // SAFETY: see `guest_slice`; the slices are dropped before the request is answered.
    segments
        .iter()
        .map(|s| unsafe { guest_slice(mem, s) })
        .collect()
}

thread_local! {
    /// Each queue thread's bounce buffer, kept between requests (no allocation and zeroing
    /// per request).
    static BOUNCE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's bounce buffer, `len` bytes long.
fn with_bounce<T>(len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    BOUNCE.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < len {
            b.resize(len, 0);
        }
        f(&mut b[..len])
    })
}

/// Reads `total` bytes at `offset` into the segments: straight into guest memory (crypt
/// decrypts in place there) when the segments are whole blocks and large, through this
/// thread's bounce buffer in one device call otherwise.
fn read(
    mem: &GuestMemoryMmap,
    offset: u64,
    segments: &[Segment],
    total: usize,
    block: usize,
    device: &dyn BlockDevice,
) -> Result<(), Failure> {
    let segments = coalesce(segments);
    if let Some(slices) = direct_slices(mem, &segments, total, block) {
        let mut pos = offset;
        for sl in slices {
            device.read_at(pos, sl)?;
            pos += sl.len() as u64;
        }
        return Ok(());
    }
    with_bounce(total, |bounce| {
        device.read_at(offset, bounce)?;
        let mut pos = 0;
        for s in &segments {
            mem.write_slice(&bounce[pos..pos + s.len], s.addr)
                .map_err(|e| Failure::Io(io::Error::other(e)))?;
            pos += s.len;
        }
        Ok(())
    })
}

/// Writes the segments' `total` bytes at `offset`: from guest memory as it is when it is one
/// buffer of whole blocks (crypt encrypts into its own scratch buffer, never into the
/// guest's), else gathered into this thread's bounce buffer, which crypt then encrypts in
/// place (the same one copy, one device call).
fn write(
    mem: &GuestMemoryMmap,
    offset: u64,
    segments: &[Segment],
    total: usize,
    block: usize,
    device: &dyn BlockDevice,
) -> Result<(), Failure> {
    let segments = coalesce(segments);
    if segments.len() == 1 {
        if let Some(slices) = direct_slices(mem, &segments, total, block) {
            device.write_at(offset, &*slices[0], WriteFlags::default())?;
            return Ok(());
        }
    }
    with_bounce(total, |buf| {
        let mut pos = 0;
        for s in &segments {
            mem.read_slice(&mut buf[pos..pos + s.len], s.addr)
                .map_err(|e| Failure::Io(io::Error::other(e)))?;
            pos += s.len;
        }
        device.write_at_scratch(offset, buf, WriteFlags::default())?;
        Ok(())
    })
}

/// Copies the (device-readable) segments into one buffer.
fn gather(mem: &GuestMemoryMmap, segments: &[Segment], writable: bool) -> Result<Vec<u8>, Failure> {
    let total: usize = segments.iter().map(|s| s.len).sum();
    if total > MAX_REQUEST_BYTES {
        return Err(einval("request too large"));
    }
    let mut buf = vec![0u8; total];
    let mut pos = 0;
    for s in segments {
        if s.writable != writable {
            return Err(einval("data buffer of the wrong direction"));
        }
        mem.read_slice(&mut buf[pos..pos + s.len], s.addr)
            .map_err(|e| Failure::Io(io::Error::other(e)))?;
        pos += s.len;
    }
    Ok(buf)
}
