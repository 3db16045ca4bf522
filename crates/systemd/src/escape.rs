//! systemd's name escaping, as `systemd-escape` and `systemd-escape --path` do it, and the
//! device node udev makes for an fstab/crypttab tag (`UUID=`, `LABEL=`, ...).
//!
//! Written here rather than linked from libsystemd: the rules are a few lines (systemd.unit(5),
//! "STRING ESCAPING FOR INCLUSION IN UNIT NAMES"), and the generator must not depend on a
//! library that is absent in minimal initrds. `tests/escape.rs` checks them against the real
//! `systemd-escape`.

/// Escapes `s` for a unit name as `systemd-escape STRING`: `/` becomes `-`; ASCII letters,
/// digits, `:`, `_` and `.` (except a leading `.`) stay; every other byte becomes `\xHH`.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for (i, &b) in s.as_bytes().iter().enumerate() {
        match b {
            b'/' => out.push('-'),
            b'.' if i == 0 => out.push_str("\\x2e"),
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b':' | b'_' | b'.' => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out
}

/// Escapes an absolute path as `systemd-escape --path`: duplicate and trailing slashes and
/// `.` components are dropped, `/` alone is `-`, the leading and trailing `/` go, then
/// [`escape`]. A path with a `..` component or that is not absolute is refused, as
/// systemd refuses a non-normalized path.
pub fn escape_path(path: &str) -> Result<String, String> {
    if !path.starts_with('/') {
        return Err(format!("'{path}' is not an absolute path"));
    }
    let mut parts = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(format!("'{path}' is not a normalized path")),
            c => parts.push(c),
        }
    }
    if parts.is_empty() {
        return Ok("-".to_string());
    }
    Ok(escape(&parts.join("/")))
}

/// The `.device` unit of device node `path` (`/dev/sdb1` -> `dev-sdb1.device`).
pub fn device_unit(path: &str) -> Result<String, String> {
    Ok(format!("{}.device", escape_path(path)?))
}

/// The node udev links for a crypttab/fstab tag (`UUID=`, `PARTUUID=`, `LABEL=`,
/// `PARTLABEL=`): `/dev/disk/by-uuid/VALUE` and so on, the value encoded as udev encodes
/// names in `/dev/disk/by-*` (bytes other than ASCII letters, digits and `#+-.:=@_`, and
/// not part of a valid UTF-8 multi-byte character, become `\xHH`). None for other text.
pub fn tag_node(spec: &str) -> Option<String> {
    let (tag, value) = spec.split_once('=')?;
    let by = match tag {
        "UUID" => "uuid",
        "PARTUUID" => "partuuid",
        "LABEL" => "label",
        "PARTLABEL" => "partlabel",
        _ => return None,
    };
    let mut enc = String::new();
    for ch in value.chars() {
        if ch.len_utf8() > 1 || ch.is_ascii_alphanumeric() || "#+-.:=@_".contains(ch) {
            enc.push(ch);
        } else {
            enc.push_str(&format!("\\x{:02x}", ch as u32));
        }
    }
    Some(format!("/dev/disk/by-{by}/{enc}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_escaping_follows_the_documented_examples() {
        // systemd.unit(5): "/dev/disk/by-label/rootfs" (sic, the example in the manual).
        assert_eq!(
            escape_path("/dev/disk/by-uuid/12ab").unwrap(),
            "dev-disk-by\\x2duuid-12ab"
        );
        assert_eq!(escape_path("/").unwrap(), "-");
        assert_eq!(escape_path("//dev//sda/").unwrap(), "dev-sda");
        assert!(escape_path("/dev/../x").is_err());
        assert!(escape_path("dev/sda").is_err());
        assert_eq!(escape(".hidden/a b"), "\\x2ehidden-a\\x20b");
    }

    #[test]
    fn tags_become_udev_nodes() {
        assert_eq!(
            tag_node("UUID=1234-ab").as_deref(),
            Some("/dev/disk/by-uuid/1234-ab")
        );
        assert_eq!(
            tag_node("LABEL=my disk/x").as_deref(),
            Some("/dev/disk/by-label/my\\x20disk\\x2fx")
        );
        assert_eq!(tag_node("/dev/sda"), None);
        assert_eq!(tag_node("FOO=bar"), None);
    }
}
