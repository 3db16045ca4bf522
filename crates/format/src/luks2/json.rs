//! JSON helpers for LUKS2 metadata: the JSON area framing rules, uint64-as-string values,
//! and the two text forms cryptsetup produces (compact on disk, json-c "pretty" for
//! `--dump-json-metadata`).

use crate::error::{FormatError, Result};
use serde_json::{Map, Value};

/// Parses a JSON area (everything after the binary header up to hdr_size).
///
/// Rules (as cryptsetup enforces them): the area starts with `{`, holds exactly one JSON
/// value, is followed by at least one NUL byte and nothing but NUL bytes after it. Returns the
/// value and the length of the JSON text.
pub fn parse_area(area: &[u8]) -> Result<(Value, usize)> {
    if area.first() != Some(&b'{') {
        return Err(FormatError::Corrupt("JSON area must start with '{'".into()));
    }
    let mut stream = serde_json::Deserializer::from_slice(area).into_iter::<Value>();
    let value = match stream.next() {
        Some(Ok(v)) => v,
        Some(Err(e)) => {
            return Err(FormatError::Corrupt(format!(
                "JSON area does not parse: {e}"
            )));
        }
        None => return Err(FormatError::Corrupt("JSON area is empty".into())),
    };
    let end = stream.byte_offset();
    if end >= area.len() {
        return Err(FormatError::Corrupt(
            "JSON area lacks the terminating NUL byte".into(),
        ));
    }
    if let Some(pos) = area[end..].iter().position(|&b| b != 0) {
        return Err(FormatError::Corrupt(format!(
            "forbidden byte 0x{:02x} after the JSON text at offset {}",
            area[end + pos],
            end + pos
        )));
    }
    if !value.is_object() {
        return Err(FormatError::Corrupt(
            "JSON metadata is not an object".into(),
        ));
    }
    Ok((value, end))
}

/// The compact text written to disk (no whitespace, `/` not escaped), like json-c's
/// `JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE`.
pub fn to_compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// The text cryptsetup prints for `luksDump --dump-json-metadata` (json-c's pretty format:
/// two-space indent, no space after `:`, empty containers still broken over two lines).
pub fn to_pretty(v: &Value) -> String {
    let mut out = String::new();
    pretty(v, 0, &mut out);
    out
}

fn indent(out: &mut String, level: usize) {
    for _ in 0..level {
        out.push_str("  ");
    }
}

fn pretty(v: &Value, level: usize, out: &mut String) {
    match v {
        Value::Object(m) => {
            out.push_str("{\n");
            for (i, (k, val)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(",\n");
                }
                indent(out, level + 1);
                out.push_str(&serde_json::to_string(k).unwrap_or_default());
                out.push(':');
                pretty(val, level + 1, out);
            }
            if !m.is_empty() {
                out.push('\n');
            }
            indent(out, level);
            out.push('}');
        }
        Value::Array(a) => {
            out.push_str("[\n");
            for (i, val) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(",\n");
                }
                indent(out, level + 1);
                pretty(val, level + 1, out);
            }
            if !a.is_empty() {
                out.push('\n');
            }
            indent(out, level);
            out.push(']');
        }
        other => out.push_str(&serde_json::to_string(other).unwrap_or_default()),
    }
}

/// True for a non-empty string of ASCII digits (cryptsetup's `numbered()` test, used on object
/// keys and uint64 strings).
pub fn numbered(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit())
}

/// A LUKS2 uint64 stored as a decimal string: digits only, no sign, no overflow.
pub fn str_u64(s: &str) -> Option<u64> {
    if !numbered(s) {
        return None;
    }
    s.parse::<u64>().ok()
}

/// The uint64 under `key` of `obj` when it is a valid decimal string.
pub fn get_u64_str(obj: &Value, key: &str) -> Option<u64> {
    obj.get(key).and_then(Value::as_str).and_then(str_u64)
}

/// A uint64 as LUKS2 stores it.
pub fn u64_value(v: u64) -> Value {
    Value::String(v.to_string())
}

/// True when `v` is a JSON integer (not a float).
pub fn is_int(v: &Value) -> bool {
    v.is_i64() || v.is_u64()
}

/// The integer under `key` when it fits in u32.
pub fn get_u32(obj: &Value, key: &str) -> Option<u32> {
    obj.get(key)
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
}

/// The non-empty string under `key`.
pub fn get_str<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// The object under `key`.
pub fn get_obj<'a>(obj: &'a Value, key: &str) -> Option<&'a Map<String, Value>> {
    obj.get(key).and_then(Value::as_object)
}

/// Iterates the numeric keys of an object in ascending numeric order.
pub fn numeric_keys(obj: &Map<String, Value>) -> Vec<(u64, &String)> {
    let mut keys: Vec<(u64, &String)> = obj
        .keys()
        .filter_map(|k| str_u64(k).map(|n| (n, k)))
        .collect();
    keys.sort();
    keys
}

/// True when the JSON array `arr` holds the string `name`.
pub fn array_has(arr: Option<&Value>, name: &str) -> bool {
    arr.and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|v| v.as_str() == Some(name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn area_framing_rules() {
        let mut a = b"{\"a\":1}".to_vec();
        a.resize(32, 0);
        let (v, end) = parse_area(&a).unwrap();
        assert_eq!(end, 7);
        assert_eq!(v["a"], 1);
        let mut bad = a.clone();
        bad[7] = b'x';
        assert!(parse_area(&bad).is_err());
        let mut bad = a.clone();
        bad[20] = b' ';
        assert!(parse_area(&bad).is_err());
        assert!(
            parse_area(b"{\"a\":1}").is_err(),
            "needs a NUL after the text"
        );
        assert!(parse_area(b" {\"a\":1}\0").is_err());
        assert!(parse_area(b"[1]\0").is_err());
    }

    #[test]
    fn uint64_strings() {
        assert_eq!(str_u64("18446744073709551615"), Some(u64::MAX));
        assert_eq!(str_u64("18446744073709551616"), None);
        assert_eq!(str_u64("-1"), None);
        assert_eq!(str_u64(""), None);
        assert_eq!(str_u64("1 "), None);
    }

    #[test]
    fn pretty_matches_json_c_layout() {
        let v: Value = serde_json::from_str(r#"{"a":{},"b":["0","1"],"c":{"d":1}}"#).unwrap();
        assert_eq!(
            to_pretty(&v),
            "{\n  \"a\":{\n  },\n  \"b\":[\n    \"0\",\n    \"1\"\n  ],\n  \"c\":{\n    \"d\":1\n  }\n}"
        );
    }
}
