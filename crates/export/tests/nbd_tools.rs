//! The NBD server against real clients: libnbd's nbdinfo and nbdcopy, qemu-img, qemu-io
//! and fio's nbd engine. Data is always checked against the device's bytes directly.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{pattern, require_tool, run, run_text, MemDisk, TempDir};
use cryptblk_export::{NbdConfig, NbdServer};

const MIB: u64 = 1 << 20;

fn serve(disk: &Arc<MemDisk>, dir: &TempDir, read_only: bool) -> NbdServer {
    let mut config = NbdConfig::unix(dir.join("nbd.sock"));
    config.read_only = read_only;
    NbdServer::start(disk.clone(), config).expect("start server")
}

fn json_export(uri: &str) -> serde_json::Value {
    let text = run_text(Command::new("nbdinfo").arg("--json").arg(uri));
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("nbdinfo JSON: {e}\n{text}"));
    v["exports"][0].clone()
}

#[test]
fn nbdinfo_shows_size_block_sizes_and_flags() {
    if !require_tool("nbdinfo", "NBDINFO") {
        return;
    }
    let dir = TempDir::new("nbdinfo");
    for (block, read_only) in [(512u32, false), (4096, true)] {
        let disk = MemDisk::new(24 * MIB, block);
        let server = serve(&disk, &dir, read_only);
        let e = json_export(&server.uri());
        assert_eq!(e["export-size"], 24 * MIB, "{e}");
        assert_eq!(e["block_size_minimum"], block, "{e}");
        assert_eq!(e["block_size_preferred"], 4096, "{e}");
        assert_eq!(e["block_size_maximum"], 32 << 20, "{e}");
        assert_eq!(e["is_read_only"], read_only, "{e}");
        for flag in [
            "can_flush",
            "can_fua",
            "can_trim",
            "can_zero",
            "can_multi_conn",
            "can_cache",
        ] {
            assert_eq!(e[flag], true, "{flag} in {e}");
        }
        // Allocation map through base:allocation: one data extent over the whole export.
        let map = run_text(Command::new("nbdinfo").arg("--map").arg(server.uri()));
        let fields: Vec<&str> = map.split_whitespace().collect();
        assert_eq!(fields, ["0", &(24 * MIB).to_string(), "0", "data"], "{map}");
        // The human-readable form too (what an operator would look at).
        let text = run_text(Command::new("nbdinfo").arg(server.uri()));
        assert!(
            text.contains(&format!("export-size: {}", 24 * MIB)),
            "{text}"
        );
        assert!(text.contains("newstyle-fixed"), "{text}");
        server.stop().unwrap();
    }
}

#[test]
fn nbdcopy_round_trip_over_several_connections() {
    if !require_tool("nbdcopy", "NBDCOPY") {
        return;
    }
    let dir = TempDir::new("nbdcopy");
    let disk = MemDisk::new(32 * MIB, 512);
    let server = serve(&disk, &dir, false);
    let input = pattern(11, 32 * MIB as usize);
    std::fs::write(dir.join("in.img"), &input).unwrap();
    // nbdcopy opens several connections when the server advertises CAN_MULTI_CONN.
    run(Command::new("nbdcopy")
        .args(["--connections=4", "--requests=16", "--flush"])
        .arg(dir.join("in.img"))
        .arg(server.uri()));
    assert!(
        disk.snapshot() == input,
        "device differs from the copied-in file"
    );
    let changed = pattern(12, 32 * MIB as usize);
    disk.fill(&changed);
    run(Command::new("nbdcopy")
        .arg(server.uri())
        .arg(dir.join("out.img")));
    assert!(
        std::fs::read(dir.join("out.img")).unwrap() == changed,
        "copied-out file differs"
    );
    server.stop().unwrap();
}

#[test]
fn qemu_img_convert_in_and_out() {
    if !require_tool("qemu-img", "QEMU_IMG") {
        return;
    }
    let dir = TempDir::new("qemuimg");
    let disk = MemDisk::new(16 * MIB, 4096);
    let server = serve(&disk, &dir, false);
    let mut input = pattern(13, 16 * MIB as usize);
    // A zero region lets qemu-img use WRITE_ZEROES on it.
    input[4 * MIB as usize..6 * MIB as usize].fill(0);
    disk.fill(&vec![0x77; 16 * MIB as usize]);
    std::fs::write(dir.join("in.img"), &input).unwrap();
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(dir.join("in.img"))
        .arg(server.uri()));
    assert!(
        disk.snapshot() == input,
        "device differs after qemu-img convert in"
    );
    let info = run_text(
        Command::new("qemu-img")
            .args(["info", "--output=json"])
            .arg(server.uri()),
    );
    assert!(
        info.contains(&format!("\"virtual-size\": {}", 16 * MIB)),
        "{info}"
    );
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw"])
        .arg(server.uri())
        .arg(dir.join("out.img")));
    assert!(
        std::fs::read(dir.join("out.img")).unwrap() == input,
        "qemu-img convert out differs"
    );
    server.stop().unwrap();
}

#[test]
fn qemu_io_patterns_zeroes_and_discard() {
    if !require_tool("qemu-io", "QEMU_IO") {
        return;
    }
    let dir = TempDir::new("qemuio");
    let disk = MemDisk::new(8 * MIB, 512);
    let server = serve(&disk, &dir, false);
    let cmds = [
        "write -P 0xab 0 64k",
        "write -P 0xcd 1M 4k",
        "write -P 0x11 1000 3000",
        "write -f -P 0x22 2M 128k",
        "write -z 3M 64k",
        "discard 5M 64k",
        "flush",
        "read -P 0xab 0 1000",
        "read -P 0x11 1000 3000",
        "read -P 0xab 4000 61536",
        "read -P 0xcd 1M 4k",
        "read -P 0x22 2M 128k",
        "read -P 0 3M 64k",
    ];
    disk.fill(&vec![0x99; 8 * MIB as usize]);
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", "raw"]);
    for c in cmds {
        cmd.args(["-c", c]);
    }
    cmd.arg(server.uri());
    let out = run_text(&mut cmd);
    // qemu-io reports a pattern mismatch on stdout but still exits 0.
    assert!(
        !out.contains("failed") && !out.contains("error"),
        "qemu-io:\n{out}"
    );
    let snap = disk.snapshot();
    assert!(snap[..1000].iter().all(|&b| b == 0xab));
    assert!(snap[1000..4000].iter().all(|&b| b == 0x11));
    assert!(snap[4000..65536].iter().all(|&b| b == 0xab));
    assert!(snap[65536..MIB as usize].iter().all(|&b| b == 0x99));
    assert!(snap[MIB as usize..MIB as usize + 4096]
        .iter()
        .all(|&b| b == 0xcd));
    assert!(snap[3 * MIB as usize..3 * MIB as usize + 65536]
        .iter()
        .all(|&b| b == 0));
    assert!(
        snap[5 * MIB as usize..5 * MIB as usize + 65536]
            .iter()
            .all(|&b| b == 0xdd),
        "discard must reach the device as a trim"
    );
    // A read that does not match must be reported (the check above can fail).
    let out = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read -P 0x12 0 512"])
        .arg(server.uri())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success() && text.contains("Pattern verification failed"),
        "{text}"
    );
    server.stop().unwrap();
}

#[test]
fn qemu_io_read_only_export_refuses_writes() {
    if !require_tool("qemu-io", "QEMU_IO") {
        return;
    }
    let dir = TempDir::new("qemuio-ro");
    let disk = MemDisk::new(4 * MIB, 512);
    disk.fill(&vec![0x42; 4 * MIB as usize]);
    let server = serve(&disk, &dir, true);
    // qemu honours NBD_FLAG_READ_ONLY: a read-write open is refused, a read-only one works.
    let out = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 1 0 4k"])
        .arg(server.uri())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success() && !text.contains("wrote"), "{text}");
    let text = run_text(
        Command::new("qemu-io")
            .args(["-r", "-f", "raw", "-c", "read -P 0x42 0 64k"])
            .arg(server.uri()),
    );
    assert!(text.contains("read 65536/65536"), "{text}");
    assert!(
        !text.contains("wrote") && !text.contains("failed"),
        "{text}"
    );
    assert!(disk.snapshot().iter().all(|&b| b == 0x42));
    server.stop().unwrap();
}

#[test]
fn two_qemu_io_clients_at_once() {
    if !require_tool("qemu-io", "QEMU_IO") {
        return;
    }
    let dir = TempDir::new("two");
    let disk = MemDisk::new(16 * MIB, 512);
    let server = serve(&disk, &dir, false);
    let spawn = |pat: u8, base: u64| {
        let mut cmd = Command::new("qemu-io");
        cmd.args(["-f", "raw"]);
        for i in 0..64u64 {
            cmd.args(["-c", &format!("write -P {pat} {} 64k", base + i * 65536)]);
        }
        for i in 0..64u64 {
            cmd.args(["-c", &format!("read -P {pat} {} 64k", base + i * 65536)]);
        }
        cmd.arg(server.uri());
        cmd.stdout(std::process::Stdio::piped());
        cmd.spawn().unwrap()
    };
    let a = spawn(0x5a, 0);
    let b = spawn(0xa5, 8 * MIB);
    for child in [a, b] {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && !text.contains("failed"), "{text}");
    }
    let snap = disk.snapshot();
    assert!(snap[..4 * MIB as usize].iter().all(|&x| x == 0x5a));
    assert!(snap[8 * MIB as usize..12 * MIB as usize]
        .iter()
        .all(|&x| x == 0xa5));
    assert!(snap[4 * MIB as usize..8 * MIB as usize]
        .iter()
        .all(|&x| x == 0));
    server.stop().unwrap();
}

#[test]
fn fio_nbd_engine_randrw_with_crc32c_verify() {
    if !require_tool("fio", "FIO") {
        return;
    }
    let engines = run_text(Command::new("fio").arg("--enghelp"));
    assert!(
        engines.contains("nbd"),
        "this fio lacks the nbd engine:\n{engines}"
    );
    let dir = TempDir::new("fio");
    let disk = MemDisk::new(32 * MIB, 512);
    let server = serve(&disk, &dir, false);
    let fio = |extra: &[&str]| {
        let mut cmd = Command::new("fio");
        cmd.args([
            "--name=nbd-verify",
            "--ioengine=nbd",
            "--rw=randrw",
            "--bs=4k",
            "--size=32M",
            "--iodepth=16",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--randseed=1234",
            "--output-format=json",
        ])
        .args(extra)
        .arg(format!("--uri={}", server.uri()))
        .current_dir(dir.path());
        cmd
    };
    let out = run_text(&mut fio(&["--do_verify=1"]));
    let v: serde_json::Value = serde_json::from_str(&out[out.find('{').unwrap_or(0)..]).unwrap();
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    assert!(job["write"]["io_bytes"].as_u64().unwrap() > 0, "{job}");
    assert!(job["read"]["io_bytes"].as_u64().unwrap() > 0, "{job}");
    // A second, verify-only pass over a new connection re-reads everything fio wrote.
    run(&mut fio(&["--verify_only"]));
    // fio's verify headers are really on the device: 4 KiB blocks fio wrote start with
    // its verify magic 0xacca.
    let snap = disk.snapshot();
    let with_header = snap
        .chunks(4096)
        .filter(|b| b[0] == 0xca && b[1] == 0xac)
        .count();
    assert!(with_header > 0, "no fio verify headers found on the device");
    // Corrupting the verified blocks behind the server's back must make fio fail.
    let mut bad = snap.clone();
    for block in bad
        .chunks_mut(4096)
        .filter(|b| b[0] == 0xca && b[1] == 0xac)
    {
        block[100] ^= 0xff;
    }
    disk.fill(&bad);
    let out = fio(&["--verify_only"]).output().unwrap();
    assert!(
        !out.status.success(),
        "fio did not notice a corrupted block"
    );
    server.stop().unwrap();
}

#[test]
fn killed_client_does_not_disturb_the_server() {
    if !require_tool("nbdcopy", "NBDCOPY") {
        return;
    }
    let dir = TempDir::new("killtool");
    let disk = MemDisk::new(64 * MIB, 512);
    let server = serve(&disk, &dir, false);
    std::fs::write(dir.join("in.img"), pattern(14, 64 * MIB as usize)).unwrap();
    for delay in [5u64, 30, 80] {
        let mut child = Command::new("nbdcopy")
            .arg(dir.join("in.img"))
            .arg(server.uri())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay));
        let _ = child.kill();
        let _ = child.wait();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while server.connection_count() > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(server.connection_count(), 0);
    // Still serving correctly.
    let fresh = pattern(15, 64 * MIB as usize);
    std::fs::write(dir.join("in2.img"), &fresh).unwrap();
    run(Command::new("nbdcopy")
        .arg(dir.join("in2.img"))
        .arg(server.uri()));
    assert!(disk.snapshot() == fresh);
    server.stop().unwrap();
}
