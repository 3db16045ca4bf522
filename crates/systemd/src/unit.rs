//! The `cryptblk@NAME.service` unit of a crypttab line.
//!
//! Modelled on systemd-cryptsetup-generator's `systemd-cryptsetup@NAME.service` (facts from
//! crypttab(5) and systemd-cryptsetup-generator(8)): no default dependencies, ordered before
//! `cryptsetup.target` (`remote-cryptsetup.target` for `_netdev`, after the network), bound
//! to the encrypted device's `.device` unit, stopped at `umount.target` after the file
//! systems on it. The difference: the volume is a serving process, so the unit is
//! `Type=notify` (`cryptblk open --foreground` sends `READY=1` once the export accepts I/O)
//! and is restarted on failure where the export survives its process.

use crate::escape;
use crate::plan::{Device, Volume};
use std::fmt::Write;

/// Paths the unit refers to.
#[derive(Clone, Debug)]
pub struct Paths {
    /// The cryptblk binary.
    pub cryptblk: String,
    /// `systemd-ask-password`.
    pub ask_password: String,
    /// A POSIX shell (only for volumes without a key file).
    pub sh: String,
    /// The crypttab the unit comes from (`SourcePath=`).
    pub crypttab: String,
}

/// The cryptblk binary units run, unless `CRYPTBLK_BIN` is set when building.
pub const CRYPTBLK_BIN: &str = match option_env!("CRYPTBLK_BIN") {
    Some(p) => p,
    None => "/usr/bin/cryptblk",
};

/// The cryptblk binary installed beside a generator at `exe`: a generator in
/// `PREFIX/lib/systemd/system-generators/` runs `PREFIX/bin/cryptblk` when that exists, so
/// units name the binary of the same installation whatever prefix `scripts/install.sh` was
/// given (systemd reads generators under /usr/lib and /usr/local/lib alike).
pub fn cryptblk_beside(exe: &std::path::Path) -> Option<String> {
    let dir = exe.parent()?;
    if !dir.ends_with("lib/systemd/system-generators") {
        return None;
    }
    let bin = dir.parent()?.parent()?.parent()?.join("bin/cryptblk");
    bin.is_file().then(|| bin.to_string_lossy().into_owned())
}

impl Default for Paths {
    /// The installed paths. The cryptblk binary: `$CRYPTBLK_BIN` at run time (tests, and
    /// packagers checking their units before installing), else the one installed beside the
    /// running generator ([`cryptblk_beside`]), else [`CRYPTBLK_BIN`].
    fn default() -> Self {
        let beside = || {
            std::env::current_exe()
                .ok()
                .and_then(|exe| cryptblk_beside(&exe))
        };
        Paths {
            cryptblk: std::env::var("CRYPTBLK_BIN")
                .ok()
                .or_else(beside)
                .unwrap_or_else(|| CRYPTBLK_BIN.to_string()),
            ask_password: "/usr/bin/systemd-ask-password".to_string(),
            sh: "/bin/sh".to_string(),
            crypttab: "/etc/crypttab".to_string(),
        }
    }
}

/// The unit name of volume `name`: `cryptblk@<systemd-escape NAME>.service`.
pub fn unit_name(name: &str) -> String {
    format!("cryptblk@{}.service", escape::escape(name))
}

/// The device unit of the block device that serves volume `v` (`dev-cryptblk-NAME.device`,
/// for `/dev/cryptblk/NAME`, which the udev rule links to a ublk export), or None when the
/// export is no block device of this machine (NBD, vhost-user, FUSE).
pub fn served_device(v: &Volume) -> Result<Option<String>, String> {
    match v.export {
        crate::plan::Export::Ublk => {
            escape::device_unit(&format!("/dev/cryptblk/{}", v.name)).map(Some)
        }
        _ => Ok(None),
    }
}

/// The target that pulls volume `v` in.
pub fn target(v: &Volume) -> &'static str {
    if v.netdev {
        "remote-cryptsetup.target"
    } else {
        "cryptsetup.target"
    }
}

/// Run by `sh -c` when the line has no key file. Positional parameters: NAME TRIES HEADLESS
/// TOKENS DEVICE ASK-PASSWORD, then the `cryptblk open` command without key options. In
/// order, as systemd-cryptsetup: a key file `/etc/cryptsetup-keys.d/NAME.key` or
/// `/run/cryptsetup-keys.d/NAME.key`; the header's tokens (checked with
/// `--token-only --test-passphrase`, then opened for real by `exec`, so cryptblk is the main
/// process); unless headless, `systemd-ask-password -n` piped into `--key-file -` (the
/// passphrase never on a command line; TOKENS 0, a plain/TCRYPT/BitLocker volume: the line
/// as a passphrase on standard input instead, which cryptblk reads to the newline), up to
/// TRIES times (0: without end) while cryptblk answers 2, a wrong passphrase. The shell stays the main process then, so the unit has
/// `NotifyAccess=all`; `WATCHDOG_PID` is dropped because it names the shell.
pub const UNLOCK_SCRIPT: &str = concat!(
    "name=$1; tries=$2; headless=$3; tokens=$4; dev=$5; ask=$6; shift 6; ",
    "for k in \"/etc/cryptsetup-keys.d/$name.key\" \"/run/cryptsetup-keys.d/$name.key\"; do ",
    "if [ -e \"$k\" ]; then exec \"$@\" --key-file \"$k\" --foreground -- \"$dev\" \"$name\"; fi; ",
    "done; ",
    "if [ \"$tokens\" = 1 ] && \"$@\" --token-only --test-passphrase -- \"$dev\" \"$name\" ",
    "</dev/null; then exec \"$@\" --token-only --foreground -- \"$dev\" \"$name\"; fi; ",
    "if [ \"$headless\" = 1 ]; then echo \"cryptblk: no key file or token opens $dev ",
    "(headless: not asking)\" >&2; exit 2; fi; ",
    "unset WATCHDOG_PID; i=0; ",
    "while [ \"$tries\" = 0 ] || [ \"$i\" -lt \"$tries\" ]; do i=$((i+1)); ",
    "if [ \"$tokens\" = 1 ]; then ",
    "\"$ask\" -n --id=\"cryptblk:$name\" \"Please enter passphrase for disk $name:\" | ",
    "\"$@\" --key-file - --foreground -- \"$dev\" \"$name\"; rc=$?; ",
    "else \"$ask\" --id=\"cryptblk:$name\" \"Please enter passphrase for disk $name:\" | ",
    "\"$@\" --foreground -- \"$dev\" \"$name\"; rc=$?; fi; ",
    "if [ \"$rc\" != 2 ]; then exit \"$rc\"; fi; done; exit 2",
);

/// One argument of an `Exec*=` line, quoted for systemd's command-line parser
/// (systemd.service(5) "COMMAND LINES"): plain words stay, anything else is double-quoted
/// with `\` and `"` escaped; `%` (specifiers) and `$` (variables) are doubled everywhere.
pub fn exec_arg(a: &str) -> String {
    let plain = !a.is_empty()
        && a.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/_.:,=+@-".contains(&b));
    if plain {
        return a.to_string();
    }
    let mut q = String::from("\"");
    for c in a.chars() {
        match c {
            '\\' => q.push_str("\\\\"),
            '"' => q.push_str("\\\""),
            '%' => q.push_str("%%"),
            '$' => q.push_str("$$"),
            '\n' => q.push_str("\\n"),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

/// A value of a unit setting that takes free text: specifiers escaped.
fn text(s: &str) -> String {
    s.replace('%', "%%")
}

/// A path in a dependency setting (`RequiresMountsFor=`): specifiers escaped, and a path
/// with spaces quoted (the setting takes a space-separated list).
fn path_value(s: &str) -> String {
    if s.contains(char::is_whitespace) || s.contains('"') || s.contains('\\') {
        exec_arg(s)
    } else {
        text(s)
    }
}

/// The argv of the `ExecStart=` line of `v`.
pub fn exec_start(v: &Volume, p: &Paths) -> Vec<String> {
    let mut open = vec![p.cryptblk.clone(), "open".to_string()];
    open.extend(v.args.iter().cloned());
    open.extend(v.export.args());
    let positional = [
        "--".to_string(),
        v.device.path().to_string(),
        v.name.clone(),
    ];
    match (&v.key_file, &v.passphrase_file) {
        (Some(k), _) => {
            open.extend(v.key_args.iter().cloned());
            open.extend(["--key-file".to_string(), k.clone(), "--foreground".into()]);
            open.extend(positional);
            open
        }
        // The passphrase arrives on standard input (`StandardInput=file:`).
        (None, Some(_)) => {
            open.push("--foreground".into());
            open.extend(positional);
            open
        }
        (None, None) => {
            let mut argv = vec![
                p.sh.clone(),
                "-c".to_string(),
                UNLOCK_SCRIPT.to_string(),
                "cryptblk-unlock".to_string(),
                v.name.clone(),
                v.tries.to_string(),
                (v.headless as u8).to_string(),
                (v.tokens as u8).to_string(),
                v.device.path().to_string(),
                p.ask_password.clone(),
            ];
            argv.extend(open);
            argv
        }
    }
}

/// The text of `cryptblk@NAME.service` for `v`.
pub fn service(v: &Volume, p: &Paths) -> Result<String, String> {
    let mut u = String::new();
    let w = &mut u;
    let _ = writeln!(
        w,
        "# Automatically generated by cryptblk-generator from {}:{}\n",
        p.crypttab, v.line
    );
    let _ = writeln!(w, "[Unit]");
    let _ = writeln!(
        w,
        "Description=cryptblk volume {} ({})",
        text(&v.name),
        v.export.kind()
    );
    let _ = writeln!(w, "Documentation=man:crypttab(5) man:cryptblk(8)");
    let _ = writeln!(w, "SourcePath={}", path_value(&p.crypttab));
    let _ = writeln!(w, "DefaultDependencies=no");
    let _ = writeln!(w, "IgnoreOnIsolate=true");
    let _ = writeln!(w, "Conflicts=umount.target");
    let _ = writeln!(w, "Before=umount.target");
    let _ = writeln!(w, "After=cryptsetup-pre.target systemd-udevd-kernel.socket");
    if v.netdev {
        let _ = writeln!(w, "After=remote-fs-pre.target network-online.target");
        let _ = writeln!(w, "Wants=network-online.target");
    }
    for (setting, value) in &v.deps {
        let _ = writeln!(w, "{setting}={}", text(value));
    }
    if !v.nofail {
        // As systemd-cryptsetup: a nofail volume does not hold its target (and boot) up.
        let _ = writeln!(w, "Before={}", target(v));
    }
    // As systemd-cryptsetup@ for its /dev/mapper/NAME: the device it makes requires the
    // unit (see generator.rs), so a mount of /dev/cryptblk/NAME pulls the volume in; and
    // it is ordered before the device's blockdev@ target, which fstab-generator orders
    // mounts of the device after (a .device unit itself cannot be ordered after a unit).
    if let Some(d) = served_device(v)? {
        let t = format!("blockdev@{}.target", d.trim_end_matches(".device"));
        let _ = writeln!(w, "Wants={t}\nBefore={t}");
    }
    match &v.device {
        Device::Node(n) => {
            let d = escape::device_unit(n)?;
            let _ = writeln!(w, "BindsTo={d}\nAfter={d}");
        }
        Device::File(f) => {
            let _ = writeln!(w, "RequiresMountsFor={}", path_value(f));
            let _ = writeln!(w, "After=systemd-tmpfiles-setup-dev.service");
        }
        Device::Remote(_) => {}
    }
    for f in [
        v.key_file.as_deref(),
        v.passphrase_file.as_deref(),
        v.header.as_deref(),
    ]
    .into_iter()
    .flatten()
    {
        if f.starts_with("/dev/") {
            let d = escape::device_unit(f)?;
            let _ = writeln!(w, "Requires={d}\nAfter={d}");
        } else if !f.starts_with("/proc/") && !f.starts_with("/sys/") {
            let _ = writeln!(w, "RequiresMountsFor={}", path_value(f));
        }
    }
    match &v.export {
        crate::plan::Export::Ublk => {
            let _ = writeln!(w, "Wants=modprobe@ublk_drv.service");
            let _ = writeln!(w, "After=modprobe@ublk_drv.service");
        }
        crate::plan::Export::Fuse(dir) => {
            let _ = writeln!(w, "Wants=modprobe@fuse.service");
            let _ = writeln!(w, "After=modprobe@fuse.service");
            let _ = writeln!(w, "RequiresMountsFor={}", path_value(dir));
        }
        crate::plan::Export::Nbd(s) | crate::plan::Export::VhostUser(s) => {
            if let Some(parent) = s
                .starts_with('/')
                .then(|| std::path::Path::new(s).parent())
                .flatten()
            {
                let _ = writeln!(
                    w,
                    "RequiresMountsFor={}",
                    path_value(&parent.to_string_lossy())
                );
            }
        }
    }
    let _ = writeln!(w, "\n[Service]");
    let _ = writeln!(w, "Type=notify");
    if let Some(f) = &v.passphrase_file {
        let _ = writeln!(w, "StandardInput=file:{}", text(f));
    }
    let _ = writeln!(w, "NotifyAccess=all");
    let argv = exec_start(v, p);
    let _ = writeln!(
        w,
        "ExecStart={}",
        argv.iter()
            .map(|a| exec_arg(a))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let _ = writeln!(
        w,
        "ExecStop={} close {}",
        exec_arg(&p.cryptblk),
        exec_arg(&v.name)
    );
    if v.export.survives_restart() {
        let _ = writeln!(w, "Restart=on-failure\nRestartSec=1s");
    } else {
        let _ = writeln!(w, "Restart=no");
    }
    // The whole group gets SIGTERM (which cryptblk turns into a clean close), also when a
    // shell waiting for a passphrase is the main process.
    let _ = writeln!(w, "KillMode=control-group");
    // Waiting for a passphrase has no time limit, as systemd-cryptsetup@ units (TimeoutSec=0);
    // a key file or token open is a KDF run and an export start.
    let start = if v.key_file.is_none() && v.passphrase_file.is_none() && !v.headless {
        "infinity"
    } else {
        "5min"
    };
    let _ = writeln!(w, "TimeoutStartSec={start}");
    // Closing flushes the backing and waits for the export to go.
    let _ = writeln!(w, "TimeoutStopSec=90s");
    // The process is the disk: the OOM killer should take nearly anything else first.
    let _ = writeln!(w, "OOMScoreAdjust=-900");
    Ok(u)
}

/// systemd-cryptsetup-generator also reads the lines served by cryptblk (it ignores
/// `x-cryptblk.export=` with a warning) and writes `systemd-cryptsetup@NAME.service`, which
/// would open the same device a second time with the kernel's dm-crypt. The generator's
/// early directory outranks its normal one (systemd.generator(7)), so cryptblk-generator
/// puts there a unit of that name that only stands for `cryptblk@NAME.service`: it requires
/// and follows it, so `cryptsetup.target`'s dependency on it (which systemd-cryptsetup-
/// generator still writes) holds. Returns (unit name, text).
pub fn cryptsetup_stub(v: &Volume) -> (String, String) {
    let ours = unit_name(&v.name);
    let stub = format!("systemd-cryptsetup@{}.service", escape::escape(&v.name));
    let body = format!(
        "# Automatically generated by cryptblk-generator: crypttab volume {name} is served by\n         # {ours}; this stands in for systemd-cryptsetup's unit of the same line.\n\n         [Unit]\n         Description=crypttab volume {name}, served by cryptblk\n         Documentation=man:crypttab(5) man:cryptblk(8)\n         DefaultDependencies=no\n         IgnoreOnIsolate=true\n         Conflicts=umount.target\n         Before=umount.target\n         Requires={ours}\n         After={ours}\n\n         [Service]\n         Type=oneshot\n         RemainAfterExit=yes\n         ExecStart=/bin/true\n",
        name = text(&v.name),
    );
    (stub, body)
}

/// The drop-in for the device unit of `v` that systemd's generators write for
/// `x-systemd.device-timeout=`: (unit name, file name, text).
pub fn device_timeout(v: &Volume) -> Result<Option<(String, String, String)>, String> {
    let (Some(t), Device::Node(n)) = (&v.device_timeout, &v.device) else {
        return Ok(None);
    };
    Ok(Some((
        escape::device_unit(n)?,
        "50-device-timeout.conf".to_string(),
        format!(
            "# Automatically generated by cryptblk-generator\n\n[Unit]\nJobRunningTimeoutSec={}\n",
            text(t)
        ),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_args_are_quoted_for_systemd() {
        assert_eq!(exec_arg("/dev/sda"), "/dev/sda");
        assert_eq!(exec_arg("a b"), "\"a b\"");
        assert_eq!(exec_arg("50%$x\"\\"), "\"50%%$$x\\\"\\\\\"");
        assert_eq!(exec_arg(""), "\"\"");
    }

    #[test]
    fn unit_names_are_escaped() {
        assert_eq!(unit_name("data"), "cryptblk@data.service");
        assert_eq!(unit_name("my-vol"), "cryptblk@my\\x2dvol.service");
    }
}
