//! Key material that never outlives its use: zeroized on drop and locked out of swap.

use zeroize::Zeroize;

/// A heap buffer for keys and passphrases.
///
/// Invariants: the bytes are `mlock`ed for the buffer's whole life (best effort: a failing
/// `mlock`, e.g. under a tight `RLIMIT_MEMLOCK`, is not an error) and overwritten with zeros
/// before the memory is released. The buffer never reallocates, so no copy is left behind.
/// `Debug` never prints the contents.
pub struct SecretBytes {
    buf: Box<[u8]>,
    locked: bool,
}

impl SecretBytes {
    /// A zero-filled secret of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        let buf = vec![0u8; len].into_boxed_slice();
        let locked = lock(&buf);
        SecretBytes { buf, locked }
    }

    /// Copies `bytes` into a new locked secret. The caller stays responsible for its own copy.
    pub fn from_slice(bytes: &[u8]) -> Self {
        let mut s = Self::zeroed(bytes.len());
        s.buf.copy_from_slice(bytes);
        s
    }

    /// Takes ownership of `v`, moving it into locked memory and wiping the original vector.
    pub fn from_vec(mut v: Vec<u8>) -> Self {
        let s = Self::from_slice(&v);
        v.zeroize();
        s
    }

    /// `len` bytes from the operating system's CSPRNG.
    pub fn random(len: usize) -> Self {
        let mut s = Self::zeroed(len);
        getrandom::getrandom(&mut s.buf).expect("the OS random source failed");
        s
    }

    /// The secret bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// The secret bytes, writable.
    pub fn as_mut_bytes(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True when the secret holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Lower-case hex, for `--dump-volume-key` style output only.
    pub fn to_hex(&self) -> String {
        // One allocation of the final size: a growing String would leave freed partial
        // copies of the key on the heap.
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = String::with_capacity(self.buf.len() * 2);
        for b in self.buf.iter() {
            out.push(DIGITS[usize::from(b >> 4)] as char);
            out.push(DIGITS[usize::from(b & 0xf)] as char);
        }
        out
    }
}

impl Clone for SecretBytes {
    fn clone(&self) -> Self {
        Self::from_slice(&self.buf)
    }
}

impl PartialEq for SecretBytes {
    /// Constant-time comparison: key digests are compared through this.
    fn eq(&self, other: &Self) -> bool {
        ct_eq(&self.buf, &other.buf)
    }
}

impl Eq for SecretBytes {}

impl std::fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretBytes({} bytes)", self.buf.len())
    }
}

impl Drop for SecretBytes {
    fn drop(&mut self) {
        self.buf.zeroize();
        if self.locked {
            // SAFETY: the pointer and length describe memory this value owns.
            unsafe { libc::munlock(self.buf.as_ptr().cast(), self.buf.len()) };
        }
    }
}

/// Compares two byte strings in time independent of where they differ.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keep the optimiser from short-circuiting the fold.
    std::hint::black_box(diff) == 0
}

fn lock(buf: &[u8]) -> bool {
    if buf.is_empty() {
        return false;
    }
    // SAFETY: mlock only reads the address range, which this buffer owns.
    unsafe { libc::mlock(buf.as_ptr().cast(), buf.len()) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_contents() {
        let s = SecretBytes::from_slice(b"hunter2");
        assert_eq!(format!("{s:?}"), "SecretBytes(7 bytes)");
    }

    #[test]
    fn ct_eq_compares_values_and_lengths() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
    }

    #[test]
    fn random_secrets_differ() {
        assert_ne!(SecretBytes::random(32), SecretBytes::random(32));
    }
}
