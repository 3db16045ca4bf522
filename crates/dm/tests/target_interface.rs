//! The kernel's target interface: constructor registry, status kinds, messages routed by
//! sector, suspend/resume hooks in the kernel's order, crypt's key messages and integrity's
//! clean suspend.

use std::any::Any;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cryptblk_dm::{
    target_type_names, BlockDevice, Mapping, Registry, StatusType, Table, TableEntry, Target,
    WriteFlags,
};
use cryptblk_format::integrity::{IntegritySuperblock, FLAG_DIRTY_BITMAP};

const KEY64: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                     202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

#[test]
fn unknown_target_type_lists_every_registered_type() {
    assert_eq!(
        target_type_names(),
        [
            "linear",
            "zero",
            "error",
            "delay",
            "flakey",
            "crypt",
            "verity",
            "integrity"
        ]
    );
    let err = Registry::new()
        .load_table("0 8 bogus")
        .err()
        .expect("unknown type refused")
        .to_string();
    assert_eq!(
        err,
        "table line 1: bogus target: unknown target type 'bogus' \
         (known: linear zero error delay flakey crypt verity integrity)"
    );
}

#[test]
fn status_kinds_are_the_table_and_status_texts() {
    let reg = Registry::new();
    let m = reg
        .create(
            "s",
            &format!("0 64 crypt aes-xts-plain64 {KEY64} 0 ram:64K 0"),
        )
        .unwrap();
    m.with_table(|t| {
        let c = &t.entries()[0].target;
        assert_eq!(c.status(StatusType::Info), c.status_params());
        assert_eq!(
            c.status(StatusType::Table { show_keys: true }),
            format!("aes-xts-plain64 {KEY64} 0 ram:64K 0")
        );
        assert_eq!(
            c.status(StatusType::Table { show_keys: false }),
            format!("aes-xts-plain64 {} 0 ram:64K 0", "0".repeat(128))
        );
        assert_eq!(t.status_lines(StatusType::Info), t.status());
    });
}

#[test]
fn messages_go_to_the_target_covering_the_sector() {
    let reg = Registry::new();
    let m = reg
        .create("two", "0 64 linear ram:64K 0\n64 64 flakey ram:64K#f 0 1 0")
        .unwrap();
    let err = m.message(10, &["force", "down"]).unwrap_err().to_string();
    assert!(
        err.contains("linear target: target linear does not accept messages"),
        "{err}"
    );
    let err = m.message(128, &["force", "down"]).unwrap_err().to_string();
    assert!(err.contains("no target covers sector 128"), "{err}");
    let err = m.message(64, &["bogus"]).unwrap_err().to_string();
    assert!(
        err.contains("flakey target: unrecognised message 'bogus'"),
        "{err}"
    );

    let mut b = [0u8; 512];
    m.read_at(64 * 512, &mut b).unwrap();
    assert_eq!(m.message(127, &["force", "down"]).unwrap(), None);
    assert_eq!(errno(&m.read_at(64 * 512, &mut b).unwrap_err()), libc::EIO);
    // The linear half is untouched.
    m.read_at(0, &mut b).unwrap();
    m.message(64, &["force", "up"]).unwrap();
    m.read_at(64 * 512, &mut b).unwrap();

    // Write-failure controls and their counters, without reaching for the concrete type.
    m.message(64, &["fail_after_writes", "1", "drop"]).unwrap();
    for _ in 0..3 {
        m.write_at(64 * 512, &[9u8; 512], WriteFlags::default())
            .unwrap();
    }
    let st = m.stats();
    assert_eq!(st.len(), 1, "only flakey reports stats here");
    assert_eq!(st[0].target_type, "flakey");
    assert_eq!(st[0].counter("writes_passed"), Some(1));
    assert_eq!(st[0].counter("writes_dropped"), Some(2));
    m.message(64, &["disarm"]).unwrap();
    m.write_at(64 * 512, &[9u8; 512], WriteFlags::default())
        .unwrap();
    assert_eq!(m.stats()[0].counter("writes_passed"), Some(2));
}

#[test]
fn crypt_reports_counters_and_pipelines_as_stats() {
    let reg = Registry::new();
    let m = reg
        .create(
            "c",
            &format!("0 64 crypt aes-xts-plain64 {KEY64} 0 ram:64K 0 2 no_read_workqueue no_write_workqueue"),
        )
        .unwrap();
    m.write_at(0, &[1u8; 4096], WriteFlags::default()).unwrap();
    let mut b = vec![0u8; 1024];
    m.read_at(0, &mut b).unwrap();
    let st = &m.stats()[0];
    assert_eq!(st.target_type, "crypt");
    assert_eq!(
        (
            st.counter("reads"),
            st.counter("read_bytes"),
            st.counter("write_bytes")
        ),
        (Some(1), Some(1024), Some(4096))
    );
    assert_eq!(st.fact("read_pipeline"), Some("inline"));
    assert_eq!(st.fact("write_pipeline"), Some("inline"));
}

/// Waits up to 5 s for `rx`, panicking on timeout.
fn recv<T>(rx: &mpsc::Receiver<T>) -> T {
    rx.recv_timeout(Duration::from_secs(5)).expect("in time")
}

#[test]
fn crypt_key_wipe_and_set_as_the_kernel() {
    for flags in ["", " 2 no_read_workqueue no_write_workqueue"] {
        let reg = Registry::new();
        let table = format!("0 64 crypt aes-xts-plain64 {KEY64} 0 ram:64K 0{flags}");
        let m = reg.create("k", &table).unwrap();
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        m.write_at(0, &data, WriteFlags::default()).unwrap();

        // Key messages need a suspended device.
        let err = m.message(0, &["key", "wipe"]).unwrap_err().to_string();
        assert!(
            err.contains("not suspended during key manipulation"),
            "{err}"
        );
        m.suspend().unwrap();
        m.message(0, &["key", "wipe"]).unwrap();
        // The key is gone: zeros of its length even with --showkeys, the target itself
        // refuses I/O, and resume is refused so the mapping stays suspended.
        assert!(
            m.table(true).contains(&"0".repeat(128)),
            "{}",
            m.table(true).as_str()
        );
        m.with_table(|t| {
            let mut b = vec![0u8; 512];
            let e = t.entries()[0].target.read_at(0, &mut b).unwrap_err();
            assert_eq!(errno(&e), libc::ENOKEY);
        });
        let err = m.resume().unwrap_err().to_string();
        assert!(err.contains("preresume failed"), "{err}");
        assert!(m.info().suspended);

        // I/O through the mapping waits (as in the kernel) until a key is set.
        let m2: Arc<Mapping> = m.clone();
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut b = vec![0u8; 4096];
            let r = m2.read_at(0, &mut b);
            tx.send(r.map(|()| b)).unwrap();
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(rx.try_recv().is_err(), "a read finished with the key wiped");

        let short = &KEY64[..64];
        let err = m
            .message(0, &["key", "set", short])
            .unwrap_err()
            .to_string();
        assert!(err.contains("key size mismatch"), "{err}");
        let err = m.message(0, &["key", "set", "zz"]).unwrap_err().to_string();
        assert!(err.contains("invalid key"), "{err}");
        assert!(m.resume().is_err(), "still no key");
        m.message(0, &["key", "set", KEY64]).unwrap();
        assert!(!m.resume().unwrap(), "same table");
        assert_eq!(recv(&rx).unwrap(), data);
        reader.join().unwrap();
        assert!(m.table(true).contains(KEY64));

        // Another key decrypts to something else.
        m.suspend().unwrap();
        let other = "11".repeat(64);
        m.message(0, &["key", "set", &other]).unwrap();
        m.resume().unwrap();
        let mut b = vec![0u8; 4096];
        m.read_at(0, &mut b).unwrap();
        assert_ne!(b, data);
        assert!(m.message(0, &["key", "frob"]).is_err());
    }
}

/// A target that records its hooks and can hold a read in flight.
struct Probe {
    name: &'static str,
    log: Arc<Mutex<Vec<String>>>,
    gate: Mutex<Option<mpsc::Receiver<()>>>,
    entered: Mutex<Option<mpsc::Sender<()>>>,
    fail_preresume: AtomicBool,
}

impl Probe {
    fn new(name: &'static str, log: &Arc<Mutex<Vec<String>>>) -> Arc<Probe> {
        Arc::new(Probe {
            name,
            log: log.clone(),
            gate: Mutex::new(None),
            entered: Mutex::new(None),
            fail_preresume: AtomicBool::new(false),
        })
    }
    fn note(&self, what: &str) {
        self.log
            .lock()
            .unwrap()
            .push(format!("{} {what}", self.name));
    }
}

impl BlockDevice for Probe {
    fn size(&self) -> u64 {
        8 * 512
    }
    fn read_at(&self, _offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if let Some(tx) = self.entered.lock().unwrap().take() {
            tx.send(()).unwrap();
        }
        let gate = self.gate.lock().unwrap().take();
        if let Some(rx) = gate {
            recv(&rx);
        }
        self.note("read done");
        buf.fill(0);
        Ok(())
    }
    fn write_at(&self, _offset: u64, _buf: &[u8], _flags: WriteFlags) -> io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

impl Target for Probe {
    fn target_type(&self) -> &'static str {
        "probe"
    }
    fn table_params(&self, _show_keys: bool) -> String {
        self.name.to_string()
    }
    fn presuspend(&self) -> io::Result<()> {
        self.note("presuspend");
        Ok(())
    }
    fn postsuspend(&self) -> io::Result<()> {
        self.note("postsuspend");
        Ok(())
    }
    fn preresume(&self) -> io::Result<()> {
        self.note("preresume");
        if self.fail_preresume.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::EAGAIN));
        }
        Ok(())
    }
    fn resume(&self) {
        self.note("resume");
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn table_of(t: &Arc<Probe>) -> Table {
    Table::from_entries(vec![TableEntry {
        start: 0,
        len: 8,
        target: t.clone(),
    }])
    .unwrap()
}

#[test]
fn suspend_and_resume_hooks_run_in_the_kernels_order() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let old = Probe::new("old", &log);
    let m = Arc::new(Mapping::new("p", table_of(&old)));

    // A read held in flight: presuspend runs before the drain, postsuspend after it.
    let (gate_tx, gate_rx) = mpsc::channel();
    let (entered_tx, entered_rx) = mpsc::channel();
    *old.gate.lock().unwrap() = Some(gate_rx);
    *old.entered.lock().unwrap() = Some(entered_tx);
    let reader = {
        let m = m.clone();
        std::thread::spawn(move || {
            let mut b = vec![0u8; 512];
            m.read_at(0, &mut b).unwrap();
        })
    };
    recv(&entered_rx);
    let suspender = {
        let m = m.clone();
        std::thread::spawn(move || m.suspend().unwrap())
    };
    while !log.lock().unwrap().iter().any(|l| l == "old presuspend") {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        *log.lock().unwrap(),
        ["old presuspend"],
        "postsuspend before the drain"
    );
    gate_tx.send(()).unwrap();
    suspender.join().unwrap();
    reader.join().unwrap();
    assert_eq!(
        *log.lock().unwrap(),
        ["old presuspend", "old read done", "old postsuspend"]
    );
    // Suspend is idempotent: no second round of hooks.
    m.suspend().unwrap();
    assert_eq!(log.lock().unwrap().len(), 3);

    // Resume with a staged table: the new table gets preresume and resume, the old none.
    let new = Probe::new("new", &log);
    m.reload(table_of(&new));
    log.lock().unwrap().clear();
    assert!(m.resume().unwrap());
    assert_eq!(*log.lock().unwrap(), ["new preresume", "new resume"]);
    assert!(!m.info().suspended);

    // Reload + resume on a live device suspends it first, as the kernel's do_resume.
    let third = Probe::new("third", &log);
    third.fail_preresume.store(true, Ordering::SeqCst);
    m.reload(table_of(&third));
    log.lock().unwrap().clear();
    let err = m.resume().unwrap_err().to_string();
    assert!(
        err.contains("probe target at sector 0: preresume failed"),
        "{err}"
    );
    assert_eq!(
        *log.lock().unwrap(),
        ["new presuspend", "new postsuspend", "third preresume"]
    );
    // A failed preresume leaves the device suspended with the new table live.
    assert!(m.info().suspended);
    assert_eq!(m.table(false), "0 8 probe third\n");
    third.fail_preresume.store(false, Ordering::SeqCst);
    log.lock().unwrap().clear();
    assert!(!m.resume().unwrap());
    assert_eq!(*log.lock().unwrap(), ["third preresume", "third resume"]);
    assert!(!m.info().suspended);
}

fn superblock_flags(dev: &dyn BlockDevice) -> u32 {
    let mut b = vec![0u8; 4096];
    dev.read_at(0, &mut b).unwrap();
    IntegritySuperblock::parse(&b).unwrap().flags
}

#[test]
fn integrity_postsuspend_leaves_the_superblock_clean() {
    let reg = Registry::new();
    let disk = reg.open_device("ram:8M#it").unwrap();
    let m = reg
        .create(
            "it",
            "0 16 integrity ram:8M#it 0 - B 1 internal_hash:crc32c",
        )
        .unwrap();
    assert_ne!(superblock_flags(&*disk) & FLAG_DIRTY_BITMAP, 0, "in use");
    m.write_at(0, &[3u8; 4096], WriteFlags::default()).unwrap();
    m.suspend().unwrap();
    assert_eq!(
        superblock_flags(&*disk) & FLAG_DIRTY_BITMAP,
        0,
        "a clean suspend retires the bitmap"
    );
    m.resume().unwrap();
    assert_ne!(
        superblock_flags(&*disk) & FLAG_DIRTY_BITMAP,
        0,
        "resume puts the bitmap back in use"
    );
    m.write_at(4096, &[4u8; 512], WriteFlags::default())
        .unwrap();
    let mut b = vec![0u8; 4608];
    m.read_at(0, &mut b).unwrap();
    assert!(b[..4096].iter().all(|&x| x == 3) && b[4096..].iter().all(|&x| x == 4));
    m.suspend().unwrap();
    drop(m);
    reg.remove("it").unwrap();
    // Reopened after the clean suspend, every tag checks (nothing needed recalculating).
    let m = reg
        .create(
            "it",
            "0 16 integrity ram:8M#it 0 - B 1 internal_hash:crc32c",
        )
        .unwrap();
    m.read_at(0, &mut b).unwrap();
    assert!(b[..4096].iter().all(|&x| x == 3) && b[4096..].iter().all(|&x| x == 4));
}

#[test]
fn integrity_postsuspend_empties_the_journal() {
    let reg = Registry::new();
    let disk = reg.open_device("ram:8M#j").unwrap();
    let m = reg
        .create("j", "0 8 integrity ram:8M#j 0 - J 1 internal_hash:crc32c")
        .unwrap();
    m.write_at(0, &[5u8; 4096], WriteFlags::default()).unwrap();
    // Journal mode keeps the data in the journal until a commit; the clean suspend
    // commits it home, so a copy of the disk taken now holds it without any replay.
    m.suspend().unwrap();
    let copy = reg.open_device("ram:8M#copy").unwrap();
    let mut all = vec![0u8; 8 << 20];
    disk.read_at(0, &mut all).unwrap();
    copy.write_at(0, &all, WriteFlags::default()).unwrap();
    let c = reg
        .create(
            "copy",
            "0 8 integrity ram:8M#copy 0 - J 1 internal_hash:crc32c",
        )
        .unwrap();
    let mut b = vec![0u8; 4096];
    c.read_at(0, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 5));
    m.resume().unwrap();
    m.read_at(0, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 5));
}
