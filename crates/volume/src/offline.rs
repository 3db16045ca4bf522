//! Offline image pipelines without dm: a plaintext stream encrypted into a new volume's data
//! segment, and a volume's data segment decrypted into a stream.

use crate::error::{Result, VolumeError};
use crate::progress::Progress;
use crate::segment::Segment;
use cryptblk_cipher::{SectorCipher, SectorOptions};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Bytes processed per cipher call: large enough to amortise per-call costs.
const CHUNK: usize = 4 << 20;

/// The sector cipher of `seg` keyed with `key`; `implementation` picks one by name
/// (`cryptblk ciphers`), `None` the fastest.
pub fn segment_cipher(
    seg: &Segment,
    key: &[u8],
    implementation: Option<String>,
) -> Result<Box<dyn SectorCipher>> {
    Ok(cryptblk_cipher::open_cipher(
        &seg.cipher,
        key,
        &SectorOptions {
            sector_size: seg.sector_size as usize,
            iv_offset: seg.iv_offset,
            iv_large_sectors: false,
            implementation,
        },
    )?)
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Encrypts `src` to `dst` as the data segment starting at sector 0 of the segment, the last
/// sector zero-padded to `sector` bytes; `total` (the input size, if known) goes to
/// `progress`. Returns the bytes written.
pub fn encrypt_stream(
    cipher: &dyn SectorCipher,
    sector: usize,
    src: &mut dyn Read,
    dst: &mut dyn Write,
    total: Option<u64>,
    progress: &mut dyn Progress,
) -> Result<u64> {
    progress.start(total, "encrypting");
    let mut buf = vec![0u8; CHUNK];
    let mut pos = 0u64;
    let mut read = 0u64;
    let result = (|| -> Result<()> {
        loop {
            let n = read_full(src, &mut buf)?;
            if n == 0 {
                break;
            }
            let padded = n.div_ceil(sector) * sector;
            buf[n..padded].fill(0);
            cipher.encrypt(pos / 512, &mut buf[..padded])?;
            dst.write_all(&buf[..padded])?;
            pos += padded as u64;
            read += n as u64;
            progress.update(read);
            if n < CHUNK {
                break;
            }
        }
        dst.flush()?;
        Ok(())
    })();
    progress.finish();
    result.map(|()| pos)
}

/// The bytes of `seg` on the data device `data_dev` of `dev_size` bytes (whole encryption
/// sectors); the geometry `open` checks ([`Segment::mapped_len`]): a segment that starts at
/// or past the device's end, or whose fixed size runs past it, is refused (exit 4) before
/// any output exists, not decrypted into an empty or short file.
pub fn segment_len(seg: &Segment, dev_size: u64, data_dev: &Path) -> Result<u64> {
    let len = seg.mapped_len(dev_size, data_dev)?;
    if seg.offset.checked_add(len).is_none_or(|end| end > dev_size) {
        return Err(VolumeError::device(format!(
            "Device {} is too small.",
            data_dev.display()
        )));
    }
    Ok(len)
}

/// Decrypts the first `len` bytes of `seg` on `data` into `dst`.
pub fn decrypt_segment(
    cipher: &dyn SectorCipher,
    seg: &Segment,
    data: &File,
    len: u64,
    dst: &mut dyn Write,
    progress: &mut dyn Progress,
) -> Result<()> {
    progress.start(Some(len), "decrypting");
    let mut buf = vec![0u8; CHUNK];
    let mut pos = 0u64;
    let result = (|| -> Result<()> {
        while pos < len {
            let n = (len - pos).min(CHUNK as u64) as usize;
            data.read_exact_at(&mut buf[..n], seg.offset + pos)?;
            cipher.decrypt(pos / 512, &mut buf[..n])?;
            dst.write_all(&buf[..n])?;
            pos += n as u64;
            progress.update(pos);
        }
        dst.flush()?;
        Ok(())
    })();
    progress.finish();
    result
}

/// One end of a pipeline as the user named it: a path, or `-` for standard input (an input)
/// or standard output (an output); with the file it is, when it is one that can be both read
/// and written (a regular file or a block device).
#[derive(Clone, Debug)]
pub struct Endpoint {
    name: String,
    id: Option<(u64, u64)>,
}

impl Endpoint {
    /// An input named `path` (`-`: standard input, seen through its descriptor, so a
    /// redirection from the output file is recognised).
    pub fn input(path: &Path) -> Self {
        Self::named(path, std::io::stdin().as_fd(), "standard input")
    }

    /// An output named `path` (`-`: standard output); a path that does not exist yet is no
    /// file so far.
    pub fn output(path: &Path) -> Self {
        Self::named(path, std::io::stdout().as_fd(), "standard output")
    }

    fn named(path: &Path, std_fd: BorrowedFd<'_>, std_name: &str) -> Self {
        if path.as_os_str() == "-" {
            let meta = std_fd
                .try_clone_to_owned()
                .ok()
                .and_then(|fd| File::from(fd).metadata().ok());
            Endpoint {
                name: std_name.to_string(),
                id: meta.as_ref().and_then(file_id),
            }
        } else {
            Endpoint {
                name: path.display().to_string(),
                id: std::fs::metadata(path).ok().as_ref().and_then(file_id),
            }
        }
    }
}

/// Device and inode of a regular file or block device: the files an output can destroy.
fn file_id(meta: &std::fs::Metadata) -> Option<(u64, u64)> {
    let t = meta.file_type();
    (t.is_file() || t.is_block_device()).then(|| (meta.dev(), meta.ino()))
}

/// Refuses (exit 1) an output that is the same file as one of `inputs`, through whatever
/// path, link or redirection: writing it would destroy the input while it is read.
pub fn check_output_distinct(inputs: &[Endpoint], output: &Endpoint) -> Result<()> {
    let Some(out) = output.id else {
        return Ok(());
    };
    match inputs.iter().find(|i| i.id == Some(out)) {
        Some(input) => Err(VolumeError::usage(format!(
            "Output {} is the same file as input {}; write to another file.",
            output.name, input.name
        ))),
        None => Ok(()),
    }
}

/// Where a pipeline writes. A regular file (new or existing) is written as a temporary file
/// in its directory and renamed over it by [`Output::commit`], so a failure or an interrupt
/// leaves the old file whole and nothing is truncated while inputs are still read; standard
/// output and existing devices (block devices, FIFOs) are written in place.
pub struct Output {
    target: OutputTarget,
    /// An existing output's data lock: a file a daemon serves is not replaced under it.
    _in_use: Option<crate::lock::DataLock>,
}

enum OutputTarget {
    Stdout(std::io::Stdout),
    InPlace(File),
    Renamed {
        tmp: tempfile::NamedTempFile,
        path: PathBuf,
    },
}

impl Output {
    /// Prepares the output `path` (`-`: standard output). An existing regular file keeps its
    /// mode; a new one gets the default mode of a created file (0666 less the umask). A
    /// symbolic link is followed: its target is replaced, the link stays.
    pub fn create(path: &Path) -> Result<Output> {
        let cannot = |e: std::io::Error| {
            VolumeError::device(format!("cannot create {}: {e}", path.display()))
        };
        if path.as_os_str() == "-" {
            return Ok(Output {
                target: OutputTarget::Stdout(std::io::stdout()),
                _in_use: None,
            });
        }
        let existing = match std::fs::metadata(path) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(cannot(e)),
        };
        let in_use = match &existing {
            Some(m) if m.is_file() || m.file_type().is_block_device() => {
                Some(crate::lock::DataLock::take(path, true)?)
            }
            _ => None,
        };
        if let Some(meta) = existing.as_ref().filter(|m| !m.is_file()) {
            if meta.is_dir() {
                return Err(VolumeError::device(format!(
                    "cannot create {}: it is a directory",
                    path.display()
                )));
            }
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(cannot)?;
            return Ok(Output {
                target: OutputTarget::InPlace(f),
                _in_use: in_use,
            });
        }
        let path = match existing {
            Some(_) => std::fs::canonicalize(path).map_err(cannot)?,
            None => path.to_path_buf(),
        };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let tmp = tempfile::Builder::new()
            .prefix(".cryptblk-")
            .permissions(std::fs::Permissions::from_mode(0o666))
            .tempfile_in(&dir)
            .map_err(cannot)?;
        if let Some(meta) = &existing {
            tmp.as_file()
                .set_permissions(std::fs::Permissions::from_mode(meta.mode() & 0o7777))
                .map_err(cannot)?;
        }
        Ok(Output {
            target: OutputTarget::Renamed { tmp, path },
            _in_use: in_use,
        })
    }

    /// The stream to write the pipeline's bytes to.
    pub fn writer(&mut self) -> &mut dyn Write {
        match &mut self.target {
            OutputTarget::Stdout(s) => s,
            OutputTarget::InPlace(f) => f,
            OutputTarget::Renamed { tmp, .. } => tmp.as_file_mut(),
        }
    }

    /// Finishes the output: flushed, and a regular file synced and renamed into place.
    /// Dropping an `Output` without committing removes its temporary file.
    pub fn commit(self) -> Result<()> {
        match self.target {
            OutputTarget::Stdout(mut s) => Ok(s.flush()?),
            OutputTarget::InPlace(f) => Ok(f.sync_data()?),
            OutputTarget::Renamed { tmp, path } => {
                tmp.as_file().sync_all()?;
                tmp.persist(&path).map_err(|e| {
                    VolumeError::device(format!("cannot create {}: {}", path.display(), e.error))
                })?;
                Ok(())
            }
        }
    }
}

/// Writes every byte of the device a dmsetup-syntax table describes to `dst`, through an
/// in-process dm: the offline image of a volume is then exactly what `open` serves.
pub fn write_table_plaintext(
    table_text: &str,
    dst: &mut dyn Write,
    progress: &mut dyn Progress,
) -> Result<()> {
    let reg = cryptblk_dm::Registry::new();
    let table = reg
        .load_table(table_text)
        .map_err(|e| VolumeError::device(e.to_string()))?;
    let len = cryptblk_dm::BlockDevice::size(&table);
    progress.start(Some(len), "decrypting");
    let result = (|| -> Result<()> {
        let mut buf = zeroize::Zeroizing::new(vec![0u8; 1 << 20]);
        let mut pos = 0u64;
        while pos < len {
            let n = (len - pos).min(buf.len() as u64) as usize;
            cryptblk_dm::BlockDevice::read_at(&table, pos, &mut buf[..n])?;
            dst.write_all(&buf[..n])?;
            pos += n as u64;
            progress.update(pos);
        }
        dst.flush()?;
        Ok(())
    })();
    progress.finish();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_through_a_hardlink_or_symlink_is_its_input() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, b"x").unwrap();
        std::fs::hard_link(&a, dir.path().join("hard")).unwrap();
        std::os::unix::fs::symlink(&a, dir.path().join("soft")).unwrap();
        let inputs = [Endpoint::input(&a)];
        for out in ["a", "hard", "soft"] {
            let e = check_output_distinct(&inputs, &Endpoint::output(&dir.path().join(out)))
                .unwrap_err();
            assert_eq!(e.code, crate::ErrorClass::WrongParameters);
            assert!(e.message.contains(out), "{}", e.message);
        }
        std::fs::write(dir.path().join("b"), b"x").unwrap();
        for out in ["b", "new"] {
            check_output_distinct(&inputs, &Endpoint::output(&dir.path().join(out))).unwrap();
        }
    }

    #[test]
    fn an_uncommitted_output_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out");
        std::fs::write(&p, b"old").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        {
            let mut o = Output::create(&p).unwrap();
            o.writer().write_all(b"new").unwrap();
            assert_eq!(std::fs::read(&p).unwrap(), b"old");
        }
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let mut o = Output::create(&p).unwrap();
        o.writer().write_all(b"new").unwrap();
        o.commit().unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        let mode = std::fs::metadata(&p).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o640);
    }

    #[test]
    fn an_output_a_daemon_serves_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("served");
        std::fs::write(&p, b"volume").unwrap();
        let _served = crate::lock::DataLock::take(&p, false).unwrap();
        let e = Output::create(&p).err().unwrap();
        assert_eq!(e.code, crate::ErrorClass::Busy);
        assert_eq!(std::fs::read(&p).unwrap(), b"volume");
    }
}
