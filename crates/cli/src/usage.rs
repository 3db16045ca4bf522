//! `--usage`: cryptsetup's (popt's) short usage, every option in brackets on lines of at
//! most 80 columns, printed on standard error (as popt prints it) with exit code 0 wherever
//! `--usage` stands.
//! Written here because clap has no popt-style usage listing.

use clap::CommandFactory;

/// True when `args` (without the program name) ask for `--usage` before any `--`.
pub fn asked(args: &[String]) -> bool {
    args.iter()
        .take_while(|a| a.as_str() != "--")
        .any(|a| a == "--usage")
}

/// The usage text for `program`, ending in a newline.
pub fn text(program: &str) -> String {
    let mut cmd = crate::args::Cli::command();
    cmd.build();
    let mut items = vec![
        "[--help]".to_string(),
        "[--usage]".to_string(),
        "[-V|--version]".to_string(),
    ];
    let mut options: Vec<(String, String)> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !a.is_positional())
        .filter_map(|a| {
            let long = a.get_long()?;
            if long == "help" {
                return None;
            }
            let takes = a.get_num_args().is_some_and(|n| n.takes_values());
            let name = match a.get_short() {
                Some(s) => format!("-{s}|--{long}"),
                None => format!("--{long}"),
            };
            let value = a
                .get_value_names()
                .and_then(|v| v.first())
                .map_or_else(|| "STRING".to_string(), |v| v.to_string());
            Some((
                long.to_string(),
                if takes {
                    format!("[{name}={value}]")
                } else {
                    format!("[{name}]")
                },
            ))
        })
        .collect();
    options.sort();
    items.extend(options.into_iter().map(|(_, item)| item));
    items.push("[OPTION...]".to_string());
    items.push("<action> <action-specific>".to_string());
    let mut out = String::new();
    let mut line = format!("Usage: {program}");
    for item in items {
        if line.len() + 1 + item.len() > 79 && !line.trim().is_empty() {
            out.push_str(&line);
            out.push('\n');
            line = " ".repeat(7);
        }
        line.push(' ');
        line.push_str(&item);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_options_in_lines_of_80_columns() {
        let t = text("cryptblk");
        assert!(t.starts_with("Usage: cryptblk [--help] [--usage] [-V|--version]"));
        assert!(t.contains("[-q|--batch-mode]"), "{t}");
        assert!(t.contains("[-c|--cipher="), "{t}");
        assert!(t.ends_with("<action> <action-specific>\n"), "{t}");
        assert!(t.lines().all(|l| l.len() <= 80), "{t}");
    }

    #[test]
    fn asked_anywhere_before_the_end_of_options() {
        let v = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert!(asked(&v("--usage")));
        assert!(asked(&v("open --usage x")));
        assert!(!asked(&v("open -- --usage")));
    }
}
