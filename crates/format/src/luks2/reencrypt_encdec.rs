//! The LUKS2 metadata of encryption and decryption in place (`reencrypt --encrypt`,
//! `--decrypt`) and of a reencryption's steps in either direction, as cryptsetup 2.6.1
//! writes them (facts from its headers, cut at every write):
//!
//! - `--encrypt --reduce-device-size 2N`: data offset and shift `N`; the volume keeps
//!   `device - 2N` bytes. The first `N` bytes of the plain device are copied to the device
//!   end (`backup-moved-segment`, linear), then the header (with its whole keyslots area)
//!   is written over the start. Segments: the moved copy, the rest of the plaintext in
//!   place, then `backup-moved-segment`, `backup-previous` (linear, the plaintext's size)
//!   and `backup-final` (crypt at `N`, dynamic); `reencrypt` keyslot mode `encrypt`,
//!   direction `backward`, area `datashift` of 4096 bytes at the largest gap with
//!   `shift_size` `N`.
//! - `--encrypt --header FILE`: a new header in `FILE`; segments linear 0 (dynamic),
//!   `backup-previous` the same, `backup-final` crypt at 0; direction `forward`.
//! - `--decrypt --header FILE` (detached header): segment 0 stays, `backup-previous` its
//!   copy, `backup-final` linear at the same offset; direction `backward`.
//! - `--decrypt --header NEW_FILE` of a volume whose header is on the device (data offset
//!   `N`): the header area is exported to `NEW_FILE`, the device's LUKS magics wiped, the
//!   first `N` bytes of ciphertext copied to the device start. Segments: crypt 0 (`N`
//!   bytes at 0, the moved copy), crypt at `2N` (the rest, `dynamic`, iv_tweak advanced),
//!   `backup-moved-segment` (crypt, `N` at 0), `backup-previous` (the original segment),
//!   `backup-final` (linear at 0, dynamic); the old digest lists the four crypt ones.
//!   Keyslot mode `decrypt`, direction `forward`, area `datashift-checksum` (hash,
//!   sector_size, `shift_size` `N`; the whole largest gap) or `datashift-journal` (only
//!   when `N` fits the area); requirement `online-reencrypt-v3`.
//! - During the steps the data segments are listed in logical order (each at its physical
//!   offset), then `backup-previous`, `backup-final` and `backup-moved-segment`. A re-key
//!   assigns each digest the hotzone first, then its other data segments, then its backup;
//!   encryption and decryption (one key) the backup first, then the data segments in
//!   number order. A linear segment has no digest.
//! - Finished: one segment; a decryption's final header keeps no keyslot and no digest.

use super::json::{get_u64_str, u64_value};
use super::reencrypt::ReencryptMode;
use super::reencrypt_write::{NewResilience, REENCRYPT_REQUIREMENT, REENCRYPT_REQUIREMENT_V3};
use super::Luks2Header;
use crate::error::{FormatError, Result};
use serde_json::{json, Map, Value};

/// One data segment of a reencryption layout, in logical order (logical offsets count
/// from the first byte of the volume's data, whatever its physical place).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutPart {
    /// Under the final parameters (`backup-final`) when true, else the original ones
    /// (`backup-previous`, or the moved segment for the first `shift` bytes).
    pub new: bool,
    /// Logical start in bytes.
    pub start: u64,
    /// Length in bytes; `None` for `dynamic` (to the device end).
    pub len: Option<u64>,
    /// The `in-reencryption` hotzone.
    pub hotzone: bool,
}

/// What [`Luks2Header::begin_encrypt`] and [`Luks2Header::begin_decrypt`] record.
#[derive(Clone, Debug)]
pub struct EncDecInit {
    /// Hotzone protection (ignored with `shift`, which is datashift).
    pub resilience: NewResilience,
    /// Encryption with a data shift of this many bytes (`--reduce-device-size` / 2).
    pub shift: Option<u64>,
    /// Bytes of plaintext (encryption with a data shift: the device size less twice the
    /// shift).
    pub data_size: u64,
    /// Iterations of the reencryption digest (`None`: calibrated).
    pub digest_iterations: Option<u32>,
}

fn bad(msg: impl Into<String>) -> FormatError {
    FormatError::Corrupt(msg.into())
}

/// A data segment cut from `backup` (offset and iv_tweak moved by `rel` bytes).
fn piece(backup: &Value, rel: u64, len: Option<u64>, hotzone: bool) -> Result<Value> {
    let mut v = backup.clone();
    let base = get_u64_str(backup, "offset").ok_or_else(|| bad("bad backup segment offset"))?;
    let crypt = backup["type"] == "crypt";
    let tweak = get_u64_str(backup, "iv_tweak").unwrap_or(0);
    let o = v
        .as_object_mut()
        .ok_or_else(|| bad("segment is no object"))?;
    o.insert("offset".into(), u64_value(base + rel));
    o.insert(
        "size".into(),
        len.map_or_else(|| Value::String("dynamic".into()), u64_value),
    );
    if crypt {
        o.insert("iv_tweak".into(), u64_value(tweak + rel / 512));
    }
    o.shift_remove("flags");
    if hotzone {
        o.insert("flags".into(), json!(["in-reencryption"]));
    }
    Ok(v)
}

impl Luks2Header {
    /// Replaces the data segments of a reencryption in progress by `parts` (see the module
    /// docs for the order and the digests), in memory; the caller writes it. Old parts in
    /// the first `shift` bytes come from the moved segment.
    pub fn set_reencrypt_layout(&mut self, parts: &[LayoutPart]) -> Result<()> {
        let mode = self
            .reencrypt_keyslot()?
            .ok_or_else(|| bad("no reencrypt keyslot"))?
            .mode;
        let (prev_id, prev) = self
            .segment_json_by_flag("backup-previous")
            .ok_or_else(|| bad("no backup-previous segment"))?;
        let (fin_id, fin) = self
            .segment_json_by_flag("backup-final")
            .ok_or_else(|| bad("no backup-final segment"))?;
        let moved = self.segment_json_by_flag("backup-moved-segment");
        let old_digest = self.digests_of_segment(prev_id).into_iter().next();
        let new_digest = self.digests_of_segment(fin_id).into_iter().next();
        let moved_len = match &moved {
            Some((_, m)) => get_u64_str(m, "size").ok_or_else(|| bad("moved segment size"))?,
            None => 0,
        };
        let mut segments = Map::new();
        // (id, new side, hotzone, crypt)
        let mut placed: Vec<(String, bool, bool, bool)> = Vec::new();
        let mut add = |segments: &mut Map<String, Value>, v: Value, new: bool, hz: bool| {
            let id = segments.len().to_string();
            let crypt = v["type"] == "crypt";
            segments.insert(id.clone(), v);
            placed.push((id, new, hz, crypt));
        };
        for p in parts {
            if p.new {
                add(
                    &mut segments,
                    piece(&fin, p.start, p.len, p.hotzone)?,
                    true,
                    p.hotzone,
                );
                continue;
            }
            let mut start = p.start;
            if let Some((_, m)) = &moved {
                if start < moved_len {
                    let end = p.len.map(|l| p.start + l);
                    let cut = end.map_or(moved_len, |e| e.min(moved_len));
                    add(
                        &mut segments,
                        piece(m, start, Some(cut - start), p.hotzone)?,
                        false,
                        p.hotzone,
                    );
                    if end.is_some_and(|e| e <= moved_len) {
                        continue;
                    }
                    start = moved_len;
                }
            }
            let len = p.len.map(|l| p.start + l - start);
            add(
                &mut segments,
                piece(&prev, start, len, p.hotzone)?,
                false,
                p.hotzone,
            );
        }
        let prev_new = segments.len().to_string();
        segments.insert(prev_new.clone(), prev);
        let fin_new = segments.len().to_string();
        segments.insert(fin_new.clone(), fin);
        let moved_new = moved.map(|(_, m)| {
            let id = segments.len().to_string();
            let crypt = m["type"] == "crypt";
            segments.insert(id.clone(), m);
            (id, crypt)
        });
        let mut json = self.json.clone();
        json["segments"] = Value::Object(segments);
        for d in json["digests"]
            .as_object_mut()
            .into_iter()
            .flat_map(|m| m.values_mut())
        {
            if d["segments"].is_array() {
                d["segments"] = json!([]);
            }
        }
        let mut assign = |digest: &Option<String>, new_side: bool, backup: &str| {
            let Some(d) = digest else { return };
            let data = placed.iter().filter(|(_, n, hz, c)| {
                *c && (*n == new_side || (*hz && mode == ReencryptMode::Reencrypt))
            });
            let mut list: Vec<Value> = Vec::new();
            if mode == ReencryptMode::Reencrypt {
                list.extend(data.clone().filter(|x| x.2).map(|x| json!(x.0)));
                list.extend(data.filter(|x| !x.2).map(|x| json!(x.0)));
                list.push(json!(backup));
            } else {
                list.push(json!(backup));
                list.extend(data.map(|x| json!(x.0)));
                if !new_side {
                    if let Some((id, true)) = &moved_new {
                        list.push(json!(id));
                    }
                }
            }
            json["digests"][d]["segments"] = Value::Array(list);
        };
        assign(&old_digest, false, &prev_new);
        assign(&new_digest, true, &fin_new);
        super::validate::validate(&json, self.hdr_size - super::binary::BIN_HDR_LEN as u64)?;
        self.json = json;
        Ok(())
    }

    /// Adds the `reencrypt` keyslot (`mode`, `direction`, resilience `area` at the
    /// largest free gap of the keyslots area, 4096 bytes for datashift), the requirement
    /// and the reencryption digest over `old`/`new` (in memory). Returns the keyslot.
    fn add_reencrypt_keyslot(
        &mut self,
        mode: &str,
        direction: &str,
        p: &EncDecInit,
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<usize> {
        let slot = (0..super::LUKS2_OBJECTS_MAX)
            .find(|s| self.json["keyslots"].get(s.to_string()).is_none())
            .ok_or(FormatError::KeyslotsFull)?;
        let (area_off, area_len) = self.largest_area_gap().ok_or(FormatError::KeyslotsFull)?;
        // A decryption that moves the data back to the device start protects its first,
        // in-place hotzone (the moved segment) with checksums or a journal: cryptsetup
        // 2.6's `datashift-checksum` / `datashift-journal` (requirement v3).
        let moving_decrypt = p.shift.is_some() && mode == "decrypt";
        let mut area = json!({
            "offset": u64_value(area_off),
            "size": u64_value(if p.shift.is_some() && !moving_decrypt {
                4096.min(area_len)
            } else {
                area_len
            }),
        });
        match (p.shift, p.resilience) {
            (Some(shift), NewResilience::Checksum { hash, block }) if moving_decrypt => {
                area["type"] = json!("datashift-checksum");
                area["hash"] = json!(hash.name());
                area["sector_size"] = json!(block);
                area["shift_size"] = u64_value(shift);
            }
            (Some(shift), NewResilience::Journal) if moving_decrypt => {
                if shift > area_len {
                    return Err(FormatError::InvalidParameter(format!(
                        "Moved segment too large. Requested size {shift}, available space \
                         for: {area_len}."
                    )));
                }
                area["type"] = json!("datashift-journal");
                area["shift_size"] = u64_value(shift);
            }
            (Some(_), NewResilience::None) if moving_decrypt => {
                return Err(FormatError::InvalidParameter(
                    "Requested --resilience option cannot be applied to current \
                     reencryption operation."
                        .into(),
                ));
            }
            (shift, r) => super::reencrypt_write::set_area_resilience(&mut area, shift, r),
        }
        self.json["keyslots"][slot.to_string()] = json!({
            "area": area,
            "type": "reencrypt",
            "key_size": 1,
            "mode": mode,
            "direction": direction,
            "priority": 0,
        });
        let reqs = &mut self.json["config"]["requirements"]["mandatory"];
        if !reqs.is_array() {
            *reqs = json!([]);
        }
        if let Some(a) = reqs.as_array_mut() {
            a.push(json!(if moving_decrypt {
                REENCRYPT_REQUIREMENT_V3
            } else {
                REENCRYPT_REQUIREMENT
            }));
        }
        self.add_reencrypt_digest(old, new, p.digest_iterations, slot)?;
        Ok(slot)
    }

    /// Turns a freshly formatted header (one crypt segment under `new_key`, its digest and
    /// keyslot) into the start of `reencrypt --encrypt` (in memory; see the module docs):
    /// with `p.shift` the datashift layout over a device of `device_size` bytes, else a
    /// detached header's forward layout. Returns the `reencrypt` keyslot.
    pub fn begin_encrypt(
        &mut self,
        p: &EncDecInit,
        device_size: u64,
        new_key: &[u8],
    ) -> Result<usize> {
        let seg = self.default_segment()?;
        let digest = self
            .digests_of_segment(seg.id)
            .into_iter()
            .next()
            .ok_or_else(|| bad("no digest for the data segment"))?;
        if !self.digest_matches(&digest, new_key)? {
            return Err(FormatError::VolumeKeyMismatch);
        }
        let fin = {
            let mut f = self.json["segments"][seg.id.to_string()].clone();
            f["flags"] = json!(["backup-final"]);
            f
        };
        let linear = |offset: u64, size: Option<u64>, flag: Option<&str>| {
            let mut v = json!({
                "type": "linear",
                "offset": u64_value(offset),
                "size": size.map_or_else(|| Value::String("dynamic".into()), u64_value),
            });
            if let Some(f) = flag {
                v["flags"] = json!([f]);
            }
            v
        };
        let saved = self.json.clone();
        let mut segments = Map::new();
        let direction = match p.shift {
            Some(shift) => {
                if seg.offset != shift
                    || p.data_size <= shift
                    || shift + p.data_size + shift > device_size
                {
                    return Err(FormatError::InvalidParameter(
                        "the data shift does not fit the device".into(),
                    ));
                }
                let moved_at = shift + p.data_size;
                segments.insert("0".into(), linear(moved_at, Some(shift), None));
                segments.insert("1".into(), linear(shift, Some(p.data_size - shift), None));
                segments.insert(
                    "2".into(),
                    linear(moved_at, Some(shift), Some("backup-moved-segment")),
                );
                segments.insert(
                    "3".into(),
                    linear(0, Some(p.data_size), Some("backup-previous")),
                );
                segments.insert("4".into(), fin);
                "backward"
            }
            None => {
                segments.insert("0".into(), linear(seg.offset, None, None));
                segments.insert(
                    "1".into(),
                    linear(seg.offset, None, Some("backup-previous")),
                );
                segments.insert("2".into(), fin);
                "forward"
            }
        };
        let fin_id = (segments.len() - 1).to_string();
        self.json["segments"] = Value::Object(segments);
        self.json["digests"][&digest]["segments"] = json!([fin_id]);
        match self.add_reencrypt_keyslot("encrypt", direction, p, None, Some(new_key)) {
            Ok(s) => Ok(s),
            Err(e) => {
                self.json = saved;
                Err(e)
            }
        }
    }

    /// Turns a header with one crypt segment under `old_key` into the start of
    /// `reencrypt --decrypt` with a detached header (in memory; see the module docs).
    /// Returns the `reencrypt` keyslot.
    pub fn begin_decrypt(&mut self, p: &EncDecInit, old_key: &[u8]) -> Result<usize> {
        self.check_requirements()?;
        let segs = self.segments();
        let [seg] = segs.as_slice() else {
            return Err(FormatError::Unsupported(
                "decryption of a volume with more than one segment".into(),
            ));
        };
        if seg.kind != "crypt" || !seg.flags.is_empty() {
            return Err(FormatError::Unsupported(
                "decryption of a segment that is not a plain crypt segment".into(),
            ));
        }
        let cur = self.json["segments"][seg.id.to_string()].clone();
        if !cur["integrity"].is_null() {
            return Err(FormatError::Unsupported(
                "Reencryption of device with integrity profile is not supported.".into(),
            ));
        }
        let digest = self
            .digests_of_segment(seg.id)
            .into_iter()
            .next()
            .ok_or_else(|| bad("no digest for the data segment"))?;
        if !self.digest_matches(&digest, old_key)? {
            return Err(FormatError::VolumeKeyMismatch);
        }
        let mut prev = cur.clone();
        prev["flags"] = json!(["backup-previous"]);
        let saved = self.json.clone();
        let mut segments = Map::new();
        let direction = match p.shift {
            // The header moves off the device: the first `shift` bytes of ciphertext were
            // copied to the device start (the moved segment, where the data starts once
            // decrypted); the rest follows in place; the plaintext will start at 0.
            Some(shift) => {
                if seg.offset != shift || p.data_size == 0 {
                    return Err(FormatError::InvalidParameter(
                        "the data shift does not fit the device".into(),
                    ));
                }
                // Data no longer than the shift moves whole: then, as cryptsetup writes
                // it, the moved segment is all there is (no segment after it).
                let moved_len = shift.min(p.data_size);
                let moved = piece(&cur, 0, Some(moved_len), false).map(|mut m| {
                    m["offset"] = u64_value(0);
                    m
                })?;
                segments.insert("0".into(), moved.clone());
                if p.data_size > shift {
                    let rest_len = get_u64_str(&cur, "size").map(|n| n - shift);
                    segments.insert("1".into(), piece(&cur, shift, rest_len, false)?);
                }
                let mut flagged = moved;
                flagged["flags"] = json!(["backup-moved-segment"]);
                let n = segments.len();
                segments.insert(n.to_string(), flagged);
                segments.insert((n + 1).to_string(), prev);
                segments.insert(
                    (n + 2).to_string(),
                    json!({
                        "type": "linear",
                        "offset": "0",
                        "size": "dynamic",
                        "flags": ["backup-final"],
                    }),
                );
                "forward"
            }
            None => {
                segments.insert("0".into(), cur.clone());
                segments.insert("1".into(), prev);
                segments.insert(
                    "2".into(),
                    json!({
                        "type": "linear",
                        "offset": cur["offset"].clone(),
                        "size": "dynamic",
                        "flags": ["backup-final"],
                    }),
                );
                "backward"
            }
        };
        let crypt_ids: Vec<String> = (0..segments.len() - 1).map(|i| i.to_string()).collect();
        self.json["segments"] = Value::Object(segments);
        self.json["digests"][&digest]["segments"] = json!(crypt_ids);
        match self.add_reencrypt_keyslot("decrypt", direction, p, Some(old_key), None) {
            Ok(s) => Ok(s),
            Err(e) => {
                self.json = saved;
                Err(e)
            }
        }
    }

    /// The moved segment of a datashift reencryption: `(offset, length)` on the data
    /// device.
    pub fn moved_segment(&self) -> Option<(u64, u64)> {
        let (_, m) = self.segment_json_by_flag("backup-moved-segment")?;
        Some((get_u64_str(&m, "offset")?, get_u64_str(&m, "size")?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn piece_moves_offset_and_tweak_and_flags() {
        let b = json!({"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0",
            "encryption":"aes-xts-plain64","sector_size":512,"flags":["backup-final"]});
        let v = piece(&b, 16 << 20, Some(16 << 20), true).unwrap();
        assert_eq!(v["offset"], "33554432");
        assert_eq!(v["iv_tweak"], "32768");
        assert_eq!(v["size"], "16777216");
        assert_eq!(v["flags"], json!(["in-reencryption"]));
        let l = json!({"type":"linear","offset":"0","size":"dynamic","flags":["backup-final"]});
        let v = piece(&l, 4096, None, false).unwrap();
        assert_eq!(v, json!({"type":"linear","offset":"4096","size":"dynamic"}));
    }
}
