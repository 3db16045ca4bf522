//! `cryptblk-generator` checked against systemd itself: its name escaping against
//! `systemd-escape`, and the units it writes for a sample crypttab against
//! `systemd-analyze verify` (which loads them as PID 1 would, without being PID 1).

use cryptblk_systemd::escape;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Runs `cmd` (60 s at most, then killed and failed).
fn run(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (systemd's tools are needed)"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{cmd:?} did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn systemd_escape(args: &[&str], s: &str) -> String {
    let out = run(Command::new("systemd-escape").args(args).arg("--").arg(s));
    assert!(
        out.status.success(),
        "systemd-escape {args:?} {s:?}: {out:?}"
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .trim_end()
        .to_string()
}

#[test]
fn escaping_matches_systemd_escape() {
    for s in [
        "data",
        "my-vol",
        "a b",
        ".hidden",
        "x.y.z",
        "with:colon_and_underscore",
        "ünïcode",
        "tab\there",
        "back\\slash",
        "per%cent$dollar",
        "a/b/c",
    ] {
        assert_eq!(escape::escape(s), systemd_escape(&[], s), "{s:?}");
    }
    for p in [
        "/",
        "/dev/sda1",
        "/dev/disk/by-uuid/3f1b7c2e-1111-4a5b-9c0d-123456789abc",
        "/dev/disk/by-label/vm\\x20disk",
        "//dev///mapper/../x",
        "/srv/images/.plain.img",
        "/srv/a b/c-d/",
        "/run/./x",
    ] {
        let theirs = run(Command::new("systemd-escape").args(["--path", "--"]).arg(p));
        match escape::escape_path(p) {
            Ok(ours) => {
                assert!(theirs.status.success(), "systemd-escape refused {p:?}");
                assert_eq!(
                    ours,
                    String::from_utf8_lossy(&theirs.stdout).trim_end(),
                    "{p:?}"
                );
            }
            Err(_) => assert!(!theirs.status.success(), "systemd-escape took {p:?}"),
        }
    }
}

const UUID: &str = "3f1b7c2e-1111-4a5b-9c0d-123456789abc";

fn sample_crypttab() -> String {
    format!(
        "# volumes served by cryptblk, and one left to systemd-cryptsetup\n\
         data   UUID={UUID}  /etc/cryptblk/data.key  luks,discard,keyfile-size=64,x-cryptblk.export=ublk,x-systemd.device-timeout=30s\n\
         \n\
         net    /dev/sdc  none  _netdev,x-cryptblk.export=nbd:/run/cryptblk-net/net.sock,tries=2,token-timeout=20s\n\
         img    /srv/images/plain.img  /etc/cryptblk/img.key  plain,cipher=aes-xts-plain64,size=512,hash=sha256,offset=0,x-cryptblk.export=fuse:/srv/fuse/img,nofail\n\
         \"vm-1\"  LABEL=\"vm disk\"  -  x-cryptblk.export=vhost-user:/run/vm/disk.sock,noauto,headless=true,swap\n\
         sys    /dev/sda2  none  luks,discard\n\
         broken \"/dev/sdd\n\
         odd    /dev/sde  -  x-cryptblk.export=iscsi\n\
         tc     /dev/sdf  /etc/cryptblk/tc.pass  tcrypt,tcrypt-keyfile=/etc/cryptblk/tc.kf,x-cryptblk.export=ublk\n"
    )
}

struct Generated {
    _dir: tempfile::TempDir,
    normal: PathBuf,
    early: PathBuf,
    late: PathBuf,
    stderr: String,
}

fn generate(crypttab: &str) -> Generated {
    let dir = tempfile::tempdir().unwrap();
    let tab = dir.path().join("crypttab");
    std::fs::write(&tab, crypttab).unwrap();
    let [normal, early, late] = ["normal", "early", "late"].map(|d| dir.path().join(d));
    for d in [&normal, &early, &late] {
        std::fs::create_dir(d).unwrap();
    }
    let out = run(Command::new(env!("CARGO_BIN_EXE_cryptblk-generator"))
        .args([&normal, &early, &late])
        .env("SYSTEMD_CRYPTTAB", &tab)
        .env("CRYPTBLK_BIN", cryptblk_bin()));
    assert!(out.status.success(), "generator failed: {out:?}");
    assert!(out.stdout.is_empty());
    Generated {
        _dir: dir,
        normal,
        early,
        late,
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// The workspace's cryptblk binary (beside the generator), so that `verify` finds the
/// program the units run.
fn cryptblk_bin() -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_cryptblk-generator"))
        .parent()
        .unwrap()
        .join("cryptblk");
    assert!(p.exists(), "{} is built with the workspace", p.display());
    p
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn generator_writes_units_for_its_lines_only_and_warns_once_per_problem() {
    let g = generate(&sample_crypttab());
    let lines: Vec<&str> = g.stderr.lines().collect();
    assert_eq!(lines.len(), 3, "{}", g.stderr);
    assert!(
        lines[0].contains(":6: option 'swap' is not supported"),
        "{}",
        g.stderr
    );
    assert!(lines[1].contains(":8: unbalanced quote"), "{}", g.stderr);
    assert!(
        lines[2].contains(":9: x-cryptblk.export=iscsi"),
        "{}",
        g.stderr
    );

    let mut names: Vec<String> = std::fs::read_dir(&g.normal)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let dev = systemd_escape(
        &["--path", "--suffix=device"],
        &format!("/dev/disk/by-uuid/{UUID}"),
    );
    assert_eq!(
        names,
        [
            "cryptblk@data.service".to_string(),
            "cryptblk@img.service".into(),
            "cryptblk@net.service".into(),
            "cryptblk@tc.service".into(),
            "cryptblk@vm\\x2d1.service".into(),
            "cryptsetup.target.requires".into(),
            "cryptsetup.target.wants".into(),
            "dev-cryptblk-data.device.d".into(),
            "dev-cryptblk-data.device.requires".into(),
            "dev-cryptblk-tc.device.d".into(),
            "dev-cryptblk-tc.device.requires".into(),
            format!("{dev}.d"),
            "remote-cryptsetup.target.requires".into(),
        ]
    );
    // systemd-cryptsetup-generator writes a unit for these lines too: the early directory
    // (which outranks its normal one) has one that only stands for cryptblk's.
    let mut early: Vec<String> = std::fs::read_dir(&g.early)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    early.sort();
    assert_eq!(
        early,
        ["data", "img", "net", "tc", "vm\\x2d1"].map(|n| format!("systemd-cryptsetup@{n}.service"))
    );
    let stub = read(&g.early.join("systemd-cryptsetup@data.service"));
    for want in [
        "Requires=cryptblk@data.service\n",
        "After=cryptblk@data.service\n",
        "DefaultDependencies=no\n",
        "RemainAfterExit=yes\n",
    ] {
        assert!(stub.contains(want), "stub lacks {want:?}:\n{stub}");
    }
    assert!(
        !stub.contains("ExecStart=/usr/lib/systemd/systemd-cryptsetup"),
        "{stub}"
    );
    assert_eq!(std::fs::read_dir(&g.late).unwrap().count(), 0);
    for (link, unit) in [
        ("cryptsetup.target.requires", "cryptblk@data.service"),
        ("cryptsetup.target.wants", "cryptblk@img.service"),
        ("remote-cryptsetup.target.requires", "cryptblk@net.service"),
    ] {
        let l = g.normal.join(link).join(unit);
        assert_eq!(std::fs::read_link(&l).unwrap(), Path::new("..").join(unit));
    }
    // The ublk volumes' own devices (/dev/cryptblk/NAME, linked by the udev rule) pull
    // their units in and wait for them, as /dev/mapper/NAME does for systemd-cryptsetup@.
    for name in ["data", "tc"] {
        let unit = format!("cryptblk@{name}.service");
        let l = g
            .normal
            .join(format!("dev-cryptblk-{name}.device.requires"))
            .join(&unit);
        assert_eq!(std::fs::read_link(&l).unwrap(), Path::new("..").join(&unit));
        assert!(read(&g.normal.join(format!(
            "dev-cryptblk-{name}.device.d/40-cryptblk-job-timeout.conf"
        )))
        .contains("\n[Unit]\nJobTimeoutSec=infinity\n"));
    }
    for (link, n) in [
        ("cryptsetup.target.requires", 2),
        ("cryptsetup.target.wants", 1),
        ("remote-cryptsetup.target.requires", 1),
    ] {
        assert_eq!(std::fs::read_dir(g.normal.join(link)).unwrap().count(), n);
    }
    assert!(
        read(&g.normal.join(format!("{dev}.d/50-device-timeout.conf")))
            .contains("\n[Unit]\nJobRunningTimeoutSec=30s\n")
    );

    let data = read(&g.normal.join("cryptblk@data.service"));
    let bin = cryptblk_bin();
    let bin = bin.to_str().unwrap();
    for want in [
        "DefaultDependencies=no\n",
        "IgnoreOnIsolate=true\n",
        "Conflicts=umount.target\n",
        "Before=umount.target\n",
        "Before=cryptsetup.target\n",
        &format!("BindsTo={dev}\n"),
        &format!("After={dev}\n"),
        "RequiresMountsFor=/etc/cryptblk/data.key\n",
        "Wants=modprobe@ublk_drv.service\n",
        "Wants=blockdev@dev-cryptblk-data.target\nBefore=blockdev@dev-cryptblk-data.target\n",
        "Type=notify\n",
        &format!(
            "ExecStart={bin} open --type luks --allow-discards --ublk --keyfile-size 64 \
             --key-file /etc/cryptblk/data.key --foreground -- /dev/disk/by-uuid/{UUID} data\n"
        ),
        &format!("ExecStop={bin} close data\n"),
        "Restart=on-failure\n",
        "TimeoutStartSec=5min\n",
    ] {
        assert!(
            data.contains(want),
            "cryptblk@data.service lacks {want:?}:\n{data}"
        );
    }
    assert!(!data.contains("network-online"), "{data}");

    let net = read(&g.normal.join("cryptblk@net.service"));
    for want in [
        "After=remote-fs-pre.target network-online.target\n",
        "Wants=network-online.target\n",
        "Before=remote-cryptsetup.target\n",
        "BindsTo=dev-sdc.device\n",
        "RequiresMountsFor=/run/cryptblk-net\n",
        "NotifyAccess=all\n",
        "TimeoutStartSec=infinity\n",
        " /usr/bin/systemd-ask-password ",
        &format!(" net 2 0 1 /dev/sdc /usr/bin/systemd-ask-password {bin} open --token-timeout 20 --nbd /run/cryptblk-net/net.sock\n"),
    ] {
        assert!(net.contains(want), "cryptblk@net.service lacks {want:?}:\n{net}");
    }
    assert!(!net.contains("Before=cryptsetup.target"), "{net}");
    assert!(
        !net.contains("dev-cryptblk-"),
        "NBD makes no block device: {net}"
    );

    let img = read(&g.normal.join("cryptblk@img.service"));
    for want in [
        "RequiresMountsFor=/srv/images/plain.img\n",
        "RequiresMountsFor=/srv/fuse/img\n",
        "Restart=no\n",
        "--type plain --cipher aes-xts-plain64 --key-size 512 --hash sha256 --offset 0 --fuse /srv/fuse/img",
    ] {
        assert!(img.contains(want), "cryptblk@img.service lacks {want:?}:\n{img}");
    }
    assert!(!img.contains("Before=cryptsetup.target"), "nofail: {img}");

    // TCRYPT: the line's key file holds the passphrase (standard input), tcrypt-keyfile=
    // are key files.
    let tc = read(&g.normal.join("cryptblk@tc.service"));
    for want in [
        "StandardInput=file:/etc/cryptblk/tc.pass\n",
        "RequiresMountsFor=/etc/cryptblk/tc.pass\n",
        &format!(
            "ExecStart={bin} open --type tcrypt --key-file /etc/cryptblk/tc.kf --ublk \
             --foreground -- /dev/sdf tc\n"
        ),
        "TimeoutStartSec=5min\n",
    ] {
        assert!(
            tc.contains(want),
            "cryptblk@tc.service lacks {want:?}:\n{tc}"
        );
    }

    let vm = read(&g.normal.join("cryptblk@vm\\x2d1.service"));
    let label = systemd_escape(
        &["--path", "--suffix=device"],
        "/dev/disk/by-label/vm\\x20disk",
    );
    assert!(vm.contains(&format!("BindsTo={label}\n")), "{vm}");
    assert!(
        vm.contains(" vm-1 3 1 1 \"/dev/disk/by-label/vm\\\\x20disk\" "),
        "{vm}"
    );
}

#[test]
fn generated_units_pass_systemd_analyze_verify() {
    let g = generate(&sample_crypttab());
    let mut units: Vec<PathBuf> = std::fs::read_dir(&g.normal)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "service"))
        .collect();
    units.sort();
    assert_eq!(units.len(), 5);
    units.extend(
        std::fs::read_dir(&g.early)
            .unwrap()
            .map(|e| e.unwrap().path()),
    );
    units.sort();
    assert_eq!(units.len(), 10);
    // The generator directory first in the search path (the trailing ':' keeps the
    // system's units, which the generated ones order against), as systemd puts it.
    let out = run(Command::new("systemd-analyze")
        .args(["verify", "--man=no", "--generators=no"])
        .args(&units)
        .env(
            "SYSTEMD_UNIT_PATH",
            format!("{}:{}:", g.early.display(), g.normal.display()),
        ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {:?}\n{stderr}",
        out.status
    );
}

#[test]
fn systemd_analyze_verify_catches_a_broken_unit() {
    // The check above can fail: a unit whose program is missing is an error to verify.
    let g = generate(&sample_crypttab());
    let unit = g.normal.join("cryptblk@data.service");
    let text = read(&unit).replace(cryptblk_bin().to_str().unwrap(), "/nonexistent/cryptblk");
    std::fs::write(&unit, text).unwrap();
    let out = run(Command::new("systemd-analyze")
        .args(["verify", "--man=no", "--generators=no"])
        .arg(&unit)
        .env("SYSTEMD_UNIT_PATH", format!("{}:", g.normal.display())));
    assert!(!out.status.success(), "{out:?}");
}

/// Undoes the quoting of systemd's unit dump (`Command Line: "a b" c\$`): a word is
/// double-quoted or bare, `\X` stands for X.
fn split_dump_command_line(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = line.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c == ' ' {
            chars.next();
            continue;
        }
        let quoted = c == '"';
        if quoted {
            chars.next();
        }
        let mut w = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => w.push(chars.next().unwrap()),
                '"' if quoted => break,
                ' ' if !quoted => break,
                c => w.push(c),
            }
        }
        words.push(w);
    }
    words
}

#[test]
fn systemd_reads_the_exec_start_words_the_generator_meant() {
    // The unlock shell's script is the hardest word to quote: systemd's own parse of the
    // unit (shown by verify's debug dump) must give back exactly the argv the generator
    // built, `$$` being the `$` systemd leaves for the exec-time expansion.
    let g = generate(&sample_crypttab());
    let unit = g.normal.join("cryptblk@net.service");
    let out = run(Command::new("systemd-analyze")
        .args(["verify", "--man=no", "--generators=no"])
        .arg(&unit)
        .env("SYSTEMD_LOG_LEVEL", "debug")
        .env("SYSTEMD_UNIT_PATH", format!("{}:", g.normal.display())));
    assert!(out.status.success(), "{out:?}");
    let dump = String::from_utf8_lossy(&out.stdout);
    let mut lines = dump.lines().skip_while(|l| l.trim() != "-> ExecStart:");
    lines.next().expect("an ExecStart in the dump");
    let cmd = lines
        .next()
        .and_then(|l| l.trim().strip_prefix("Command Line: "))
        .unwrap_or_else(|| panic!("no command line in:\n{dump}"));
    let words: Vec<String> = split_dump_command_line(cmd)
        .into_iter()
        .map(|w| w.replace("$$", "$"))
        .collect();

    let tab = sample_crypttab();
    let (entries, _) = cryptblk_systemd::crypttab::parse(&tab);
    let net = entries.iter().find(|e| e.name == "net").unwrap();
    let v = cryptblk_systemd::plan::plan(net, &mut |_| {})
        .unwrap()
        .unwrap();
    let paths = cryptblk_systemd::unit::Paths {
        cryptblk: cryptblk_bin().to_str().unwrap().to_string(),
        ..Default::default()
    };
    assert_eq!(words, cryptblk_systemd::unit::exec_start(&v, &paths));
}

/// A LUKS2 image made by cryptsetup, with `tokens` imported by `cryptsetup token import`.
fn luks2_with_tokens(dir: &Path, name: &str, tokens: &[serde_json::Value]) -> PathBuf {
    let img = dir.join(name);
    std::fs::File::create(&img)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let key = dir.join("key");
    std::fs::write(&key, b"tang test key").unwrap();
    let out = run(Command::new("cryptsetup")
        .args(["luksFormat", "--batch-mode", "--type", "luks2"])
        .args(["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"])
        .arg("--key-file")
        .arg(&key)
        .arg(&img));
    assert!(out.status.success(), "cryptsetup luksFormat: {out:?}");
    for t in tokens {
        let json = dir.join("token.json");
        std::fs::write(&json, t.to_string()).unwrap();
        let out = run(Command::new("cryptsetup")
            .args(["token", "import", "--json-file"])
            .arg(&json)
            .arg(&img));
        assert!(out.status.success(), "cryptsetup token import: {out:?}");
    }
    img
}

fn b64(v: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v)
}

/// A clevis token whose JWE's protected header is `clevis` (the pin's part); the
/// ciphertext is a placeholder: only the pin is read at generation time.
fn clevis_token(clevis: serde_json::Value) -> serde_json::Value {
    let protected = serde_json::json!({"alg": "ECDH-ES", "enc": "A256GCM", "clevis": clevis});
    serde_json::json!({
        "type": "clevis",
        "keyslots": ["0"],
        "jwe": {
            "protected": b64(protected.to_string().as_bytes()),
            "encrypted_key": "",
            "iv": b64(&[0; 12]),
            "ciphertext": b64(&[0; 32]),
            "tag": b64(&[0; 16]),
        }
    })
}

#[test]
fn volumes_bound_to_tang_wait_for_the_network() {
    let dir = tempfile::tempdir().unwrap();
    let tang = serde_json::json!({"pin": "tang", "tang": {"url": "http://127.0.0.1:1"}});
    let tang_img = luks2_with_tokens(dir.path(), "tang.img", &[clevis_token(tang.clone())]);
    // sss over one tang share, the share a compact JWE as clevis writes them.
    let share = format!(
        "{}..{}.{}.{}",
        b64(
            serde_json::json!({"alg": "ECDH-ES", "enc": "A256GCM", "clevis": tang})
                .to_string()
                .as_bytes()
        ),
        b64(&[0; 12]),
        b64(&[0; 32]),
        b64(&[0; 16])
    );
    let sss = serde_json::json!({"pin": "sss", "sss": {"t": 1, "p": "AQ", "jwe": [share]}});
    let sss_img = luks2_with_tokens(dir.path(), "sss.img", &[clevis_token(sss)]);
    let tpm = serde_json::json!({"pin": "tpm2", "tpm2": {}});
    let tpm_img = luks2_with_tokens(dir.path(), "tpm.img", &[clevis_token(tpm)]);
    let tab = format!(
        "tangvol {t} none luks,x-cryptblk.export=ublk\n\
         sssvol {s} - x-cryptblk.export=ublk\n\
         tpmvol {p} none x-cryptblk.export=ublk\n\
         keyvol {t} /etc/k x-cryptblk.export=ublk\n",
        t = tang_img.display(),
        s = sss_img.display(),
        p = tpm_img.display()
    );
    let g = generate(&tab);
    assert!(g.stderr.is_empty(), "{}", g.stderr);
    for (name, network) in [
        ("tangvol", true),
        ("sssvol", true),
        ("tpmvol", false),
        ("keyvol", false),
    ] {
        let unit = read(&g.normal.join(format!("cryptblk@{name}.service")));
        assert_eq!(
            unit.contains("Wants=network-online.target\n"),
            network,
            "{name}:\n{unit}"
        );
        let target = if network {
            "remote-cryptsetup.target"
        } else {
            "cryptsetup.target"
        };
        assert!(
            g.normal
                .join(format!("{target}.requires/cryptblk@{name}.service"))
                .exists(),
            "{name} not pulled in by {target}"
        );
    }
}

#[test]
fn x_systemd_dependencies_become_unit_dependencies_systemd_loads() {
    // fstab(5)'s x-systemd.after=/before=/wants=/requires= on a crypttab line: systemd's own
    // load of the unit (verify's debug dump) has each dependency; requires= of a path is
    // the mount it needs; a path given where a unit is wanted skips the line.
    let tab = "web /dev/sdb /etc/k luks,x-cryptblk.export=ublk,x-systemd.after=time-sync.target,\
               x-systemd.before=local-fs-pre.target,x-systemd.wants=systemd-udev-settle.service,\
               x-systemd.requires=systemd-journald.socket,x-systemd.requires=/srv/keys\n\
               bad /dev/sdc /etc/k x-cryptblk.export=ublk,x-systemd.after=/srv\n";
    let g = generate(tab);
    assert!(
        g.stderr
            .contains(":2: option x-systemd.after: '/srv' is a path, not a unit; line ignored"),
        "{}",
        g.stderr
    );
    assert!(!g.normal.join("cryptblk@bad.service").exists());
    let unit = g.normal.join("cryptblk@web.service");
    let text = read(&unit);
    for want in [
        "After=time-sync.target\n",
        "Before=local-fs-pre.target\n",
        "Wants=systemd-udev-settle.service\n",
        "After=systemd-journald.socket\nRequires=systemd-journald.socket\n",
        "RequiresMountsFor=/srv/keys\n",
    ] {
        assert!(text.contains(want), "lacks {want:?}:\n{text}");
    }
    let out = run(Command::new("systemd-analyze")
        .args(["verify", "--man=no", "--generators=no"])
        .arg(&unit)
        .env("SYSTEMD_LOG_LEVEL", "debug")
        .env("SYSTEMD_UNIT_PATH", format!("{}:", g.normal.display())));
    assert!(out.status.success(), "{out:?}");
    let dump = String::from_utf8_lossy(&out.stdout);
    let deps: Vec<&str> = dump
        .lines()
        .skip_while(|l| !l.contains("-> Unit cryptblk@web.service:"))
        .take_while(|l| !l.trim().starts_with("-> ExecStart"))
        .map(str::trim)
        .collect();
    for want in [
        "After: time-sync.target",
        "Before: local-fs-pre.target",
        "Wants: systemd-udev-settle.service",
        "Requires: systemd-journald.socket",
        "After: systemd-journald.socket",
        "RequiresMountsFor: /srv/keys",
    ] {
        assert!(
            deps.iter().any(|l| l.starts_with(want)),
            "systemd did not load {want:?}:\n{}",
            deps.join("\n")
        );
    }
}
