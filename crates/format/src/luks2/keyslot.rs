//! LUKS2 keyslots of type `luks2`: unlocking (KDF, area decryption, AF merge, digest check)
//! and storing (the reverse), plus the keyslot-level header edits (add, remove, change,
//! priority, unbound keys).

use super::json::{array_has, get_str, get_u32, get_u64_str, u64_value};
use super::{Luks2Header, Unlocked, LUKS2_OBJECTS_MAX};
use crate::af;
use crate::error::{FormatError, Result};
use crate::hdrio::HeaderIo;
use crate::kdf::{self, Pbkdf, PbkdfRequest};
use base64::Engine;
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::secret::ct_eq;
use cryptblk_cipher::SecretBytes;
use serde_json::{json, Value};

/// Keyslot areas are encrypted in 512-byte sectors, IV sector 0 at the area start.
const AREA_SECTOR: usize = 512;
/// Salt length of keyslot KDFs and digests (cryptsetup's LUKS_SALTSIZE).
const SALT_LEN: usize = 32;
/// Keyslot areas are allocated in 4 KiB units.
const AREA_ALIGN: u64 = 4096;

/// Why a key is being unlocked; decides which keyslots may answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnlockPurpose {
    /// To map the data segment: only keyslots bound to the segment, never with unmet
    /// requirements.
    Activate,
    /// `open --test-passphrase` / `luksDump --dump-volume-key`: bound keyslots; a keyslot
    /// named explicitly may also be unbound.
    Verify,
    /// `--unbound`: bound and unbound keyslots.
    Unbound,
}

/// How to create a keyslot.
#[derive(Clone, Debug)]
pub struct KeyslotParams {
    /// KDF choice and cost (`--pbkdf`, `--iter-time`, `--pbkdf-force-iterations`,
    /// `--pbkdf-memory`, `--pbkdf-parallel`).
    pub pbkdf: PbkdfRequest,
    /// Hash of the anti-forensic splitter (cryptsetup uses `--hash`, default sha256).
    pub af_hash: HashAlgorithm,
    /// Keyslot number (`--key-slot`); None picks the lowest free one.
    pub slot: Option<usize>,
    /// 0 ignore, 1 normal, 2 prefer (`--priority`).
    pub priority: u8,
    /// Keyslot area cipher (`--keyslot-cipher`); None: the segment cipher when usable,
    /// else aes-xts-plain64.
    pub cipher: Option<String>,
    /// Keyslot area key size in bytes (`--keyslot-key-size`); None: with `cipher` None the
    /// volume key size, else 64.
    pub cipher_key_size: Option<usize>,
}

impl KeyslotParams {
    /// cryptsetup's defaults: Argon2id calibrated to 2 s, AF hash sha256, normal priority.
    pub fn new(pbkdf: PbkdfRequest) -> Self {
        KeyslotParams {
            pbkdf,
            af_hash: HashAlgorithm::Sha256,
            slot: None,
            priority: 1,
            cipher: None,
            cipher_key_size: None,
        }
    }
}

impl Default for KeyslotParams {
    fn default() -> Self {
        Self::new(PbkdfRequest::argon2id())
    }
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

pub(super) fn decode_b64(s: &str, what: &str) -> Result<Vec<u8>> {
    b64()
        .decode(s)
        .map_err(|_| FormatError::Corrupt(format!("{what} is not valid base64")))
}

fn random_bytes(n: usize) -> Result<Vec<u8>> {
    let mut v = vec![0u8; n];
    getrandom::getrandom(&mut v).map_err(|e| FormatError::Kdf(format!("random source: {e}")))?;
    Ok(v)
}

/// The keyslot's priority (absent: normal).
pub(super) fn priority_of(ks: &Value) -> u8 {
    match ks.get("priority").and_then(Value::as_i64) {
        None => 1,
        Some(p) => u8::try_from(p).unwrap_or(255),
    }
}

fn invalid(slot: usize, reason: impl Into<String>) -> FormatError {
    FormatError::InvalidKeyslot {
        slot,
        reason: reason.into(),
    }
}

/// Parses a keyslot's KDF object into runnable parameters.
fn kdf_of(slot: usize, kdf: &Value) -> Result<(Pbkdf, Vec<u8>)> {
    let ty = kdf["type"].as_str().unwrap_or("");
    let salt = decode_b64(get_str(kdf, "salt").unwrap_or(""), "keyslot salt")?;
    let pbkdf = match ty {
        "pbkdf2" => {
            let hash = HashAlgorithm::from_name(kdf["hash"].as_str().unwrap_or(""))?;
            let iterations = get_u32(kdf, "iterations")
                .filter(|&n| n > 0)
                .ok_or_else(|| invalid(slot, "invalid PBKDF2 iteration count"))?;
            Pbkdf::Pbkdf2 { hash, iterations }
        }
        "argon2i" | "argon2id" => {
            let time = get_u32(kdf, "time").ok_or_else(|| invalid(slot, "invalid Argon2 time"))?;
            let memory_kib =
                get_u32(kdf, "memory").ok_or_else(|| invalid(slot, "invalid Argon2 memory"))?;
            let parallel =
                get_u32(kdf, "cpus").ok_or_else(|| invalid(slot, "invalid Argon2 cpus"))?;
            if memory_kib > ARGON2_MAX_MEMORY_KIB
                || parallel == 0
                || parallel > ARGON2_MAX_PARALLEL
                || time == 0
            {
                return Err(invalid(
                    slot,
                    format!("Argon2 cost out of range (time {time}, memory {memory_kib} KiB, cpus {parallel})"),
                ));
            }
            if ty == "argon2i" {
                Pbkdf::Argon2i {
                    time,
                    memory_kib,
                    parallel,
                }
            } else {
                Pbkdf::Argon2id {
                    time,
                    memory_kib,
                    parallel,
                }
            }
        }
        other => {
            return Err(FormatError::Kdf(format!(
                "keyslot {slot} uses unsupported PBKDF '{other}'"
            )))
        }
    };
    Ok((pbkdf, salt))
}

fn kdf_json(pbkdf: &Pbkdf, salt: &[u8]) -> Value {
    let salt = b64().encode(salt);
    match *pbkdf {
        Pbkdf::Pbkdf2 { hash, iterations } => json!({
            "type": "pbkdf2", "hash": hash.name(), "iterations": iterations, "salt": salt
        }),
        Pbkdf::Argon2i {
            time,
            memory_kib,
            parallel,
        }
        | Pbkdf::Argon2id {
            time,
            memory_kib,
            parallel,
        } => json!({
            "type": pbkdf.name(), "time": time, "memory": memory_kib, "cpus": parallel,
            "salt": salt
        }),
    }
}

/// Encrypts or decrypts keyslot material in place with the area cipher.
///
/// cryptblk-cipher's sector cipher registry is being written concurrently; until it is
/// available this private helper is the single place keyslot areas are (de)crypted.
fn area_crypt(spec: &str, key: &[u8], encrypt: bool, buf: &mut [u8]) -> Result<()> {
    super::areacipher::crypt(spec, key, encrypt, buf)
}

/// True when `spec` can encrypt keyslot material with a `key_len`-byte key.
fn area_cipher_usable(spec: &str, key_len: usize) -> bool {
    let key = vec![0u8; key_len];
    let mut buf = [0u8; AREA_SECTOR];
    area_crypt(spec, &key, true, &mut buf).is_ok()
}

/// Bytes of keyslot material for a `key_len`-byte key: split size rounded to 512
/// (saturating, so hostile sizes fail the area-size check instead of overflowing).
fn material_len(key_len: usize, stripes: u32) -> usize {
    af::split_len(key_len, stripes)
        .div_ceil(AREA_SECTOR)
        .saturating_mul(AREA_SECTOR)
}

/// cryptsetup's ceiling for Argon2 memory (4 GiB, in KiB): larger values in a header are
/// refused instead of attempting the allocation.
const ARGON2_MAX_MEMORY_KIB: u32 = 4 * 1024 * 1024;
/// Ceiling for Argon2 lanes accepted from a header.
const ARGON2_MAX_PARALLEL: u32 = 64;

/// Overwrites a keyslot area with random bytes.
pub(super) fn wipe_area(io: &dyn HeaderIo, offset: u64, len: u64) -> Result<()> {
    const CHUNK: u64 = 1 << 20;
    let mut pos = offset;
    while pos < offset + len {
        let n = CHUNK.min(offset + len - pos) as usize;
        let noise = random_bytes(n)?;
        io.write_at(pos, &noise)
            .map_err(|e| FormatError::io("wiping keyslot area", e))?;
        pos += n as u64;
    }
    io.sync()
        .map_err(|e| FormatError::io("syncing keyslot wipe", e))
}

impl Luks2Header {
    fn keyslot_json(&self, slot: usize) -> Option<&Value> {
        self.json["keyslots"].get(slot.to_string())
    }

    /// (offset, size) of a keyslot's area.
    pub fn keyslot_area(&self, slot: usize) -> Option<(u64, u64)> {
        let area = self.keyslot_json(slot)?.get("area")?;
        Some((get_u64_str(area, "offset")?, get_u64_str(area, "size")?))
    }

    /// Id of the digest that lists keyslot `slot`.
    fn digest_of_keyslot(&self, slot: usize) -> Option<String> {
        let name = slot.to_string();
        self.json["digests"]
            .as_object()?
            .iter()
            .find(|(_, d)| array_has(d.get("keyslots"), &name))
            .map(|(k, _)| k.clone())
    }

    /// Id of the digest bound to the default (lowest crypt) segment.
    fn segment_digest(&self) -> Option<String> {
        let seg = self.crypt_segments().into_iter().next()?.id.to_string();
        self.json["digests"]
            .as_object()?
            .iter()
            .find(|(_, d)| array_has(d.get("segments"), &seg))
            .map(|(k, _)| k.clone())
    }

    /// Checks `key` against a pbkdf2 digest.
    pub(super) fn digest_matches(&self, digest_id: &str, key: &[u8]) -> Result<bool> {
        let d = &self.json["digests"][digest_id];
        if d["type"] != "pbkdf2" {
            return Err(FormatError::Unsupported(format!(
                "digest {digest_id} has unsupported type {}",
                d["type"]
            )));
        }
        let hash = HashAlgorithm::from_name(d["hash"].as_str().unwrap_or(""))?;
        let iterations = get_u32(d, "iterations")
            .filter(|&n| n > 0)
            .ok_or_else(|| FormatError::Corrupt(format!("digest {digest_id}: bad iterations")))?;
        let salt = decode_b64(d["salt"].as_str().unwrap_or(""), "digest salt")?;
        let want = decode_b64(d["digest"].as_str().unwrap_or(""), "digest")?;
        if salt.len() != SALT_LEN
            || want.len() < 20
            || (want.len() != 20 && want.len() != hash.output_len())
        {
            return Err(FormatError::Corrupt(format!(
                "digest {digest_id}: invalid salt or digest length"
            )));
        }
        let got = Pbkdf::Pbkdf2 { hash, iterations }.derive(key, &salt, want.len())?;
        Ok(ct_eq(got.as_bytes(), &want))
    }

    /// Verifies a volume key against the segment's digest (`--volume-key-file` opens).
    pub fn verify_volume_key(&self, key: &[u8]) -> Result<()> {
        let d = self
            .segment_digest()
            .ok_or_else(|| FormatError::Corrupt("no digest for the data segment".into()))?;
        if self.digest_matches(&d, key)? {
            Ok(())
        } else {
            Err(FormatError::VolumeKeyMismatch)
        }
    }

    /// Size in bytes of the volume key (from the segment's keyslots, or the digest).
    pub fn volume_key_size(&self) -> Option<usize> {
        let d = self.segment_digest()?;
        let ks = self.json["digests"][&d]["keyslots"].as_array()?;
        ks.iter()
            .filter_map(|s| s.as_str())
            .filter_map(|s| self.json["keyslots"].get(s))
            .find_map(|k| get_u32(k, "key_size"))
            .map(|n| n as usize)
    }

    /// Opens one keyslot with `passphrase`: KDF, area decryption, AF merge, digest check.
    /// Wrong passphrase: [`FormatError::WrongPassphrase`].
    pub fn open_keyslot(
        &self,
        io: &dyn HeaderIo,
        slot: usize,
        passphrase: &[u8],
    ) -> Result<SecretBytes> {
        let ks = self
            .keyslot_json(slot)
            .ok_or_else(|| FormatError::NoKeyslot(format!(" (keyslot {slot} is not in use)")))?;
        if ks["type"] != "luks2" {
            return Err(invalid(
                slot,
                format!("unsupported keyslot type {}", ks["type"]),
            ));
        }
        let key_size = get_u32(ks, "key_size")
            .filter(|&n| n > 0)
            .ok_or_else(|| invalid(slot, "invalid key_size"))? as usize;
        let area = &ks["area"];
        let (offset, size) = self
            .keyslot_area(slot)
            .ok_or_else(|| invalid(slot, "invalid area"))?;
        let spec = area["encryption"].as_str().unwrap_or("");
        let area_key_size = get_u32(area, "key_size")
            .filter(|&n| n > 0)
            .ok_or_else(|| invalid(slot, "invalid area key_size"))?
            as usize;
        let stripes = get_u32(&ks["af"], "stripes")
            .filter(|&n| n > 0)
            .ok_or_else(|| invalid(slot, "invalid AF stripes"))?;
        let af_hash = HashAlgorithm::from_name(ks["af"]["hash"].as_str().unwrap_or(""))?;
        let len = material_len(key_size, stripes);
        if len as u64 > size {
            return Err(invalid(
                slot,
                format!("area of {size} bytes cannot hold {len} bytes of key material"),
            ));
        }
        let digest = self
            .digest_of_keyslot(slot)
            .ok_or_else(|| invalid(slot, "no digest"))?;
        let (pbkdf, salt) = kdf_of(slot, &ks["kdf"])?;
        let derived = pbkdf.derive(passphrase, &salt, area_key_size)?;
        let mut material = SecretBytes::zeroed(len);
        io.read_at(offset, material.as_mut_bytes())
            .map_err(|e| FormatError::io(format!("reading keyslot {slot} area"), e))?;
        area_crypt(spec, derived.as_bytes(), false, material.as_mut_bytes())?;
        let key = af::merge(material.as_bytes(), key_size, stripes, af_hash)?;
        if self.digest_matches(&digest, key.as_bytes())? {
            Ok(key)
        } else {
            Err(FormatError::WrongPassphrase)
        }
    }

    /// Finds the keyslot `passphrase` opens, as cryptsetup does: an explicit `slot` is
    /// tried alone; otherwise keyslots with priority "prefer" first, then "normal" ones
    /// ("ignore" never). `purpose` limits the candidates (see [`UnlockPurpose`]); unknown
    /// mandatory requirements refuse [`UnlockPurpose::Activate`].
    pub fn unlock(
        &self,
        io: &dyn HeaderIo,
        passphrase: &[u8],
        slot: Option<usize>,
        purpose: UnlockPurpose,
    ) -> Result<Unlocked> {
        if purpose == UnlockPurpose::Activate {
            self.check_requirements()?;
        }
        if let Some(s) = slot {
            if self.keyslot_json(s).is_none() {
                return Err(FormatError::NoKeyslot(format!(
                    " (keyslot {s} is not in use)"
                )));
            }
            if purpose == UnlockPurpose::Activate && !self.keyslot_is_bound(s) {
                return Err(invalid(
                    s,
                    "keyslot is not bound to a data segment (unbound key) and cannot activate it",
                ));
            }
            let key = self.open_keyslot(io, s, passphrase)?;
            return Ok(Unlocked { slot: s, key });
        }
        let infos = self.keyslots();
        let mut tried = 0;
        let mut last_err = None;
        for prio in [2u8, 1] {
            for k in infos
                .iter()
                .filter(|k| k.priority == prio && k.kind == "luks2")
            {
                if k.unbound && purpose != UnlockPurpose::Unbound {
                    continue;
                }
                tried += 1;
                match self.open_keyslot(io, k.id, passphrase) {
                    Ok(key) => return Ok(Unlocked { slot: k.id, key }),
                    Err(FormatError::WrongPassphrase) => {}
                    Err(e) => last_err = Some(e),
                }
            }
        }
        if tried == 0 {
            return Err(FormatError::NoKeyslot(String::new()));
        }
        match last_err {
            // A keyslot that could not even be tried (I/O, unsupported KDF) is reported only
            // when no keyslot rejected the passphrase normally.
            Some(e) if tried == 1 => Err(e),
            _ => Err(FormatError::WrongPassphrase),
        }
    }

    fn free_keyslot(&self, wanted: Option<usize>) -> Result<usize> {
        match wanted {
            Some(s) if s >= LUKS2_OBJECTS_MAX => Err(invalid(
                s,
                format!("keyslot numbers are 0..{}", LUKS2_OBJECTS_MAX - 1),
            )),
            Some(s) if self.keyslot_json(s).is_some() => Err(FormatError::KeyslotActive(s)),
            Some(s) => Ok(s),
            None => (0..LUKS2_OBJECTS_MAX)
                .find(|&s| self.keyslot_json(s).is_none())
                .ok_or(FormatError::KeyslotsFull),
        }
    }

    /// Lowest 4 KiB-aligned gap of `len` bytes in the keyslots area not used by any keyslot
    /// other than `except`.
    pub(super) fn find_area_gap(&self, len: u64, except: Option<usize>) -> Result<u64> {
        let start = 2 * self.hdr_size;
        let end = start + self.keyslots_size();
        let mut used: Vec<(u64, u64)> = self
            .keyslots()
            .iter()
            .filter(|k| Some(k.id) != except)
            .filter_map(|k| self.keyslot_area(k.id))
            .collect();
        used.sort();
        let mut pos = start;
        for (off, sz) in used {
            if off >= pos + len {
                break;
            }
            pos = pos.max((off + sz).div_ceil(AREA_ALIGN) * AREA_ALIGN);
        }
        if pos + len > end {
            return Err(FormatError::KeyslotsFull);
        }
        Ok(pos)
    }

    /// Writes the encrypted split of `key` at `offset` and returns the keyslot JSON.
    #[allow(clippy::too_many_arguments)]
    fn build_keyslot(
        &self,
        io: &dyn HeaderIo,
        key: &[u8],
        passphrase: &[u8],
        params: &KeyslotParams,
        offset: u64,
        area_size: u64,
        spec: &str,
        area_key_size: usize,
        pbkdf: &Pbkdf,
    ) -> Result<Value> {
        let salt = random_bytes(SALT_LEN)?;
        let derived = pbkdf.derive(passphrase, &salt, area_key_size)?;
        let split = af::split(key, af::LUKS_STRIPES, params.af_hash)?;
        let mut material = SecretBytes::zeroed(material_len(key.len(), af::LUKS_STRIPES));
        material.as_mut_bytes()[..split.len()].copy_from_slice(split.as_bytes());
        area_crypt(spec, derived.as_bytes(), true, material.as_mut_bytes())?;
        io.write_at(offset, material.as_bytes())
            .map_err(|e| FormatError::io("writing keyslot material", e))?;
        io.sync()
            .map_err(|e| FormatError::io("syncing keyslot material", e))?;
        let mut ks = json!({
            "type": "luks2",
            "key_size": key.len(),
            "af": {"type": "luks1", "stripes": af::LUKS_STRIPES, "hash": params.af_hash.name()},
            "area": {
                "type": "raw",
                "offset": u64_value(offset),
                "size": u64_value(area_size),
                "encryption": spec,
                "key_size": area_key_size
            },
            "kdf": kdf_json(pbkdf, &salt)
        });
        if params.priority != 1 {
            ks["priority"] = json!(params.priority);
        }
        Ok(ks)
    }

    pub(super) fn area_cipher_choice(
        &self,
        params: &KeyslotParams,
        key_len: usize,
    ) -> (String, usize) {
        if let Some(c) = &params.cipher {
            return (c.clone(), params.cipher_key_size.unwrap_or(64));
        }
        if let Ok(seg) = self.default_segment() {
            let n = params.cipher_key_size.unwrap_or(key_len);
            if seg.integrity.is_none() && area_cipher_usable(&seg.encryption, n) {
                return (seg.encryption, n);
            }
        }
        (
            "aes-xts-plain64".to_string(),
            params.cipher_key_size.unwrap_or(64),
        )
    }

    pub(super) fn add_keyslot_for_digest(
        &mut self,
        io: &dyn HeaderIo,
        key: &[u8],
        passphrase: &[u8],
        params: &KeyslotParams,
        digest: &str,
    ) -> Result<usize> {
        self.check_requirements()?;
        if params.priority > 2 {
            return Err(FormatError::InvalidParameter(
                "priority must be 0, 1 or 2".into(),
            ));
        }
        let slot = self.free_keyslot(params.slot)?;
        let area_size =
            (material_len(key.len(), af::LUKS_STRIPES) as u64).div_ceil(AREA_ALIGN) * AREA_ALIGN;
        let offset = self.find_area_gap(area_size, None)?;
        let (spec, area_key_size) = self.area_cipher_choice(params, key.len());
        let pbkdf = kdf::calibrate(&params.pbkdf, area_key_size)?;
        let ks = self.build_keyslot(
            io,
            key,
            passphrase,
            params,
            offset,
            area_size,
            &spec,
            area_key_size,
            &pbkdf,
        )?;
        let mut candidate = self.json.clone();
        candidate["keyslots"][slot.to_string()] = ks;
        if let Some(arr) = candidate["digests"][digest]["keyslots"].as_array_mut() {
            arr.push(Value::String(slot.to_string()));
            sort_refs(arr);
        }
        let old = std::mem::replace(&mut self.json, candidate);
        if let Err(e) = self.write(io) {
            self.json = old;
            return Err(e);
        }
        Ok(slot)
    }

    /// Adds a keyslot holding the volume key `vk` (verified against the segment digest
    /// first) under `passphrase` (`luksAddKey`). Returns the keyslot number.
    pub fn add_keyslot(
        &mut self,
        io: &dyn HeaderIo,
        vk: &SecretBytes,
        passphrase: &[u8],
        params: &KeyslotParams,
    ) -> Result<usize> {
        self.verify_volume_key(vk.as_bytes())?;
        let digest = self
            .segment_digest()
            .ok_or_else(|| FormatError::Corrupt("no digest for the data segment".into()))?;
        self.add_keyslot_for_digest(io, vk.as_bytes(), passphrase, params, &digest)
    }

    /// Adds an unbound keyslot (`luksAddKey --unbound`): a new random key of `key_size`
    /// bytes with its own digest that is assigned to no segment. Returns the keyslot number
    /// and the key.
    pub fn add_unbound_keyslot(
        &mut self,
        io: &dyn HeaderIo,
        key_size: usize,
        passphrase: &[u8],
        params: &KeyslotParams,
    ) -> Result<(usize, SecretBytes)> {
        if key_size == 0 || key_size > 512 {
            return Err(FormatError::InvalidParameter(format!(
                "unbound key size {key_size}"
            )));
        }
        self.add_unbound_keyslot_with_key(io, SecretBytes::random(key_size), passphrase, params)
    }

    /// [`Self::add_unbound_keyslot`] for a given key (cryptsetup's `luksAddKey --unbound
    /// --volume-key-file`) instead of a random one.
    pub fn add_unbound_keyslot_with_key(
        &mut self,
        io: &dyn HeaderIo,
        key: SecretBytes,
        passphrase: &[u8],
        params: &KeyslotParams,
    ) -> Result<(usize, SecretBytes)> {
        let key_size = key.len();
        if key_size == 0 || key_size > 512 {
            return Err(FormatError::InvalidParameter(format!(
                "unbound key size {key_size}"
            )));
        }
        let digests = self.json["digests"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let id = (0..)
            .find(|i: &usize| !digests.contains_key(&i.to_string()))
            .unwrap_or(0);
        let digest = new_digest(key.as_bytes(), params.pbkdf.hash, &[], &[])?;
        let old = self.json.clone();
        self.json["digests"][id.to_string()] = digest;
        match self.add_keyslot_for_digest(io, key.as_bytes(), passphrase, params, &id.to_string()) {
            Ok(slot) => Ok((slot, key)),
            Err(e) => {
                self.json = old;
                Err(e)
            }
        }
    }

    pub(super) fn drop_keyslot_json(&mut self, slot: usize) {
        let name = slot.to_string();
        if let Some(ks) = self.json["keyslots"].as_object_mut() {
            // shift_remove keeps the other keyslots in their order, as cryptsetup's JSON does
            // (remove would swap the last keyslot into the hole).
            ks.shift_remove(&name);
        }
        let unref = |v: &mut Value| {
            if let Some(a) = v.get_mut("keyslots").and_then(Value::as_array_mut) {
                a.retain(|s| s.as_str() != Some(&name));
            }
        };
        if let Some(d) = self.json["digests"].as_object_mut() {
            d.values_mut().for_each(unref);
            d.retain(|_, v| {
                let empty = |k: &str| v[k].as_array().is_some_and(|a| a.is_empty());
                !(empty("keyslots") && empty("segments"))
            });
        }
        if let Some(t) = self.json["tokens"].as_object_mut() {
            t.values_mut().for_each(unref);
        }
    }

    /// Removes a keyslot (`luksKillSlot` / `luksRemoveKey`): the header without it is
    /// written first, then its area is wiped.
    pub fn remove_keyslot(&mut self, io: &dyn HeaderIo, slot: usize) -> Result<()> {
        self.check_requirements()?;
        let area = self
            .keyslot_area(slot)
            .ok_or_else(|| FormatError::NoKeyslot(format!(" (keyslot {slot} is not in use)")))?;
        let old = self.json.clone();
        self.drop_keyslot_json(slot);
        if let Err(e) = self.write(io) {
            self.json = old;
            return Err(e);
        }
        wipe_area(io, area.0, area.1)
    }

    /// Replaces the passphrase of the keyslot that `old_passphrase` opens
    /// (`luksChangeKey`). The new material goes to a free area first, one header write
    /// switches the keyslot to it, then the old area is wiped; with no free area the
    /// keyslot is rewritten in place (not crash-safe, as cryptsetup). The keyslot keeps its
    /// number unless `params.slot` names another. Returns the keyslot number.
    pub fn change_key(
        &mut self,
        io: &dyn HeaderIo,
        old_passphrase: &[u8],
        new_passphrase: &[u8],
        slot: Option<usize>,
        params: &KeyslotParams,
    ) -> Result<usize> {
        self.rewrite_keyslot(io, old_passphrase, new_passphrase, slot, params, true)
    }

    /// Re-derives the keyslot that `passphrase` opens (from `slot` if given) with new KDF
    /// parameters, keeping its number and passphrase (`luksConvertKey`). As cryptsetup, the
    /// rewritten keyslot takes `params` whole (KDF, AF hash, priority, area cipher: the
    /// segment's or the default one unless `params.cipher` names one) instead of inheriting
    /// the old keyslot's. Crash-safe as [`Luks2Header::change_key`]: the new material goes
    /// to a free area, one header write switches to it, the old area is wiped after.
    /// Returns the keyslot number.
    pub fn convert_keyslot(
        &mut self,
        io: &dyn HeaderIo,
        passphrase: &[u8],
        slot: Option<usize>,
        params: &KeyslotParams,
    ) -> Result<usize> {
        let mut p = params.clone();
        p.slot = None;
        self.rewrite_keyslot(io, passphrase, passphrase, slot, &p, false)
    }

    /// [`Luks2Header::change_key`] and [`Luks2Header::convert_keyslot`]: `inherit` keeps
    /// the old keyslot's area cipher and priority where `params` leaves them default.
    fn rewrite_keyslot(
        &mut self,
        io: &dyn HeaderIo,
        old_passphrase: &[u8],
        new_passphrase: &[u8],
        slot: Option<usize>,
        params: &KeyslotParams,
        inherit: bool,
    ) -> Result<usize> {
        self.check_requirements()?;
        let unlocked = self.unlock(io, old_passphrase, slot, UnlockPurpose::Unbound)?;
        let old_slot = unlocked.slot;
        let new_slot = match params.slot {
            Some(s) if s != old_slot => self.free_keyslot(Some(s))?,
            _ => old_slot,
        };
        let key = unlocked.key;
        let old_area = self
            .keyslot_area(old_slot)
            .ok_or_else(|| invalid(old_slot, "invalid area"))?;
        let area_size =
            (material_len(key.len(), af::LUKS_STRIPES) as u64).div_ceil(AREA_ALIGN) * AREA_ALIGN;
        let (offset, in_place) = match self.find_area_gap(area_size, None) {
            Ok(off) => (off, false),
            Err(_) if old_area.1 >= area_size => (old_area.0, true),
            Err(e) => return Err(e),
        };
        let old_ks = self.keyslot_json(old_slot).cloned().unwrap_or(Value::Null);
        let mut p = params.clone();
        if inherit && p.cipher.is_none() {
            if let Some(enc) = old_ks["area"]["encryption"].as_str() {
                p.cipher = Some(enc.to_string());
                p.cipher_key_size = get_u32(&old_ks["area"], "key_size").map(|n| n as usize);
            }
        }
        if inherit && p.priority == 1 {
            p.priority = priority_of(&old_ks);
        }
        let (spec, area_key_size) = self.area_cipher_choice(&p, key.len());
        let pbkdf = kdf::calibrate(&p.pbkdf, area_key_size)?;
        let size = if in_place { old_area.1 } else { area_size };
        let ks = self.build_keyslot(
            io,
            key.as_bytes(),
            new_passphrase,
            &p,
            offset,
            size,
            &spec,
            area_key_size,
            &pbkdf,
        )?;
        let digest = self
            .digest_of_keyslot(old_slot)
            .ok_or_else(|| invalid(old_slot, "no digest"))?;
        let old_json = self.json.clone();
        if new_slot != old_slot {
            self.drop_keyslot_json(old_slot);
            if self.json["digests"].get(&digest).is_none() {
                // The digest only existed for this (unbound) keyslot: keep it.
                self.json["digests"][&digest] = old_json["digests"][&digest].clone();
            }
            if let Some(arr) = self.json["digests"][&digest]["keyslots"].as_array_mut() {
                arr.push(Value::String(new_slot.to_string()));
                sort_refs(arr);
            }
        }
        self.json["keyslots"][new_slot.to_string()] = ks;
        if let Err(e) = self.write(io) {
            self.json = old_json;
            return Err(e);
        }
        if !in_place {
            wipe_area(io, old_area.0, old_area.1)?;
        }
        Ok(new_slot)
    }

    /// Sets a keyslot's priority (0 ignore, 1 normal, 2 prefer); takes effect on the next
    /// write (`config --priority`).
    pub fn set_priority(&mut self, slot: usize, priority: u8) -> Result<()> {
        if priority > 2 {
            return Err(FormatError::InvalidParameter(
                "priority must be 0, 1 or 2".into(),
            ));
        }
        let ks = self.json["keyslots"]
            .get_mut(slot.to_string())
            .and_then(Value::as_object_mut)
            .ok_or_else(|| FormatError::NoKeyslot(format!(" (keyslot {slot} is not in use)")))?;
        if priority == 1 {
            ks.remove("priority");
        } else {
            ks.insert("priority".into(), json!(priority));
        }
        Ok(())
    }
}

/// Keeps keyslot/segment reference arrays in numeric order, as cryptsetup writes them.
fn sort_refs(arr: &mut [Value]) {
    arr.sort_by_key(|v| {
        v.as_str()
            .and_then(super::json::str_u64)
            .unwrap_or(u64::MAX)
    });
}

/// A pbkdf2 digest object for `key` (iterations calibrated to 125 ms like cryptsetup,
/// at least 1000).
pub(super) fn new_digest(
    key: &[u8],
    hash: HashAlgorithm,
    keyslots: &[usize],
    segments: &[u32],
) -> Result<Value> {
    new_digest_iterations(key, hash, None, keyslots, segments)
}

/// [`new_digest`] with a fixed iteration count (`None`: calibrated). cryptsetup skips the
/// calibration (and uses the minimum, 1000) when its PBKDF is set not to benchmark.
pub(super) fn new_digest_iterations(
    key: &[u8],
    hash: HashAlgorithm,
    fixed: Option<u32>,
    keyslots: &[usize],
    segments: &[u32],
) -> Result<Value> {
    let iterations = match fixed {
        Some(n) => n.max(kdf::PBKDF2_MIN_ITERATIONS),
        None => {
            let per_ms = kdf::pbkdf2_iterations_per_ms(hash, hash.output_len())?;
            ((per_ms * 125.0) as u32).max(kdf::PBKDF2_MIN_ITERATIONS)
        }
    };
    let salt = random_bytes(SALT_LEN)?;
    let d = Pbkdf::Pbkdf2 { hash, iterations }.derive(key, &salt, hash.output_len())?;
    Ok(json!({
        "type": "pbkdf2",
        "keyslots": keyslots.iter().map(|k| k.to_string()).collect::<Vec<_>>(),
        "segments": segments.iter().map(|k| k.to_string()).collect::<Vec<_>>(),
        "hash": hash.name(),
        "iterations": iterations,
        "salt": b64().encode(&salt),
        "digest": b64().encode(d.as_bytes()),
    }))
}
