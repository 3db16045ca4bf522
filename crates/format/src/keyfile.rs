//! Passphrase and key sources with cryptsetup's rules.
//!
//! * `--key-file FILE` (`-d`): the file's bytes are the key, newlines included, after skipping
//!   `--keyfile-offset` bytes and limited to `--keyfile-size` bytes (which must then all be
//!   present). Without a size limit, input longer than [`DEFAULT_KEYFILE_SIZE_MAX`] is refused.
//! * `--key-file -`: the same, read from standard input (binary, no newline handling).
//! * No key file, standard input not a terminal: the passphrase ends at the first newline
//!   (which is not part of it); end of input with nothing read is an error.
//! * No key file, standard input a terminal: prompt with echo off.
//!
//! Everything read ends up in a [`SecretBytes`]; intermediate buffers are wiped.

use crate::error::{FormatError, Result};
use cryptblk_cipher::SecretBytes;
use std::io::{self, Read, Write};
use std::path::Path;
use zeroize::Zeroize;

/// cryptsetup's default maximum key file size (`DEFAULT_KEYFILE_SIZE_MAXKB` = 8192 KiB).
pub const DEFAULT_KEYFILE_SIZE_MAX: usize = 8192 * 1024;

/// Where a key comes from, as the CLI options describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// `--key-file PATH` (or `-` for standard input, read as binary).
    File(std::path::PathBuf),
    /// A passphrase typed at the terminal or piped in (ends at the first newline).
    Passphrase,
}

/// `--keyfile-offset` / `--keyfile-size`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyFileLimits {
    /// Bytes to skip at the start.
    pub offset: u64,
    /// Exact number of bytes to read (`None`: all, up to [`DEFAULT_KEYFILE_SIZE_MAX`]).
    pub size: Option<usize>,
}

/// Reads a key from `source` the way cryptsetup does; `prompt` is shown on a terminal.
pub fn read_key(source: &KeySource, limits: KeyFileLimits, prompt: &str) -> Result<SecretBytes> {
    match source {
        KeySource::File(path) => read_key_file(path, limits),
        KeySource::Passphrase => {
            if stdin_is_tty() {
                if limits.offset != 0 {
                    return Err(FormatError::KeyFile(
                        "cannot use offset with terminal input".into(),
                    ));
                }
                let pass = prompt_passphrase(prompt)?;
                match limits.size {
                    Some(n) if n < pass.len() => Ok(SecretBytes::from_slice(&pass.as_bytes()[..n])),
                    _ => Ok(pass),
                }
            } else {
                read_key_from(io::stdin().lock(), limits, true, false)
            }
        }
    }
}

/// Reads a key file (`-` = standard input), binary, honouring `limits`.
pub fn read_key_file(path: &Path, limits: KeyFileLimits) -> Result<SecretBytes> {
    if path == Path::new("-") {
        if stdin_is_tty() {
            return Err(FormatError::KeyFile(
                "cannot read keyfile from a terminal".into(),
            ));
        }
        return read_key_from(io::stdin().lock(), limits, false, false);
    }
    let file = std::fs::File::open(path)
        .map_err(|e| FormatError::KeyFile(format!("failed to open key file: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| FormatError::KeyFile(format!("failed to stat key file: {e}")))?;
    let regular = meta.is_file();
    if regular && limits.offset > meta.len() {
        return Err(FormatError::KeyFile(
            "cannot seek to requested keyfile offset".into(),
        ));
    }
    read_key_from(file, limits, false, regular)
}

/// Reads a volume key of `key_bytes` bytes from `path` (`--volume-key-file`), as
/// cryptsetup does: the first `key_bytes` bytes of whatever the file is (a longer file, a
/// device, `/dev/urandom`), refused when it holds fewer. No size cap applies and nothing is
/// special about `-`: cryptsetup opens a file of that name too.
pub fn read_volume_key_file(path: &Path, key_bytes: usize) -> Result<SecretBytes> {
    let file = std::fs::File::open(path)
        .map_err(|_| FormatError::UnreadableKeyFile(path.display().to_string()))?;
    let short = || FormatError::ShortVolumeKeyFile {
        bytes: key_bytes,
        path: path.display().to_string(),
    };
    let limits = KeyFileLimits {
        offset: 0,
        size: Some(key_bytes),
    };
    match read_key_from(file, limits, false, true) {
        Ok(k) if k.len() == key_bytes => Ok(k),
        Ok(_) => Err(short()),
        Err(FormatError::KeyFile(_) | FormatError::NothingToRead) => Err(short()),
        Err(e) => Err(e),
    }
}

/// The core reader: skips `limits.offset` bytes, then reads up to `limits.size` bytes (or the
/// default maximum), stopping at a newline when `stop_at_newline` (the newline is dropped).
/// `regular_file` allows an empty key (an empty regular file is a valid, empty key; an empty
/// pipe is "nothing to read").
pub fn read_key_from<R: Read>(
    mut reader: R,
    limits: KeyFileLimits,
    stop_at_newline: bool,
    regular_file: bool,
) -> Result<SecretBytes> {
    let read_err = |e: io::Error| FormatError::KeyFile(format!("error reading passphrase: {e}"));
    // Skip the offset by reading (works on pipes, too).
    let mut to_skip = limits.offset;
    let mut scratch = [0u8; 4096];
    while to_skip > 0 {
        let want = scratch.len().min(to_skip as usize);
        let n = read_some(&mut reader, &mut scratch[..want]).map_err(read_err)?;
        if n == 0 {
            scratch.zeroize();
            return Err(FormatError::KeyFile(
                "cannot seek to requested keyfile offset".into(),
            ));
        }
        to_skip -= n as u64;
    }
    scratch.zeroize();

    // One more than the maximum, so "exactly at the limit" and "over it" differ.
    let limit = limits.size.unwrap_or(DEFAULT_KEYFILE_SIZE_MAX + 1);
    let mut buf = GrowingSecret::new();
    let mut newline = false;
    if stop_at_newline {
        // One byte at a time so nothing after the newline is consumed.
        let mut byte = [0u8; 1];
        while buf.len() < limit {
            if read_some(&mut reader, &mut byte).map_err(read_err)? == 0 {
                break;
            }
            if byte[0] == b'\n' {
                newline = true;
                break;
            }
            buf.push(&byte);
        }
        byte.zeroize();
    } else {
        let mut chunk = [0u8; 4096];
        while buf.len() < limit {
            let want = chunk.len().min(limit - buf.len());
            let n = read_some(&mut reader, &mut chunk[..want]).map_err(read_err)?;
            if n == 0 {
                break;
            }
            buf.push(&chunk[..n]);
        }
        chunk.zeroize();
    }
    if buf.len() == 0 && !regular_file && !newline {
        return Err(FormatError::NothingToRead);
    }
    match limits.size {
        None if buf.len() > DEFAULT_KEYFILE_SIZE_MAX => {
            Err(FormatError::KeyFile("maximum keyfile size exceeded".into()))
        }
        Some(n) if buf.len() != n => Err(FormatError::KeyFile(
            "cannot read requested amount of data".into(),
        )),
        _ => Ok(buf.into_secret()),
    }
}

fn read_some<R: Read>(reader: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match reader.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// A byte buffer that wipes every allocation it leaves behind when it grows.
struct GrowingSecret {
    buf: Vec<u8>,
}

impl GrowingSecret {
    fn new() -> Self {
        GrowingSecret {
            buf: Vec::with_capacity(256),
        }
    }

    fn len(&self) -> usize {
        self.buf.len()
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.buf.len() + bytes.len() > self.buf.capacity() {
            let mut bigger = Vec::with_capacity((self.buf.len() + bytes.len()).max(256) * 2);
            bigger.extend_from_slice(&self.buf);
            self.buf.zeroize();
            self.buf = bigger;
        }
        self.buf.extend_from_slice(bytes);
    }

    fn into_secret(mut self) -> SecretBytes {
        SecretBytes::from_vec(std::mem::take(&mut self.buf))
    }
}

impl Drop for GrowingSecret {
    fn drop(&mut self) {
        self.buf.zeroize();
    }
}

/// True when standard input is a terminal.
pub fn stdin_is_tty() -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(libc::STDIN_FILENO) == 1 }
}

/// Prompts on standard error and reads one line from the terminal with echo disabled.
///
/// Hand-written rather than `rpassword` (checked with 7.5.4, the current release): it reads
/// characters, not bytes, in raw mode, so it drops control characters (a typed `pass<TAB>word`
/// came back as `password`) and turns bytes that are not UTF-8 into U+FFFD (`caf\xe9` came
/// back as `caf\xef\xbf\xbd`), and it reads `/dev/tty` rather than standard input.
/// cryptsetup hashes the bytes typed on standard input as they are (canonical mode, echo
/// off), so such a passphrase would not open its volume. The `key_hygiene` test
/// `passphrase_with_a_tab_typed_on_a_terminal` holds this to cryptsetup's behaviour.
pub fn prompt_passphrase(prompt: &str) -> Result<SecretBytes> {
    let fd = libc::STDIN_FILENO;
    let mut stderr = io::stderr();
    let _ = write!(stderr, "{prompt}");
    let _ = stderr.flush();
    // SAFETY: termios is plain data; tcgetattr fills it for a valid descriptor.
    let mut saved: libc::termios = unsafe { std::mem::zeroed() };
    let have_tty = unsafe { libc::tcgetattr(fd, &mut saved) } == 0;
    if have_tty {
        let mut quiet = saved;
        quiet.c_lflag &= !libc::ECHO;
        // SAFETY: applying attributes derived from the ones just read.
        unsafe { libc::tcsetattr(fd, libc::TCSAFLUSH, &quiet) };
    }
    let result = read_key_from(io::stdin().lock(), KeyFileLimits::default(), true, false);
    if have_tty {
        // SAFETY: restores the attributes read above.
        unsafe { libc::tcsetattr(fd, libc::TCSAFLUSH, &saved) };
        let _ = writeln!(stderr);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(offset: u64, size: Option<usize>) -> KeyFileLimits {
        KeyFileLimits { offset, size }
    }

    #[test]
    fn key_file_keeps_newlines() {
        let k = read_key_from(&b"ab\ncd\n"[..], limits(0, None), false, true).unwrap();
        assert_eq!(k.as_bytes(), b"ab\ncd\n");
    }

    #[test]
    fn passphrase_stops_at_first_newline() {
        let mut input = &b"secret\nnext\n"[..];
        let k = read_key_from(&mut input, limits(0, None), true, false).unwrap();
        assert_eq!(k.as_bytes(), b"secret");
        // The rest stays unread for a second prompt (luksAddKey reads two lines).
        assert_eq!(input, b"next\n");
    }

    #[test]
    fn offset_and_size_select_bytes() {
        let k = read_key_from(&b"0123456789"[..], limits(2, Some(4)), false, true).unwrap();
        assert_eq!(k.as_bytes(), b"2345");
    }

    #[test]
    fn short_input_with_explicit_size_fails() {
        let e = read_key_from(&b"0123"[..], limits(0, Some(10)), false, true).unwrap_err();
        assert!(e.to_string().contains("requested amount"), "{e}");
    }

    #[test]
    fn offset_past_end_fails() {
        assert!(read_key_from(&b"0123"[..], limits(10, None), false, false).is_err());
    }

    #[test]
    fn empty_pipe_is_an_error_but_empty_file_is_not() {
        assert!(read_key_from(&b""[..], limits(0, None), false, false).is_err());
        assert_eq!(
            read_key_from(&b""[..], limits(0, None), false, true)
                .unwrap()
                .len(),
            0
        );
        // An empty line is an empty passphrase, not a missing one.
        assert_eq!(
            read_key_from(&b"\n"[..], limits(0, None), true, false)
                .unwrap()
                .len(),
            0
        );
    }

    #[test]
    fn oversized_input_is_refused() {
        let big = vec![b'x'; DEFAULT_KEYFILE_SIZE_MAX + 10];
        assert!(read_key_from(&big[..], limits(0, None), false, true).is_err());
        let exact = vec![b'x'; DEFAULT_KEYFILE_SIZE_MAX];
        assert_eq!(
            read_key_from(&exact[..], limits(0, None), false, true)
                .unwrap()
                .len(),
            DEFAULT_KEYFILE_SIZE_MAX
        );
    }

    #[test]
    fn reads_real_files() {
        let dir = std::env::temp_dir().join(format!("cryptblk-keyfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("key");
        std::fs::write(&p, b"hello world").unwrap();
        let k = read_key_file(&p, limits(6, None)).unwrap();
        assert_eq!(k.as_bytes(), b"world");
        assert!(read_key_file(&p, limits(100, None)).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
