//! Memory for key material: page-aligned anonymous mappings of their own, locked out of swap,
//! left out of core dumps and wiped before they are unmapped.
//!
//! Hand-written on `mmap`/`mlock` rather than taken from a crate because of two needs the
//! guarded-allocation crates do not meet together: a C allocator for AWS-LC
//! (`CRYPTO_set_mem_functions` wants `malloc`/`realloc`/`free` whose `free` finds the size
//! from the pointer), and growable text (the hex of a key in a table line) whose growth leaves
//! no copy behind. One mapping per allocation is what makes unlocking safe: `munlock` works
//! on whole pages and does not count, so two secrets sharing a page would unlock each other.

use std::ptr::NonNull;
use std::sync::Once;

/// A zero-filled, page-aligned mapping of at least `len` bytes, locked (best effort: a
/// failing `mlock`, e.g. under a tight `RLIMIT_MEMLOCK`, leaves it unlocked) and excluded
/// from core dumps. Wiped and unmapped on drop.
pub(crate) struct LockedRegion {
    ptr: NonNull<u8>,
    map_len: usize,
    locked: bool,
}

// SAFETY: the region is plain owned memory; access goes through &self / &mut self.
unsafe impl Send for LockedRegion {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for LockedRegion {}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

impl LockedRegion {
    /// A region of at least `len` bytes (one page for `len` 0), or `None` when the system
    /// has no memory for it.
    pub(crate) fn new(len: usize) -> Option<Self> {
        let page = page_size();
        let map_len = len.max(1).checked_next_multiple_of(page)?;
        // SAFETY: a fresh private anonymous mapping; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        // SAFETY: the mapping was just created with this length.
        let locked = unsafe {
            libc::madvise(p, map_len, libc::MADV_DONTDUMP);
            libc::mlock(p, map_len) == 0
        };
        Some(LockedRegion {
            ptr: NonNull::new(p.cast())?,
            map_len,
            locked,
        })
    }

    /// Bytes usable (the mapping's length, a whole number of pages).
    pub(crate) fn capacity(&self) -> usize {
        self.map_len
    }

    /// Whether `mlock` succeeded.
    pub(crate) fn is_locked(&self) -> bool {
        self.locked
    }

    /// The whole region.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is readable for map_len bytes while self lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.map_len) }
    }

    /// The whole region, writable.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as bytes(), and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.map_len) }
    }
}

impl Drop for LockedRegion {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(self.bytes_mut());
        // SAFETY: the mapping is ours and nothing refers to it any more.
        unsafe {
            if self.locked {
                libc::munlock(self.ptr.as_ptr().cast(), self.map_len);
            }
            libc::munmap(self.ptr.as_ptr().cast(), self.map_len);
        }
    }
}

/// A value (a key schedule, a keyed cipher) kept in a [`LockedRegion`] of its own: locked,
/// out of core dumps, and wiped after the value is dropped. The value is moved in, so
/// whatever built it on the stack should be as short-lived as a stack frame.
pub(crate) struct LockedBox<T> {
    region: LockedRegion,
    _owns: std::marker::PhantomData<T>,
}

// SAFETY: a LockedBox owns its T exactly like a Box does.
unsafe impl<T: Send> Send for LockedBox<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for LockedBox<T> {}

impl<T> LockedBox<T> {
    /// Moves `value` into locked memory.
    pub(crate) fn new(value: T) -> Self {
        assert!(
            std::mem::align_of::<T>() <= page_size(),
            "page-aligned memory holds any value"
        );
        let region =
            LockedRegion::new(std::mem::size_of::<T>()).expect("out of memory for a key schedule");
        // SAFETY: the region is page-aligned (enough for T, checked above), large enough,
        // and uninitialised as far as T is concerned.
        unsafe { region.ptr.as_ptr().cast::<T>().write(value) };
        LockedBox {
            region,
            _owns: std::marker::PhantomData,
        }
    }
}

impl<T> std::ops::Deref for LockedBox<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: new() wrote a T there, alive until drop.
        unsafe { &*self.region.ptr.as_ptr().cast::<T>() }
    }
}

impl<T> std::ops::DerefMut for LockedBox<T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as deref, exclusive through &mut self.
        unsafe { &mut *self.region.ptr.as_ptr().cast::<T>() }
    }
}

impl<T> Drop for LockedBox<T> {
    fn drop(&mut self) {
        // SAFETY: the T written by new() is dropped once; the region then wipes the bytes.
        unsafe { std::ptr::drop_in_place(self.region.ptr.as_ptr().cast::<T>()) };
    }
}

/// Text that holds key material (a key's hex, a table line or control answer carrying it):
/// kept in a [`LockedRegion`], wiped on drop. Growing moves it to a larger region and wipes
/// the old one, so no copy stays behind.
pub struct SecretText {
    region: Option<LockedRegion>,
    len: usize,
}

impl SecretText {
    /// An empty text with room for `cap` bytes before it has to move.
    pub fn with_capacity(cap: usize) -> Self {
        let mut t = SecretText {
            region: None,
            len: 0,
        };
        t.reserve(cap);
        t
    }

    /// An empty text.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// Copies `s` into a new secret text (the caller wipes its own copy).
    pub fn from_str_copy(s: &str) -> Self {
        let mut t = Self::with_capacity(s.len());
        t.push_str(s);
        t
    }

    fn reserve(&mut self, extra: usize) {
        let need = self
            .len
            .checked_add(extra)
            .expect("secret text size overflows");
        let cap = self.region.as_ref().map_or(0, LockedRegion::capacity);
        if need <= cap || need == 0 {
            return;
        }
        let mut bigger = LockedRegion::new(need.max(cap * 2)).expect("out of memory for a secret");
        if let Some(old) = &self.region {
            bigger.bytes_mut()[..self.len].copy_from_slice(&old.bytes()[..self.len]);
        }
        // Dropping the old region wipes it.
        self.region = Some(bigger);
    }

    /// Appends `s`.
    pub fn push_str(&mut self, s: &str) {
        self.reserve(s.len());
        if let Some(r) = &mut self.region {
            r.bytes_mut()[self.len..self.len + s.len()].copy_from_slice(s.as_bytes());
        }
        self.len += s.len();
    }

    /// Appends one character.
    pub fn push(&mut self, c: char) {
        self.push_str(c.encode_utf8(&mut [0; 4]));
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        match &self.region {
            // SAFETY: only whole `&str`s are ever copied in, so the first len bytes are UTF-8.
            Some(r) => unsafe { std::str::from_utf8_unchecked(&r.bytes()[..self.len]) },
            None => "",
        }
    }

    /// Whether the text lives in locked memory (false only when `mlock` was refused, or
    /// for an empty text that has none).
    pub fn is_locked(&self) -> bool {
        self.region.as_ref().is_some_and(LockedRegion::is_locked)
    }
}

impl Default for SecretText {
    fn default() -> Self {
        Self::new()
    }
}

impl std::ops::Deref for SecretText {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Write for SecretText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.push_str(s);
        Ok(())
    }
}

impl std::fmt::Debug for SecretText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretText({} bytes)", self.len)
    }
}

impl PartialEq<str> for SecretText {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl From<&str> for SecretText {
    fn from(s: &str) -> Self {
        Self::from_str_copy(s)
    }
}

impl PartialEq<SecretText> for String {
    fn eq(&self, other: &SecretText) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<SecretText> for &str {
    fn eq(&self, other: &SecretText) -> bool {
        *self == other.as_str()
    }
}

impl PartialEq<String> for SecretText {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq for SecretText {
    fn eq(&self, other: &SecretText) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for SecretText {}

impl Clone for SecretText {
    fn clone(&self) -> Self {
        Self::from_str_copy(self.as_str())
    }
}

impl std::io::Write for SecretText {
    /// Takes whole UTF-8 fragments (what serializers write); anything else is an error.
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let s = std::str::from_utf8(buf)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        self.push_str(s);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl PartialEq<&str> for SecretText {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Bytes in front of every AWS-LC allocation: the mapping's length, so `free` and `realloc`
/// find it from the pointer. 16 keeps the returned pointer aligned for any C type.
const HEADER: usize = 16;

unsafe extern "C" fn awslc_malloc(
    size: usize,
    _file: *const libc::c_char,
    _line: libc::c_int,
) -> *mut libc::c_void {
    let Some(total) = size.checked_add(HEADER) else {
        return std::ptr::null_mut();
    };
    let Some(region) = LockedRegion::new(total) else {
        return std::ptr::null_mut();
    };
    let region = std::mem::ManuallyDrop::new(region);
    let base = region.ptr.as_ptr();
    // SAFETY: the region holds at least HEADER bytes; the header stores the mapping length
    // and whether it is locked, which free needs to undo both.
    unsafe {
        base.cast::<usize>().write(region.map_len);
        base.add(8)
            .cast::<usize>()
            .write(usize::from(region.locked));
        base.add(HEADER).cast()
    }
}

/// The region behind a pointer `awslc_malloc` returned.
///
/// # Safety
/// `p` must come from `awslc_malloc` and not have been freed.
unsafe fn region_of(p: *mut libc::c_void) -> LockedRegion {
    // SAFETY: per the contract, the header sits HEADER bytes before p.
    unsafe {
        let base = p.cast::<u8>().sub(HEADER);
        LockedRegion {
            ptr: NonNull::new_unchecked(base),
            map_len: base.cast::<usize>().read(),
            locked: base.add(8).cast::<usize>().read() != 0,
        }
    }
}

unsafe extern "C" fn awslc_free(
    p: *mut libc::c_void,
    _file: *const libc::c_char,
    _line: libc::c_int,
) {
    if !p.is_null() {
        // SAFETY: AWS-LC frees only what its malloc (ours) returned; dropping wipes and unmaps.
        drop(unsafe { region_of(p) });
    }
}

unsafe extern "C" fn awslc_realloc(
    p: *mut libc::c_void,
    size: usize,
    file: *const libc::c_char,
    line: libc::c_int,
) -> *mut libc::c_void {
    if p.is_null() {
        // SAFETY: plain allocation.
        return unsafe { awslc_malloc(size, file, line) };
    }
    // SAFETY: p came from awslc_malloc (AWS-LC reallocates only its own allocations).
    let old = std::mem::ManuallyDrop::new(unsafe { region_of(p) });
    // SAFETY: plain allocation.
    let new = unsafe { awslc_malloc(size, file, line) };
    if !new.is_null() {
        let keep = size.min(old.map_len - HEADER);
        // SAFETY: both buffers hold at least `keep` bytes and are distinct mappings.
        unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), new.cast::<u8>(), keep) };
        // Wipes and unmaps the old block.
        drop(std::mem::ManuallyDrop::into_inner(old));
    }
    new
}

/// Routes every allocation AWS-LC makes (cipher contexts and their key schedules included)
/// to locked, wiped mappings. Runs once, and must run before AWS-LC allocates anything:
/// every entry point of this crate that reaches AWS-LC calls it first. Code that calls
/// `aws-lc-sys` directly must call it before its first call too.
pub fn lock_backend_memory() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: three functions with the signatures AWS-LC expects; installed before any
        // AWS-LC allocation, as the function's contract says.
        let ok = unsafe {
            aws_lc_sys::CRYPTO_set_mem_functions(
                Some(awslc_malloc),
                Some(awslc_realloc),
                Some(awslc_free),
            )
        };
        // 0 means AWS-LC's allocator was already customised: its own memory handling stays.
        let _ = ok;
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt::Write as _;

    #[test]
    fn text_grows_without_losing_content() {
        let mut t = SecretText::new();
        for i in 0..2000 {
            write!(t, "{i:04}").unwrap();
        }
        assert_eq!(t.len, 8000);
        assert!(t.as_str().starts_with("000000010002"));
        assert!(t.as_str().ends_with("1999"));
        assert_eq!(format!("{t:?}"), "SecretText(8000 bytes)");
    }

    #[test]
    fn regions_are_page_aligned_and_zeroed() {
        let r = LockedRegion::new(10).unwrap();
        assert_eq!(r.ptr.as_ptr() as usize % page_size(), 0);
        assert!(r.bytes().iter().all(|&b| b == 0));
        assert_eq!(r.capacity(), page_size());
    }

    #[test]
    fn backend_allocator_keeps_contents_across_realloc() {
        // SAFETY: the allocator functions used as AWS-LC would.
        unsafe {
            let p = awslc_malloc(100, std::ptr::null(), 0).cast::<u8>();
            assert!(!p.is_null());
            for i in 0..100 {
                p.add(i).write(i as u8);
            }
            let q = awslc_realloc(p.cast(), 10_000, std::ptr::null(), 0).cast::<u8>();
            assert!((0..100).all(|i| q.add(i).read() == i as u8));
            awslc_free(q.cast(), std::ptr::null(), 0);
        }
    }
}
