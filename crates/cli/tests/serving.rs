//! Volumes served by the cryptblk daemon to real clients (nbdcopy, qemu-img, fio), checked
//! against cryptsetup's view of the same volume and the independent pyca model.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn luks2_written_through_nbd_decrypts_with_cryptsetups_key() {
    let Some(_) = tool("nbdcopy") else { return };
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, b"nbd test key").unwrap();
    let img = dir.path().join("vol.img");
    let Some(()) = cryptsetup_luks2(&img, &key, 40 << 20) else {
        return;
    };

    let data_path = dir.path().join("data.bin");
    let data = write_pattern(&data_path, 8 << 20, 11);
    let sock = dir.path().join("nbd.sock");
    {
        let _s = open_nbd(&img, &key, "t-nbd-w", &sock, &[]);
        run_ok(
            Command::new("nbdcopy").arg(&data_path).arg(nbd_uri(&sock)),
            b"",
        );
    }
    // The daemon is gone; check the bytes on disk with cryptsetup's volume key.
    let vk = cryptsetup_volume_key(&img, &key, &[]).unwrap();
    let (off, sector) = cryptsetup_luks2_segment(&img).unwrap();
    let raw = std::fs::read(&img).unwrap();
    let plain = independent(
        "decrypt",
        "aes-xts-plain64",
        &vk,
        sector,
        &raw[off..off + data.len()],
    );
    assert!(
        plain == data,
        "data written over NBD does not decrypt to what was written"
    );

    // Reverse: ciphertext made by the independent model reads back through cryptblk.
    let other = write_pattern(&data_path, 4 << 20, 12);
    let cipher = independent("encrypt", "aes-xts-plain64", &vk, sector, &other);
    let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &cipher, off as u64).unwrap();
    drop(f);
    let out = dir.path().join("out.bin");
    {
        let _s = open_nbd(&img, &key, "t-nbd-r", &sock, &["--readonly"]);
        run_ok(Command::new("nbdcopy").arg(nbd_uri(&sock)).arg(&out), b"");
    }
    let back = std::fs::read(&out).unwrap();
    assert!(
        back[..other.len()] == other[..],
        "cryptblk reads back something else than was encrypted"
    );
}

#[test]
fn qemu_img_converts_in_and_out() {
    let Some(_) = tool("qemu-img") else { return };
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, b"qemu key").unwrap();
    let img = dir.path().join("vol.img");
    cryptblk_luks2(&img, &key, 32 << 20);
    let src = dir.path().join("src.raw");
    let data = write_pattern(&src, 16 << 20, 3);
    let sock = dir.path().join("q.sock");
    let _s = open_nbd(&img, &key, "t-qemu", &sock, &[]);
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&src)
            .arg(nbd_uri(&sock)),
        b"",
    );
    let dst = dir.path().join("dst.raw");
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw"])
            .arg(nbd_uri(&sock))
            .arg(&dst),
        b"",
    );
    let back = std::fs::read(&dst).unwrap();
    assert!(
        back[..data.len()] == data[..],
        "qemu-img round trip differs"
    );
    let mut io = Command::new("qemu-io");
    io.args([
        "-f",
        "raw",
        "-c",
        "write -P 0xab 1M 64k",
        "-c",
        "read -P 0xab 1M 64k",
    ])
    .arg(nbd_uri(&sock));
    let out = run_ok(&mut io, b"");
    assert!(!out.contains("Pattern verification failed"), "{out}");
}

/// Writes a dm table to a private file (tables with keys never go on a command line).
fn table_file(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("table");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn fio_verifies_while_refresh_flips_the_pipeline() {
    let Some(_) = tool("fio") else { return };
    let dir = tempdir();
    let key: String = (0..64)
        .map(|i| format!("{:02x}", (i * 7 + 3) % 256))
        .collect();
    let tbl = table_file(
        dir.path(),
        &format!("0 131072 crypt aes-xts-plain64 {key} 0 ram:64M 0\n"),
    );
    let sock = dir.path().join("f.sock");
    run_ok(
        cryptblk()
            .args(["dm", "create", "t-flip", "--table-file"])
            .arg(&tbl)
            .arg("--nbd")
            .arg(&sock),
        b"",
    );
    let _s = Served::volume("t-flip");

    let mut child = spawn_fio_verify(dir.path(), &sock, "flip", "32M", 3);

    // Flip between the models for as long as fio runs; count only flips made under load.
    let modes: [&[&str]; 4] = [
        &["--perf-queued"],
        &[],
        &["--perf-no_read_workqueue"],
        &["--perf-same_cpu_crypt"],
    ];
    let flips = repeat_while_running(&mut child, Duration::from_millis(100), |n| {
        let m = modes[n % modes.len()];
        run_ok(cryptblk().args(["refresh", "t-flip"]).args(m), b"");
    });
    for job in fio_jobs(child, &format!("during {flips} refreshes")) {
        assert_eq!(job["error"], 0, "fio job error: {job}");
        assert!(
            job["read"]["io_bytes"].as_u64().unwrap() > 0,
            "job read nothing"
        );
        assert!(
            job["write"]["io_bytes"].as_u64().unwrap() > 0,
            "job wrote nothing"
        );
    }
    assert!(flips >= 4, "only {flips} refreshes happened");
    let v = status("t-flip");
    assert_eq!(v["pipeline"].as_array().unwrap().len(), 1);
}

#[test]
fn sigterm_flushes_and_data_survives() {
    let Some(_) = tool("nbdcopy") else { return };
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, b"sigterm key").unwrap();
    let img = dir.path().join("vol.img");
    sparse_file(&img, 24 << 20);
    run_ok(
        cryptblk()
            .args(["luksFormat", "--batch-mode", "--type", "luks1"])
            .args(["--pbkdf-force-iterations", "1000"])
            .arg("--key-file")
            .arg(&key)
            .arg(&img),
        b"",
    );
    let data_path = dir.path().join("d.bin");
    let data = write_pattern(&data_path, 2 << 20, 5);
    let sock = dir.path().join("s.sock");
    let out = run_ok(
        cryptblk()
            .args(["open", "--json", "--key-file"])
            .arg(&key)
            .arg(&img)
            .arg("t-term")
            .arg("--nbd")
            .arg(&sock),
        b"",
    );
    let facts: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let pid = facts["pid"].as_i64().unwrap() as i32;
    run_ok(
        Command::new("nbdcopy").arg(&data_path).arg(nbd_uri(&sock)),
        b"",
    );
    // SAFETY: signalling a child process we started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let ctl = runtime_dir().join("t-term.ctl");
    let t = Instant::now();
    while ctl.exists() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!ctl.exists(), "daemon did not stop on SIGTERM");
    let plain = dir.path().join("plain.bin");
    run_ok(
        cryptblk()
            .args(["decrypt", "--key-file"])
            .arg(&key)
            .arg(&img)
            .arg(&plain),
        b"",
    );
    let back = std::fs::read(&plain).unwrap();
    assert!(
        back[..data.len()] == data[..],
        "data written before SIGTERM was lost"
    );
}

#[test]
fn errors_have_cryptsetup_exit_codes() {
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, b"k1").unwrap();
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, b"k2").unwrap();
    let img = dir.path().join("vol.img");
    cryptblk_luks2(&img, &key, 20 << 20);
    let code = |c: &mut Command| {
        let o = run(c, b"");
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(!err.contains("panicked"), "panic: {err}");
        (o.status.code().unwrap(), err)
    };
    let (c, e) = code(
        cryptblk()
            .args(["open", "--test-passphrase", "--key-file"])
            .arg(&wrong)
            .arg(&img),
    );
    assert_eq!(c, 2, "wrong passphrase: {e}");
    assert!(e.contains("No key available"), "{e}");
    let (c, e) = code(
        cryptblk()
            .args(["luksDump"])
            .arg(dir.path().join("missing.img")),
    );
    assert_eq!(c, 4, "missing device: {e}");
    let notluks = dir.path().join("zero.img");
    sparse_file(&notluks, 4 << 20);
    let (c, e) = code(cryptblk().args(["luksDump"]).arg(&notluks));
    assert_eq!(c, 1, "not LUKS: {e}");
    assert!(e.contains("not a valid LUKS device"), "{e}");
    let (c, _) = code(cryptblk().args(["isLuks"]).arg(&notluks));
    assert_eq!(c, 1);
    let (c, _) = code(cryptblk().args(["isLuks"]).arg(&img));
    assert_eq!(c, 0);
    let (c, _) = code(cryptblk().args(["isLuks", "--type", "luks1"]).arg(&img));
    assert_eq!(c, 1);
    let (c, e) = code(cryptblk().args(["close", "no-such-mapping"]));
    assert_eq!(c, 4, "{e}");
    let (c, e) = code(
        cryptblk()
            .args([
                "luksFormat",
                "--batch-mode",
                "--cipher",
                "aes-nope-plain64",
                "--key-file",
            ])
            .arg(&key)
            .arg(&notluks),
    );
    assert_eq!(c, 1, "{e}");
    let (c, e) = code(
        cryptblk()
            .args(["open", "--key-file"])
            .arg(&key)
            .arg(&img)
            .arg("bad/name")
            .args(["--nbd", "/tmp/x.sock"]),
    );
    assert_eq!(c, 1, "{e}");
    // A busy name: the second open of the same name must fail with 5 and leave the first up.
    let sock = dir.path().join("b.sock");
    let _s = open_nbd(&img, &key, "t-busy", &sock, &[]);
    let (c, e) = code(
        cryptblk()
            .args(["open", "--key-file"])
            .arg(&key)
            .arg(&img)
            .arg("t-busy")
            .arg("--nbd")
            .arg(dir.path().join("b2.sock")),
    );
    assert_eq!(c, 5, "{e}");
    run_ok(cryptblk().args(["status", "t-busy"]), b"");
    // Unknown option: wrong parameters.
    let (c, _) = code(cryptblk().args(["luksDump", "--no-such-option"]).arg(&img));
    assert_eq!(c, 1);
}

#[test]
fn dm_reload_suspend_resume_under_fio_verify() {
    let Some(_) = tool("fio") else { return };
    let dir = tempdir();
    let key: String = (0..64)
        .map(|i| format!("{:02x}", (i * 13 + 1) % 256))
        .collect();
    let queued = format!("0 131072 crypt aes-xts-plain64 {key} 0 ram:64M 0\n");
    let inline = format!(
        "0 131072 crypt aes-xts-plain64 {key} 0 ram:64M 0 2 no_read_workqueue no_write_workqueue\n"
    );
    let sock = dir.path().join("r.sock");
    run_ok(
        cryptblk()
            .args(["dm", "create", "t-reload", "--table-file"])
            .arg(table_file(dir.path(), &queued))
            .arg("--nbd")
            .arg(&sock),
        b"",
    );
    let _s = Served::volume("t-reload");
    // Keys are masked in `dm table`, as dmsetup masks them without --showkeys.
    let shown = run_ok(cryptblk().args(["dm", "table", "t-reload"]), b"");
    assert!(
        !shown.contains(&key) && shown.contains(" crypt aes-xts-plain64 0000"),
        "{shown}"
    );

    let mut fio = Command::new("fio");
    // fio leaves verify state files in its working directory.
    fio.current_dir(dir.path());
    fio.args([
        "--name=reload",
        "--ioengine=nbd",
        &format!("--uri={}", nbd_uri(&sock)),
        "--rw=randwrite",
        "--bs=16k",
        "--size=48M",
        "--iodepth=8",
        "--verify=crc32c",
        "--verify_backlog=32",
        "--verify_fatal=1",
        "--loops=2",
    ]);
    let mut child = spawn_captured(&mut fio);
    let swaps = repeat_while_running(&mut child, Duration::from_millis(100), |n| {
        let text = if n % 2 == 0 { &inline } else { &queued };
        run_ok(
            cryptblk().args(["dm", "reload", "t-reload", "--table-file", "-"]),
            text.as_bytes(),
        );
        run_ok(cryptblk().args(["dm", "suspend", "t-reload"]), b"");
        run_ok(cryptblk().args(["dm", "resume", "t-reload"]), b"");
    });
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "fio failed across {swaps} table swaps: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(swaps >= 3, "only {swaps} swaps happened while fio ran");
}

#[test]
fn plain_volume_uses_cryptsetups_key_derivation_and_offsets() {
    let Some(_) = tool("nbdcopy") else { return };
    let dir = tempdir();
    let img = dir.path().join("plain.img");
    sparse_file(&img, 16 << 20);
    let data_path = dir.path().join("d");
    let data = write_pattern(&data_path, 1 << 20, 31);
    let sock = dir.path().join("p.sock");
    // cryptsetup's api-test vector: passphrase "blabla", sha256, 256-bit key =>
    // volume key = sha256("blabla").
    run_ok(
        cryptblk()
            .args([
                "open",
                "--type",
                "plain",
                "--cipher",
                "aes-cbc-essiv:sha256",
                "--key-size",
                "256",
                "--hash",
                "sha256",
            ])
            .args(["--offset", "2048", "--skip", "16"])
            .arg(&img)
            .arg("t-plain")
            .arg("--nbd")
            .arg(&sock),
        b"blabla\n",
    );
    {
        let _s = Served::volume("t-plain");
        let st = run_ok(cryptblk().args(["status", "t-plain", "--json"]), b"");
        let v: serde_json::Value = serde_json::from_str(&st).unwrap();
        assert_eq!(v["size"].as_u64().unwrap(), (16 << 20) - 2048 * 512);
        run_ok(
            Command::new("nbdcopy").arg(&data_path).arg(nbd_uri(&sock)),
            b"",
        );
    }
    let vk = "ccadd99b16cd3d200c22d6db45d8b6630ef3d936767127347ec8a76ab992c2ea";
    let raw = std::fs::read(&img).unwrap();
    let ct = &raw[2048 * 512..2048 * 512 + data.len()];
    // --skip is the IV offset: sector 0 of the mapping uses IV sector 16.
    let out = run(
        Command::new("python3").arg(independent_model()).args([
            "decrypt",
            "--cipher",
            "aes-cbc-essiv:sha256",
            "--key",
            vk,
            "--iv-offset",
            "16",
            "-",
            "-",
        ]),
        ct,
    );
    assert!(out.status.success());
    assert!(
        out.stdout == data,
        "plain mapping does not match cryptsetup's derivation"
    );
}
