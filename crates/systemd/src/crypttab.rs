//! crypttab(5): one volume a line, `NAME DEVICE [KEY-FILE [OPTIONS]]`, fields separated by
//! spaces or tabs, `#` starting a comment line.
//!
//! Quoting follows systemd's reading of the file: a field may be wrapped in `"..."` or
//! `'...'` (or have quoted parts), a backslash outside single quotes takes the next character
//! literally; in the options field a backslash-escaped comma does not separate options.
//! A key file of `none` or `-` (or none given) means "ask" (see [`Entry::key_file`]).

/// One volume line of a crypttab.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Line number (1-based), for messages.
    pub line: usize,
    /// The volume name (first field).
    pub name: String,
    /// The encrypted device as written: a path, or `UUID=`, `PARTUUID=`, `LABEL=`,
    /// `PARTLABEL=`.
    pub device: String,
    /// The key file; None when absent, `none` or `-` (ask for a passphrase).
    pub key_file: Option<String>,
    /// The options in order, each `name` or `name=value`.
    pub options: Vec<CryptOption>,
}

/// One crypttab option.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CryptOption {
    /// The option name (before `=`).
    pub name: String,
    /// The value after the first `=`, if any.
    pub value: Option<String>,
}

/// A line that could not be read: its number and why (one line, for one warning).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadLine {
    /// Line number (1-based).
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// Reads a whole crypttab: the volume lines, and one [`BadLine`] per line that is not one
/// (which systemd also skips with a message).
pub fn parse(text: &str) -> (Vec<Entry>, Vec<BadLine>) {
    let mut entries = Vec::new();
    let mut bad = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let trimmed = raw.trim_matches(|c| c == ' ' || c == '\t' || c == '\r');
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        match parse_line(trimmed) {
            Ok(fields) => match fields.len() {
                2..=4 => {
                    let mut f = fields.into_iter();
                    let name = f.next().unwrap_or_default();
                    let device = f.next().unwrap_or_default();
                    let key_file = f
                        .next()
                        .filter(|k| !matches!(k.as_str(), "none" | "-" | ""));
                    let options = f.next().map(|o| split_options(&o)).unwrap_or_default();
                    entries.push(Entry {
                        line,
                        name,
                        device,
                        key_file,
                        options,
                    });
                }
                n => bad.push(BadLine {
                    line,
                    message: format!("{n} fields, a crypttab line has 2 to 4"),
                }),
            },
            Err(message) => bad.push(BadLine { line, message }),
        }
    }
    (entries, bad)
}

/// Splits a line into fields, honouring quotes and backslashes.
fn parse_line(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut in_field = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if in_field {
                    fields.push(std::mem::take(&mut cur));
                    in_field = false;
                }
            }
            '\\' => {
                // Kept for the options field, where `\,` is a literal comma; elsewhere the
                // escaped character stands for itself.
                let n = chars
                    .next()
                    .ok_or_else(|| "a backslash ends the line".to_string())?;
                if n == ',' {
                    cur.push('\\');
                }
                cur.push(n);
                in_field = true;
            }
            '\'' => {
                in_field = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(',') => cur.push_str("\\,"),
                        Some(ch) => cur.push(ch),
                        None => return Err("unbalanced quote (')".to_string()),
                    }
                }
            }
            '"' => {
                in_field = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(',') => cur.push_str("\\,"),
                            Some(ch) => cur.push(ch),
                            None => return Err("unbalanced quote (\")".to_string()),
                        },
                        Some(',') => cur.push_str("\\,"),
                        Some(ch) => cur.push(ch),
                        None => return Err("unbalanced quote (\")".to_string()),
                    }
                }
            }
            c if c.is_control() => {
                return Err(format!("control character {:?} in the line", c));
            }
            c => {
                cur.push(c);
                in_field = true;
            }
        }
    }
    if in_field {
        fields.push(cur);
    }
    // Only the options field may carry a literal comma marker; elsewhere undo it.
    let n = fields.len();
    for (i, f) in fields.iter_mut().enumerate() {
        if i + 1 != n || n < 4 {
            *f = f.replace("\\,", ",");
        }
    }
    Ok(fields)
}

/// Splits the options field at commas (not at `\,`).
fn split_options(field: &str) -> Vec<CryptOption> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = field.chars().peekable();
    let mut push = |cur: &mut String| {
        let word = std::mem::take(cur);
        if word.is_empty() {
            return;
        }
        let (name, value) = match word.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (word, None),
        };
        out.push(CryptOption { name, value });
    };
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&',') => {
                cur.push(',');
                chars.next();
            }
            ',' => push(&mut cur),
            c => cur.push(c),
        }
    }
    push(&mut cur);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opt(name: &str, value: Option<&str>) -> CryptOption {
        CryptOption {
            name: name.into(),
            value: value.map(Into::into),
        }
    }

    #[test]
    fn fields_comments_and_key_forms() {
        let text = "# comment\n\n  \t\ndata UUID=12-ab /etc/k luks,discard\nswap /dev/sdb2\n\
                    home\t/dev/sda3\tnone\tx-cryptblk.export=ublk\nx /dev/x - tries=2\n";
        let (e, bad) = parse(text);
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(e.len(), 4);
        assert_eq!(e[0].line, 4);
        assert_eq!(e[0].name, "data");
        assert_eq!(e[0].device, "UUID=12-ab");
        assert_eq!(e[0].key_file.as_deref(), Some("/etc/k"));
        assert_eq!(e[0].options, vec![opt("luks", None), opt("discard", None)]);
        assert_eq!(e[1].key_file, None);
        assert!(e[1].options.is_empty());
        assert_eq!(e[2].key_file, None);
        assert_eq!(e[2].options, vec![opt("x-cryptblk.export", Some("ublk"))]);
        assert_eq!(e[3].key_file, None);
    }

    #[test]
    fn quoting_and_escaped_commas() {
        let (e, bad) = parse(
            "\"my vol\" '/dev/disk/by-label/a b' \"/etc/key file\" \
             x-cryptblk.export=fuse:\"/mnt/a,b\",header=/h\\,1,keyfile-offset=4\n",
        );
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(e[0].name, "my vol");
        assert_eq!(e[0].device, "/dev/disk/by-label/a b");
        assert_eq!(e[0].key_file.as_deref(), Some("/etc/key file"));
        assert_eq!(
            e[0].options,
            vec![
                opt("x-cryptblk.export", Some("fuse:/mnt/a,b")),
                opt("header", Some("/h,1")),
                opt("keyfile-offset", Some("4")),
            ]
        );
    }

    #[test]
    fn bad_lines_are_reported_once_each_and_the_rest_read() {
        let (e, bad) = parse("lonely\nok /dev/a\nq \"/dev/b\na b c d e\nz /dev/z\\\n");
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].name, "ok");
        assert_eq!(bad.iter().map(|b| b.line).collect::<Vec<_>>(), [1, 3, 4, 5]);
        assert!(bad[0].message.contains("1 fields"), "{bad:?}");
        assert!(bad[1].message.contains("unbalanced"), "{bad:?}");
    }
}
