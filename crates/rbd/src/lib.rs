//! Ceph RBD images through librbd: bindings generated from the installed headers ([`sys`])
//! and a small safe layer over them ([`Image`]) whose I/O is librbd's asynchronous calls with
//! completions, so every caller thread has its own request in flight and one large request
//! reaches all the objects it covers at once.
//!
//! librbd is loaded (`dlopen`) when the first image is opened, not linked: a served volume on
//! a file or an NBD store never maps librbd, librados, libceph-common and the ~30 libraries
//! they pull in, whose relocated pages and static initialisers cost every process about
//! 1.5 MB of private memory (issue 28). A machine without librbd gets one error line then.
//!
//! The client configuration is librados's own: `CEPH_CONF`, else the default search
//! (`/etc/ceph/ceph.conf`, `~/.ceph/config`, `./ceph.conf`), then `CEPH_ARGS`.

use std::ffi::CString;
use std::io;
use std::marker::PhantomData;
use std::ptr;
use std::sync::OnceLock;

/// The raw librbd and librados functions (as the fields and methods of [`sys::Librbd`], loaded
/// at run time) and types (bindgen output).
#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    clippy::all,
    missing_docs
)]
pub mod sys {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}

/// An image named as `pool[/namespace]/image[@snapshot]` (the text after `rbd:`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageSpec {
    /// The RADOS pool.
    pub pool: String,
    /// The RADOS namespace within the pool (none = the default one).
    pub namespace: Option<String>,
    /// The image.
    pub image: String,
    /// A snapshot, opened read-only.
    pub snapshot: Option<String>,
}

impl ImageSpec {
    /// Parses `pool/image`, `pool/namespace/image`, either with `@snapshot`.
    pub fn parse(text: &str) -> Result<ImageSpec, String> {
        let bad =
            |why: &str| format!("invalid RBD image 'rbd:{text}': {why} (rbd:POOL/IMAGE[@SNAP])");
        let (path, snapshot) = match text.split_once('@') {
            Some((_, s)) if s.is_empty() || s.contains('@') || s.contains('/') => {
                return Err(bad("bad snapshot name"))
            }
            Some((p, s)) => (p, Some(s.to_string())),
            None => (text, None),
        };
        let parts: Vec<&str> = path.split('/').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(bad("empty pool, namespace or image name"));
        }
        if text
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '\0')
        {
            return Err(bad("white space in the name"));
        }
        let (pool, namespace, image) = match parts[..] {
            [pool, image] => (pool, None, image),
            [pool, ns, image] => (pool, Some(ns.to_string()), image),
            _ => return Err(bad("expected a pool and an image")),
        };
        Ok(ImageSpec {
            pool: pool.to_string(),
            namespace,
            image: image.to_string(),
            snapshot,
        })
    }
}

impl std::fmt::Display for ImageSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/", self.pool)?;
        if let Some(ns) = &self.namespace {
            write!(f, "{ns}/")?;
        }
        write!(f, "{}", self.image)?;
        if let Some(s) = &self.snapshot {
            write!(f, "@{s}")?;
        }
        Ok(())
    }
}

/// An `io::Error` from a negative errno that librados or librbd returned.
fn errno(ret: i64) -> io::Error {
    io::Error::from_raw_os_error(i32::try_from(-ret).unwrap_or(libc::EIO))
}

fn check(ret: libc::c_int, what: &str) -> io::Result<()> {
    if ret < 0 {
        let e = errno(ret.into());
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

/// The file loaded: librbd's soname (Debian's `librbd1`); it brings librados, whose
/// `rados_*` functions `dlsym` finds through it.
const LIBRBD: &str = "librbd.so.1";

/// librbd, loaded the first time it is needed and kept for the life of the process (Ceph's
/// libraries do not support being unloaded).
fn lib() -> io::Result<&'static sys::Librbd> {
    static LIB: OnceLock<Result<sys::Librbd, String>> = OnceLock::new();
    // SAFETY: loading runs librbd's and its dependencies' initialisers, which is what linking
    // it did before; every function the bindings name must be there (`require_all`).
    LIB.get_or_init(|| unsafe { sys::Librbd::new(LIBRBD) }.map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| {
            // Unsupported: this machine cannot open RBD images at all (not a device error).
            io::Error::new(
                io::ErrorKind::Unsupported,
                format!("cannot load {LIBRBD} for RBD images (install librbd1): {e}"),
            )
        })
}

fn c_string(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// An open RBD image with its own cluster connection.
pub struct Image {
    lib: &'static sys::Librbd,
    cluster: sys::rados_t,
    ioctx: sys::rados_ioctx_t,
    image: sys::rbd_image_t,
    size: u64,
    object_size: u64,
    read_only: bool,
}

// SAFETY: librbd's image handle and librados's cluster and I/O context are thread-safe for the
// calls made here (QEMU's rbd driver issues aio on one image from several threads); the handles
// are only closed in Drop, when no borrow (and so no completion) is left.
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

impl Image {
    /// Connects to the cluster and opens `spec`, read-only when `read_only` or a snapshot is
    /// named. Connecting gives up after `client_mount_timeout` (30 s unless the configuration
    /// says otherwise) instead of librados's default five minutes.
    ///
    /// A writable open takes the image's exclusive lock and keeps it until closed, so there is
    /// one writer: librbd's automatic lock would pass to any other client that writes, and a
    /// second cryptblk (which asks the same way) is refused. Images without the
    /// exclusive-lock feature open without it.
    pub fn open(spec: &ImageSpec, read_only: bool) -> io::Result<Image> {
        let read_only = read_only || spec.snapshot.is_some();
        let api = lib()?;
        let mut img = Image {
            lib: api,
            cluster: ptr::null_mut(),
            ioctx: ptr::null_mut(),
            image: ptr::null_mut(),
            size: 0,
            object_size: 0,
            read_only,
        };
        // SAFETY: every pointer handed over is valid for the call; handles are released by
        // Drop in reverse order, whatever step failed.
        unsafe {
            check(
                api.rados_create(&mut img.cluster, ptr::null()),
                "cannot create a Ceph client",
            )?;
            let (k, v) = (c_string("client_mount_timeout")?, c_string("30")?);
            api.rados_conf_set(img.cluster, k.as_ptr(), v.as_ptr());
            check(
                api.rados_conf_read_file(img.cluster, ptr::null()),
                "cannot read the Ceph configuration (CEPH_CONF, /etc/ceph/ceph.conf)",
            )?;
            check(
                api.rados_conf_parse_env(img.cluster, ptr::null()),
                "bad CEPH_ARGS",
            )?;
            // Failures come back as errnos and cryptblk reports them in one line; librados's
            // own messages (e.g. an admin socket another client of the same name holds) would
            // only add lines to a command's error output. Its log file still gets them.
            for key in ["log_to_stderr", "err_to_stderr"] {
                let (k, v) = (c_string(key)?, c_string("false")?);
                api.rados_conf_set(img.cluster, k.as_ptr(), v.as_ptr());
            }
            check(
                api.rados_connect(img.cluster),
                "cannot connect to the Ceph cluster",
            )?;
            let pool = c_string(&spec.pool)?;
            check(
                api.rados_ioctx_create(img.cluster, pool.as_ptr(), &mut img.ioctx),
                &format!("cannot open pool {}", spec.pool),
            )?;
            if let Some(ns) = &spec.namespace {
                let ns = c_string(ns)?;
                api.rados_ioctx_set_namespace(img.ioctx, ns.as_ptr());
            }
            let name = c_string(&spec.image)?;
            let snap = spec.snapshot.as_deref().map(c_string).transpose()?;
            let snap_ptr = snap.as_ref().map_or(ptr::null(), |s| s.as_ptr());
            let ret = if read_only {
                api.rbd_open_read_only(img.ioctx, name.as_ptr(), &mut img.image, snap_ptr)
            } else {
                api.rbd_open(img.ioctx, name.as_ptr(), &mut img.image, snap_ptr)
            };
            if ret < 0 {
                img.image = ptr::null_mut();
            }
            check(ret, &format!("cannot open RBD image {spec}"))?;
            let mut info: sys::rbd_image_info_t = std::mem::zeroed();
            check(
                api.rbd_stat(
                    img.image,
                    &mut info,
                    std::mem::size_of::<sys::rbd_image_info_t>(),
                ),
                &format!("cannot stat RBD image {spec}"),
            )?;
            img.size = info.size;
            img.object_size = info.obj_size;
            if !read_only {
                match api.rbd_lock_acquire(img.image, sys::rbd_lock_mode_t_RBD_LOCK_MODE_EXCLUSIVE)
                {
                    r if r >= 0 || r == -libc::EINVAL || r == -libc::EOPNOTSUPP => {}
                    r => {
                        let e = errno(r.into());
                        return Err(io::Error::new(
                            io::ErrorKind::ResourceBusy,
                            format!(
                                "RBD image {spec} is in use: another client holds its \
                                 exclusive lock ({e})"
                            ),
                        ));
                    }
                }
            }
        }
        Ok(img)
    }

    /// Size in bytes (`rbd_stat`).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Size of the image's RADOS objects in bytes.
    pub fn object_size(&self) -> u64 {
        self.object_size
    }

    /// True if opened read-only (asked for, or a snapshot).
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    fn completion(&self) -> io::Result<sys::rbd_completion_t> {
        let api = self.lib;
        let mut c: sys::rbd_completion_t = ptr::null_mut();
        // SAFETY: no callback: the completion is waited for and released by `Completion`.
        check(
            unsafe { api.rbd_aio_create_completion(ptr::null_mut(), None, &mut c) },
            "cannot create an RBD completion",
        )?;
        Ok(c)
    }

    /// Submits `ret = submit(c)` on a fresh completion and wraps it.
    fn submit<'a>(
        &'a self,
        expected: Option<usize>,
        submit: impl FnOnce(sys::rbd_completion_t) -> libc::c_int,
    ) -> io::Result<Completion<'a>> {
        let c = self.completion()?;
        let ret = submit(c);
        if ret < 0 {
            // SAFETY: the request was refused, so the completion will never fire.
            unsafe { self.lib.rbd_aio_release(c) };
            return Err(errno(ret.into()));
        }
        Ok(Completion {
            lib: self.lib,
            c,
            expected,
            _borrow: PhantomData,
        })
    }

    /// Starts reading `buf.len()` bytes at `offset` into `buf`.
    pub fn aio_read<'a>(&'a self, offset: u64, buf: &'a mut [u8]) -> io::Result<Completion<'a>> {
        let (len, p) = (buf.len(), buf.as_mut_ptr().cast());
        // SAFETY: `buf` stays borrowed until the completion has fired (Completion's lifetime).
        self.submit(Some(len), |c| unsafe {
            self.lib.rbd_aio_read(self.image, offset, len, p, c)
        })
    }

    /// Starts writing `buf` at `offset`.
    pub fn aio_write<'a>(&'a self, offset: u64, buf: &'a [u8]) -> io::Result<Completion<'a>> {
        let (len, p) = (buf.len(), buf.as_ptr().cast());
        // SAFETY: as in `aio_read`. A write's completion reports 0, not a length.
        self.submit(None, |c| unsafe {
            self.lib.rbd_aio_write(self.image, offset, len, p, c)
        })
    }

    /// Starts a flush of every write completed so far.
    pub fn aio_flush(&self) -> io::Result<Completion<'_>> {
        // SAFETY: no buffer involved.
        self.submit(None, |c| unsafe { self.lib.rbd_aio_flush(self.image, c) })
    }

    /// Starts a discard (reads of the range return zeros afterwards).
    pub fn aio_discard(&self, offset: u64, len: u64) -> io::Result<Completion<'_>> {
        // SAFETY: no buffer involved.
        self.submit(None, |c| unsafe {
            self.lib.rbd_aio_discard(self.image, offset, len, c)
        })
    }

    /// Starts zeroing a range.
    pub fn aio_write_zeroes(&self, offset: u64, len: u64) -> io::Result<Completion<'_>> {
        let len = usize::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: no buffer involved.
        self.submit(None, |c| unsafe {
            self.lib
                .rbd_aio_write_zeroes(self.image, offset, len, c, 0, 0)
        })
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let api = self.lib;
        // SAFETY: each handle was created by the matching call and is released once; no
        // completion can be outstanding (they borrow the image).
        unsafe {
            if !self.image.is_null() {
                api.rbd_close(self.image);
            }
            if !self.ioctx.is_null() {
                api.rados_ioctx_destroy(self.ioctx);
            }
            if !self.cluster.is_null() {
                api.rados_shutdown(self.cluster);
            }
        }
    }
}

/// One request in flight; [`Completion::wait`] gives its result. Dropping it waits too, so
/// the buffer it borrows is never written after the borrow ends.
pub struct Completion<'a> {
    lib: &'static sys::Librbd,
    c: sys::rbd_completion_t,
    /// Bytes a read must report (none for writes, flush, discard, zeroing).
    expected: Option<usize>,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl Completion<'_> {
    /// Waits for the request; a short transfer is an `EIO`.
    pub fn wait(self) -> io::Result<()> {
        let ret = self.finish();
        std::mem::forget(self);
        ret
    }

    fn finish(&self) -> io::Result<()> {
        // SAFETY: `c` is a live completion of a submitted request; released exactly once
        // here (`wait` forgets self, Drop runs only when `wait` was not called).
        let api = self.lib;
        let ret = unsafe {
            api.rbd_aio_wait_for_complete(self.c);
            let r = api.rbd_aio_get_return_value(self.c);
            api.rbd_aio_release(self.c);
            r
        };
        if ret < 0 {
            return Err(errno(ret as i64));
        }
        match self.expected {
            Some(n) if ret as usize != n => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("short RBD transfer: {ret} of {n} bytes"),
            )),
            _ => Ok(()),
        }
    }
}

impl Drop for Completion<'_> {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// librbd's version as `major.minor.extra` (loads librbd).
pub fn version() -> io::Result<String> {
    let (mut a, mut b, mut c) = (0, 0, 0);
    // SAFETY: writes three ints.
    unsafe { lib()?.rbd_version(&mut a, &mut b, &mut c) };
    Ok(format!("{a}.{b}.{c}"))
}

#[cfg(test)]
mod tests {
    use super::ImageSpec;

    #[test]
    fn specs() {
        let s = ImageSpec::parse("testpool/img").unwrap();
        assert_eq!((s.pool.as_str(), s.image.as_str()), ("testpool", "img"));
        assert_eq!((s.namespace, s.snapshot), (None, None));
        let s = ImageSpec::parse("p/ns/img@snap1").unwrap();
        assert_eq!(s.namespace.as_deref(), Some("ns"));
        assert_eq!(s.snapshot.as_deref(), Some("snap1"));
        assert_eq!(s.to_string(), "p/ns/img@snap1");
        for bad in [
            "", "img", "/img", "p/", "p//i", "a/b/c/d", "p/i@", "p/i@a@b", "p/i x",
        ] {
            assert!(ImageSpec::parse(bad).is_err(), "{bad} accepted");
        }
    }
}
