//! Reading and rewriting table text for control requests: `refresh`'s new crypt flags,
//! `status`'s pipelines, and which tables name a lower mapping (`dm remove`'s busy check).

use cryptblk_dm::table::parse_table_lines;
use cryptblk_dm::targets::crypt::CryptFlags;
use cryptblk_volume::control::{Pipeline, Queueing};

/// True if a table names device `name` (as `name` or `/dev/mapper/name`).
pub(super) fn table_names_device(table: &str, name: &str) -> bool {
    let dev = format!("/dev/mapper/{name}");
    parse_table_lines(table).is_ok_and(|lines| {
        lines
            .iter()
            .any(|l| l.args.iter().any(|a| a == name || *a == dev))
    })
}

/// The live table with every crypt line's activation flags (`allow_discards` and the four
/// pipeline flags) replaced by `perf`, as cryptsetup's refresh sets them from the command
/// line alone; the line's format options (`sector_size:`, `iv_large_sectors`, `integrity:`,
/// `integrity_key_size:`) are kept, so a refresh never changes how sectors are encrypted.
pub(super) fn refreshed_table(table: &str, perf: &[String]) -> Result<String, String> {
    let lines = parse_table_lines(table).map_err(|e| e.to_string())?;
    let given = CryptFlags::parse(perf)?;
    let mut out = String::new();
    for l in lines {
        let mut args = l.args.clone();
        if l.target_type == "crypt" && args.len() >= 5 {
            let opts: &[String] = if args.len() > 6 { &args[6..] } else { &[] };
            let f = CryptFlags {
                allow_discards: given.allow_discards,
                same_cpu_crypt: given.same_cpu_crypt,
                submit_from_crypt_cpus: given.submit_from_crypt_cpus,
                no_read_workqueue: given.no_read_workqueue,
                no_write_workqueue: given.no_write_workqueue,
                ..CryptFlags::parse(opts)?
            };
            args.truncate(5);
            let formatted = f.format();
            if !formatted.is_empty() {
                args.push(formatted.len().to_string());
                args.extend(formatted);
            }
        }
        let mut fields = vec![
            l.start.to_string(),
            l.len.to_string(),
            l.target_type.clone(),
        ];
        fields.extend(args);
        out.push_str(&fields.join(" "));
        out.push('\n');
    }
    Ok(out)
}

/// For `status`: the pipeline of each crypt line per direction, read from its flags.
pub(super) fn crypt_pipelines(table: &str) -> Vec<Pipeline> {
    let Ok(lines) = parse_table_lines(table) else {
        return Vec::new();
    };
    lines
        .iter()
        .filter(|l| l.target_type == "crypt")
        .map(|l| {
            let opts: &[String] = if l.args.len() > 6 { &l.args[6..] } else { &[] };
            let f = CryptFlags::parse(opts).unwrap_or_default();
            let queueing = |inline| {
                if inline {
                    Queueing::Inline
                } else {
                    Queueing::Queued
                }
            };
            Pipeline {
                start: l.start,
                read: queueing(f.no_read_workqueue),
                write: queueing(f.no_write_workqueue),
                flags: f.format(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refresh_replaces_only_activation_flags() {
        let t = "0 8 crypt aes-xts-plain64 00 0 /dev/x 0 3 allow_discards sector_size:4096 same_cpu_crypt\n";
        let out = refreshed_table(
            t,
            &["no_read_workqueue".into(), "no_write_workqueue".into()],
        )
        .unwrap();
        assert_eq!(
            out,
            "0 8 crypt aes-xts-plain64 00 0 /dev/x 0 3 no_read_workqueue no_write_workqueue sector_size:4096\n"
        );
        let queued = refreshed_table(&out, &["allow_discards".into()]).unwrap();
        assert_eq!(
            queued,
            "0 8 crypt aes-xts-plain64 00 0 /dev/x 0 2 allow_discards sector_size:4096\n"
        );
    }

    #[test]
    fn refresh_keeps_authenticated_encryption_options() {
        let t = "0 8 crypt capi:authenc(hmac(sha256),xts(aes))-random 00 0 /dev/x 0 3 \
                 integrity:32:aead integrity_key_size:40 sector_size:4096\n";
        let out = refreshed_table(t, &["no_read_workqueue".into()]).unwrap();
        assert_eq!(
            out,
            "0 8 crypt capi:authenc(hmac(sha256),xts(aes))-random 00 0 /dev/x 0 4 \
             no_read_workqueue integrity:32:aead integrity_key_size:40 sector_size:4096\n"
        );
    }

    #[test]
    fn users_of_a_lower_mapping_are_found_by_name_or_mapper_path() {
        let t = "0 8 crypt capi:gcm(aes)-random 00 0 /dev/mapper/x_dif 0 1 integrity:28:aead\n";
        assert!(table_names_device(t, "x_dif"));
        assert!(!table_names_device(t, "x"));
        assert!(table_names_device("0 8 linear x_dif 0\n", "x_dif"));
        assert!(!table_names_device(
            "0 8 linear /dev/mapper/x_dif2 0\n",
            "x_dif"
        ));
    }

    #[test]
    fn refresh_leaves_other_targets_alone() {
        let t = "0 8 linear /dev/x 0\n8 8 zero\n";
        assert_eq!(
            refreshed_table(t, &["no_read_workqueue".into()]).unwrap(),
            t
        );
    }
}
