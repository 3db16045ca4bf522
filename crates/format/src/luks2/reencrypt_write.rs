//! Writing the metadata of a LUKS2 re-key (`reencrypt` mode, forward) as cryptsetup 2.6
//! writes it, so that either tool can take over a reencryption the other began:
//!
//! - [`Luks2Header::begin_reencrypt`]: the `reencrypt` keyslot in the largest free gap of
//!   the keyslots area, the segment list `0` (the current data) + `backup-previous` +
//!   `backup-final`, the requirement `online-reencrypt-v2`, and the reencryption digest;
//! - [`Luks2Header::set_reencrypt_layout`] (in `reencrypt_encdec`): the segments of a step
//!   in progress or finished, for every mode and direction;
//! - [`Luks2Header::finish_reencryption`]: the final header (one new segment, the old
//!   key's keyslots, the `reencrypt` keyslot, the backups and the requirement gone).
//!
//! The reencryption digest binds the `reencrypt` keyslot and the backup segments to both
//! volume keys, so a header edited behind the tools' back is refused. Its input (facts from
//! the LUKS2 format as cryptsetup 2.6 implements it, checked against headers it wrote): the
//! byte `'v'`, the byte `'0' + version` (2), the old key, the new key (when its digest
//! differs), then the `reencrypt` keyslot's mode, direction, area type, area offset and
//! size (and hash and checksum block size for checksum areas, shift size for datashift
//! areas), then the `backup-previous`, `backup-final` (and `backup-moved-segment`)
//! segments: type, offset, size (or the text `dynamic`), and for crypt segments iv_tweak,
//! encryption and sector_size. Texts are their bytes, numbers stored as strings are 8-byte
//! big-endian, JSON integers 4-byte big-endian. It is stored as a pbkdf2 digest assigned
//! to the `reencrypt` keyslot and to no segment.

use super::json::{get_u32, get_u64_str, numeric_keys, u64_value};
use super::keyslot::new_digest_iterations;
use super::{KeyslotParams, Luks2Header};
use crate::error::{FormatError, Result};
use crate::hdrio::HeaderIo;
use crate::kdf::{PbkdfKind, PbkdfRequest};
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;
use serde_json::{json, Map, Value};

/// The requirement cryptsetup 2.6 writes while a reencryption is unfinished.
pub const REENCRYPT_REQUIREMENT: &str = "online-reencrypt-v2";
/// The reencryption metadata version that requirement names.
const REENCRYPT_VERSION: u8 = 2;
/// The requirement of a decryption that moves the data to the device start
/// (`datashift-checksum`/`-journal` resilience), which older cryptsetup cannot resume.
pub const REENCRYPT_REQUIREMENT_V3: &str = "online-reencrypt-v3";
/// cryptsetup's cap on the keyslots area (`LUKS2_MAX_KEYSLOTS_SIZE`).
const MAX_KEYSLOTS_SIZE: u64 = 128 << 20;

/// How a new reencryption protects its hotzone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NewResilience {
    /// Nothing: a crash inside a step loses that step's data.
    None,
    /// A hash of the old ciphertext per `block` bytes in the keyslot area.
    Checksum {
        /// The hash (`--resilience-hash`).
        hash: HashAlgorithm,
        /// Bytes per hashed block: the largest of the device block size and both sector
        /// sizes.
        block: u32,
    },
    /// A copy of the hotzone's old ciphertext in the keyslot area.
    Journal,
}

/// What [`Luks2Header::begin_reencrypt`] records.
#[derive(Clone, Debug)]
pub struct ReencryptInit {
    /// The new segment's cipher (`aes-xts-plain64`).
    pub cipher: String,
    /// The new segment's encryption sector size.
    pub sector_size: u32,
    /// The hotzone protection.
    pub resilience: NewResilience,
    /// Id of the digest of the new volume key (made with its first keyslot).
    pub new_digest: String,
    /// Iterations of the reencryption digest (`None`: calibrated to 125 ms).
    pub digest_iterations: Option<u32>,
    /// `--reduce-device-size` in bytes: the new data starts this much later and the run
    /// goes backward with `datashift` resilience (whatever `resilience` says, as cryptsetup
    /// 2.6 does), dropping the old data's last `shift` bytes.
    pub shift: Option<u64>,
}

/// Sets the reencrypt keyslot area's resilience fields for a re-key or an encryption or
/// decryption that does not move data back (`datashift` when the data moves by `shift`
/// bytes, else the hotzone protection asked for), as cryptsetup writes them.
pub(super) fn set_area_resilience(area: &mut Value, shift: Option<u64>, r: NewResilience) {
    match (shift, r) {
        (Some(shift), _) => {
            area["type"] = json!("datashift");
            area["shift_size"] = u64_value(shift);
        }
        (None, NewResilience::None) => area["type"] = json!("none"),
        (None, NewResilience::Journal) => area["type"] = json!("journal"),
        (None, NewResilience::Checksum { hash, block }) => {
            area["type"] = json!("checksum");
            area["hash"] = json!(hash.name());
            area["sector_size"] = json!(block);
        }
    }
}

fn bad(msg: impl Into<String>) -> FormatError {
    FormatError::Corrupt(msg.into())
}

/// Appends the verification-data encoding of `obj[key]` (see the module docs).
fn ser(out: &mut Vec<u8>, obj: &Value, key: &str, kind: char) -> Result<()> {
    let v = obj
        .get(key)
        .ok_or_else(|| bad(format!("reencryption metadata lacks '{key}'")))?;
    match (kind, v) {
        ('s', Value::String(s)) if s.len() <= 64 => out.extend_from_slice(s.as_bytes()),
        ('u', Value::String(_)) => {
            let n = get_u64_str(obj, key).ok_or_else(|| bad(format!("bad number '{key}'")))?;
            out.extend_from_slice(&n.to_be_bytes());
        }
        ('x', Value::String(s)) if s == "dynamic" => out.extend_from_slice(b"dynamic"),
        ('x', Value::String(_)) => {
            let n = get_u64_str(obj, key).ok_or_else(|| bad(format!("bad size '{key}'")))?;
            out.extend_from_slice(&n.to_be_bytes());
        }
        ('i', Value::Number(_)) => {
            let n = get_u32(obj, key).ok_or_else(|| bad(format!("bad integer '{key}'")))?;
            out.extend_from_slice(&n.to_be_bytes());
        }
        _ => {
            return Err(bad(format!(
                "reencryption metadata field '{key}' is malformed"
            )))
        }
    }
    Ok(())
}

pub(super) fn ser_segment(out: &mut Vec<u8>, seg: &Value) -> Result<()> {
    match seg["type"].as_str() {
        Some("crypt") => {
            for (k, t) in [
                ("type", 's'),
                ("offset", 'u'),
                ("size", 'x'),
                ("iv_tweak", 'u'),
                ("encryption", 's'),
                ("sector_size", 'i'),
            ] {
                ser(out, seg, k, t)?;
            }
        }
        Some("linear") => {
            for (k, t) in [("type", 's'), ("offset", 'u'), ("size", 'x')] {
                ser(out, seg, k, t)?;
            }
        }
        _ => return Err(bad("reencryption backup segment of unknown type")),
    }
    Ok(())
}

/// A crypt segment object with cryptsetup's key order.
pub(super) fn crypt_segment(
    offset: u64,
    size: Option<u64>,
    iv_tweak: u64,
    cipher: &str,
    sector: u32,
    flag: Option<&str>,
) -> Value {
    let mut v = json!({
        "type": "crypt",
        "offset": u64_value(offset),
        "size": size.map_or_else(|| Value::String("dynamic".into()), u64_value),
        "iv_tweak": u64_value(iv_tweak),
        "encryption": cipher,
        "sector_size": sector,
    });
    if let Some(f) = flag {
        v["flags"] = json!([f]);
    }
    v
}

impl Luks2Header {
    /// The largest free gap of the keyslots area (the first of equal ones), as cryptsetup
    /// picks the `reencrypt` keyslot's area: `(offset, length)`.
    pub fn largest_area_gap(&self) -> Option<(u64, u64)> {
        let start = 2 * self.hdr_size;
        let end = start + self.keyslots_size();
        let mut used: Vec<(u64, u64)> = self
            .keyslots()
            .iter()
            .filter_map(|k| self.keyslot_area(k.id))
            .collect();
        used.sort();
        used.push((end, 1));
        let mut pos = start;
        let mut best: Option<(u64, u64)> = None;
        for (off, len) in used {
            if pos < off && best.is_none_or(|(_, l)| off - pos > l) {
                best = Some((pos, off - pos));
            }
            pos = off + len;
        }
        best
    }

    /// The KDF of keyslot `slot` as a request that reproduces it without benchmarking
    /// (cryptsetup's new keyslots of a re-key take the old keyslot's KDF this way).
    pub fn keyslot_pbkdf_request(&self, slot: usize) -> Option<PbkdfRequest> {
        let kdf = self.json["keyslots"].get(slot.to_string())?.get("kdf")?;
        let kind = PbkdfKind::from_name(kdf["type"].as_str()?).ok()?;
        let mut r = match kind {
            PbkdfKind::Pbkdf2 => {
                let hash = HashAlgorithm::from_name(kdf["hash"].as_str()?).ok()?;
                PbkdfRequest::pbkdf2(hash).with_forced_iterations(get_u32(kdf, "iterations")?)
            }
            _ => {
                let mut r = PbkdfRequest::argon2id();
                r.kind = kind;
                r.force_iterations = Some(get_u32(kdf, "time")?);
                r.max_memory_kib = get_u32(kdf, "memory")?;
                r.parallel = get_u32(kdf, "cpus")?;
                r
            }
        };
        if let Some(h) = self.json["keyslots"][slot.to_string()]["af"]["hash"].as_str() {
            if kind != PbkdfKind::Pbkdf2 {
                r.hash = HashAlgorithm::from_name(h).ok()?;
            }
        }
        Some(r)
    }

    /// The keyslot parameters cryptsetup gives the new keyslot that replaces `slot` in a
    /// re-key: the old keyslot's area cipher and AF hash, `pbkdf` when the caller chose one,
    /// else the old keyslot's KDF unchanged.
    pub fn rekey_keyslot_params(
        &self,
        slot: usize,
        pbkdf: Option<PbkdfRequest>,
    ) -> Result<KeyslotParams> {
        let ks = self.json["keyslots"]
            .get(slot.to_string())
            .ok_or_else(|| FormatError::NoKeyslot(format!(" (keyslot {slot} is not in use)")))?;
        let req = match pbkdf {
            Some(p) => p,
            None => self
                .keyslot_pbkdf_request(slot)
                .ok_or_else(|| bad(format!("keyslot {slot}: unreadable KDF")))?,
        };
        let mut p = KeyslotParams::new(req);
        if let Some(h) = ks["af"]["hash"].as_str() {
            p.af_hash = HashAlgorithm::from_name(h)?;
        }
        match ks["area"]["encryption"].as_str() {
            // cryptsetup replaces a cipher_null keyslot cipher by its default.
            Some(c) if !c.starts_with("cipher_null") => {
                p.cipher = Some(c.to_string());
                p.cipher_key_size = ks["area"]["key_size"].as_u64().map(|n| n as usize);
            }
            _ => {
                p.cipher = Some("aes-xts-plain64".into());
                p.cipher_key_size = Some(64);
            }
        }
        Ok(p)
    }

    /// Adds a keyslot for a new volume key `key` under `passphrase` with a new digest
    /// assigned to no segment (the first keyslot of a re-key's new key). Writes the header.
    /// Returns the keyslot and the digest id.
    pub fn add_keyslot_new_key(
        &mut self,
        io: &dyn HeaderIo,
        key: &SecretBytes,
        passphrase: &[u8],
        params: &KeyslotParams,
        digest_iterations: Option<u32>,
    ) -> Result<(usize, String)> {
        let id = self.free_digest_id();
        let d = new_digest_iterations(
            key.as_bytes(),
            params.pbkdf.hash,
            digest_iterations,
            &[],
            &[],
        )?;
        let old = self.json.clone();
        self.json["digests"][&id] = d;
        match self.add_keyslot_for_digest(io, key.as_bytes(), passphrase, params, &id) {
            Ok(slot) => Ok((slot, id)),
            Err(e) => {
                self.json = old;
                Err(e)
            }
        }
    }

    /// Adds a keyslot holding `key` (already verified by digest `digest`) under
    /// `passphrase`. Writes the header. Returns the keyslot.
    pub fn add_keyslot_to_digest(
        &mut self,
        io: &dyn HeaderIo,
        key: &SecretBytes,
        passphrase: &[u8],
        params: &KeyslotParams,
        digest: &str,
    ) -> Result<usize> {
        if !self.digest_matches(digest, key.as_bytes())? {
            return Err(FormatError::VolumeKeyMismatch);
        }
        self.add_keyslot_for_digest(io, key.as_bytes(), passphrase, params, digest)
    }

    pub(super) fn free_digest_id(&self) -> String {
        let d = self.json["digests"].as_object();
        (0..)
            .map(|i: u32| i.to_string())
            .find(|i| d.is_none_or(|m| !m.contains_key(i)))
            .unwrap_or_default()
    }

    pub(super) fn segment_json_by_flag(&self, flag: &str) -> Option<(u32, Value)> {
        let segs = self.json["segments"].as_object()?;
        numeric_keys(segs).into_iter().find_map(|(id, k)| {
            let s = &segs[k.as_str()];
            let has = s["flags"]
                .as_array()
                .is_some_and(|a| a.iter().any(|f| f.as_str() == Some(flag)));
            has.then(|| (id as u32, s.clone()))
        })
    }

    pub(super) fn reencrypt_keyslot_json(&self) -> Option<(usize, &Value)> {
        let ks = self.json["keyslots"].as_object()?;
        numeric_keys(ks).into_iter().find_map(|(id, k)| {
            let v = &ks[k.as_str()];
            (v["type"] == "reencrypt").then_some((id as usize, v))
        })
    }

    /// Adds the reencryption digest (of the verification data for `old`/`new`, assigned to
    /// the reencrypt keyslot `slot`) and checks the whole metadata: the last step of every
    /// reencryption metadata written (re-key, encryption, decryption).
    pub(super) fn add_reencrypt_digest(
        &mut self,
        old: Option<&[u8]>,
        new: Option<&[u8]>,
        digest_iterations: Option<u32>,
        slot: usize,
    ) -> Result<()> {
        let data = self.reencrypt_verification_data(old, new)?;
        let id = self.free_digest_id();
        let d = new_digest_iterations(
            data.as_bytes(),
            HashAlgorithm::Sha256,
            digest_iterations,
            &[slot],
            &[],
        )?;
        self.json["digests"][&id] = d;
        super::validate::validate(
            &self.json,
            self.hdr_size - super::binary::BIN_HDR_LEN as u64,
        )
    }

    /// The reencryption verification data for the keys (see the module docs).
    pub(super) fn reencrypt_verification_data(
        &self,
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<SecretBytes> {
        let (_, ks) = self
            .reencrypt_keyslot_json()
            .ok_or_else(|| bad("no reencrypt keyslot"))?;
        let (prev_id, prev) = self
            .segment_json_by_flag("backup-previous")
            .ok_or_else(|| bad("no backup-previous segment"))?;
        let (fin_id, fin) = self
            .segment_json_by_flag("backup-final")
            .ok_or_else(|| bad("no backup-final segment"))?;
        let d_old = self.digests_of_segment(prev_id).into_iter().next();
        let d_new = self.digests_of_segment(fin_id).into_iter().next();
        // The version byte is the requirement's (`online-reencrypt-vN`).
        let version = self
            .reencrypt_requirement_version()
            .unwrap_or(REENCRYPT_VERSION);
        let mut out = vec![b'v', b'0' + version];
        if d_old.is_some() {
            out.extend_from_slice(old.ok_or_else(|| bad("the old volume key is needed"))?);
        }
        if d_new.is_some() && d_new != d_old {
            out.extend_from_slice(new.ok_or_else(|| bad("the new volume key is needed"))?);
        }
        let area = &ks["area"];
        ser(&mut out, ks, "mode", 's')?;
        ser(&mut out, ks, "direction", 's')?;
        ser(&mut out, area, "type", 's')?;
        ser(&mut out, area, "offset", 'u')?;
        ser(&mut out, area, "size", 'u')?;
        match area["type"].as_str() {
            Some("checksum") => {
                ser(&mut out, area, "hash", 's')?;
                ser(&mut out, area, "sector_size", 'i')?;
            }
            Some("datashift-checksum") => {
                ser(&mut out, area, "hash", 's')?;
                ser(&mut out, area, "sector_size", 'i')?;
                ser(&mut out, area, "shift_size", 'u')?;
            }
            Some("datashift") | Some("datashift-journal") => {
                ser(&mut out, area, "shift_size", 'u')?;
            }
            _ => {}
        }
        ser_segment(&mut out, &prev)?;
        ser_segment(&mut out, &fin)?;
        if let Some((_, moved)) = self.segment_json_by_flag("backup-moved-segment") {
            ser_segment(&mut out, &moved)?;
        }
        Ok(SecretBytes::from_vec(out))
    }

    /// True when the reencryption metadata is unprotected: the unversioned
    /// `online-reencrypt` requirement of cryptsetup 2.2, or no digest on the reencrypt
    /// keyslot. cryptsetup refuses to run such a reencryption until `repair` has checked the
    /// keys and added the digest ([`Luks2Header::upgrade_reencrypt_metadata`]).
    pub fn reencrypt_metadata_unprotected(&self) -> bool {
        if !self.reencryption_in_progress() {
            return false;
        }
        let Some((slot, _)) = self.reencrypt_keyslot_json() else {
            return false;
        };
        self.reencrypt_requirement_version().is_none_or(|v| v < 2)
            || self.digest_of_slot(slot).is_none()
    }

    /// `repair` of unprotected reencryption metadata (see
    /// [`Luks2Header::reencrypt_metadata_unprotected`]), in memory: the keys `old`/`new` must
    /// match the backup segments' digests; the requirement becomes `online-reencrypt-v2`
    /// (`-v3` for a decryption that moved its first segment, as cryptsetup picks it) and the
    /// reencrypt keyslot gets a fresh digest over the metadata. The caller writes it.
    pub fn upgrade_reencrypt_metadata(
        &mut self,
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<()> {
        let (slot, ks) = self
            .reencrypt_keyslot_json()
            .ok_or_else(|| bad("no reencrypt keyslot"))?;
        let decrypt_datashift = ks["mode"] == "decrypt"
            && ks["area"]["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("datashift-"))
            && self.segment_json_by_flag("backup-moved-segment").is_some();
        for (flag, key) in [("backup-previous", old), ("backup-final", new)] {
            let (id, _) = self
                .segment_json_by_flag(flag)
                .ok_or_else(|| bad("no backup segment"))?;
            if let (Some(d), Some(k)) = (self.digests_of_segment(id).into_iter().next(), key) {
                if !self.digest_matches(&d, k)? {
                    return Err(FormatError::VolumeKeyMismatch);
                }
            }
        }
        let requirement = if decrypt_datashift {
            REENCRYPT_REQUIREMENT_V3
        } else {
            REENCRYPT_REQUIREMENT
        };
        let mandatory: Vec<Value> = self
            .requirements()
            .into_iter()
            .filter(|r| !super::validate::is_online_reencrypt_requirement(r))
            .map(Value::from)
            .chain(std::iter::once(Value::from(requirement)))
            .collect();
        self.json["config"]["requirements"]["mandatory"] = Value::Array(mandatory);
        // A stale digest of the keyslot goes: the new one covers the metadata as it is now.
        let name = slot.to_string();
        if let Some(digests) = self.json["digests"].as_object_mut() {
            digests.retain(|_, d| !super::json::array_has(d.get("keyslots"), &name));
        }
        self.add_reencrypt_digest(old, new, None, slot)
    }

    /// Checks the reencryption digest against the keys (cryptsetup's "Reencryption
    /// metadata is invalid." when it does not match or is missing).
    pub fn verify_reencrypt_digest(&self, old: Option<&[u8]>, new: Option<&[u8]>) -> Result<()> {
        let invalid = || FormatError::Corrupt("Reencryption metadata is invalid.".into());
        let (slot, _) = self.reencrypt_keyslot_json().ok_or_else(invalid)?;
        let digest = self.digest_of_slot(slot).ok_or_else(invalid)?;
        let data = self
            .reencrypt_verification_data(old, new)
            .map_err(|_| invalid())?;
        if self.digest_matches(&digest, data.as_bytes())? {
            Ok(())
        } else {
            Err(invalid())
        }
    }

    /// Turns a header with one crypt segment under the old key into the start of a forward
    /// re-key (in memory; the caller writes it): see the module docs. `new_digest` must
    /// already hold a keyslot of `new_key`. Returns the `reencrypt` keyslot number.
    pub fn begin_reencrypt(
        &mut self,
        p: &ReencryptInit,
        old_key: &[u8],
        new_key: &[u8],
    ) -> Result<usize> {
        self.check_requirements()?;
        let segs = self.segments();
        let [seg] = segs.as_slice() else {
            return Err(FormatError::Unsupported(
                "reencryption of a volume with more than one segment".into(),
            ));
        };
        if seg.kind != "crypt" || !seg.flags.is_empty() {
            return Err(FormatError::Unsupported(
                "reencryption of a segment that is not a plain crypt segment".into(),
            ));
        }
        if !self.json["segments"][seg.id.to_string()]["integrity"].is_null() {
            return Err(FormatError::Unsupported(
                "Reencryption of device with integrity profile is not supported.".into(),
            ));
        }
        let old_digest = self
            .digests_of_segment(seg.id)
            .into_iter()
            .next()
            .ok_or_else(|| bad("no digest for the data segment"))?;
        if !self.digest_matches(&old_digest, old_key)?
            || !self.digest_matches(&p.new_digest, new_key)?
        {
            return Err(FormatError::VolumeKeyMismatch);
        }
        let slot = (0..super::LUKS2_OBJECTS_MAX)
            .find(|s| self.json["keyslots"].get(s.to_string()).is_none())
            .ok_or(FormatError::KeyslotsFull)?;
        let (area_off, area_len) = self.largest_area_gap().ok_or(FormatError::KeyslotsFull)?;
        let mut area = json!({
            "offset": u64_value(area_off),
            "size": u64_value(if p.shift.is_some() { 4096.min(area_len) } else { area_len }),
        });
        set_area_resilience(&mut area, p.shift, p.resilience);
        // A shifted re-key writes each chunk above where it read it: going backward, no
        // chunk is overwritten before it is read.
        let direction = if p.shift.is_some() {
            "backward"
        } else {
            "forward"
        };
        let keyslot = json!({
            "area": area,
            "type": "reencrypt",
            "key_size": 1,
            "mode": "reencrypt",
            "direction": direction,
            "priority": 0,
        });
        let cur = self.json["segments"][seg.id.to_string()].clone();
        let mut prev = cur.clone();
        prev["flags"] = json!(["backup-previous"]);
        let fin = crypt_segment(
            seg.offset + p.shift.unwrap_or(0),
            None,
            seg.iv_tweak,
            &p.cipher,
            p.sector_size,
            Some("backup-final"),
        );
        let mut json = self.json.clone();
        let mut segments = Map::new();
        segments.insert("0".into(), cur);
        segments.insert("1".into(), prev);
        segments.insert("2".into(), fin);
        json["segments"] = Value::Object(segments);
        json["digests"][&old_digest]["segments"] = json!(["0", "1"]);
        json["digests"][&p.new_digest]["segments"] = json!(["2"]);
        json["keyslots"][slot.to_string()] = keyslot;
        let reqs = &mut json["config"]["requirements"]["mandatory"];
        if !reqs.is_array() {
            *reqs = json!([]);
        }
        if let Some(a) = reqs.as_array_mut() {
            a.push(json!(REENCRYPT_REQUIREMENT));
        }
        let saved = std::mem::replace(&mut self.json, json);
        let result =
            self.add_reencrypt_digest(Some(old_key), Some(new_key), p.digest_iterations, slot);
        if let Err(e) = result {
            self.json = saved;
            return Err(e);
        }
        Ok(slot)
    }

    /// The header of a finished re-key, in memory (the caller writes it, then wipes the
    /// returned keyslot areas): one segment with the new parameters over the whole data,
    /// the keyslots of the old key and the `reencrypt` keyslot removed with their digests,
    /// the backup segments and the requirement gone, and the keyslots area grown up to the
    /// data offset as cryptsetup does. cryptsetup reaches this in several header writes;
    /// one write here means no header ever names only new data while the requirement is
    /// still set (cryptsetup 2.6.1 resumes such a header by reencrypting again). Returns the
    /// `(offset, length)` areas of the removed keyslots.
    pub fn finish_reencryption(&mut self) -> Result<Vec<(u64, u64)>> {
        let (fin_id, fin) = self
            .segment_json_by_flag("backup-final")
            .ok_or_else(|| bad("no backup-final segment"))?;
        // A decryption's final segment is linear: no key, no digest.
        let new_digest = self.digests_of_segment(fin_id).into_iter().next();
        if new_digest.is_none() && fin["type"] == "crypt" {
            return Err(bad("backup-final has no digest"));
        }
        let old_digest = self
            .segment_json_by_flag("backup-previous")
            .and_then(|(id, _)| self.digests_of_segment(id).into_iter().next());
        let mut seg = fin.clone();
        if let Some(o) = seg.as_object_mut() {
            o.remove("flags");
            o.insert("size".into(), Value::String("dynamic".into()));
        }
        let data_offset = get_u64_str(&fin, "offset").unwrap_or(0);
        let saved = self.json.clone();
        let mut removed = Vec::new();
        let mut doomed: Vec<usize> = Vec::new();
        if let Some((rs, _)) = self.reencrypt_keyslot_json() {
            doomed.push(rs);
        }
        if let Some(od) = old_digest
            .as_ref()
            .filter(|d| Some(*d) != new_digest.as_ref())
        {
            if let Some(a) = self.json["digests"][od]["keyslots"].as_array() {
                doomed.extend(a.iter().filter_map(|s| s.as_str()?.parse::<usize>().ok()));
            }
        }
        doomed.sort_unstable();
        for d in self.json["digests"]
            .as_object_mut()
            .into_iter()
            .flat_map(|m| m.values_mut())
        {
            d["segments"] = json!([]);
        }
        self.json["segments"] = json!({ "0": seg });
        if let Some(nd) = &new_digest {
            self.json["digests"][nd]["segments"] = json!(["0"]);
        }
        for s in doomed {
            if let Some(a) = self.keyslot_area(s) {
                removed.push(a);
            }
            self.drop_keyslot_json(s);
        }
        if let Some(cfg) = self.json["config"].as_object_mut() {
            let empty = if let Some(r) = cfg.get_mut("requirements") {
                if let Some(m) = r.get_mut("mandatory").and_then(Value::as_array_mut) {
                    m.retain(|x| {
                        !x.as_str()
                            .is_some_and(super::validate::is_online_reencrypt_requirement)
                    });
                    if m.is_empty() {
                        r.as_object_mut().map(|o| o.remove("mandatory"));
                    }
                }
                r.as_object().is_some_and(|o| o.is_empty())
            } else {
                false
            };
            if empty {
                cfg.remove("requirements");
            }
            if data_offset >= 2 * self.hdr_size {
                let ks = (data_offset - 2 * self.hdr_size).min(MAX_KEYSLOTS_SIZE) / 4096 * 4096;
                cfg.insert("keyslots_size".into(), u64_value(ks));
            }
        }
        if let Err(e) = super::validate::validate(
            &self.json,
            self.hdr_size - super::binary::BIN_HDR_LEN as u64,
        ) {
            self.json = saved;
            return Err(e);
        }
        Ok(removed)
    }

    /// Adds keyslot `to` to every token that lists keyslot `from` (in memory), as
    /// cryptsetup hands a re-keyed keyslot's tokens to its replacement.
    pub fn copy_token_keyslot(&mut self, from: usize, to: usize) {
        let (f, t) = (from.to_string(), to.to_string());
        if let Some(tokens) = self.json["tokens"].as_object_mut() {
            for tok in tokens.values_mut() {
                if let Some(a) = tok["keyslots"].as_array_mut() {
                    if a.iter().any(|x| x.as_str() == Some(&f)) {
                        a.push(Value::String(t.clone()));
                    }
                }
            }
        }
    }
}

/// Overwrites keyslot areas with random bytes and syncs (after
/// [`Luks2Header::finish_reencryption`]'s header is written, so no header names them).
pub fn wipe_areas(io: &dyn HeaderIo, areas: &[(u64, u64)]) -> Result<()> {
    for &(off, len) in areas {
        super::keyslot::wipe_area(io, off, len)?;
    }
    Ok(())
}
