//! The few lookups cryptsetup makes in CoreStorage's XML property lists, with its exact
//! acceptance rules, so that cryptblk takes and refuses the same metadata.
//!
//! cryptsetup does not parse the plist: it searches the text for the first place where the
//! ERE `<key>K</key><T[^>]*>([^<]+)</T>` matches and takes the group. Keys contain dots, which
//! the ERE reads as "any character"; an element with an empty value (`<data ID="18"></data>`)
//! does not match, so the search goes on to the next one. Numbers are read with
//! `strtoull(.., 16)` and UUIDs with libuuid's `uuid_parse`. A real XML parser would accept
//! different inputs, which is why this is hand-written.

/// True when `text` starts with `pattern`, a `.` in the pattern matching any one byte.
fn matches_at(text: &[u8], pattern: &[u8]) -> bool {
    text.len() >= pattern.len() && pattern.iter().zip(text).all(|(&p, &t)| p == b'.' || p == t)
}

/// The value of the first `<key>key</key><ty ...>value</ty>` in `xml` with a non-empty
/// value, as cryptsetup's search finds it.
pub fn search<'a>(xml: &'a [u8], key: &str, ty: &str) -> Option<&'a [u8]> {
    let head = format!("<key>{key}</key><{ty}");
    let head = head.as_bytes();
    let close = format!("</{ty}>");
    let close = close.as_bytes();
    for start in 0..xml.len() {
        if !matches_at(&xml[start..], head) {
            continue;
        }
        // `[^>]*>`: the attributes run to the first `>`.
        let rest = &xml[start + head.len()..];
        let Some(gt) = rest.iter().position(|&b| b == b'>') else {
            continue;
        };
        // `([^<]+)</ty>`: a non-empty value up to the first `<`, which must open `</ty>`.
        let value = &rest[gt + 1..];
        let Some(lt) = value.iter().position(|&b| b == b'<') else {
            continue;
        };
        if lt > 0 && value[lt..].starts_with(close) {
            return Some(&value[..lt]);
        }
    }
    None
}

/// `strtoull(text, NULL, 16)` as glibc computes it: leading white space, an optional sign and
/// `0x` prefix, then hex digits up to the first other byte; `u64::MAX` on overflow, 0 when
/// there are no digits, and a minus sign negating modulo 2^64.
pub fn strtoull_hex(text: &[u8]) -> u64 {
    let mut p = 0;
    while p < text.len() && matches!(text[p], b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r') {
        p += 1;
    }
    let mut negative = false;
    if p < text.len() && (text[p] == b'+' || text[p] == b'-') {
        negative = text[p] == b'-';
        p += 1;
    }
    // "0x" is a prefix only when a hex digit follows; otherwise the "0" is the number.
    if text.len() >= p + 3
        && text[p] == b'0'
        && (text[p + 1] | 0x20) == b'x'
        && text[p + 2].is_ascii_hexdigit()
    {
        p += 2;
    }
    let mut v: u64 = 0;
    let mut overflow = false;
    while p < text.len() {
        let Some(d) = (text[p] as char).to_digit(16) else {
            break;
        };
        match v.checked_mul(16).and_then(|v| v.checked_add(u64::from(d))) {
            Some(n) => v = n,
            None => overflow = true,
        }
        p += 1;
    }
    if overflow {
        u64::MAX
    } else if negative {
        v.wrapping_neg()
    } else {
        v
    }
}

/// The 16 bytes of a UUID in libuuid's text form (36 characters, dashes at 8, 13, 18 and 23,
/// hex digits of either case elsewhere), as `uuid_parse` accepts it.
pub fn parse_uuid(text: &[u8]) -> Option<[u8; 16]> {
    if text.len() != 36 {
        return None;
    }
    let mut out = [0u8; 16];
    let mut n = 0;
    for (i, &c) in text.iter().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            if c != b'-' {
                return None;
            }
            continue;
        }
        let d = (c as char).to_digit(16)? as u8;
        out[n / 2] |= if n % 2 == 0 { d << 4 } else { d };
        n += 1;
    }
    Some(out)
}

/// libuuid's lower-case text form of `b` (`uuid_unparse`).
pub fn uuid_text(b: &[u8; 16]) -> String {
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_skips_empty_values_and_takes_the_first_match() {
        let xml = br#"<dict><key>A</key><data ID="1"></data><key>A</key><data ID="2">QUJD</data><key>A</key><data>REVG</data></dict>"#;
        assert_eq!(search(xml, "A", "data"), Some(&b"QUJD"[..]));
        assert_eq!(search(xml, "B", "data"), None);
        // A value must be closed by the same element.
        assert_eq!(search(b"<key>A</key><data>x</string>", "A", "data"), None);
        // The dots of a key are wildcards in cryptsetup's ERE.
        assert_eq!(
            search(
                b"<key>comXapple</key><string>v</string>",
                "com.apple",
                "string"
            ),
            Some(&b"v"[..])
        );
        // The element name is a prefix match (`<T[^>]*>`).
        assert_eq!(
            search(b"<key>A</key><datax y>v</data>", "A", "data"),
            Some(&b"v"[..])
        );
    }

    #[test]
    fn strtoull_as_glibc() {
        assert_eq!(strtoull_hex(b"0xa000000"), 0xa00_0000);
        assert_eq!(strtoull_hex(b"  0XfF junk"), 255);
        assert_eq!(strtoull_hex(b"ff"), 255);
        assert_eq!(strtoull_hex(b"0x"), 0);
        assert_eq!(strtoull_hex(b"zz"), 0);
        assert_eq!(strtoull_hex(b"-1"), u64::MAX);
        assert_eq!(strtoull_hex(b"-0x10"), 0u64.wrapping_sub(16));
        assert_eq!(strtoull_hex(b"10000000000000000"), u64::MAX);
        assert_eq!(strtoull_hex(b"ffffffffffffffff"), u64::MAX);
    }

    #[test]
    fn uuids_as_libuuid() {
        let u = parse_uuid(b"33A76CAA-1481-4bc5-8D04-1AC1707C19C0").unwrap();
        assert_eq!(uuid_text(&u), "33a76caa-1481-4bc5-8d04-1ac1707c19c0");
        assert!(parse_uuid(b"33A76CAA14814bc58D041AC1707C19C0").is_none());
        assert!(parse_uuid(b"33A76CAA-1481-4bc5-8D04-1AC1707C19C").is_none());
        assert!(parse_uuid(b"33A76CAA-1481-4bc5-8D04+1AC1707C19C0").is_none());
        assert!(parse_uuid(b"33A76CAG-1481-4bc5-8D04-1AC1707C19C0").is_none());
    }
}
