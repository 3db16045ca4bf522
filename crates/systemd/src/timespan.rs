//! systemd.time(7) time spans (`30s`, `1min 30s`, `2h`, a bare number is seconds), for the
//! crypttab options that take one. Hand-written because no maintained crate parses systemd's
//! unit names (`min`, `usec`, `M` for month...) exactly, and the generator needs only this.

/// Seconds in `s` (fractions kept); `infinity` is None. Errors name the bad part.
pub fn parse_seconds(s: &str) -> Result<Option<f64>, String> {
    let s = s.trim();
    if s == "infinity" {
        return Ok(None);
    }
    if s.is_empty() {
        return Err("empty time span".to_string());
    }
    let mut total = 0.0;
    let mut rest = s;
    while !rest.is_empty() {
        rest = rest.trim_start();
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(format!("'{s}' is not a time span"));
        }
        let n: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("'{s}' is not a time span"))?;
        rest = rest[num_len..].trim_start();
        let unit_len = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let factor = match &rest[..unit_len] {
            "" | "s" | "sec" | "second" | "seconds" => 1.0,
            "us" | "usec" | "µs" => 1e-6,
            "ms" | "msec" => 1e-3,
            "m" | "min" | "minute" | "minutes" => 60.0,
            "h" | "hr" | "hour" | "hours" => 3600.0,
            "d" | "day" | "days" => 86400.0,
            "w" | "week" | "weeks" => 604800.0,
            "M" | "month" | "months" => 2629800.0,
            "y" | "year" | "years" => 31557600.0,
            u => return Err(format!("unknown time unit '{u}' in '{s}'")),
        };
        total += n * factor;
        rest = &rest[unit_len..];
    }
    Ok(Some(total))
}

#[cfg(test)]
mod tests {
    use super::parse_seconds;

    #[test]
    fn spans() {
        assert_eq!(parse_seconds("30").unwrap(), Some(30.0));
        assert_eq!(parse_seconds("1min 30s").unwrap(), Some(90.0));
        assert_eq!(parse_seconds("2h").unwrap(), Some(7200.0));
        assert_eq!(parse_seconds("500ms").unwrap(), Some(0.5));
        assert_eq!(parse_seconds("infinity").unwrap(), None);
        assert!(parse_seconds("soon").is_err());
        assert!(parse_seconds("3 parsecs").is_err());
        assert!(parse_seconds("").is_err());
    }
}
