//! Table text: `<start> <len> <target> <args...>` lines split and checked for shape
//! (contiguous from sector 0, non-zero lengths), before any target parses its arguments.
//! Both the typed tables ([`crate::spec`]) and the built ones ([`crate::table`]) start here.

use crate::error::DmError;
use crate::SECTOR_SIZE;

/// One parsed (not yet built) table line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableLine {
    /// 1-based line number in the source text (for error messages).
    pub line: usize,
    /// First sector covered.
    pub start: u64,
    /// Number of sectors covered.
    pub len: u64,
    /// Target type name.
    pub target_type: String,
    /// Target arguments, whitespace-split.
    pub args: Vec<String>,
}

/// Splits table text into lines and checks their shape: blank lines and `#` comments are
/// skipped; lines must be contiguous from sector 0 with non-zero lengths.
pub fn parse_table_lines(text: &str) -> Result<Vec<TableLine>, DmError> {
    let mut lines = Vec::new();
    let mut next_start = 0u64;
    for (i, raw) in text.lines().enumerate() {
        let lineno = i + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let mut fields = trimmed.split_whitespace();
        let start_s = fields.next().unwrap_or_default();
        let start: u64 = start_s.parse().map_err(|_| {
            DmError::table(
                lineno,
                format!("invalid <start> '{start_s}' (expected sectors)"),
            )
        })?;
        let len_s = fields
            .next()
            .ok_or_else(|| DmError::table(lineno, "missing <length> and <target>"))?;
        let len: u64 = len_s.parse().map_err(|_| {
            DmError::table(
                lineno,
                format!("invalid <length> '{len_s}' (expected sectors)"),
            )
        })?;
        let target_type = fields
            .next()
            .ok_or_else(|| DmError::table(lineno, "missing <target> type"))?
            .to_string();
        if len == 0 {
            return Err(DmError::table(lineno, "zero-length target"));
        }
        if start != next_start {
            return Err(DmError::table(
                lineno,
                format!("target starts at sector {start} but the previous one ends at {next_start} (a table must be contiguous from 0)"),
            ));
        }
        next_start = start
            .checked_add(len)
            .filter(|end| end.checked_mul(SECTOR_SIZE).is_some())
            .ok_or_else(|| DmError::table(lineno, "table end overflows"))?;
        lines.push(TableLine {
            line: lineno,
            start,
            len,
            target_type,
            args: fields.map(str::to_string).collect(),
        });
    }
    if lines.is_empty() {
        return Err(DmError::TableShape("table has no targets".into()));
    }
    Ok(lines)
}
