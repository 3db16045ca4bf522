//! What a careless or hostile user can do must lose no data and let nobody in: outputs onto
//! inputs, two writers on one volume, a runtime directory someone else controls, headers that
//! put data over metadata, and the small compatibility items of the hardening issue. Every
//! refused action leaves the original files' sha256 unchanged; where cryptsetup has the same
//! case, its exit code and message are the reference.

mod common;
use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Asserts that `out` failed with exit `code` and one stderr line containing `text`.
fn assert_refused(out: &Output, code: i32, text: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {err}");
    assert!(err.contains(text), "expected '{text}' in: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
}

/// A LUKS2 image of `mib` MiB formatted by cryptblk with key file `key`.
fn luks2_image(dir: &Path, name: &str, key: &Path, mib: u64) -> PathBuf {
    let img = dir.join(name);
    cryptblk_luks2(&img, key, mib << 20);
    img
}

fn key_file(dir: &Path) -> PathBuf {
    write_file(dir, "key", b"hardening key")
}

#[test]
fn an_output_that_is_an_input_is_refused_and_the_input_survives() {
    let dir = tempdir();
    let d = dir.path();
    let key = key_file(d);
    let plain = d.join("in.bin");
    write_pattern(&plain, 300_000, 17);
    std::fs::hard_link(&plain, d.join("in.hard")).unwrap();
    std::os::unix::fs::symlink(&plain, d.join("in.soft")).unwrap();
    let before = sha256(&plain);
    let encrypt = || {
        let mut c = cryptblk();
        c.arg("encrypt").args(FAST).arg("--key-file").arg(&key);
        c
    };
    for out in ["in.bin", "in.hard", "in.soft"] {
        let o = run(encrypt().arg(&plain).arg(d.join(out)), b"");
        assert_refused(&o, 1, "is the same file as input");
        assert_eq!(sha256(&plain), before, "{out}");
    }
    // `-` with standard input redirected from the output file.
    let o = encrypt()
        .arg("-")
        .arg(&plain)
        .stdin(std::fs::File::open(&plain).unwrap())
        .output()
        .unwrap();
    assert_refused(&o, 1, "input standard input");
    assert_eq!(sha256(&plain), before);

    let vol = d.join("vol.img");
    run_ok(encrypt().arg(&plain).arg(&vol), b"");
    std::fs::hard_link(&vol, d.join("vol.hard")).unwrap();
    let vol_sum = sha256(&vol);
    let decrypt = || {
        let mut c = cryptblk();
        c.arg("decrypt").arg("--key-file").arg(&key).arg(&vol);
        c
    };
    for out in ["vol.img", "vol.hard"] {
        let o = run(decrypt().arg(d.join(out)), b"");
        assert_refused(&o, 1, "is the same file as input");
        assert_eq!(sha256(&vol), vol_sum, "{out}");
    }
    // Standard output appended to the volume.
    let o = decrypt()
        .arg("-")
        .stdout(std::fs::OpenOptions::new().append(true).open(&vol).unwrap())
        .output()
        .unwrap();
    assert_refused(&o, 1, "Output standard output");
    assert_eq!(sha256(&vol), vol_sum);

    // A failed decrypt (wrong passphrase) leaves an existing output as it was, and a good
    // one replaces it whole, keeping its mode.
    let out = d.join("out.bin");
    std::fs::write(&out, b"keep me").unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o640)).unwrap();
    let bad_key = d.join("bad");
    std::fs::write(&bad_key, b"wrong").unwrap();
    let o = run(
        cryptblk()
            .arg("decrypt")
            .arg("--key-file")
            .arg(&bad_key)
            .arg(&vol)
            .arg(&out),
        b"",
    );
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
    run_ok(decrypt().arg(&out), b"");
    let back = std::fs::read(&out).unwrap();
    assert_eq!(&back[..300_000], &std::fs::read(&plain).unwrap()[..]);
    assert_eq!(std::fs::metadata(&out).unwrap().mode() & 0o777, 0o640);
    // No temporary file is left behind.
    let stray: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".cryptblk-"))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
}

#[test]
fn a_served_volume_has_one_writer_whatever_the_path() {
    let dir = tempdir();
    let d = dir.path();
    let key = key_file(d);
    let img = luks2_image(d, "vol.img", &key, 24);
    std::fs::hard_link(&img, d.join("vol.hard")).unwrap();
    std::os::unix::fs::symlink(&img, d.join("vol.soft")).unwrap();
    let plain_key = d.join("plain.key");
    std::fs::write(&plain_key, [7u8; 64]).unwrap();
    let sum = sha256(&img);
    let served = open_nbd(&img, &key, "t-hd-one", &d.join("one.sock"), &[]);

    let open = |path: &str, name: &str, extra: &[&str], key: &Path| {
        run(
            cryptblk()
                .arg("open")
                .args(extra)
                .arg("--key-file")
                .arg(key)
                .arg(d.join(path))
                .arg(name)
                .arg("--nbd")
                .arg(d.join(format!("{name}.sock"))),
            b"",
        )
    };
    for (path, extra) in [
        ("vol.img", &[][..]),
        ("vol.hard", &[]),
        ("vol.soft", &[]),
        ("vol.img", &["--readonly"]),
    ] {
        let o = open(path, "t-hd-two", extra, &key);
        assert_refused(&o, 5, "which is in use (already mapped or mounted).");
    }
    let o = open(
        "vol.img",
        "t-hd-plain",
        &[
            "--type",
            "plain",
            "--cipher",
            "aes-xts-plain64",
            "--key-size",
            "256",
        ],
        &plain_key,
    );
    assert_refused(&o, 5, "which is in use (already mapped or mounted).");
    let o = run(
        cryptblk()
            .args(["luksFormat", "-q"])
            .args(FAST)
            .arg("--key-file")
            .arg(&key)
            .arg(&img),
        b"",
    );
    assert_refused(&o, 5, "in use.");
    // Nor does an offline pipeline replace the served file.
    let plain = d.join("plain.bin");
    write_pattern(&plain, 4096, 3);
    let o = run(
        cryptblk()
            .arg("encrypt")
            .args(FAST)
            .arg("--key-file")
            .arg(&key)
            .arg(&plain)
            .arg(&img),
        b"",
    );
    assert_refused(&o, 5, "which is in use (already mapped or mounted).");
    assert_eq!(sha256(&img), sum);

    // Header-only actions go on while the volume is served, as with cryptsetup.
    let key2 = d.join("key2");
    std::fs::write(&key2, b"second key").unwrap();
    run_ok(
        cryptblk()
            .arg("luksAddKey")
            .args(FAST)
            .arg("--key-file")
            .arg(&key)
            .arg(&img)
            .arg(&key2),
        b"",
    );
    drop(served);
    // Closed: the lock went with the daemon.
    let _again = open_nbd(&img, &key2, "t-hd-again", &d.join("again.sock"), &[]);
}

#[test]
fn read_only_opens_share_a_volume() {
    let dir = tempdir();
    let d = dir.path();
    let key = key_file(d);
    let img = luks2_image(d, "vol.img", &key, 24);
    let _a = open_nbd(&img, &key, "t-hd-ro1", &d.join("ro1.sock"), &["--readonly"]);
    let _b = open_nbd(&img, &key, "t-hd-ro2", &d.join("ro2.sock"), &["--readonly"]);
    let o = run(
        cryptblk()
            .arg("open")
            .arg("--key-file")
            .arg(&key)
            .arg(&img)
            .arg("t-hd-rw")
            .arg("--nbd")
            .arg(d.join("rw.sock")),
        b"",
    );
    assert_refused(&o, 5, "in use");
}

#[test]
fn a_served_integrity_device_is_not_formatted_again() {
    let dir = tempdir();
    let d = dir.path();
    let img = d.join("int.img");
    sparse_file(&img, 16 << 20);
    let format = || {
        run(
            cryptblk()
                .args(["integrity", "format", "--batch-mode"])
                .arg(&img),
            b"",
        )
    };
    let o = format();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let _s = integrity_open_nbd(&img, "t-hd-int", &d.join("int.sock"), &[]);
    let sum = sha256(&img);
    let o = format();
    assert_refused(
        &o,
        5,
        &format!("Cannot format device {} in use.", img.display()),
    );
    assert_eq!(sha256(&img), sum);
}

/// Rewrites both LUKS2 header copies of `img` with segment 0 at `offset` (checksums resealed).
fn set_luks2_segment_offset(img: &Path, offset: &str) {
    use cryptblk_format::luks2::binary;
    let mut bytes = std::fs::read(img).unwrap();
    let hdr_size = u64::from_be_bytes(bytes[8..16].try_into().unwrap()) as usize;
    for at in [0, hdr_size] {
        let area = &mut bytes[at..at + hdr_size];
        let json_end = area[4096..].iter().position(|&b| b == 0).unwrap() + 4096;
        let mut json: serde_json::Value = serde_json::from_slice(&area[4096..json_end]).unwrap();
        json["segments"]["0"]["offset"] = serde_json::Value::String(offset.into());
        let text = serde_json::to_vec(&json).unwrap();
        area[4096..].fill(0);
        area[4096..4096 + text.len()].copy_from_slice(&text);
        binary::seal("sha256", area).unwrap();
    }
    std::fs::write(img, bytes).unwrap();
}

#[test]
fn data_over_the_header_is_refused_as_cryptsetup_does() {
    let dir = tempdir();
    let d = dir.path();
    let key = key_file(d);
    let Some(mut cs) = cryptsetup() else { return };
    let l2 = d.join("l2.img");
    sparse_file(&l2, 20 << 20);
    run_ok(
        cs.args(["luksFormat", "--type", "luks2"])
            .args(FAST)
            .arg("--key-file")
            .arg(&key)
            .arg(&l2),
        b"",
    );
    set_luks2_segment_offset(&l2, "0");
    let l1 = d.join("l1.img");
    cryptsetup_luks1(&l1, &key, 20 << 20).unwrap();
    // LUKS1 payload offset (sectors, big-endian) at byte 104 of the header.
    let mut b = std::fs::read(&l1).unwrap();
    b[104..108].fill(0);
    std::fs::write(&l1, b).unwrap();

    const MSG: &str = "Reduced data offset is allowed only for detached LUKS header.";
    for img in [&l2, &l1] {
        let sum = sha256(img);
        // cryptsetup refuses before it needs device-mapper.
        let theirs = run(
            cryptsetup()
                .unwrap()
                .arg("open")
                .arg("--key-file")
                .arg(&key)
                .arg(img)
                .arg("t-hd-cs"),
            b"",
        );
        assert_eq!(theirs.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&theirs.stderr).contains(MSG));
        for extra in [&[][..], &["--readonly"]] {
            let o = run(
                cryptblk()
                    .arg("open")
                    .args(extra)
                    .arg("--key-file")
                    .arg(&key)
                    .arg(img)
                    .arg("t-hd-off0")
                    .arg("--nbd")
                    .arg(d.join("off0.sock")),
                b"",
            );
            assert_refused(&o, 1, MSG);
        }
        assert_eq!(&sha256(img), &sum);
    }

    // A detached header with data offset 0 is the normal case and still opens.
    let hdr = d.join("hdr.img");
    let data = d.join("data.img");
    sparse_file(&data, 8 << 20);
    run_ok(
        cryptblk()
            .args(["luksFormat", "-q", "--type", "luks2"])
            .args(FAST)
            .arg("--header")
            .arg(&hdr)
            .arg("--key-file")
            .arg(&key)
            .arg(&data),
        b"",
    );
    let _s = open_nbd(
        &data,
        &key,
        "t-hd-detached",
        &d.join("det.sock"),
        &["--header", hdr.to_str().unwrap()],
    );
}

#[test]
fn nbd_addresses_outside_the_grammar_create_nothing() {
    let dir = tempdir();
    let d = dir.path();
    let key = key_file(d);
    let img = luks2_image(d, "vol.img", &key, 24);
    let work = d.join("cwd");
    std::fs::create_dir(&work).unwrap();
    for addr in [
        "localhost",
        ":10809",
        "10809",
        "127.0.0.1:65536",
        "data.sock",
    ] {
        let o = run(
            cryptblk()
                .current_dir(&work)
                .arg("open")
                .arg("--key-file")
                .arg(&key)
                .arg(&img)
                .arg("t-hd-addr")
                .arg("--nbd")
                .arg(addr),
            b"",
        );
        assert_refused(&o, 1, &format!("invalid --nbd address '{addr}'"));
        assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0, "{addr}");
    }
    // unix:PATH is a Unix socket at that path (relative to the current directory).
    run_ok(
        cryptblk()
            .current_dir(&work)
            .arg("open")
            .arg("--key-file")
            .arg(&key)
            .arg(&img)
            .arg("t-hd-unix")
            .args(["--nbd", "unix:v.sock"]),
        b"",
    );
    let _s = Served::volume("t-hd-unix");
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(work.join("v.sock"))
        .unwrap()
        .file_type()
        .is_socket());
}

#[test]
fn small_items_match_cryptsetup() {
    let dir = tempdir();
    let d = dir.path();
    let key = key_file(d);
    let Some(_) = cryptsetup() else { return };
    // luksFormat --type luks1 on an empty file: refused, untouched; on a small one: done,
    // with a warning that no room is left for data.
    for size in [0u64, 1000, 4096] {
        let mine = d.join(format!("cb{size}.img"));
        let theirs = d.join(format!("cs{size}.img"));
        sparse_file(&mine, size);
        sparse_file(&theirs, size);
        let c = run(luks1_format(&mut cryptsetup().unwrap(), &theirs, &key), b"");
        let m = run(
            cryptblk()
                .args([
                    "luksFormat",
                    "-q",
                    "--type",
                    "luks1",
                    "--pbkdf-force-iterations",
                    "1000",
                ])
                .arg("--key-file")
                .arg(&key)
                .arg(&mine),
            b"",
        );
        assert_eq!(m.status.code(), c.status.code(), "size {size}");
        // The same lines on the same streams, paths aside.
        let text =
            |b: &[u8], p: &Path| String::from_utf8_lossy(b).replace(&*p.to_string_lossy(), "D");
        assert_eq!(
            text(&m.stderr, &mine),
            text(&c.stderr, &theirs),
            "size {size}"
        );
        assert_eq!(
            text(&m.stdout, &mine),
            text(&c.stdout, &theirs),
            "size {size}"
        );
        assert_eq!(
            std::fs::metadata(&mine).unwrap().len(),
            std::fs::metadata(&theirs).unwrap().len(),
            "size {size}"
        );
    }

    // --keyfile-size 0 is the whole file.
    let img = luks2_image(d, "vol.img", &key, 24);
    for tool in [cryptsetup().unwrap(), cryptblk()] {
        let mut tool = tool;
        run_ok(
            tool.args([
                "open",
                "--test-passphrase",
                "--keyfile-size",
                "0",
                "--key-file",
            ])
            .arg(&key)
            .arg(&img),
            b"",
        );
    }
}

/// A system user made for one test and deleted (with what it owns here) when dropped.
struct TestUser {
    name: String,
    uid: u32,
    /// The binary under test where this user can run it (the build tree may sit in a
    /// directory only root can enter).
    exe: PathBuf,
}

impl TestUser {
    fn create(scratch: &Path) -> TestUser {
        require_root("to act as another user (useradd, runuser)");
        let name = format!("cbhard{}", std::process::id());
        run_ok(
            Command::new("useradd").args(["-M", "-r", "-s", "/usr/sbin/nologin", &name]),
            b"",
        );
        let id = run_ok(Command::new("id").args(["-u", &name]), b"");
        let exe = scratch.join("cryptblk");
        let built = Path::new(env!("CARGO_BIN_EXE_cryptblk"));
        if std::fs::hard_link(built, &exe).is_err() {
            std::fs::copy(built, &exe).unwrap();
        }
        TestUser {
            uid: id.trim().parse().unwrap(),
            name,
            exe,
        }
    }

    /// cryptblk run as this user, with `env` and no inherited runtime directory.
    fn cryptblk(&self, env: &[(&str, &Path)]) -> Command {
        let mut c = Command::new("runuser");
        c.args(["-u", &self.name, "--", "env", "-u", "XDG_RUNTIME_DIR"]);
        for (k, v) in env {
            c.arg(format!("{k}={}", v.display()));
        }
        c.arg(&self.exe);
        c.env_remove("CRYPTBLK_RUNTIME_DIR");
        c
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = run(Command::new("userdel").arg(&self.name), b"");
    }
}

/// A directory at a fixed path under the system temporary directory, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_runtime_directory_someone_else_controls_is_refused() {
    let base = Scratch(std::env::temp_dir().join(format!("cbhard-{}", std::process::id())));
    std::fs::create_dir(&base.0).unwrap();
    std::fs::set_permissions(&base.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let d = &base.0;
    let user = TestUser::create(d);
    let key = key_file(d);
    let img = luks2_image(d, "vol.img", &key, 24);

    // Root's open with a runtime directory another user owns, who planted a log symlink to
    // a root file: refused, naming the directory; the root file is untouched.
    let planted = d.join("planted");
    std::fs::create_dir(&planted).unwrap();
    chown(&planted, user.uid, None);
    let victim = d.join("victim");
    std::fs::write(&victim, b"root's file").unwrap();
    std::os::unix::fs::symlink(&victim, planted.join("t-hd-rt.log")).unwrap();
    let victim_sum = sha256(&victim);
    let img_sum = sha256(&img);
    for var in ["CRYPTBLK_RUNTIME_DIR", "XDG_RUNTIME_DIR"] {
        let o = run(
            cryptblk()
                .env_remove("CRYPTBLK_RUNTIME_DIR")
                .env(var, &planted)
                .arg("open")
                .arg("--key-file")
                .arg(&key)
                .arg(&img)
                .arg("t-hd-rt")
                .arg("--nbd")
                .arg(d.join("rt.sock")),
            b"",
        );
        assert_refused(
            &o,
            1,
            &format!("unsafe runtime directory {}", planted.display()),
        );
        assert!(String::from_utf8_lossy(&o.stderr).contains(&format!("uid {}", user.uid)));
    }
    assert_eq!(sha256(&victim), victim_sum);
    assert_eq!(sha256(&img), img_sum);

    // A world-writable directory is refused, never chmod'ed, even by a read-only command.
    let open_dir = d.join("open");
    std::fs::create_dir(&open_dir).unwrap();
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let o = run(
        cryptblk()
            .env("CRYPTBLK_RUNTIME_DIR", &open_dir)
            .args(["dm", "ls"]),
        b"",
    );
    assert_refused(&o, 1, "writable by other users (mode 1777)");
    let mode = std::fs::metadata(&open_dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o1777);

    // The default directory of an ordinary user, pre-created by someone else: refused with
    // the path named (not a bare "Permission denied").
    let default = Scratch(PathBuf::from(format!("/tmp/cryptblk-{}", user.uid)));
    std::fs::create_dir(&default.0).unwrap();
    let o = run(user.cryptblk(&[]).args(["dm", "ls"]), b"");
    assert_refused(
        &o,
        1,
        &format!("unsafe runtime directory {}", default.0.display()),
    );
    drop(default);
    // Missing, it is made private to the user.
    let o = run(user.cryptblk(&[]).args(["dm", "ls"]), b"");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let made = Scratch(PathBuf::from(format!("/tmp/cryptblk-{}", user.uid)));
    let meta = std::fs::symlink_metadata(&made.0).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (user.uid, 0o700));
    drop(made);

    // A listener of another uid in the user's own directory hears nothing: the client checks
    // the peer before sending the table (which holds a key).
    let private = d.join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    chown(&private, user.uid, None);
    let ctl = private.join("v.ctl");
    let listener = std::os::unix::net::UnixListener::bind(&ctl).unwrap();
    std::fs::set_permissions(&ctl, std::fs::Permissions::from_mode(0o777)).unwrap();
    let table = format!(
        "0 8 crypt aes-xts-plain64 {} 0 /dev/null 0\n",
        "ab".repeat(64)
    );
    let o = run(
        user.cryptblk(&[("CRYPTBLK_RUNTIME_DIR", &private)]).args([
            "dm",
            "reload",
            "v",
            "--table-file",
            "-",
        ]),
        table.as_bytes(),
    );
    assert_refused(&o, 2, "not as you, so nothing is sent to it");
    // The client did connect (its connection waits in the backlog), and sent nothing.
    listener.set_nonblocking(true).unwrap();
    let (mut stream, _) = listener.accept().expect("the client connected");
    stream.set_nonblocking(false).unwrap();
    let mut heard = Vec::new();
    std::io::Read::read_to_end(&mut stream, &mut heard).unwrap();
    assert_eq!(heard, b"");
}

/// A LUKS2 volume (cryptsetup's, data at 16 MiB) cut short so that its data segment starts
/// at or past the device's end: `decrypt` refuses it as `open` does (same line, exit 4),
/// creates no output and leaves the volume as it was.
#[test]
fn decrypt_refuses_a_data_segment_past_the_end_as_open_does() {
    let dir = tempdir();
    let d = dir.path();
    let key = key_file(d);
    for (i, cut) in [8u64 << 20, 16 << 20].into_iter().enumerate() {
        let img = d.join(format!("short{i}.img"));
        cryptsetup_luks2(&img, &key, 32 << 20).expect("cryptsetup");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&img)
            .unwrap()
            .set_len(cut)
            .unwrap();
        let sum = sha256(&img);
        let name = format!("t-hd-short{i}");
        let open = run(
            cryptblk()
                .arg("open")
                .arg("--key-file")
                .arg(&key)
                .arg(&img)
                .arg(&name)
                .arg("--nbd")
                .arg(d.join(format!("{name}.sock"))),
            b"",
        );
        assert_refused(&open, 4, "is too small");
        let out = d.join(format!("plain{i}.bin"));
        let dec = run(
            cryptblk()
                .arg("decrypt")
                .arg("--key-file")
                .arg(&key)
                .arg(&img)
                .arg(&out),
            b"",
        );
        assert_refused(&dec, 4, "is too small");
        assert_eq!(dec.stderr, open.stderr, "decrypt and open refuse alike");
        assert!(!out.exists(), "decrypt left an output at cut {cut}");
        assert_eq!(sha256(&img), sum);
    }
}

/// `encrypt` of an empty input would make a volume without a data sector, which `open`
/// refuses as too small: refused (exit 4), from a file and from standard input, and no
/// output is left.
#[test]
fn encrypt_refuses_an_input_that_leaves_no_data_area() {
    let dir = tempdir();
    let d = dir.path();
    let key = key_file(d);
    let empty = write_file(d, "empty.bin", b"");
    let out = d.join("vol.img");
    let encrypt = || {
        let mut c = cryptblk();
        c.arg("encrypt").args(FAST).arg("--key-file").arg(&key);
        c
    };
    let o = run(encrypt().arg(&empty).arg(&out), b"");
    assert_refused(&o, 4, "is empty");
    assert!(!out.exists());
    let o = run(encrypt().arg("-").arg(&out), b"");
    assert_refused(&o, 4, "is empty");
    assert!(!out.exists());
}
