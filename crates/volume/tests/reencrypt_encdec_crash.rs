//! Crash safety of `reencrypt --encrypt` and `--decrypt` (in place): the whole run (the
//! new header, every step, the final header and wipes) is cut at each of its writes,
//! cleanly and torn, and what is left is finished by cryptblk's resume (every cut) and by
//! cryptsetup 2.6's `reencrypt --resume-only` (a sample; all of them in the ignored
//! sweep). Every finished volume must hold the original plaintext: 0 bytes lost.
//!
//! Scenarios: encryption with a data shift (header on the device, backward, datashift
//! resilience, the moved first segment), encryption with a detached header (forward,
//! checksum), decryption with a detached header (backward, checksum and journal), and
//! decryption of a volume whose header is on the device, exported to a new header file
//! while the data moves back to the device start (forward, `datashift-checksum`, the moved
//! first segment last).
//!
//! A detached header and its data device live in one buffer (header first), seen through
//! two windows, so one fault plan counts the writes to both.
//!
//! Cutting the one write that puts a datashift encryption's header over the device start
//! (as cryptsetup, one write of the whole header area) leaves no header: the device is
//! plain again, and the bytes the write tore are those it first copied to the device end;
//! such cuts are checked for exactly that.

#[path = "../../cli/tests/common/sweep.rs"]
mod sweep;
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_format::hdrio::{FaultPlan, FaultyIo, HeaderIo, MemIo};
use cryptblk_format::kdf::PbkdfRequest;
use cryptblk_format::luks2::{FormatParams, KeyslotParams, Luks2Header, UnlockPurpose};
use cryptblk_volume::progress::NoProgress;
use cryptblk_volume::reencrypt::{
    self, EncryptParams, ReencryptKeys, ReencryptState, ResilienceChoice, RunOptions,
};
use std::io;
use std::path::Path;
use std::process::Command;
use sweep::sweep_offset;

const PASS: &[u8] = b"crash-pass";
const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// A detached header's window (cryptsetup's 16 MiB).
const HDR: u64 = 16 * MIB;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    EncryptShift,
    EncryptDetached,
    DecryptDetached,
    /// Header on the device, exported to the header window; `step` is the data offset.
    DecryptExport,
}

#[derive(Clone, Copy, Debug)]
struct Scenario {
    name: &'static str,
    kind: Kind,
    /// Bytes of plaintext.
    data: u64,
    /// Data shift (EncryptShift), else hotzone size.
    step: u64,
    resilience: ResilienceChoice,
    tears: &'static [usize],
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "encrypt, datashift 512 KiB",
        kind: Kind::EncryptShift,
        data: 2 * MIB,
        step: 512 * KIB,
        resilience: ResilienceChoice::Checksum,
        tears: &[0, 1, 8],
    },
    Scenario {
        name: "encrypt, detached header, checksum",
        kind: Kind::EncryptDetached,
        data: MIB,
        step: 128 * KIB,
        resilience: ResilienceChoice::Checksum,
        tears: &[0, 8],
    },
    Scenario {
        name: "decrypt, detached header, checksum",
        kind: Kind::DecryptDetached,
        data: MIB,
        step: 128 * KIB,
        resilience: ResilienceChoice::Checksum,
        tears: &[0, 8],
    },
    Scenario {
        name: "decrypt, header exported, datashift-checksum",
        kind: Kind::DecryptExport,
        data: 2 * MIB,
        step: 512 * KIB,
        resilience: ResilienceChoice::Checksum,
        tears: &[0, 8],
    },
    Scenario {
        name: "decrypt, detached header, journal",
        kind: Kind::DecryptDetached,
        data: MIB,
        step: 64 * KIB,
        resilience: ResilienceChoice::Journal,
        tears: &[0, 3],
    },
];

/// A window `[base, base + len)` of another device (`len` `None`: to its end).
struct View<'a> {
    inner: &'a dyn HeaderIo,
    base: u64,
    len: Option<u64>,
}

impl HeaderIo for View<'_> {
    fn size(&self) -> io::Result<u64> {
        Ok(match self.len {
            Some(l) => l,
            None => self.inner.size()? - self.base,
        })
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(self.base + offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if self.len.is_some_and(|l| offset + buf.len() as u64 > l) {
            return Err(io::Error::other("write past the window"));
        }
        self.inner.write_at(self.base + offset, buf)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
}

/// (header window, data window) of an image of scenario `sc`.
fn views<'a>(sc: &Scenario, io: &'a dyn HeaderIo) -> (View<'a>, View<'a>) {
    match sc.kind {
        Kind::EncryptShift => (
            View {
                inner: io,
                base: 0,
                len: None,
            },
            View {
                inner: io,
                base: 0,
                len: None,
            },
        ),
        _ => (
            View {
                inner: io,
                base: 0,
                len: Some(HDR),
            },
            View {
                inner: io,
                base: HDR,
                len: None,
            },
        ),
    }
}

fn fast() -> KeyslotParams {
    KeyslotParams::new(PbkdfRequest::pbkdf2(HashAlgorithm::Sha256).with_forced_iterations(1000))
}

fn pattern(len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(2654435761) >> 9) as u8 ^ (i >> 12) as u8)
        .collect()
}

/// The starting image and its plaintext.
fn make(sc: &Scenario) -> (Vec<u8>, Vec<u8>) {
    let plain = pattern(sc.data);
    match sc.kind {
        Kind::EncryptShift => {
            // The plain device: the data, then room for the shift twice.
            let mut img = plain.clone();
            img.extend(pattern(2 * sc.step).iter().map(|b| b ^ 0x5a));
            (img, plain)
        }
        Kind::EncryptDetached => {
            let mut img = vec![0u8; HDR as usize];
            img.extend_from_slice(&plain);
            (img, plain)
        }
        Kind::DecryptDetached => {
            let io = MemIo::zeroed((HDR + sc.data) as usize);
            let (hv, dv) = views(sc, &io);
            let p = FormatParams {
                sector_size: 4096,
                data_offset: Some(0),
                detached_header: true,
                keyslot: fast(),
                ..FormatParams::default()
            };
            let (h, vk, _) = Luks2Header::format(&hv, &p, PASS).unwrap();
            let mut ct = plain.clone();
            h.open_segment_cipher(&vk)
                .unwrap()
                .encrypt(0, &mut ct)
                .unwrap();
            dv.write_at(0, &ct).unwrap();
            (io.into_inner(), plain)
        }
        Kind::DecryptExport => {
            // The header window stays empty: the export goes there.
            let io = MemIo::zeroed((HDR + sc.step + sc.data) as usize);
            let (_, dv) = views(sc, &io);
            let p = FormatParams {
                sector_size: 4096,
                data_offset: Some(sc.step),
                keyslot: fast(),
                ..FormatParams::default()
            };
            let (h, vk, _) = Luks2Header::format(&dv, &p, PASS).unwrap();
            let mut ct = plain.clone();
            h.open_segment_cipher(&vk)
                .unwrap()
                .encrypt(0, &mut ct)
                .unwrap();
            dv.write_at(sc.step, &ct).unwrap();
            (io.into_inner(), plain)
        }
    }
}

fn run_opts(sc: &Scenario) -> RunOptions {
    RunOptions {
        max_hotzone: Some(sc.step),
        device_block: 4096,
        chunk: None,
    }
}

/// The whole `cryptblk reencrypt --encrypt|--decrypt` on `io`.
fn op_on(io: &dyn HeaderIo, sc: &Scenario) -> cryptblk_volume::Result<()> {
    let (hv, dv) = views(sc, io);
    match sc.kind {
        Kind::EncryptShift | Kind::EncryptDetached => {
            let p = EncryptParams {
                cipher: "aes-xts-plain64".into(),
                key_size: 64,
                sector_size: 512,
                resilience: sc.resilience,
                resilience_hash: HashAlgorithm::Sha256,
                keyslot: fast(),
                reduce: (sc.kind == Kind::EncryptShift).then_some(2 * sc.step),
                device_block: 4096,
                digest_iterations: Some(1000),
            };
            let hdr: Option<&dyn HeaderIo> =
                (sc.kind == Kind::EncryptDetached).then_some(&hv as &dyn HeaderIo);
            let (mut h, key) = reencrypt::init_encrypt(&dv, hdr, PASS, &p)?;
            let keys = ReencryptKeys {
                old: None,
                new: Some(key),
            };
            reencrypt::run_split(&mut h, &hv, &dv, &keys, &run_opts(sc), &mut NoProgress)?;
        }
        Kind::DecryptDetached => {
            let mut h = Luks2Header::read(&hv)?;
            let keys = reencrypt::init_decrypt(
                &mut h,
                &hv,
                sc.data,
                PASS,
                None,
                sc.resilience,
                HashAlgorithm::Sha256,
                4096,
                Some(1000),
            )?;
            reencrypt::run_split(&mut h, &hv, &dv, &keys, &run_opts(sc), &mut NoProgress)?;
        }
        Kind::DecryptExport => {
            let mut h = Luks2Header::read(&dv)?;
            let keys = reencrypt::init_decrypt_export(
                &mut h,
                &dv,
                &hv,
                PASS,
                None,
                sc.resilience,
                HashAlgorithm::Sha256,
                4096,
                Some(1000),
            )?;
            reencrypt::run_split(&mut h, &hv, &dv, &keys, &run_opts(sc), &mut NoProgress)?;
        }
    }
    Ok(())
}

/// The plaintext a finished image holds (`None`: no LUKS header, the device is plain).
fn plaintext(sc: &Scenario, img: &[u8]) -> Vec<u8> {
    let io = MemIo::new(img.to_vec());
    let (hv, dv) = views(sc, &io);
    // An export cut before the header file was whole: the device's own header holds.
    let (h, from): (Luks2Header, &dyn HeaderIo) = match Luks2Header::read(&hv) {
        Ok(h) => (h, &hv),
        Err(_) if sc.kind == Kind::DecryptExport => (Luks2Header::read(&dv).unwrap(), &dv),
        Err(_) => {
            // No header: a plain device (datashift encryption cut before its header).
            let mut v = vec![0u8; sc.data as usize];
            dv.read_at(0, &mut v).unwrap();
            return v;
        }
    };
    assert!(
        !h.reencryption_in_progress(),
        "{}: still reencrypting",
        sc.name
    );
    let segs = h.segments();
    let seg = &segs[0];
    let mut buf = vec![0u8; sc.data as usize];
    dv.read_at(seg.offset, &mut buf).unwrap();
    if seg.kind == "crypt" {
        let u = h.unlock(from, PASS, None, UnlockPurpose::Activate).unwrap();
        h.open_segment_cipher(&u.key)
            .unwrap()
            .decrypt(0, &mut buf)
            .unwrap();
    }
    buf
}

/// cryptblk's resume of a cut image (and, before it, the plaintext read without changing
/// anything); returns the finished image.
fn cryptblk_resume(sc: &Scenario, img: Vec<u8>, plain: &[u8], what: &str) -> Vec<u8> {
    let io = MemIo::new(img);
    {
        let (hv, dv) = views(sc, &io);
        let Ok(mut h) = Luks2Header::read(&hv) else {
            return io.into_inner();
        };
        if let Some(state) = ReencryptState::of(&h).unwrap() {
            let keys = reencrypt::unlock_keys(&h, &hv, &state, PASS, None).unwrap();
            let (mut out, size) = (Vec::new(), dv.size().unwrap());
            let data = tempfile::tempfile().unwrap();
            let mut whole = vec![0u8; size as usize];
            dv.read_at(0, &mut whole).unwrap();
            std::os::unix::fs::FileExt::write_all_at(&data, &whole, 0).unwrap();
            reencrypt::read_plaintext(&state, &keys, &hv, &data, size, &mut out, &mut NoProgress)
                .unwrap();
            assert!(out == plain, "{what}: the interrupted volume reads wrong");
            reencrypt::run_split(&mut h, &hv, &dv, &keys, &run_opts(sc), &mut NoProgress).unwrap();
        }
    }
    io.into_inner()
}

fn cut(base: &[u8], sc: &Scenario, n: usize, torn: usize) -> Vec<u8> {
    let io = FaultyIo::new(
        MemIo::new(base.to_vec()),
        FaultPlan {
            fail_write: Some(n),
            torn_sectors: torn,
        },
    );
    assert!(
        op_on(&io, sc).is_err(),
        "{}: write {n} was not cut",
        sc.name
    );
    io.into_inner().into_inner()
}

fn writes_of(base: &[u8], sc: &Scenario, plain: &[u8]) -> usize {
    let io = FaultyIo::new(MemIo::new(base.to_vec()), FaultPlan::default());
    op_on(&io, sc).unwrap();
    let total = io.writes_attempted();
    let done = io.into_inner().into_inner();
    assert!(
        plaintext(sc, &done) == plain,
        "{}: uncut run lost data",
        sc.name
    );
    total
}

/// A datashift encryption cut at its header write leaves a plain device whose torn start
/// is held whole by the copy at its end.
fn check_plain_cut(sc: &Scenario, img: &[u8], plain: &[u8], what: &str) {
    let shift = sc.step as usize;
    let copy = &img[sc.data as usize + shift..sc.data as usize + 2 * shift];
    let start_ok = img[..shift] == plain[..shift] || copy == &plain[..shift];
    assert!(
        start_ok && img[shift..sc.data as usize] == plain[shift..],
        "{what}: plain device lost data"
    );
}

fn cryptblk_sweep(sc: &Scenario) -> usize {
    let (base, plain) = make(sc);
    let total = writes_of(&base, sc, &plain);
    let mut cuts = 0;
    for &torn in sc.tears {
        for n in 0..total {
            let what = format!("{}: cut at write {n} (torn {torn})", sc.name);
            let img = cut(&base, sc, n, torn);
            let done = cryptblk_resume(sc, img, &plain, &what);
            let has_header = {
                let io = MemIo::new(done.clone());
                let (hv, _) = views(sc, &io);
                Luks2Header::read(&hv).is_ok()
            };
            if !has_header && sc.kind == Kind::EncryptShift {
                check_plain_cut(sc, &done, &plain, &what);
            } else {
                assert!(plaintext(sc, &done) == plain, "{what}: lost data");
            }
            cuts += 1;
        }
    }
    cuts
}

/// Every write of every scenario cut, clean and torn, resumed by cryptblk: 0 bytes lost.
#[test]
fn every_cut_is_resumed_by_cryptblk_without_loss() {
    let cuts: usize = std::thread::scope(|s| {
        let handles: Vec<_> = SCENARIOS
            .iter()
            .map(|sc| s.spawn(move || cryptblk_sweep(sc)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    eprintln!("cryptblk resumed {cuts} encrypt/decrypt cut points, 0 bytes lost");
    assert!(cuts >= 100, "only {cuts} cut points");
}

fn cryptsetup(dir: &Path) -> Option<Command> {
    if !Path::new("/usr/sbin/cryptsetup").is_file() && !Path::new("/sbin/cryptsetup").is_file() {
        if std::env::var("CRYPTBLK_SKIP_CRYPTSETUP").as_deref() == Ok("1") {
            return None;
        }
        panic!("cryptsetup is required (or set CRYPTBLK_SKIP_CRYPTSETUP=1)");
    }
    let mut c = Command::new("cryptsetup");
    c.arg("--batch-mode").current_dir(dir);
    Some(c)
}

/// cryptsetup finishes the cut image (`reencrypt --resume-only`, after `repair` where it
/// asks for it) and accepts the header (`open --test-passphrase`). Returns the image.
fn cryptsetup_resume(sc: &Scenario, dir: &Path, img: &[u8]) -> Option<Vec<u8>> {
    // The only None: cryptsetup is missing and CRYPTBLK_SKIP_CRYPTSETUP=1 (it panics
    // otherwise); below, every cryptsetup run either works or fails the test.
    cryptsetup(dir)?;
    let cs = || cryptsetup(dir).expect("cryptsetup was found above");
    std::fs::write(dir.join("key"), PASS).unwrap();
    let detached = sc.kind != Kind::EncryptShift;
    let (hdr, data) = if detached {
        (&img[..HDR as usize], &img[HDR as usize..])
    } else {
        (img, img)
    };
    std::fs::write(dir.join("cut.img"), data).unwrap();
    let hdr_arg: Vec<&str> = if detached {
        std::fs::write(dir.join("cut.hdr"), hdr).unwrap();
        vec!["--header", "cut.hdr"]
    } else {
        vec![]
    };
    let header_ok = Luks2Header::read(&MemIo::new(hdr.to_vec()));
    let Ok(h) = header_ok else {
        return Some(img.to_vec());
    };
    let reassemble = || {
        let data = std::fs::read(dir.join("cut.img")).unwrap();
        if detached {
            let mut v = std::fs::read(dir.join("cut.hdr")).unwrap();
            v.extend(data);
            v
        } else {
            data
        }
    };
    if h.reencryption_in_progress() {
        let resume = || {
            cs().args(["reencrypt", "--resume-only", "--force-offline-reencrypt"])
                .args(&hdr_arg)
                .args(["--key-file", "key", "cut.img"])
                .output()
                .expect("cannot run cryptsetup")
        };
        let out = resume();
        if !out.status.success() {
            let rep = cs()
                .arg("repair")
                .args(&hdr_arg)
                .args(["--key-file", "key", "cut.img"])
                .output()
                .unwrap();
            assert!(
                rep.status.success(),
                "{}: cryptsetup repair failed: {}",
                sc.name,
                String::from_utf8_lossy(&rep.stderr)
            );
            let hdr_now = std::fs::read(if detached {
                dir.join("cut.hdr")
            } else {
                dir.join("cut.img")
            })
            .unwrap();
            let h = Luks2Header::read(&MemIo::new(hdr_now)).unwrap();
            if !h.reencryption_in_progress() {
                return Some(reassemble());
            }
            if h.segments().iter().filter(|s| !s.is_backup()).count() == 1 {
                // cryptsetup 2.6.1's repair of a cut last hotzone leaves all data new with
                // the requirement set, and its own resume would process the whole device
                // again (destroying it): cryptblk finishes the metadata.
                let io = MemIo::new(reassemble());
                {
                    let (hv, dv) = views(sc, &io);
                    let mut h = Luks2Header::read(&hv).unwrap();
                    let state = ReencryptState::of(&h).unwrap().unwrap();
                    let keys = reencrypt::unlock_keys(&h, &hv, &state, PASS, None).unwrap();
                    reencrypt::run_split(&mut h, &hv, &dv, &keys, &run_opts(sc), &mut NoProgress)
                        .unwrap();
                }
                return Some(io.into_inner());
            }
            let out = resume();
            assert!(
                out.status.success(),
                "{}: cryptsetup resume after repair failed: {}",
                sc.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    if !matches!(sc.kind, Kind::DecryptDetached | Kind::DecryptExport) {
        let test = cs()
            .args(["open", "--test-passphrase"])
            .args(&hdr_arg)
            .args(["--key-file", "key", "cut.img"])
            .output()
            .unwrap();
        assert!(
            test.status.success(),
            "{}: cryptsetup refuses the finished header",
            sc.name
        );
    }
    Some(reassemble())
}

fn cryptsetup_sweep(every: usize) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let mut cuts = 0;
    for (i, sc) in SCENARIOS.iter().enumerate() {
        let (base, plain) = make(sc);
        let total = writes_of(&base, sc, &plain);
        for &torn in sc.tears {
            // This run's sample of the cuts: a rotating offset (seeded) within each stride.
            let at = sweep_offset(every, (i as u64) << 32 | torn as u64);
            for n in (0..total).filter(|n| n % every == at) {
                let what = format!("{}: cut at write {n} (torn {torn}), cryptsetup", sc.name);
                let img = cut(&base, sc, n, torn);
                let Some(done) = cryptsetup_resume(sc, dir.path(), &img) else {
                    // cryptsetup is missing and CRYPTBLK_SKIP_CRYPTSETUP=1: nothing ran,
                    // and the callers accept 0 cuts only then.
                    return 0;
                };
                let has_header = {
                    let io = MemIo::new(done.clone());
                    let (hv, _) = views(sc, &io);
                    Luks2Header::read(&hv).is_ok()
                };
                if !has_header && sc.kind == Kind::EncryptShift {
                    check_plain_cut(sc, &done, &plain, &what);
                } else {
                    assert!(plaintext(sc, &done) == plain, "{what}: lost data");
                }
                cuts += 1;
            }
        }
    }
    eprintln!("cryptsetup resumed {cuts} encrypt/decrypt cut points, 0 bytes lost");
    cuts
}

/// A sample of the cuts (every 13th write, from an offset the sweep seed picks per
/// scenario and tear) finished by cryptsetup; over many runs every cut is tried.
#[test]
fn a_sample_of_cuts_is_resumed_by_cryptsetup_without_loss() {
    let n = cryptsetup_sweep(13);
    assert!(
        n >= 10 || std::env::var("CRYPTBLK_SKIP_CRYPTSETUP").as_deref() == Ok("1"),
        "cryptsetup resumed only {n} cut points"
    );
}

/// Every cut finished by cryptsetup (slow: one cryptsetup run per cut). Run with
/// `cargo test -p cryptblk-volume --test reencrypt_encdec_crash -- --ignored`.
#[test]
#[ignore]
fn every_cut_is_resumed_by_cryptsetup_without_loss() {
    let n = cryptsetup_sweep(1);
    assert!(n >= 100, "only {n} cut points");
}
