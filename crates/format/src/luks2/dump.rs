//! `luksDump` text for LUKS2, laid out as cryptsetup 2.6 prints it (same labels, tabs and
//! trailing spaces) so scripts that parse cryptsetup's output can parse cryptblk's.

use super::json::{get_u64_str, str_u64};
use super::Luks2Header;
use base64::Engine;
use serde_json::Value;
use std::fmt::Write;

/// Hex bytes, 16 per line, continuation lines indented like cryptsetup's `hexprint_base64`.
fn hex_b64(out: &mut String, v: &Value) {
    let bytes = v
        .as_str()
        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
        .unwrap_or_default();
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 && i.is_multiple_of(16) {
            out.push_str("\n\t            ");
        }
        let _ = write!(out, "{b:02x} ");
    }
    out.push('\n');
}

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

/// A key size in bits as cryptsetup prints it (`uint32 * 8`, wrapping like C).
fn bits(v: &Value) -> u32 {
    (int(v) as u32).wrapping_mul(8)
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

fn strings(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

pub(super) fn dump(h: &Luks2Header) -> String {
    let j = &h.json;
    let mut o = String::new();
    let or = |v: &str, none: &str| {
        if v.is_empty() {
            none.to_string()
        } else {
            v.to_string()
        }
    };
    o.push_str("LUKS header information\n");
    o.push_str("Version:       \t2\n");
    let _ = writeln!(o, "Epoch:         \t{}", h.seqid);
    let _ = writeln!(o, "Metadata area: \t{} [bytes]", h.hdr_size);
    let _ = writeln!(o, "Keyslots area: \t{} [bytes]", h.keyslots_size());
    let _ = writeln!(o, "UUID:          \t{}", or(&h.uuid, "(no UUID)"));
    let _ = writeln!(o, "Label:         \t{}", or(&h.label, "(no label)"));
    let _ = writeln!(o, "Subsystem:     \t{}", or(&h.subsystem, "(no subsystem)"));

    let flags = strings(j["config"].get("flags"));
    let reqs = strings(
        j["config"]
            .get("requirements")
            .and_then(|r| r.get("mandatory")),
    );
    o.push_str("Flags:       \t");
    for f in &flags {
        let _ = write!(o, "{f} ");
    }
    o.push_str(if flags.is_empty() {
        "(no flags)\n"
    } else {
        "\n"
    });
    if reqs.is_empty() {
        o.push('\n');
    } else {
        o.push_str("Requirements:\t");
        for r in &reqs {
            let _ = write!(o, "{r} ");
        }
        o.push_str("\n\n");
    }

    o.push_str("Data segments:\n");
    for i in 0..super::LUKS2_OBJECTS_MAX {
        let Some(seg) = j["segments"].get(i.to_string()) else {
            continue;
        };
        let _ = writeln!(o, "  {i}: {}", s(&seg["type"]));
        let _ = writeln!(
            o,
            "\toffset: {} [bytes]",
            get_u64_str(seg, "offset").unwrap_or(0)
        );
        if seg["size"] == "dynamic" {
            o.push_str("\tlength: (whole device)\n");
        } else {
            let _ = writeln!(
                o,
                "\tlength: {} [bytes]",
                get_u64_str(seg, "size").unwrap_or(0)
            );
        }
        // cryptsetup 2.6 prints nothing for segments without software encryption.
        if let Some(e) = seg.get("encryption") {
            let _ = writeln!(o, "\tcipher: {}", s(e));
        }
        if let Some(ss) = seg.get("sector_size") {
            let _ = writeln!(o, "\tsector: {} [bytes]", int(ss));
        }
        if let Some(t) = seg.get("integrity").and_then(|i| i.get("type")) {
            let _ = writeln!(o, "\tintegrity: {}", s(t));
        }
        if let Some(k) = seg.get("integrity").and_then(|i| i.get("key_size")) {
            let _ = writeln!(o, "\tintegrity key size: {} [bits]", bits(k));
        }
        let f = strings(seg.get("flags"));
        if !f.is_empty() {
            let _ = writeln!(o, "\tflags : {}", f.join(", "));
        }
        o.push('\n');
    }

    o.push_str("Keyslots:\n");
    for i in 0..super::LUKS2_OBJECTS_MAX {
        let Some(ks) = j["keyslots"].get(i.to_string()) else {
            continue;
        };
        let unbound = if h.keyslot_is_bound(i) {
            ""
        } else {
            " (unbound)"
        };
        let _ = writeln!(o, "  {i}: {}{unbound}", s(&ks["type"]));
        if let Some(k) = ks.get("key_size") {
            let _ = writeln!(o, "\tKey:        {} bits", bits(k));
        }
        let prio = match ks.get("priority").map(int) {
            None | Some(1) => "normal",
            Some(0) => "ignored",
            Some(2) => "preferred",
            _ => "invalid",
        };
        let _ = writeln!(o, "\tPriority:   {prio}");
        if ks["type"] == "luks2" {
            dump_luks2_keyslot(&mut o, ks);
        } else if ks["type"] == "reencrypt" {
            dump_reencrypt_keyslot(&mut o, ks);
        }
        let name = i.to_string();
        if let Some(d) = j["digests"].as_object() {
            for (id, dg) in d {
                if strings(dg.get("keyslots")).contains(&name.as_str()) {
                    let _ = writeln!(o, "\tDigest ID:  {id}");
                }
            }
        }
    }

    o.push_str("Tokens:\n");
    for i in 0..super::LUKS2_OBJECTS_MAX {
        let Some(t) = j["tokens"].get(i.to_string()) else {
            continue;
        };
        let _ = writeln!(o, "  {i}: {}", s(&t["type"]));
        if t["type"] == "luks2-keyring" {
            let _ = writeln!(o, "\tKey description: {}", s(&t["key_description"]));
        }
        systemd_token(&mut o, t);
        for k in strings(t.get("keyslots")) {
            let _ = writeln!(o, "\tKeyslot:    {k}");
        }
    }

    o.push_str("Digests:\n");
    for i in 0..8 {
        let Some(d) = j["digests"].get(i.to_string()) else {
            continue;
        };
        let _ = writeln!(o, "  {i}: {}", s(&d["type"]));
        if d["type"] == "pbkdf2" {
            let _ = writeln!(o, "\tHash:       {}", s(&d["hash"]));
            let _ = writeln!(o, "\tIterations: {}", int(&d["iterations"]));
            o.push_str("\tSalt:       ");
            hex_b64(&mut o, &d["salt"]);
            o.push_str("\tDigest:     ");
            hex_b64(&mut o, &d["digest"]);
        }
    }
    o
}

fn dump_luks2_keyslot(o: &mut String, ks: &Value) {
    let (kdf, af, area) = (&ks["kdf"], &ks["af"], &ks["area"]);
    let _ = writeln!(o, "\tCipher:     {}", s(&area["encryption"]));
    let _ = writeln!(o, "\tCipher key: {} bits", bits(&area["key_size"]));
    let _ = writeln!(o, "\tPBKDF:      {}", s(&kdf["type"]));
    if kdf["type"] == "pbkdf2" {
        let _ = writeln!(o, "\tHash:       {}", s(&kdf["hash"]));
        let _ = writeln!(o, "\tIterations: {}", int(&kdf["iterations"]));
    } else {
        let _ = writeln!(o, "\tTime cost:  {}", int(&kdf["time"]));
        let _ = writeln!(o, "\tMemory:     {}", int(&kdf["memory"]));
        let _ = writeln!(o, "\tThreads:    {}", int(&kdf["cpus"]));
    }
    o.push_str("\tSalt:       ");
    hex_b64(o, &kdf["salt"]);
    let _ = writeln!(o, "\tAF stripes: {}", int(&af["stripes"]));
    let _ = writeln!(o, "\tAF hash:    {}", s(&af["hash"]));
    let off = area["offset"].as_str().and_then(str_u64).unwrap_or(0);
    let len = area["size"].as_str().and_then(str_u64).unwrap_or(0);
    let _ = writeln!(o, "\tArea offset:{off} [bytes]");
    let _ = writeln!(o, "\tArea length:{len} [bytes]");
}

/// The `reencrypt` keyslot lines of cryptsetup 2.6: the hash lines only for plain
/// `checksum` resilience (not `datashift-checksum`), the shift size only for plain
/// `datashift`, printed without a space before `[bytes]` as cryptsetup does.
fn dump_reencrypt_keyslot(o: &mut String, ks: &Value) {
    let area = &ks["area"];
    let _ = writeln!(o, "\tMode:       {}", s(&ks["mode"]));
    let _ = writeln!(o, "\tDirection:  {}", s(&ks["direction"]));
    let _ = writeln!(o, "\tResilience: {}", s(&area["type"]));
    if area["type"] == "checksum" {
        let _ = writeln!(o, "\tHash:       {}", s(&area["hash"]));
        let _ = writeln!(o, "\tHash data:  {} [bytes]", int(&area["sector_size"]));
    } else if area["type"] == "datashift" {
        let shift = area["shift_size"].as_str().and_then(str_u64).unwrap_or(0);
        let _ = writeln!(o, "\tShift size: {shift}[bytes]");
    }
    let off = area["offset"].as_str().and_then(str_u64).unwrap_or(0);
    let len = area["size"].as_str().and_then(str_u64).unwrap_or(0);
    let _ = writeln!(o, "\tArea offset:{off} [bytes]");
    let _ = writeln!(o, "\tArea length:{len} [bytes]");
}

/// Key bytes as cryptsetup's `--dump-volume-key` prints them: `%02x ` each, 16 per line,
/// continuation lines indented by two tabs.
fn key_hex(o: &mut String, key: &[u8]) {
    for (i, b) in key.iter().enumerate() {
        if i > 0 && i.is_multiple_of(16) {
            o.push_str("\n\t\t");
        }
        let _ = write!(o, "{b:02x} ");
    }
    o.push('\n');
}

pub(super) fn volume_key(h: &Luks2Header, device: &str, key: &[u8]) -> String {
    let mut o = String::new();
    let (name, mode) = match h.default_segment() {
        Ok(seg) => match seg.encryption.split_once('-') {
            Some((n, m)) => (n.to_string(), m.to_string()),
            None => (seg.encryption.clone(), String::new()),
        },
        Err(_) => (String::new(), String::new()),
    };
    let _ = writeln!(o, "LUKS header information for {device}");
    let _ = writeln!(o, "Cipher name:   \t{name}");
    let _ = writeln!(o, "Cipher mode:   \t{mode}");
    let _ = writeln!(o, "Payload offset:\t{}", h.data_offset() / 512);
    let _ = writeln!(o, "UUID:          \t{}", h.uuid);
    let _ = writeln!(o, "MK bits:       \t{}", key.len() * 8);
    o.push_str("MK dump:\t");
    key_hex(&mut o, key);
    o
}

pub(super) fn unbound_key(h: &Luks2Header, device: &str, slot: usize, key: &[u8]) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "LUKS header information for {device}");
    let _ = writeln!(o, "UUID:    \t{}", h.uuid);
    let _ = writeln!(o, "Keyslot: \t{slot}");
    let _ = writeln!(o, "Key bits:\t{}", key.len() * 8);
    o.push_str("Unbound Key:\t");
    key_hex(&mut o, key);
    o
}

/// The continuation of a value on the next line in the systemd token plugins' dumps.
const SD_SEP: &str = "\n\t            ";

/// Bytes in hex as systemd's token plugins print them: 16 to a line, no trailing space,
/// "(null)" for nothing.
fn sd_hex(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "(null)".into();
    }
    bytes
        .chunks(16)
        .map(|c| {
            c.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join(SD_SEP)
}

fn sd_b64(v: &Value) -> Vec<u8> {
    v.as_str()
        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
        .unwrap_or_default()
}

/// PCR numbers joined with '+', "n/a" for none.
fn sd_pcrs(v: &Value) -> String {
    let list: Vec<String> = v
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_u64)
                .map(|n| n.to_string())
                .collect()
        })
        .unwrap_or_default();
    if list.is_empty() {
        "n/a".into()
    } else {
        list.join("+")
    }
}

fn sd_bool(v: &Value, default: bool) -> &'static str {
    if v.as_bool().unwrap_or(default) {
        "true"
    } else {
        "false"
    }
}

/// The lines the systemd token plugins Debian's systemd 252 installs (and cryptsetup loads)
/// add to luksDump for `systemd-tpm2`, `systemd-fido2` and `systemd-pkcs11` tokens; field
/// names, defaults and layout as cryptsetup 2.6 prints them with those plugins.
fn systemd_token(o: &mut String, t: &Value) {
    match t["type"].as_str() {
        Some("systemd-tpm2") => {
            let bank = t["tpm2-pcr-bank"].as_str().unwrap_or("n/a");
            let policy = t["tpm2-policy-hash"]
                .as_str()
                .and_then(|h| hex::decode(h).ok())
                .unwrap_or_default();
            let _ = writeln!(o, "\ttpm2-hash-pcrs:   {}", sd_pcrs(&t["tpm2-pcrs"]));
            let _ = writeln!(o, "\ttpm2-pcr-bank:    {bank}");
            let _ = writeln!(
                o,
                "\ttpm2-pubkey:{SD_SEP}{}",
                sd_hex(&sd_b64(&t["tpm2_pubkey"]))
            );
            let _ = writeln!(o, "\ttpm2-pubkey-pcrs: {}", sd_pcrs(&t["tpm2_pubkey_pcrs"]));
            let _ = writeln!(
                o,
                "\ttpm2-primary-alg: {}",
                t["tpm2-primary-alg"].as_str().unwrap_or("ecc")
            );
            let _ = writeln!(
                o,
                "\ttpm2-blob:        {}",
                sd_hex(&sd_b64(&t["tpm2-blob"]))
            );
            let _ = writeln!(o, "\ttpm2-policy-hash:{SD_SEP}{}", sd_hex(&policy));
            let _ = writeln!(o, "\ttpm2-pin:         {}", sd_bool(&t["tpm2-pin"], false));
        }
        Some("systemd-fido2") => {
            let _ = writeln!(
                o,
                "\tfido2-credential:{SD_SEP}{}",
                sd_hex(&sd_b64(&t["fido2-credential"]))
            );
            let _ = writeln!(o, "\tfido2-salt: {}", sd_hex(&sd_b64(&t["fido2-salt"])));
            let _ = writeln!(o, "\tfido2-rp:   {}", s(&t["fido2-rp"]));
            for (k, default) in [
                ("fido2-clientPin-required", true),
                ("fido2-up-required", true),
                ("fido2-uv-required", false),
            ] {
                let _ = writeln!(o, "\t{k}:{SD_SEP}{}", sd_bool(&t[k], default));
            }
        }
        Some("systemd-pkcs11") => {
            let _ = writeln!(o, "\tpkcs11-uri: {}", s(&t["pkcs11-uri"]));
            let _ = writeln!(o, "\tpkcs11-key: {}", sd_hex(&sd_b64(&t["pkcs11-key"])));
        }
        _ => {}
    }
}
