//! `resize NAME [--size SECTORS | --device-size BYTES]` of a served crypt volume (LUKS1,
//! LUKS2 or plain), as cryptsetup resizes an active mapping: by default to the backing
//! device's current size less the data offset, after the backing file grew or before it
//! shrinks. The daemon reloads the crypt line with the new length and swaps it in with a
//! suspend/resume (I/O in flight drains, new I/O waits, nothing fails); its resume tells the
//! export, which tells the clients where its protocol can (see `cryptblk_export::Export`).
//! The key never leaves the daemon's socket: the reloaded table comes from the daemon's own
//! live table and goes back to it.

use crate::control::{self, Request, Status};
use crate::error::{Result, VolumeError};
use crate::luks::{LuksType, Volume};
use cryptblk_dm::TableSpec;
use std::path::{Path, PathBuf};

/// What `resize` was asked for; neither: the backing device's size less the data offset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResizeRequest {
    /// `--size`: the new size in 512-byte sectors (0 means the default, as cryptsetup).
    pub size_sectors: Option<u64>,
    /// `--device-size`: the new size in bytes (a multiple of 512).
    pub device_size: Option<u64>,
}

/// A done resize.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resized {
    /// The mapping.
    pub name: String,
    /// The backing device.
    pub device: PathBuf,
    /// Size before, in 512-byte sectors.
    pub old_sectors: u64,
    /// Size now, in 512-byte sectors.
    pub new_sectors: u64,
}

/// The new length in sectors for `req` on a device of `device_sectors` whose data starts at
/// `offset` sectors, encrypted in `sector_size`-byte sectors; `fixed` is a LUKS2 segment's
/// fixed size in sectors (none for a `dynamic` segment, LUKS1 and plain).
pub fn new_length(
    req: &ResizeRequest,
    device: &Path,
    device_sectors: u64,
    offset: u64,
    sector_size: u32,
    fixed: Option<u64>,
) -> Result<u64> {
    let asked = match (req.size_sectors, req.device_size) {
        (Some(_), Some(_)) => {
            return Err(VolumeError::usage(
                "Options --device-size and --size cannot be combined.",
            ))
        }
        (None, Some(b)) if b % 512 != 0 => {
            return Err(VolumeError::usage(
                "Device size must be multiple of 512 bytes sector.",
            ))
        }
        (None, Some(b)) => b / 512,
        (Some(s), None) => s,
        (None, None) => 0,
    };
    let too_small = || VolumeError::usage(format!("Device {} is too small.", device.display()));
    let len = match asked {
        0 => device_sectors.checked_sub(offset).ok_or_else(too_small)?,
        n => n,
    };
    if len == 0
        || offset
            .checked_add(len)
            .is_none_or(|end| end > device_sectors)
    {
        return Err(too_small());
    }
    if (len * 512) % u64::from(sector_size.max(512)) != 0 {
        return Err(VolumeError::usage(
            "Device size is not aligned to requested sector size.",
        ));
    }
    if let Some(max) = fixed {
        if len > max {
            return Err(VolumeError::usage(format!(
                "The LUKS2 data segment has a fixed size of {max} sectors; {len} sectors would \
                 map data outside it."
            )));
        }
    }
    Ok(len)
}

/// The fixed size, in sectors, of the LUKS2 data segment behind `st` (none when `dynamic`).
fn fixed_segment_sectors(st: &Status) -> Result<Option<u64>> {
    if st.info.kind != "LUKS2" {
        return Ok(None);
    }
    let Some(header) = st.info.header.as_deref() else {
        return Ok(None);
    };
    let vol = Volume::load(Path::new(header), LuksType::Luks2, false)?;
    Ok(vol.segment()?.size.map(|b| b / 512))
}

/// Resizes the served volume `name` (see the module doc).
pub fn resize(name: &str, req: &ResizeRequest) -> Result<Resized> {
    let st = control::status(name)?;
    if !matches!(st.info.kind.as_str(), "LUKS1" | "LUKS2" | "PLAIN") {
        return Err(VolumeError::usage(format!(
            "{name} is not active LUKS or plain crypt device name."
        )));
    }
    if !st.lower.is_empty() {
        return Err(VolumeError::usage(format!(
            "Resize of {name} is not supported: its integrity layer would need a new format."
        )));
    }
    if st.suspended {
        return Err(VolumeError::busy(format!(
            "Volume {name} is suspended; resume it first."
        )));
    }
    let table = control::table(name, true)?;
    let mut spec = TableSpec::parse(&table)
        .map_err(|e| VolumeError::device(format!("{name}: live table: {e}")))?;
    drop(table);
    let [line] = spec.lines.as_mut_slice() else {
        return Err(VolumeError::usage(format!(
            "Resize of {name} is not supported: its table has more than one line."
        )));
    };
    let old = line.len;
    let cfg = line.target.as_crypt().ok_or_else(|| {
        VolumeError::usage(format!(
            "{name} is not active LUKS or plain crypt device name."
        ))
    })?;
    let device = PathBuf::from(&cfg.device);
    let device_sectors = crate::device::device_size(&device)? / 512;
    let len = new_length(
        req,
        &device,
        device_sectors,
        cfg.offset,
        cfg.flags.sector_size,
        fixed_segment_sectors(&st)?,
    )?;
    line.len = len;
    let text = spec.to_text(true);
    drop(spec);
    control::request(
        name,
        &Request::Reload {
            table: text.to_string(),
        },
    )?;
    control::request(name, &Request::Suspend)?;
    control::request(name, &Request::Resume)?;
    Ok(Resized {
        name: name.to_string(),
        device,
        old_sectors: old,
        new_sectors: len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn len(req: ResizeRequest, dev: u64, off: u64, ss: u32, fixed: Option<u64>) -> Result<u64> {
        new_length(&req, Path::new("d"), dev, off, ss, fixed)
    }

    #[test]
    fn sizes_follow_cryptsetups_rules() {
        let none = ResizeRequest::default();
        assert_eq!(len(none, 1000, 32, 512, None).unwrap(), 968);
        let zero = ResizeRequest {
            size_sectors: Some(0),
            device_size: None,
        };
        assert_eq!(len(zero, 1000, 32, 512, None).unwrap(), 968);
        let some = ResizeRequest {
            size_sectors: Some(100),
            device_size: None,
        };
        assert_eq!(len(some, 1000, 32, 512, None).unwrap(), 100);
        let bytes = ResizeRequest {
            size_sectors: None,
            device_size: Some(51200),
        };
        assert_eq!(len(bytes, 1000, 32, 512, None).unwrap(), 100);
        let e = len(
            ResizeRequest {
                size_sectors: Some(969),
                device_size: None,
            },
            1000,
            32,
            512,
            None,
        )
        .unwrap_err();
        assert_eq!(e.message, "Device d is too small.");
        let e = len(
            ResizeRequest {
                size_sectors: Some(9),
                device_size: None,
            },
            1000,
            32,
            4096,
            None,
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            "Device size is not aligned to requested sector size."
        );
        let e = len(
            ResizeRequest {
                size_sectors: None,
                device_size: Some(513),
            },
            1000,
            32,
            512,
            None,
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            "Device size must be multiple of 512 bytes sector."
        );
        let e = len(
            ResizeRequest {
                size_sectors: Some(1),
                device_size: Some(512),
            },
            1000,
            32,
            512,
            None,
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            "Options --device-size and --size cannot be combined."
        );
        assert!(len(none, 1000, 32, 512, Some(500)).is_err());
        assert_eq!(len(some, 1000, 32, 512, Some(500)).unwrap(), 100);
        assert!(len(none, 20, 32, 512, None).is_err());
    }
}
