//! `cryptblk-generator`: crypttab lines with `x-cryptblk.export=` become
//! `cryptblk@NAME.service` units in the generator's normal directory (systemd.generator(7)).

use crate::crypttab;
use crate::plan;
use crate::tang;
use crate::unit::{self, Paths};
use std::path::Path;

/// The crypttab systemd-cryptsetup-generator reads: `$SYSTEMD_CRYPTTAB`, else `/etc/crypttab`.
pub fn crypttab_path() -> String {
    std::env::var("SYSTEMD_CRYPTTAB").unwrap_or_else(|_| "/etc/crypttab".to_string())
}

/// Writes the units of `text` (the crypttab at `p.crypttab`) into `normal_dir`. Returns the
/// warnings in line order, one line each (a bad line, an ignored option); an Err only when
/// a file cannot be written.
pub fn generate(text: &str, normal_dir: &Path, p: &Paths) -> std::io::Result<Vec<String>> {
    let mut warnings = Vec::new();
    let (entries, bad) = crypttab::parse(text);
    let mut bad = bad.into_iter().peekable();
    let mut flush_bad = |upto: usize, warnings: &mut Vec<String>| {
        while let Some(b) = bad.next_if(|b| b.line < upto) {
            warnings.push(format!(
                "{}:{}: {}; line ignored",
                p.crypttab, b.line, b.message
            ));
        }
    };
    let mut seen = std::collections::HashSet::new();
    for e in &entries {
        flush_bad(e.line, &mut warnings);
        let mut ignored = Vec::new();
        let mut v = match plan::plan(e, &mut |m| ignored.push(m)) {
            Ok(Some(v)) => v,
            Ok(None) => continue,
            Err(m) => {
                warnings.push(format!("{}:{}: {m}; line ignored", p.crypttab, e.line));
                continue;
            }
        };
        // Tokens are tried only without a key file; a tang token then needs the network.
        if !v.netdev && v.tokens && v.key_file.is_none() {
            let header = v.header.as_deref().unwrap_or(v.device.path());
            if matches!(v.device, plan::Device::Node(_) | plan::Device::File(_))
                && tang::bound_to_tang(Path::new(header))
            {
                v.netdev = true;
            }
        }
        for m in ignored {
            warnings.push(format!("{}:{}: {m}", p.crypttab, e.line));
        }
        if !seen.insert(v.name.clone()) {
            warnings.push(format!(
                "{}:{}: volume {} is named twice; line ignored",
                p.crypttab, e.line, v.name
            ));
            continue;
        }
        let text = match unit::service(&v, p) {
            Ok(t) => t,
            Err(m) => {
                warnings.push(format!("{}:{}: {m}; line ignored", p.crypttab, e.line));
                continue;
            }
        };
        let name = unit::unit_name(&v.name);
        std::fs::write(normal_dir.join(&name), text)?;
        if !v.noauto {
            let dep = if v.nofail { "wants" } else { "requires" };
            let d = normal_dir.join(format!("{}.{dep}", unit::target(&v)));
            std::fs::create_dir_all(&d)?;
            let link = d.join(&name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(format!("../{name}"), link)?;
        }
        if let Ok(Some((dev, file, text))) = unit::device_timeout(&v) {
            let d = normal_dir.join(format!("{dev}.d"));
            std::fs::create_dir_all(&d)?;
            std::fs::write(d.join(file), text)?;
        }
    }
    flush_bad(usize::MAX, &mut warnings);
    Ok(warnings)
}
