//! Validation of LUKS2 JSON metadata, rule for rule as cryptsetup applies it on load, plus
//! the one automatic repair cryptsetup performs (leftover KDF parameters).
//!
//! Every rule returns an error naming what is wrong; nothing here panics on hostile input.

use super::binary::{is_valid_metadata_size, BIN_HDR_LEN, KEYSLOTS_SIZE_MAX};
use super::json::{array_has, get_obj, get_str, is_int, numbered, str_u64, to_compact};
use crate::error::{FormatError, Result};
use serde_json::{Map, Value};

fn bad(msg: impl Into<String>) -> FormatError {
    FormatError::Corrupt(msg.into())
}

/// Requirement names cryptsetup knows (anything else is "unknown" and blocks writes and
/// activation).
pub const KNOWN_REQUIREMENTS: &[&str] = &[
    "offline-reencrypt",
    "online-reencrypt",
    "online-reencrypt-v2",
    "online-reencrypt-v3",
    "inline-hw-tags",
    "opal",
    "opal-v2",
];

/// Validates the whole metadata object against a JSON area of `json_area_size` bytes; if it
/// fails, applies cryptsetup's repair (drop KDF parameters not used by the KDF type) and
/// validates again. Returns true when the repair changed the object.
pub fn validate_or_repair(hdr: &mut Value, json_area_size: u64) -> Result<bool> {
    match validate(hdr, json_area_size) {
        Ok(()) => Ok(false),
        Err(first) => {
            let mut repaired = hdr.clone();
            repair(&mut repaired);
            if repaired == *hdr {
                return Err(first);
            }
            validate(&repaired, json_area_size)?;
            *hdr = repaired;
            Ok(true)
        }
    }
}

/// Checks every rule; the order follows cryptsetup so the first reported problem matches.
pub fn validate(hdr: &Value, json_area_size: u64) -> Result<()> {
    if !hdr.is_object() {
        return Err(bad("JSON metadata is not an object"));
    }
    validate_requirements(hdr)?;
    validate_tokens(hdr)?;
    validate_digests(hdr)?;
    validate_segments(hdr)?;
    validate_keyslots(hdr)?;
    validate_config(hdr)?;
    validate_areas(hdr)?;
    validate_json_size(hdr, json_area_size)?;
    validate_keyslot_types(hdr)?;
    Ok(())
}

fn section<'a>(hdr: &'a Value, name: &str) -> Result<&'a Map<String, Value>> {
    get_obj(hdr, name).ok_or_else(|| bad(format!("missing or non-object '{name}' section")))
}

fn need_str<'a>(obj: &'a Value, key: &str, what: &str) -> Result<&'a str> {
    get_str(obj, key).ok_or_else(|| bad(format!("{what}: missing or invalid string '{key}'")))
}

fn need_int<'a>(obj: &'a Value, key: &str, what: &str) -> Result<&'a Value> {
    obj.get(key)
        .filter(|v| is_int(v))
        .ok_or_else(|| bad(format!("{what}: missing or invalid integer '{key}'")))
}

fn need_array<'a>(obj: &'a Value, key: &str, what: &str) -> Result<&'a Vec<Value>> {
    obj.get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| bad(format!("{what}: missing or invalid array '{key}'")))
}

fn need_obj<'a>(obj: &'a Value, key: &str, what: &str) -> Result<&'a Value> {
    obj.get(key)
        .filter(|v| v.is_object())
        .ok_or_else(|| bad(format!("{what}: missing or invalid object '{key}'")))
}

fn is_u32(v: &Value) -> bool {
    v.as_u64().is_some_and(|n| n <= u32::MAX as u64)
}

fn check_key(key: &str, what: &str) -> Result<()> {
    if numbered(key) {
        Ok(())
    } else {
        Err(bad(format!("{what} key '{key}' is not a number")))
    }
}

/// Every element is a string naming an existing object in `target`.
fn check_refs(arr: &[Value], target: &Map<String, Value>, what: &str) -> Result<()> {
    for r in arr {
        let name = r
            .as_str()
            .ok_or_else(|| bad(format!("{what}: reference is not a string")))?;
        if !target.get(name).is_some_and(Value::is_object) {
            return Err(bad(format!("{what} references missing object '{name}'")));
        }
    }
    Ok(())
}

/// The `config.requirements.mandatory` names (empty when absent).
pub fn mandatory_requirements(hdr: &Value) -> Vec<String> {
    hdr.get("config")
        .and_then(|c| c.get("requirements"))
        .and_then(|r| r.get("mandatory"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// True for the online reencryption requirement names (`online-reencrypt`, and
/// `online-reencrypt-vN` of any version N cryptsetup may write).
pub fn is_online_reencrypt_requirement(flag: &str) -> bool {
    reencrypt_candidate(flag)
}

fn reencrypt_candidate(flag: &str) -> bool {
    if flag == "online-reencrypt" {
        return true;
    }
    flag.strip_prefix("online-reencrypt-v")
        .is_some_and(|v| !v.is_empty() && v.bytes().all(|c| c.is_ascii_digit()))
}

fn validate_requirements(hdr: &Value) -> Result<()> {
    let config = need_obj(hdr, "config", "JSON area")?;
    let mut online = 0;
    if let Some(req) = config.get("requirements") {
        if !req.is_object() {
            return Err(bad("config: 'requirements' is not an object"));
        }
        if let Some(m) = req.get("mandatory") {
            let arr = m
                .as_array()
                .ok_or_else(|| bad("requirements: 'mandatory' is not an array"))?;
            for f in arr {
                let s = f
                    .as_str()
                    .ok_or_else(|| bad("requirements: 'mandatory' holds a non-string"))?;
                if reencrypt_candidate(s) {
                    online += 1;
                }
            }
        }
    }
    if online > 1 {
        return Err(bad("multiple online-reencrypt requirement flags"));
    }
    Ok(())
}

fn validate_tokens(hdr: &Value) -> Result<()> {
    let tokens = section(hdr, "tokens")?;
    let keyslots = get_obj(hdr, "keyslots");
    for (key, tok) in tokens {
        check_key(key, "token")?;
        let what = format!("token {key}");
        need_str(tok, "type", &what)?;
        let arr = need_array(tok, "keyslots", &what)?;
        let keyslots = keyslots.ok_or_else(|| bad("missing 'keyslots' section"))?;
        check_refs(arr, keyslots, &what)?;
    }
    Ok(())
}

fn validate_digests(hdr: &Value) -> Result<()> {
    let digests = section(hdr, "digests")?;
    let keyslots = section(hdr, "keyslots")?;
    let segments = section(hdr, "segments")?;
    for (key, d) in digests {
        check_key(key, "digest")?;
        let what = format!("digest {key}");
        need_str(d, "type", &what)?;
        let ks = need_array(d, "keyslots", &what)?;
        let sg = need_array(d, "segments", &what)?;
        check_refs(ks, keyslots, &what)?;
        check_refs(sg, segments, &what)?;
    }
    Ok(())
}

/// True when the segment carries a flag starting with `backup-`.
pub fn segment_is_backup(seg: &Value) -> bool {
    seg.get("flags").and_then(Value::as_array).is_some_and(|a| {
        a.iter()
            .any(|f| f.as_str().is_some_and(|s| s.starts_with("backup-")))
    })
}

fn segment_has_flag(seg: &Value, flag: &str) -> bool {
    array_has(seg.get("flags"), flag)
}

fn segment_has_digest(name: &str, digests: &Map<String, Value>) -> bool {
    digests.values().any(|d| array_has(d.get("segments"), name))
}

fn validate_crypt_segment(
    seg: &Value,
    key: &str,
    digests: &Map<String, Value>,
    size: u64,
) -> Result<()> {
    let what = format!("segment {key}");
    let iv = need_str(seg, "iv_tweak", &what)?;
    need_str(seg, "encryption", &what)?;
    let ss = need_int(seg, "sector_size", &what)?;
    if let Some(integ) = seg.get("integrity") {
        if !integ.is_object() {
            return Err(bad(format!("{what}: 'integrity' is not an object")));
        }
        for k in ["type", "journal_encryption", "journal_integrity"] {
            need_str(integ, k, &format!("{what} integrity"))?;
        }
    }
    if !is_u32(ss) {
        return Err(bad(format!("{what}: sector_size out of range")));
    }
    let ss = ss.as_u64().unwrap_or(0);
    if ss == 0 || !ss.is_multiple_of(512) {
        return Err(bad(format!("{what}: invalid sector_size {ss}")));
    }
    if str_u64(iv).is_none() {
        return Err(bad(format!("{what}: invalid iv_tweak '{iv}'")));
    }
    if !size.is_multiple_of(ss) {
        return Err(bad(format!(
            "{what}: size {size} is not a multiple of sector_size {ss}"
        )));
    }
    if !segment_has_digest(key, digests) {
        return Err(bad(format!("{what} has no digest assigned")));
    }
    Ok(())
}

fn validate_segments(hdr: &Value) -> Result<()> {
    let segments = section(hdr, "segments")?;
    if segments.is_empty() {
        return Err(bad("no segments"));
    }
    let digests = section(hdr, "digests")?;
    let count = segments.len() as u64;
    let mut first_backup: Option<u64> = None;
    // Non-backup segment numbers seen before the first backup one (order of appearance).
    let mut plain_ids: Vec<u64> = Vec::new();
    for (key, seg) in segments {
        check_key(key, "segment")?;
        let what = format!("segment {key}");
        let ty = need_str(seg, "type", &what)?;
        let off = need_str(seg, "offset", &what)?;
        let size_s = need_str(seg, "size", &what)?;
        let offset = str_u64(off).ok_or_else(|| bad(format!("{what}: invalid offset '{off}'")))?;
        let size = if size_s == "dynamic" {
            0
        } else {
            match str_u64(size_s) {
                Some(n) if n > 0 => n,
                _ => return Err(bad(format!("{what}: invalid size '{size_s}'"))),
            }
        };
        if !offset.is_multiple_of(512) {
            return Err(bad(format!(
                "{what}: offset {offset} not aligned to 512 bytes"
            )));
        }
        if !size.is_multiple_of(512) {
            return Err(bad(format!("{what}: size {size} not aligned to 512 bytes")));
        }
        if let Some(flags) = seg.get("flags") {
            let arr = flags
                .as_array()
                .ok_or_else(|| bad(format!("{what}: 'flags' is not an array")))?;
            if arr.iter().any(|f| !f.is_string()) {
                return Err(bad(format!("{what}: 'flags' holds a non-string")));
            }
        }
        // Keys are digits only here; a number too large for the index space is invalid.
        let id = str_u64(key)
            .filter(|&n| n <= i32::MAX as u64)
            .ok_or_else(|| bad(format!("{what}: key out of range")))?;
        if segment_is_backup(seg) {
            if first_backup.is_none_or(|fb| id < fb) {
                first_backup = Some(id);
            }
        } else {
            if first_backup.is_some_and(|fb| id >= fb) {
                return Err(bad(format!(
                    "{what}: regular segment after a backup segment"
                )));
            }
            plain_ids.push(id);
        }
        if ty == "crypt" {
            validate_crypt_segment(seg, key, digests, size)?;
        }
        if ty.starts_with("hw-opal") {
            return Err(FormatError::Unsupported(format!(
                "{what}: hardware OPAL segments are not supported"
            )));
        }
    }
    if first_backup == Some(0) {
        return Err(bad("segment 0 is a backup segment"));
    }
    if first_backup.is_some_and(|fb| fb >= count) {
        return Err(bad("backup segment number leaves a gap"));
    }
    let first_backup = first_backup.unwrap_or(count);
    let mut intervals = Vec::with_capacity(first_backup as usize);
    for i in 0..first_backup {
        let seg = segments
            .get(&i.to_string())
            .ok_or_else(|| bad(format!("gap at segment {i}")))?;
        let off = super::json::get_u64_str(seg, "offset").unwrap_or(0);
        let len = super::json::get_u64_str(seg, "size").unwrap_or(u64::MAX);
        intervals.push((off, len));
    }
    let n = intervals.len();
    for (i, &(oi, li)) in intervals.iter().enumerate() {
        if li == u64::MAX && i != n - 1 {
            return Err(bad(format!("dynamic segment {i} is not the last one")));
        }
        for (j, &(oj, lj)) in intervals.iter().enumerate() {
            if i == j {
                continue;
            }
            if lj != u64::MAX && oj > u64::MAX - lj {
                return Err(bad(format!("segment {j} overflows")));
            }
            if oi >= oj && (lj == u64::MAX || oi < oj + lj) {
                return Err(bad(format!("segments {i} and {j} overlap")));
            }
        }
    }
    for i in first_backup..count {
        if !segments.contains_key(&i.to_string()) {
            return Err(bad(format!("gap at backup segment {i}")));
        }
    }
    let reqs = mandatory_requirements(hdr);
    if reqs.iter().any(|r| reencrypt_candidate(r)) {
        let backups: Vec<&Value> = (first_backup..count)
            .filter_map(|i| segments.get(&i.to_string()))
            .collect();
        let find = |f: &str| backups.iter().copied().find(|s| segment_has_flag(s, f));
        let (Some(fin), Some(prev)) = (find("backup-final"), find("backup-previous")) else {
            return Err(bad(
                "reencryption requires backup-final and backup-previous segments",
            ));
        };
        // As cryptsetup: every data segment is under the old or the new parameters (type,
        // and for crypt segments cipher and sector size); one in reencryption under the new.
        let same = |a: &Value, b: &Value| {
            a.get("type") == b.get("type")
                && (a.get("type").and_then(Value::as_str) != Some("crypt")
                    || (a.get("encryption") == b.get("encryption")
                        && a.get("sector_size") == b.get("sector_size")))
        };
        for i in 0..first_backup {
            let Some(seg) = segments.get(&i.to_string()) else {
                continue;
            };
            let ok = if segment_has_flag(seg, "in-reencryption") {
                same(seg, fin)
            } else {
                same(seg, fin) || same(seg, prev)
            };
            if !ok {
                return Err(bad(format!(
                    "segment {i} matches neither backup-final nor backup-previous"
                )));
            }
        }
    }
    let _ = plain_ids;
    Ok(())
}

fn validate_keyslots(hdr: &Value) -> Result<()> {
    let keyslots = section(hdr, "keyslots")?;
    for (key, ks) in keyslots {
        check_key(key, "keyslot")?;
        let what = format!("keyslot {key}");
        need_str(ks, "type", &what)?;
        let size = need_int(ks, "key_size", &what)?;
        if !is_u32(size) {
            return Err(bad(format!("{what}: key_size out of range")));
        }
    }
    Ok(())
}

/// json_size + 4096 and keyslots_size from config (validated values only).
pub fn config_sizes(hdr: &Value) -> Option<(u64, u64)> {
    let c = hdr.get("config")?;
    let json = super::json::get_u64_str(c, "json_size")?;
    let ks = super::json::get_u64_str(c, "keyslots_size")?;
    Some((json.checked_add(BIN_HDR_LEN as u64)?, ks))
}

/// Lowest offset of the non-backup segments; 0 when any starts at 0 (detached header).
pub fn min_segment_offset(hdr: &Value) -> u64 {
    let Some(segs) = get_obj(hdr, "segments") else {
        return 0;
    };
    let mut min = u64::MAX;
    for seg in segs.values() {
        if segment_is_backup(seg) {
            continue;
        }
        let off = super::json::get_u64_str(seg, "offset").unwrap_or(0);
        if off == 0 {
            return 0;
        }
        min = min.min(off);
    }
    min
}

fn validate_config(hdr: &Value) -> Result<()> {
    let config = need_obj(hdr, "config", "JSON area")?;
    let js = need_str(config, "json_size", "config")?;
    let json_size = str_u64(js).ok_or_else(|| bad(format!("config: invalid json_size '{js}'")))?;
    let kss = need_str(config, "keyslots_size", "config")?;
    let keyslots_size =
        str_u64(kss).ok_or_else(|| bad(format!("config: invalid keyslots_size '{kss}'")))?;
    let metadata_size = json_size
        .checked_add(BIN_HDR_LEN as u64)
        .ok_or_else(|| bad("config: json_size overflows"))?;
    if !is_valid_metadata_size(metadata_size) {
        return Err(bad(format!(
            "config: invalid metadata size {metadata_size}"
        )));
    }
    if !keyslots_size.is_multiple_of(4096) || keyslots_size > KEYSLOTS_SIZE_MAX {
        return Err(bad(format!(
            "config: invalid keyslots_size {keyslots_size}"
        )));
    }
    let seg_off = min_segment_offset(hdr);
    if seg_off != 0 && (seg_off < keyslots_size || seg_off - keyslots_size < 2 * metadata_size) {
        return Err(bad(format!(
            "config: keyslots_size {keyslots_size} does not fit below data offset {seg_off}"
        )));
    }
    if let Some(flags) = config.get("flags") {
        let arr = flags
            .as_array()
            .ok_or_else(|| bad("config: 'flags' is not an array"))?;
        if arr.iter().any(|f| !f.is_string()) {
            return Err(bad("config: 'flags' holds a non-string"));
        }
    }
    Ok(())
}

fn validate_areas(hdr: &Value) -> Result<()> {
    let keyslots = section(hdr, "keyslots")?;
    let (metadata_size, keyslots_size) =
        config_sizes(hdr).ok_or_else(|| bad("config: invalid sizes"))?;
    let end = 2 * metadata_size + keyslots_size;
    let mut ix: Vec<(u64, u64, &String)> = Vec::new();
    for (key, ks) in keyslots {
        let what = format!("keyslot {key}");
        let area = need_obj(ks, "area", &what)?;
        need_str(area, "type", &format!("{what} area"))?;
        let off = need_str(area, "offset", &what)?;
        let len = need_str(area, "size", &what)?;
        let off = str_u64(off).ok_or_else(|| bad(format!("{what}: invalid area offset")))?;
        let len = str_u64(len).ok_or_else(|| bad(format!("{what}: invalid area size")))?;
        ix.push((off, len, key));
    }
    for &(off, len, key) in &ix {
        if off < 2 * metadata_size {
            return Err(bad(format!("keyslot {key}: area overlaps the metadata")));
        }
        if len == 0 {
            return Err(bad(format!("keyslot {key}: empty area")));
        }
        let stop = off
            .checked_add(len)
            .ok_or_else(|| bad(format!("keyslot {key}: area overflows")))?;
        if stop > end {
            return Err(bad(format!(
                "keyslot {key}: area ends beyond the keyslots area"
            )));
        }
        for &(o2, l2, k2) in &ix {
            if std::ptr::eq(key, k2) {
                continue;
            }
            let stop2 = o2
                .checked_add(l2)
                .ok_or_else(|| bad(format!("keyslot {k2}: area overflows")))?;
            if off >= o2 && off < stop2 {
                return Err(bad(format!(
                    "keyslots {key} and {k2} have overlapping areas"
                )));
            }
        }
    }
    Ok(())
}

fn validate_json_size(hdr: &Value, json_area_size: u64) -> Result<()> {
    let configured = hdr
        .get("config")
        .and_then(|c| super::json::get_u64_str(c, "json_size"))
        .unwrap_or(0);
    if configured != json_area_size {
        return Err(bad(format!(
            "config json_size {configured} differs from the header's JSON area size {json_area_size}"
        )));
    }
    if to_compact(hdr).len() as u64 > json_area_size {
        return Err(bad("JSON metadata does not fit its area"));
    }
    Ok(())
}

/// Number of digests that list keyslot `slot`.
pub fn keyslot_digest_count(hdr: &Value, slot: &str) -> usize {
    get_obj(hdr, "digests")
        .map(|d| {
            d.values()
                .filter(|v| array_has(v.get("keyslots"), slot))
                .count()
        })
        .unwrap_or(0)
}

fn validate_luks2_keyslot(ks: &Value, what: &str) -> Result<()> {
    let kdf = need_obj(ks, "kdf", what)?;
    let af = need_obj(ks, "af", what)?;
    let area = need_obj(ks, "area", what)?;
    let n = kdf.as_object().map_or(0, Map::len);
    let ty = need_str(kdf, "type", &format!("{what} kdf"))?;
    let kw = format!("{what} kdf {ty}");
    match ty {
        "pbkdf2" => {
            if n != 4 {
                return Err(bad(format!("{kw}: unexpected parameters")));
            }
            need_str(kdf, "hash", &kw)?;
            need_int(kdf, "iterations", &kw)?;
            need_str(kdf, "salt", &kw)?;
        }
        "argon2i" | "argon2id" => {
            if n != 5 {
                return Err(bad(format!("{kw}: unexpected parameters")));
            }
            need_int(kdf, "time", &kw)?;
            need_int(kdf, "memory", &kw)?;
            need_int(kdf, "cpus", &kw)?;
            need_str(kdf, "salt", &kw)?;
        }
        // Other names (e.g. the pre-release "argon2") load but cannot be unlocked.
        _ => {}
    }
    let aw = format!("{what} af");
    match need_str(af, "type", &aw)? {
        "luks1" => {
            need_str(af, "hash", &aw)?;
            need_int(af, "stripes", &aw)?;
        }
        other => return Err(bad(format!("{aw}: unknown type '{other}'"))),
    }
    let arw = format!("{what} area");
    match need_str(area, "type", &arw)? {
        "raw" => {
            need_str(area, "encryption", &arw)?;
            need_int(area, "key_size", &arw)?;
            need_str(area, "offset", &arw)?;
            need_str(area, "size", &arw)?;
        }
        other => return Err(bad(format!("{arw}: unknown type '{other}'"))),
    }
    Ok(())
}

fn validate_keyslot_types(hdr: &Value) -> Result<()> {
    let keyslots = section(hdr, "keyslots")?;
    let mut reencrypt = 0;
    for (key, ks) in keyslots {
        let what = format!("keyslot {key}");
        match ks.get("type").and_then(Value::as_str) {
            Some("luks2") => {
                validate_luks2_keyslot(ks, &what)?;
                // Digests reference keyslots by canonical decimal name.
                let canon = str_u64(key).map(|n| n.to_string()).unwrap_or_default();
                if keyslot_digest_count(hdr, &canon) != 1 {
                    return Err(bad(format!("{what} is not assigned to exactly one digest")));
                }
            }
            Some("reencrypt") => {
                reencrypt += 1;
                // cryptsetup: "Illegal reencrypt key size."
                if ks.get("key_size").and_then(Value::as_u64) != Some(1) {
                    return Err(bad(format!("{what}: illegal reencrypt key size")));
                }
            }
            _ => {}
        }
    }
    let reqs = mandatory_requirements(hdr);
    let candidate = reqs.iter().any(|r| reencrypt_candidate(r));
    if candidate && reencrypt == 0 {
        return Err(bad("missing reencryption keyslot"));
    }
    if reencrypt > 0 && !candidate {
        return Err(bad("reencryption keyslot without reencryption requirement"));
    }
    if reencrypt > 1 {
        return Err(bad("too many reencryption keyslots"));
    }
    Ok(())
}

/// Removes KDF parameters that do not belong to the keyslot's KDF type (left behind by
/// cryptsetup < 2.0.3 when a keyslot's KDF was changed).
pub fn repair(hdr: &mut Value) {
    let Some(keyslots) = hdr.get_mut("keyslots").and_then(Value::as_object_mut) else {
        return;
    };
    for ks in keyslots.values_mut() {
        let Some(kdf) = ks.get_mut("kdf").and_then(Value::as_object_mut) else {
            continue;
        };
        let keep: &[&str] = match kdf.get("type").and_then(Value::as_str) {
            Some("pbkdf2") => &["type", "salt", "hash", "iterations"],
            Some("argon2i") | Some("argon2id") => &["type", "salt", "time", "memory", "cpus"],
            _ => continue,
        };
        kdf.retain(|k, _| keep.contains(&k.as_str()));
    }
}
