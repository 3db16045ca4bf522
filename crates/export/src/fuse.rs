//! A FUSE mount holding one regular file whose contents are a [`BlockDevice`].
//!
//! The file can be attached to a loop device (`losetup --direct-io=on`) to get a kernel
//! block device on top of any cryptblk device. The file is opened with `FOPEN_DIRECT_IO`
//! so the kernel page cache does not hold a second copy of data the loop device or the
//! application above it already caches. Requests at any byte offset are accepted; partial
//! blocks are read-modify-written ([`AlignedIo`]).
//!
//! `fallocate(PUNCH_HOLE)` is mapped to zeroing, not to [`BlockDevice::discard`]: punching
//! a hole promises that the range reads back as zeros afterwards (the loop driver turns
//! block-layer WRITE_ZEROES into `PUNCH_HOLE`, and mkfs relies on it), whereas a discarded
//! range of a device reads back unspecified data (e.g. random-looking plaintext of
//! discarded ciphertext on crypt).

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cryptblk_dm::device::{BlockDevice, WriteFlags};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, KernelConfig,
    LockOwner, MountOption, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
};

use crate::aligned::AlignedIo;
use crate::error::ExportError;
use crate::export::{check_resize, Export, StartExport};
use crate::ExportDescription;

/// Settings of a [`FuseExport`].
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct FuseConfig {
    /// Existing, empty directory to mount on.
    pub mountpoint: PathBuf,
    /// Name of the single file in the mount.
    pub file_name: String,
    /// Refuse writes (the file is mode 0400 and opening it for writing fails with EROFS).
    pub read_only: bool,
    /// Worker threads handling FUSE requests (each gets its own cloned /dev/fuse fd).
    pub threads: usize,
    /// Let users other than the mounting one use the file (`allow_other`).
    pub allow_other: bool,
}

impl FuseConfig {
    /// Defaults: file "disk", read-write, 4 worker threads, owner-only access.
    pub fn new(mountpoint: impl Into<PathBuf>) -> Self {
        FuseConfig {
            mountpoint: mountpoint.into(),
            file_name: "disk".to_string(),
            read_only: false,
            threads: 4,
            allow_other: false,
        }
    }
}

/// Where clients find a [`FuseExport`]: what its [`Export::describe`] answers.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FuseDescription {
    /// Path of the exported file, `<mountpoint>/<file_name>`.
    pub file: PathBuf,
}

/// A mounted FUSE export. Dropping it unmounts like [`FuseExport::unmount`], ignoring errors.
pub struct FuseExport {
    session: Option<fuser::BackgroundSession>,
    /// Tells the kernel to drop the file's cached attributes when the device is resized.
    notifier: fuser::Notifier,
    io: Arc<AlignedIo>,
    /// Opens of the file not yet released (shared with the request threads).
    opens: Arc<AtomicUsize>,
    file_path: PathBuf,
    mountpoint: PathBuf,
}

impl FuseExport {
    /// Mounts `device` as `<mountpoint>/<file_name>`. When this returns, the kernel has
    /// completed the FUSE handshake and the file can be opened (the export is ready).
    pub fn mount(
        device: Arc<dyn BlockDevice>,
        config: FuseConfig,
    ) -> Result<FuseExport, ExportError> {
        if config.file_name.is_empty()
            || config.file_name.contains('/')
            || config.file_name == "."
            || config.file_name == ".."
        {
            return Err(ExportError::Config(format!(
                "invalid file name {:?}",
                config.file_name
            )));
        }
        let mountpoint = config.mountpoint.canonicalize().map_err(|e| {
            ExportError::io(format!("mount point {}", config.mountpoint.display()), e)
        })?;
        let io = Arc::new(AlignedIo::new(device));
        let opens = Arc::new(AtomicUsize::new(0));
        let fs = DiskFs {
            io: Arc::clone(&io),
            opens: Arc::clone(&opens),
            file_name: config.file_name.clone(),
            file_path: mountpoint.join(&config.file_name),
            read_only: config.read_only,
            uid: unsafe_free_getuid(),
            gid: unsafe_free_getgid(),
            mounted_at: SystemTime::now(),
        };
        let mut fuse_config = fuser::Config::default();
        fuse_config.mount_options = vec![
            MountOption::FSName("cryptblk".to_string()),
            MountOption::Subtype("cryptblk".to_string()),
            MountOption::NoDev,
            MountOption::NoSuid,
        ];
        if config.read_only {
            fuse_config.mount_options.push(MountOption::RO);
        }
        if config.allow_other {
            fuse_config.acl = fuser::SessionACL::All;
        }
        fuse_config.n_threads = Some(config.threads.max(1));
        fuse_config.clone_fd = config.threads > 1;
        let session = fuser::spawn_mount(fs, &mountpoint, &fuse_config).map_err(|e| {
            ExportError::io(
                format!("mounting FUSE on {}", config.mountpoint.display()),
                e,
            )
        })?;
        Ok(FuseExport {
            notifier: session.notifier(),
            session: Some(session),
            io,
            opens,
            file_path: mountpoint.join(&config.file_name),
            mountpoint,
        })
    }

    /// Path of the exported file, e.g. `<mountpoint>/disk`.
    pub fn file_path(&self) -> &Path {
        &self.file_path
    }

    /// Whether the file system is still being served; false once it was unmounted, also
    /// from outside (`umount`, `fusermount3 -u`). A CLI can poll this while waiting for a
    /// stop signal.
    pub fn is_active(&self) -> bool {
        self.session
            .as_ref()
            .is_some_and(|s| !s.guard.is_finished())
    }

    /// Opens of the file that the kernel has not released yet: every open file
    /// description counts once, however many descriptors share it (a loop device attached
    /// to the file holds one until `losetup -d`). The kernel sends a release after the
    /// last `close`, so a user that just closed may be counted for a moment longer.
    pub fn open_count(&self) -> usize {
        self.opens.load(Ordering::SeqCst)
    }

    /// The directory the export is mounted on.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Unmounts, waits for the request threads and flushes the device. Fails with EBUSY
    /// (leaving the export mounted and usable, so the call can be retried) while the file
    /// is still open, e.g. attached to a loop device. Calling it again after success does
    /// nothing.
    pub fn unmount(&mut self) -> Result<(), ExportError> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        if let Err(e) = umount2(&self.mountpoint, 0) {
            // EINVAL: somebody else already unmounted it; the session has ended then.
            if e.raw_os_error() != Some(libc::EINVAL) {
                self.session = Some(session);
                return Err(ExportError::io(
                    format!("unmounting {}", self.mountpoint.display()),
                    e,
                ));
            }
        }
        session.join().map_err(|e| {
            ExportError::io(format!("FUSE session on {}", self.mountpoint.display()), e)
        })?;
        self.io
            .flush()
            .map_err(|e| ExportError::io("flushing the device after unmount", e))
    }
}

impl StartExport for FuseConfig {
    fn start(self, device: Arc<dyn BlockDevice>) -> Result<Box<dyn Export>, ExportError> {
        Ok(Box::new(FuseExport::mount(device, self)?))
    }
}

impl Export for FuseExport {
    fn describe(&self) -> ExportDescription {
        ExportDescription::Fuse(FuseDescription {
            file: self.file_path.clone(),
        })
    }

    /// The file's attributes come from the device's size, but the kernel caches them for
    /// [`TTL`]: this invalidates that cache, so the next `stat` shows the new size.
    fn resized(&self, new_size: u64) -> Result<(), ExportError> {
        check_resize(self.io.device().as_ref(), new_size)?;
        if self.session.is_none() {
            return Err(ExportError::Config(format!(
                "{} is no longer mounted",
                self.mountpoint.display()
            )));
        }
        // A negative offset invalidates the attributes only (the file has no page cache:
        // FOPEN_DIRECT_IO). ENOENT: the kernel holds no inode for the file, so it has no
        // stale size either.
        match self.notifier.inval_inode(FILE_INO, -1, 0) {
            Err(e) if e.raw_os_error() != Some(libc::ENOENT) => Err(ExportError::io(
                format!("invalidating {}'s size", self.file_path.display()),
                e,
            )),
            _ => Ok(()),
        }
    }

    fn users(&self) -> usize {
        self.open_count()
    }

    fn stop(self: Box<Self>) -> Result<(), ExportError> {
        let mut export = *self;
        export.unmount()
    }
}

impl Drop for FuseExport {
    fn drop(&mut self) {
        if self.unmount().is_err() {
            // Still busy: detach lazily so no mount is left pointing at a dead process.
            let _ = umount2(&self.mountpoint, libc::MNT_DETACH);
            let _ = self.io.flush();
        }
    }
}

fn umount2(path: &Path, flags: i32) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: c is a valid NUL-terminated path for the duration of the call.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn unsafe_free_getuid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

fn unsafe_free_getgid() -> u32 {
    // SAFETY: getgid has no preconditions and cannot fail.
    unsafe { libc::getgid() }
}

const FILE_INO: INodeNo = INodeNo(2);
/// The file's size changes only on a resize, which invalidates the kernel's copy
/// ([`Export::resized`]), so the kernel may cache attributes for a while.
const TTL: Duration = Duration::from_secs(60);
/// Largest write the kernel is asked to send in one request.
const MAX_WRITE: u32 = 1 << 20;

struct DiskFs {
    io: Arc<AlignedIo>,
    /// Opens of the file not yet released ([`FuseExport::open_count`]).
    opens: Arc<AtomicUsize>,
    file_name: String,
    /// `<mountpoint>/<file_name>`, as the daemon's log names the export.
    file_path: PathBuf,
    read_only: bool,
    uid: u32,
    gid: u32,
    mounted_at: SystemTime,
}

/// The process (thread group) of thread `tid`, from `/proc/<tid>/status`; `tid` itself when
/// that cannot be read (the thread is gone).
fn process_of(tid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Tgid:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(tid)
}

fn errno(err: &io::Error) -> Errno {
    Errno::from_i32(err.raw_os_error().unwrap_or(libc::EIO))
}

impl DiskFs {
    fn dir_attr(&self) -> FileAttr {
        FileAttr {
            ino: INodeNo::ROOT,
            size: 0,
            blocks: 0,
            atime: self.mounted_at,
            mtime: self.mounted_at,
            ctime: self.mounted_at,
            crtime: self.mounted_at,
            kind: FileType::Directory,
            perm: 0o755,
            nlink: 2,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        }
    }

    fn file_attr(&self) -> FileAttr {
        let size = self.io.size();
        FileAttr {
            ino: FILE_INO,
            size,
            blocks: size.div_ceil(512),
            atime: self.mounted_at,
            mtime: self.mounted_at,
            ctime: self.mounted_at,
            crtime: self.mounted_at,
            kind: FileType::RegularFile,
            perm: if self.read_only { 0o400 } else { 0o600 },
            nlink: 1,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            flags: 0,
            blksize: (self.io.block_size() as u32).max(4096),
        }
    }

    fn attr_of(&self, ino: INodeNo) -> Option<FileAttr> {
        match ino {
            INodeNo::ROOT => Some(self.dir_attr()),
            FILE_INO => Some(self.file_attr()),
            _ => None,
        }
    }

    /// Clamps `[offset, offset + len)` to the device; `None` when it starts at or past the end.
    fn clamp(&self, offset: u64, len: u64) -> Option<u64> {
        let size = self.io.size();
        (offset < size).then(|| len.min(size - offset))
    }
}

impl Filesystem for DiskFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        if let Err(nearest) = config.set_max_write(MAX_WRITE) {
            let _ = config.set_max_write(nearest);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == INodeNo::ROOT && name == OsStr::new(&self.file_name) {
            reply.entry(&TTL, &self.file_attr(), fuser::Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr_of(ino) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let Some(attr) = self.attr_of(ino) else {
            reply.error(Errno::ENOENT);
            return;
        };
        // The device cannot be resized. Truncation to 0 is what open(O_TRUNC) sends (e.g. a
        // plain `dd of=`); like a block device, the file ignores it. Mode/owner/time
        // changes are accepted and ignored so tools that preserve metadata do not fail.
        match size {
            Some(s) if ino == FILE_INO && s != attr.size && s != 0 => {
                reply.error(Errno::from_i32(libc::EINVAL))
            }
            _ => reply.attr(&TTL, &attr),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino != FILE_INO {
            reply.error(Errno::from_i32(libc::EISDIR));
            return;
        }
        if self.read_only && !matches!(flags.acc_mode(), OpenAccMode::O_RDONLY) {
            reply.error(Errno::from_i32(libc::EROFS));
            return;
        }
        // Counted before the reply, so the opener can never see its open uncounted.
        if self.opens.fetch_add(1, Ordering::SeqCst) == 0 {
            // The export's "client connected": the first open of the file (later opens
            // while it is in use would be a line per `open(2)` of every reader).
            // The request names the opening thread; the log names its process.
            let pid = process_of(req.pid());
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            log::info!(
                "FUSE {}: opened by pid {pid} ({}), now in use",
                self.file_path.display(),
                comm.trim_end()
            );
        }
        reply.opened(
            FileHandle(0),
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
        );
    }

    /// The kernel sends one release per successful open of the file (directories get
    /// `releasedir`), once its last descriptor is closed.
    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if ino == FILE_INO {
            // Saturating: a release the count never saw must not wrap it to "in use".
            let before = self
                .opens
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            // The release carries no reliable pid (the kernel sends it when the last
            // descriptor of an open goes, possibly from another task): none is named.
            if before == Ok(1) {
                log::info!(
                    "FUSE {}: last open released, no longer in use",
                    self.file_path.display()
                );
            }
        }
        reply.ok();
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(len) = self.clamp(offset, u64::from(size)) else {
            reply.data(&[]);
            return;
        };
        let mut buf = vec![0u8; len as usize];
        match self.io.read_at(offset, &mut buf) {
            Ok(()) => reply.data(&buf),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if self.read_only {
            reply.error(Errno::from_i32(libc::EROFS));
            return;
        }
        // Writing at or past the end of a fixed-size device fails like on a block device;
        // a write straddling the end is shortened.
        let Some(len) = self.clamp(offset, data.len() as u64) else {
            reply.error(Errno::from_i32(libc::ENOSPC));
            return;
        };
        let fua = flags.0 & (libc::O_SYNC | libc::O_DSYNC) != 0;
        match self
            .io
            .write_at(offset, &data[..len as usize], WriteFlags { fua })
        {
            Ok(()) => reply.written(len as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2): make what this opener wrote durable, as fsync-on-close would.
        match self.io.flush() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.io.flush() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if ino != FILE_INO {
            reply.error(Errno::from_i32(libc::ENODEV));
            return;
        }
        if self.read_only {
            reply.error(Errno::from_i32(libc::EROFS));
            return;
        }
        let size = self.io.size();
        let end = offset.checked_add(length);
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let zeroing = mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0;
        let known =
            libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if mode & !known != 0 || (mode & libc::FALLOC_FL_PUNCH_HOLE != 0 && !keep_size) {
            reply.error(Errno::from_i32(libc::EOPNOTSUPP));
            return;
        }
        let Some(end) = end else {
            reply.error(Errno::from_i32(libc::EFBIG));
            return;
        };
        if end > size && !keep_size {
            // The file would have to grow, which a device cannot.
            reply.error(Errno::from_i32(libc::EFBIG));
            return;
        }
        if !zeroing || offset >= size {
            // Plain allocation: every byte of a device is already allocated.
            reply.ok();
            return;
        }
        let len = end.min(size) - offset;
        match self.io.write_zeroes(offset, len, WriteFlags::default()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            reply.error(Errno::from_i32(libc::ENOTDIR));
            return;
        }
        let entries = [
            (INodeNo::ROOT, FileType::Directory, "."),
            (INodeNo::ROOT, FileType::Directory, ".."),
            (FILE_INO, FileType::RegularFile, self.file_name.as_str()),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let bsize = (self.io.block_size() as u32).max(4096);
        let blocks = self.io.size() / u64::from(bsize);
        reply.statfs(blocks, 0, 0, 2, 0, bsize, 255, bsize);
    }
}
