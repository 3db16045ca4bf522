//! `luksSuspend` / `luksResume` of a volume served over NBD: a writer started while the
//! volume is suspended is held, not failed, and completes after resume with its data on
//! disk (checked with cryptsetup's volume key and the independent model); after suspend the
//! volume key is nowhere in the daemon's memory (/proc/PID/mem); a wrong passphrase on
//! resume exits 2 and leaves the volume suspended; the other refusals exit with the codes
//! and messages cryptsetup 2.6 gives on a kernel (observed in the lab: already suspended 1,
//! not suspended 1, inactive key slot 1, no such device 4, not a LUKS mapping 4).

mod common;
use common::memory::in_memory;
use common::*;
use std::process::Command;
use std::time::{Duration, Instant};

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn suspend_holds_io_wipes_the_key_and_resume_releases_it() {
    let Some(_) = tool("nbdcopy") else { return };
    let dir = tempdir();
    let key = write_file(dir.path(), "key", b"suspend test key");
    let bad = write_file(dir.path(), "bad", b"not the key");
    let img = dir.path().join("vol.img");
    let Some(()) = cryptsetup_luks2(&img, &key, 24 << 20) else {
        return;
    };
    let vk_hex = cryptsetup_volume_key(&img, &key, &[]).unwrap();
    let vk = hex_bytes(&vk_hex);
    let name = "t-suspend";
    let sock = dir.path().join("nbd.sock");
    let served = open_nbd(&img, &key, name, &sock, &[]);
    let pid = status(name)["pid"].as_u64().unwrap() as u32;
    // The scan can see the key while the volume is live: its absence later means something.
    assert!(in_memory(pid, &vk), "the scan does not find the live key");

    run_ok(cryptblk().args(["luksSuspend", name]), b"");
    assert_eq!(status(name)["suspended"], true);
    assert!(
        !in_memory(pid, &vk),
        "volume key still in the daemon's memory after suspend"
    );
    assert!(
        !in_memory(pid, vk_hex.as_bytes()),
        "volume key (hex) still in the daemon's memory after suspend"
    );
    // Nothing rebuilds the table from the wiped key meanwhile.
    let (rc, err) = code(cryptblk().args(["refresh", name, "--perf-queued"]));
    assert_eq!(rc, 5, "{err}");
    let (rc, err) = code(cryptblk().args(["resize", name]));
    assert_eq!(rc, 5, "{err}");
    let (rc, err) = code(cryptblk().args(["luksSuspend", name]));
    assert_eq!(rc, 1, "{err}");
    assert!(
        err.contains(&format!("Volume {name} is already suspended.")),
        "{err}"
    );

    // A writer while suspended: held, not failed.
    let data_path = dir.path().join("data.bin");
    let data = write_pattern(&data_path, 2 << 20, 7);
    let mut writer = Command::new("nbdcopy")
        .arg(&data_path)
        .arg(nbd_uri(&sock))
        .spawn()
        .unwrap();
    // Its first request reaches the daemon and is held there (status counts it).
    wait_held(name, &mut writer);

    let (rc, err) = code(
        cryptblk()
            .args(["luksResume", name, "--key-file"])
            .arg(&bad),
    );
    assert_eq!(rc, 2, "{err}");
    assert!(
        err.contains("No key available with this passphrase."),
        "{err}"
    );
    assert_eq!(status(name)["suspended"], true);
    let (rc, err) = code(
        cryptblk()
            .args(["luksResume", name, "-S", "3", "--key-file"])
            .arg(&key),
    );
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("No usable keyslot is available."), "{err}");
    assert_eq!(status(name)["suspended"], true);
    assert!(
        writer.try_wait().unwrap().is_none(),
        "the writer ended while suspended"
    );
    // Held I/O is an opener: close refuses as the kernel refuses an open device.
    let (rc, err) = code(cryptblk().args(["close", name]));
    assert_eq!(rc, 5, "{err}");
    assert!(
        err.contains(&format!("Device {name} is still in use.")),
        "{err}"
    );
    assert_eq!(status(name)["suspended"], true);

    run_ok(
        cryptblk()
            .args(["luksResume", name, "--key-file"])
            .arg(&key),
        b"",
    );
    let done = writer.wait().unwrap();
    assert!(done.success(), "the held writer failed: {done}");
    assert_eq!(status(name)["suspended"], false);
    let (rc, err) = code(
        cryptblk()
            .args(["luksResume", name, "--key-file"])
            .arg(&key),
    );
    assert_eq!(rc, 1, "{err}");
    assert!(
        err.contains(&format!("Volume {name} is not suspended.")),
        "{err}"
    );
    // A second suspend also finds no copy left behind by the first resume's `key set`.
    run_ok(cryptblk().args(["luksSuspend", name]), b"");
    assert!(!in_memory(pid, &vk), "key in memory after a second suspend");
    assert!(
        !in_memory(pid, vk_hex.as_bytes()),
        "key (hex) in memory after a second suspend"
    );
    // Nothing held: a suspended volume closes (the kernel removes a suspended device), its
    // backing flushed without waiting for a resume.
    run_ok(cryptblk().args(["close", name]), b"");
    let (rc, err) = code(cryptblk().args(["status", name]));
    assert_eq!(rc, 4, "{err}");
    drop(served);

    // What the held writer wrote is on disk, encrypted with the volume key.
    let (off, sector) = cryptsetup_luks2_segment(&img).unwrap();
    let raw = std::fs::read(&img).unwrap();
    let plain = independent(
        "decrypt",
        "aes-xts-plain64",
        &vk_hex,
        sector,
        &raw[off..off + data.len()],
    );
    assert!(plain == data, "the held write did not land intact");
}

#[test]
fn suspend_refuses_what_is_not_a_served_luks_volume() {
    let (rc, err) = code(cryptblk().args(["luksSuspend", "t-no-such-volume"]));
    assert_eq!(rc, 4, "{err}");
    let (rc, err) = code(cryptblk().args(["luksResume", "t-no-such-volume"]));
    assert_eq!(rc, 4, "{err}");
    // A raw dm mapping has no LUKS header to resume from.
    let name = "t-suspend-raw";
    let dir = tempdir();
    run_ok(
        cryptblk()
            .args(["dm", "create", name, "--table", "0 2048 zero", "--nbd"])
            .arg(dir.path().join("raw.sock")),
        b"",
    );
    let _served = Served::volume(name);
    let (rc, err) = code(cryptblk().args(["luksSuspend", name]));
    assert_eq!(rc, 4, "{err}");
    assert!(
        err.contains(&format!("{name} is not active LUKS device name.")),
        "{err}"
    );
}

#[test]
fn fio_verifies_across_suspend_resume_cycles() {
    let Some(_) = tool("fio") else { return };
    let dir = tempdir();
    let key = write_file(dir.path(), "key", b"fio suspend key");
    let img = dir.path().join("vol.img");
    let Some(()) = cryptsetup_luks2(&img, &key, 40 << 20) else {
        return;
    };
    let name = "t-suspend-fio";
    let sock = dir.path().join("nbd.sock");
    let _served = open_nbd(&img, &key, name, &sock, &[]);
    let mut child = spawn_fio_verify(dir.path(), &sock, "suspend", "8M", 2);
    // Suspend and resume for as long as fio runs; count only cycles made under load.
    let cycles = repeat_while_running(&mut child, Duration::from_millis(150), |_| {
        run_ok(cryptblk().args(["luksSuspend", name]), b"");
        // Resume only once fio's I/O is held by the suspend (or fio has finished).
        let deadline = Instant::now() + Duration::from_secs(20);
        while status(name).get("held").is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        run_ok(
            cryptblk()
                .args(["luksResume", name, "--key-file"])
                .arg(&key),
            b"",
        );
    });
    for job in fio_jobs(child, &format!("across {cycles} suspend/resume cycles")) {
        assert_eq!(job["error"], 0, "fio job error: {job}");
        assert!(
            job["read"]["io_bytes"].as_u64().unwrap() > 0,
            "job verified nothing"
        );
    }
    assert!(cycles >= 2, "only {cycles} cycles happened while fio ran");
    eprintln!("fio verified across {cycles} suspend/resume cycles");
}

#[test]
fn luks1_resumes_by_key_slot_and_keeps_its_data() {
    let Some(_) = tool("nbdcopy") else { return };
    let dir = tempdir();
    let key = write_file(dir.path(), "key", b"luks1 suspend key");
    let img = dir.path().join("vol.img");
    let Some(()) = cryptsetup_luks1(&img, &key, 8 << 20) else {
        return;
    };
    let name = "t-suspend-luks1";
    let sock = dir.path().join("nbd.sock");
    let _served = open_nbd(&img, &key, name, &sock, &[]);
    let data_path = dir.path().join("data.bin");
    let data = write_pattern(&data_path, 1 << 20, 4);
    run_ok(
        Command::new("nbdcopy").arg(&data_path).arg(nbd_uri(&sock)),
        b"",
    );
    run_ok(cryptblk().args(["luksSuspend", name]), b"");
    let (rc, err) = code(
        cryptblk()
            .args(["luksResume", name, "-S", "1", "--key-file"])
            .arg(&key),
    );
    assert_eq!(rc, 1, "{err}");
    run_ok(
        cryptblk()
            .args(["luksResume", name, "-S", "0", "--key-file"])
            .arg(&key),
        b"",
    );
    let back = dir.path().join("back.bin");
    run_ok(Command::new("nbdcopy").arg(nbd_uri(&sock)).arg(&back), b"");
    assert!(std::fs::read(&back).unwrap()[..data.len()] == data[..]);
}

/// Waits until the suspended volume `name` holds a request of `writer` (status `held`),
/// failing when the writer ends first or after 20 s.
fn wait_held(name: &str, writer: &mut std::process::Child) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if status(name)["held"].as_u64().unwrap_or(0) > 0 {
            return;
        }
        assert!(
            writer.try_wait().unwrap().is_none(),
            "the writer ended instead of being held"
        );
        assert!(Instant::now() < deadline, "no request was held within 20 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}
