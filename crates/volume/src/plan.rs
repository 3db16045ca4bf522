//! Activation plans: what an unlocked volume becomes when it is activated, before anything is
//! served. A plan holds the tables of the mappings to create (the top one keyed; lower ones
//! keyless, or keyed for the layers of a TCRYPT cipher chain) and the facts `status` reports;
//! the daemon (or a program embedding the library) builds the dm stack from it.

use crate::activation::Activation;
use crate::error::{Result, VolumeError};
use crate::facts::VolumeFacts;
use crate::luks::Volume;
use crate::luks2_integrity;
use crate::segment::Segment;
use cryptblk_cipher::SecretBytes;
use cryptblk_format::plain::PlainVolume;
use std::path::Path;
use zeroize::Zeroizing;

/// A mapping below the top one, created first in the same stack; its table holds no key.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LowerMapping {
    /// Mapping name (`<name>_dif` for LUKS2 integrity, as cryptsetup names it).
    pub name: String,
    /// Its dm table.
    pub table: String,
}

/// A mapping below the top one whose table holds a key (one layer of a TCRYPT cipher
/// chain, as cryptsetup stacks `<name>_1`, `<name>_2`): it travels like the top table, only
/// through the daemon's pipe, never in `info`.
pub struct KeyedLower {
    /// Mapping name.
    pub name: String,
    /// Its dm table, key included.
    pub table: Zeroizing<String>,
}

/// What activating one volume creates.
pub struct ActivationPlan {
    /// Name of the top mapping.
    pub name: String,
    /// Its dm table, keys included: only ever sent through a pipe.
    pub table: Zeroizing<String>,
    /// Keyless mappings the top one stacks on, in creation order.
    pub lower: Vec<LowerMapping>,
    /// Keyed mappings the top one stacks on, in creation order (after `lower`).
    pub keyed_lower: Vec<KeyedLower>,
    /// Facts for `status` (type, UUID, cipher, devices): never secrets.
    pub info: VolumeFacts,
}

/// Where a LUKS volume's header and data are.
pub struct LuksLocation<'a> {
    /// The data device.
    pub device: &'a Path,
    /// The header, as an absolute path (the device, or `--header`): `refresh --persistent`
    /// finds it from any working directory.
    pub header: &'a Path,
}

/// Refuses a data segment that starts inside the header or keyslot areas of the same device:
/// writes to the volume would destroy them. cryptsetup 2.6 refuses data offset 0 on the header's
/// device with this message (exit 1) whatever the mode, and other overlaps already as invalid
/// headers; any overlap that gets here is refused the same way.
fn check_data_after_header(vol: &Volume, seg: &Segment, at: &LuksLocation<'_>) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let id = |p: &Path| std::fs::metadata(p).map(|m| (m.dev(), m.ino()));
    let same_device = match (id(at.device), id(at.header)) {
        (Ok(d), Ok(h)) => d == h,
        _ => at.device == at.header,
    };
    if same_device && seg.offset < vol.metadata_size() {
        return Err(VolumeError::usage(
            "Reduced data offset is allowed only for detached LUKS header.",
        ));
    }
    Ok(())
}

/// The plan that activates unlocked LUKS volume `vol` (key `vk`) as `name` with `flags`.
pub fn luks(
    vol: &Volume,
    vk: &SecretBytes,
    at: LuksLocation<'_>,
    name: &str,
    flags: &Activation,
) -> Result<ActivationPlan> {
    let seg = vol.segment()?;
    check_data_after_header(vol, &seg, &at)?;
    if let (Some(_), Some(h)) = (&seg.integrity, vol.luks2()) {
        // As cryptsetup: discards cannot pass through dm-integrity (given or stored).
        if flags.crypt.allow_discards {
            return Err(VolumeError::usage("Discard/TRIM is not supported."));
        }
        let st = luks2_integrity::stack(
            h,
            vk,
            at.device,
            name,
            // `--integrity-no-journal`, or the persistent LUKS2 flag cryptsetup stores for it.
            flags.no_journal,
            &flags.crypt.table_flags(),
        )?;
        let l = &st.layout;
        let lower = LowerMapping {
            name: st.lower_name.clone(),
            table: st.lower_table.clone(),
        };
        let info = VolumeFacts {
            kind: vol.type_name().to_string(),
            uuid: Some(vol.uuid().to_string()),
            cipher: Some(seg.cipher.clone()),
            keysize: Some(format!("{} bits", l.encryption_key_size * 8)),
            integrity: Some(l.integrity.kind.to_string()),
            integrity_tag_size: Some(format!("{} bytes", l.tag_size)),
            // As cryptsetup's status: an integrity key size only for keyed MACs.
            integrity_keysize: (l.integrity_key_size > 0)
                .then(|| format!("{} bits", l.integrity_key_size * 8)),
            device: Some(at.device.display().to_string()),
            header: Some(at.header.display().to_string()),
            sector_size: Some(u64::from(seg.sector_size)),
            offset: Some("0 sectors".into()),
            lower: vec![lower.clone()],
            ..Default::default()
        };
        return Ok(ActivationPlan {
            name: name.to_string(),
            table: st.table.clone(),
            lower: vec![lower],
            keyed_lower: Vec::new(),
            info,
        });
    }
    let table = seg.crypt_table(vk, at.device, &flags.crypt.table_flags())?;
    Ok(ActivationPlan {
        name: name.to_string(),
        table,
        lower: Vec::new(),
        keyed_lower: Vec::new(),
        info: VolumeFacts {
            kind: vol.type_name().to_string(),
            uuid: Some(vol.uuid().to_string()),
            cipher: Some(seg.cipher.clone()),
            keysize: Some(format!("{} bits", vk.len() * 8)),
            device: Some(at.device.display().to_string()),
            header: Some(at.header.display().to_string()),
            sector_size: Some(u64::from(seg.sector_size)),
            offset: Some(format!("{} sectors", seg.offset / 512)),
            ..Default::default()
        },
    })
}

/// The plan that activates plain dm-crypt volume `pv` on `device` as `name`; `crypt_flags`
/// are the crypt table's activation options.
pub fn plain(
    pv: &PlainVolume,
    device: &Path,
    name: &str,
    crypt_flags: &[String],
) -> Result<ActivationPlan> {
    let seg = Segment {
        cipher: pv.cipher_spec.clone(),
        offset: pv.offset_sectors * 512,
        size: Some(pv.size_sectors * 512),
        iv_offset: pv.iv_offset_sectors,
        sector_size: pv.sector_size,
        integrity: None,
    };
    let table = seg.crypt_table(&pv.volume_key, device, crypt_flags)?;
    Ok(ActivationPlan {
        name: name.to_string(),
        table,
        lower: Vec::new(),
        keyed_lower: Vec::new(),
        info: VolumeFacts {
            kind: "PLAIN".into(),
            cipher: Some(seg.cipher.clone()),
            keysize: Some(format!("{} bits", pv.volume_key.len() * 8)),
            device: Some(device.display().to_string()),
            sector_size: Some(u64::from(seg.sector_size)),
            offset: Some(format!("{} sectors", pv.offset_sectors)),
            ..Default::default()
        },
    })
}
