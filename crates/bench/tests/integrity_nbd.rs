//! End to end: the integrity report over the NBD transport (cryptblk's NBD server driven by
//! fio's nbd engine), and proof that its fio verification catches wrong data.
//!
//! Needs fio with its nbd engine; set CRYPTBLK_SKIP_FIO=1 to accept its absence explicitly
//! (without it a missing fio fails the tests). No test asserts a speed.

use std::sync::Arc;
use std::time::Duration;

use cryptblk_bench::fio::{self, FioJob, FioTarget, FioVerify};
use cryptblk_bench::integrity::{
    self, IntegrityBenchConfig, IntegrityBenchOptions, IntegrityStack, NbdSetup,
};
use cryptblk_bench::{Transport, Workload};
use cryptblk_dm::{Registry, WriteFlags};

fn fio_missing() -> bool {
    let usable = fio::version(std::path::Path::new("fio")).is_some()
        && fio::has_engine(std::path::Path::new("fio"), "nbd");
    if !usable && std::env::var("CRYPTBLK_SKIP_FIO").is_ok_and(|v| v == "1") {
        eprintln!("fio with the nbd engine is missing: skipped (CRYPTBLK_SKIP_FIO=1)");
        return true;
    }
    assert!(
        usable,
        "fio with its nbd engine is needed (set CRYPTBLK_SKIP_FIO=1 to skip explicitly)"
    );
    false
}

#[test]
fn both_transports_fill_their_own_table() {
    if fio_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let opts = IntegrityBenchOptions {
        runtime: Duration::from_millis(200),
        repeats: 1,
        device_size: 64 << 20,
        region: 8 << 20,
        configs: vec!["int-crc32c-j".into(), "verity".into()],
        workloads: vec!["write".into(), "randread".into()],
        transports: vec![Transport::Inproc, Transport::Nbd],
        work_dir: Some(dir.path().to_path_buf()),
        ..IntegrityBenchOptions::default()
    };
    let r = integrity::run(&opts).unwrap();
    let names: Vec<&str> = r.configs.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["plain", "int-crc32c-j", "verity"]);
    for t in ["inproc", "nbd"] {
        for (c, w) in [
            ("plain", "write"),
            ("int-crc32c-j", "write"),
            ("plain", "randread"),
            ("int-crc32c-j", "randread"),
            ("verity", "randread"),
        ] {
            let v = r.mb_s(t, c, w);
            assert!(v.is_some_and(|v| v > 0.0), "{t} {c} {w}: {v:?}");
        }
        // verity takes no writes on either transport.
        assert_eq!(r.mb_s(t, "verity", "write"), None);
    }
    let md = r.render_markdown();
    assert!(md.contains("#### Transport `inproc`"), "{md}");
    assert!(md.contains("#### Transport `nbd`"), "{md}");
    assert!(r.render_aims().contains("ratio to plain (nbd)"));
}

#[test]
fn nbd_reads_of_data_fio_did_not_write_fail_verification() {
    if fio_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let registry = Arc::new(Registry::new());
    let region = 4 << 20;
    let plain = IntegrityBenchConfig::builtin()
        .into_iter()
        .find(|c| c.name == "plain")
        .unwrap();
    let setup = NbdSetup {
        fio: std::path::Path::new("fio"),
        dir: dir.path(),
    };
    let stack = IntegrityStack::create(&registry, &plain, 16 << 20, region, Some(&setup))
        .unwrap()
        .unwrap();
    let uri = stack.nbd_uri().expect("served over NBD");
    let read = Workload {
        name: "read".into(),
        description: String::new(),
        pattern: cryptblk_bench::workload::AccessPattern::Sequential,
        read_percent: 100,
        block_size: 4096,
        jobs: 1,
        iodepth: 1,
    };
    let job = FioJob {
        target: FioTarget::Nbd { uri },
        workload: &read,
        offset: region,
        region,
        runtime: Duration::from_millis(300),
        verify: FioVerify::Headers,
        logs: None,
    };
    // The region as filled: every block carries a valid fio header.
    let m = fio::run(std::path::Path::new("fio"), &job, dir.path()).unwrap();
    assert!(m.read.ops > 0);
    // One block overwritten behind fio's back: the read job must fail on it.
    stack
        .device()
        .write_at(region + 8 * 4096, &[0x5a; 4096], WriteFlags::default())
        .unwrap();
    let err = fio::run(std::path::Path::new("fio"), &job, dir.path()).unwrap_err();
    assert!(err.to_string().contains("verify"), "{err}");
}
