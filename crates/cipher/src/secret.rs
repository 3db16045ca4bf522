//! Key material that never outlives its use: zeroized on drop and locked out of swap.

use crate::locked::LockedRegion;
pub use crate::locked::SecretText;
use zeroize::Zeroize;

/// A buffer for keys and passphrases.
///
/// Invariants: the bytes live in a page-aligned mapping of their own that is `mlock`ed for
/// the buffer's whole life (best effort: a failing `mlock`, e.g. under a tight
/// `RLIMIT_MEMLOCK`, is not an error), left out of core dumps, and overwritten with zeros
/// before it is unmapped. The buffer never reallocates, so no copy is left behind. `Debug`
/// never prints the contents.
pub struct SecretBytes {
    region: Option<LockedRegion>,
    len: usize,
}

impl SecretBytes {
    /// A zero-filled secret of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        let region = (len > 0).then(|| LockedRegion::new(len).expect("out of memory for a secret"));
        SecretBytes { region, len }
    }

    /// Copies `bytes` into a new locked secret. The caller stays responsible for its own copy.
    pub fn from_slice(bytes: &[u8]) -> Self {
        let mut s = Self::zeroed(bytes.len());
        s.as_mut_bytes().copy_from_slice(bytes);
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
        getrandom::getrandom(s.as_mut_bytes()).expect("the OS random source failed");
        s
    }

    /// The secret bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.region {
            Some(r) => &r.bytes()[..self.len],
            None => &[],
        }
    }

    /// The secret bytes, writable.
    pub fn as_mut_bytes(&mut self) -> &mut [u8] {
        match &mut self.region {
            Some(r) => &mut r.bytes_mut()[..self.len],
            None => &mut [],
        }
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the secret holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the bytes are locked in memory (false when `mlock` was refused).
    pub fn is_locked(&self) -> bool {
        self.region.as_ref().is_some_and(LockedRegion::is_locked)
    }

    /// Lower-case hex, for `--dump-volume-key` style output and table lines with keys: in
    /// locked memory of its own, wiped on drop.
    pub fn to_hex(&self) -> SecretText {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = SecretText::with_capacity(self.len * 2);
        for b in self.as_bytes() {
            out.push(char::from(DIGITS[usize::from(b >> 4)]));
            out.push(char::from(DIGITS[usize::from(b & 0xf)]));
        }
        out
    }
}

impl Clone for SecretBytes {
    fn clone(&self) -> Self {
        Self::from_slice(self.as_bytes())
    }
}

impl PartialEq for SecretBytes {
    /// Constant-time comparison: key digests are compared through this.
    fn eq(&self, other: &Self) -> bool {
        ct_eq(self.as_bytes(), other.as_bytes())
    }
}

impl Eq for SecretBytes {}

impl std::fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretBytes({} bytes)", self.len)
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
