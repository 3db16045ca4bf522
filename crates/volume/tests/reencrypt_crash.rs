//! Crash safety of `reencrypt` (offline LUKS2 re-key): the whole run (new keyslots, the
//! reencryption metadata, every step, the final header and wipes) is cut at each of its
//! writes, cleanly and torn, and the image left behind is finished by cryptblk's resume
//! (every cut) and by cryptsetup 2.6's `reencrypt --resume-only` (after `repair` where it
//! asks for it; a sample of the cuts, all of them in the ignored sweep). Every finished
//! volume must hold the original plaintext: 0 bytes lost.
//!
//! Torn writes keep whole 4096-byte blocks for checksum resilience: its recovery (as
//! cryptsetup's) decides old or new per checksum block, so it relies on the device writing
//! a block atomically. Journal resilience is also torn mid-block.

#[path = "../../cli/tests/common/sweep.rs"]
mod sweep;
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;
use cryptblk_format::hdrio::{FaultPlan, FaultyIo, HeaderIo, MemIo};
use cryptblk_format::kdf::PbkdfRequest;
use cryptblk_format::luks2::{FormatParams, KeyslotParams, Luks2Header, UnlockPurpose};
use cryptblk_volume::progress::NoProgress;
use cryptblk_volume::reencrypt::{
    self, InitParams, ReencryptKeys, ReencryptState, ResilienceChoice, RunOptions,
};
use std::path::Path;
use std::process::Command;
use sweep::sweep_offset;

const PASS: &[u8] = b"crash-pass";
/// The passphrase of a second keyslot (scenarios with two keyslots carried over).
const SECOND: &[u8] = b"second-pass";
const MIB: u64 = 1 << 20;
/// 2 MiB of metadata and keyslots (16 KiB header copies), then the data.
const DATA_OFFSET: u64 = 2 * MIB;

#[derive(Clone, Copy, Debug)]
struct Scenario {
    name: &'static str,
    sector: u32,
    new_sector: Option<u32>,
    new_cipher: Option<&'static str>,
    resilience: ResilienceChoice,
    data: u64,
    hotzone: u64,
    tears: &'static [usize],
    /// A second keyslot (another passphrase) is carried over too.
    second: bool,
    /// `RunOptions::chunk`: small enough that a hotzone is hashed or journalled and then
    /// rewritten chunk by chunk (the path a hotzone over 64 MiB takes by default).
    chunk: Option<u64>,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "checksum, 512-byte sectors",
        sector: 512,
        new_sector: None,
        new_cipher: None,
        resilience: ResilienceChoice::Checksum,
        data: MIB,
        hotzone: 32 << 10,
        tears: &[0, 8],
        second: false,
        chunk: None,
    },
    Scenario {
        name: "checksum, sector size 512 -> 4096",
        sector: 512,
        new_sector: Some(4096),
        new_cipher: None,
        resilience: ResilienceChoice::Checksum,
        data: MIB,
        hotzone: 64 << 10,
        tears: &[0, 8],
        second: false,
        chunk: None,
    },
    Scenario {
        name: "journal, cipher change to aes-cbc-essiv:sha256",
        sector: 4096,
        new_sector: None,
        new_cipher: Some("aes-cbc-essiv:sha256"),
        resilience: ResilienceChoice::Journal,
        data: MIB,
        hotzone: 64 << 10,
        tears: &[0, 3, 8],
        second: false,
        chunk: None,
    },
    Scenario {
        name: "checksum, two keyslots carried over, aes-xts 256-bit key",
        sector: 4096,
        new_sector: None,
        new_cipher: Some("aes-xts-plain64"),
        resilience: ResilienceChoice::Checksum,
        data: MIB,
        hotzone: 128 << 10,
        tears: &[0, 8],
        second: true,
        chunk: None,
    },
    Scenario {
        name: "checksum, hotzone rewritten in 16 KiB chunks",
        sector: 4096,
        new_sector: None,
        new_cipher: None,
        resilience: ResilienceChoice::Checksum,
        data: MIB,
        hotzone: 512 << 10,
        tears: &[0, 8],
        second: false,
        chunk: Some(16 << 10),
    },
    Scenario {
        name: "journal, hotzone journalled and rewritten in 16 KiB chunks",
        sector: 512,
        new_sector: None,
        new_cipher: None,
        resilience: ResilienceChoice::Journal,
        data: MIB,
        hotzone: 512 << 10,
        tears: &[0, 3, 8],
        second: false,
        chunk: Some(16 << 10),
    },
];

fn fast_keyslot() -> KeyslotParams {
    KeyslotParams::new(PbkdfRequest::pbkdf2(HashAlgorithm::Sha256).with_forced_iterations(1000))
}

/// A LUKS2 image (header and data) with a known plaintext; returns (image, plaintext).
fn make(sc: &Scenario) -> (Vec<u8>, Vec<u8>) {
    let io = MemIo::zeroed((DATA_OFFSET + sc.data) as usize);
    let p = FormatParams {
        sector_size: sc.sector,
        metadata_size: 16 << 10,
        keyslots_size: Some(MIB),
        data_offset: Some(DATA_OFFSET),
        keyslot: fast_keyslot(),
        ..FormatParams::default()
    };
    let (mut h, vk, _) = Luks2Header::format(&io, &p, PASS).unwrap();
    if sc.second {
        h.add_keyslot(&io, &vk, SECOND, &fast_keyslot()).unwrap();
    }
    let plain: Vec<u8> = (0..sc.data)
        .map(|i| (i.wrapping_mul(2654435761) >> 7) as u8)
        .collect();
    let mut ct = plain.clone();
    h.open_segment_cipher(&vk)
        .unwrap()
        .encrypt(0, &mut ct)
        .unwrap();
    io.write_at(DATA_OFFSET, &ct).unwrap();
    (io.into_inner(), plain)
}

fn run_opts(sc: &Scenario) -> RunOptions {
    RunOptions {
        max_hotzone: Some(sc.hotzone),
        device_block: 4096,
        chunk: sc.chunk,
    }
}

/// The whole `cryptblk reencrypt` on `io`.
fn reencrypt_on(io: &dyn HeaderIo, sc: &Scenario) -> cryptblk_volume::Result<()> {
    let mut h = Luks2Header::read(io)?;
    let mut pass = vec![(0, SecretBytes::from_vec(PASS.to_vec()))];
    if sc.second {
        pass.push((1, SecretBytes::from_vec(SECOND.to_vec())));
    }
    let init = reencrypt::init(
        &mut h,
        io,
        &pass,
        &InitParams {
            cipher: sc.new_cipher.map(str::to_string),
            key_size: sc.second.then_some(32),
            sector_size: sc.new_sector,
            resilience: sc.resilience,
            resilience_hash: HashAlgorithm::Sha256,
            pbkdf: None,
            device_block: 4096,
            one_keyslot: false,
            new_key: None,
            shift: None,
        },
    )?;
    let keys = ReencryptKeys {
        old: Some(init.old_key),
        new: Some(init.new_key),
    };
    reencrypt::run(&mut h, io, &keys, &run_opts(sc), &mut NoProgress)?;
    Ok(())
}

/// The plaintext of a finished (not reencrypting) image, and its volume key.
fn plaintext(img: &[u8]) -> (Vec<u8>, SecretBytes) {
    let io = MemIo::new(img.to_vec());
    let h = Luks2Header::read(&io).unwrap();
    assert!(!h.reencryption_in_progress(), "still reencrypting");
    let u = h.unlock(&io, PASS, None, UnlockPurpose::Activate).unwrap();
    let mut buf = img[h.data_offset() as usize..].to_vec();
    h.open_segment_cipher(&u.key)
        .unwrap()
        .decrypt(0, &mut buf)
        .unwrap();
    (buf, u.key)
}

/// cryptblk's resume of a cut image; returns the finished image and whether a
/// reencryption was in progress.
fn cryptblk_resume(img: Vec<u8>, sc: &Scenario) -> (Vec<u8>, bool) {
    let io = MemIo::new(img);
    let mut h = Luks2Header::read(&io).unwrap();
    let Some(state) = ReencryptState::of(&h).unwrap() else {
        return (io.into_inner(), false);
    };
    let keys = reencrypt::unlock_keys(&h, &io, &state, PASS, None).unwrap();
    reencrypt::run(&mut h, &io, &keys, &run_opts(sc), &mut NoProgress).unwrap();
    (io.into_inner(), true)
}

/// The image `sc`'s run leaves when cut at write `n` (torn after `torn` sectors).
fn cut(base: &[u8], sc: &Scenario, n: usize, torn: usize) -> Vec<u8> {
    let io = FaultyIo::new(
        MemIo::new(base.to_vec()),
        FaultPlan {
            fail_write: Some(n),
            torn_sectors: torn,
        },
    );
    assert!(
        reencrypt_on(&io, sc).is_err(),
        "{}: write {n} was not cut",
        sc.name
    );
    io.into_inner().into_inner()
}

fn writes_of(base: &[u8], sc: &Scenario) -> usize {
    let io = FaultyIo::new(MemIo::new(base.to_vec()), FaultPlan::default());
    reencrypt_on(&io, sc).unwrap();
    let total = io.writes_attempted();
    let (plain, _) = plaintext(&io.into_inner().into_inner());
    let (_, want) = make(sc);
    assert_eq!(plain.len(), want.len());
    total
}

/// Every write of every scenario cut, clean and torn, resumed by cryptblk: 0 bytes lost,
/// and a resumed reencryption ends under a new key. Returns the number of cut points.
#[test]
fn every_cut_is_resumed_by_cryptblk_without_loss() {
    // One thread per scenario: the cuts are independent.
    let cuts: usize = std::thread::scope(|s| {
        let handles: Vec<_> = SCENARIOS
            .iter()
            .map(|sc| s.spawn(move || cryptblk_sweep(sc)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    eprintln!("cryptblk resumed {cuts} cut points, 0 bytes lost");
    assert!(cuts >= 1000, "only {cuts} cut points");
}

fn cryptblk_sweep(sc: &Scenario) -> usize {
    let mut cuts = 0;
    let (base, plain) = make(sc);
    let (_, old_key) = plaintext(&base);
    let total = writes_of(&base, sc);
    assert!(total > 50, "{}: only {total} writes", sc.name);
    for &torn in sc.tears {
        for n in 0..total {
            let img = cut(&base, sc, n, torn);
            let (done, resumed) = cryptblk_resume(img, sc);
            let (got, key) = plaintext(&done);
            assert!(
                got == plain,
                "{}: cut at write {n} (torn {torn}) lost data",
                sc.name
            );
            if sc.second {
                let io = MemIo::new(done.clone());
                let h = Luks2Header::read(&io).unwrap();
                let u = h
                    .unlock(&io, SECOND, None, UnlockPurpose::Activate)
                    .unwrap();
                assert_eq!(u.key.as_bytes(), key.as_bytes(), "{}: cut {n}", sc.name);
            }
            if resumed {
                assert_ne!(
                    key.as_bytes(),
                    old_key.as_bytes(),
                    "{}: cut {n}: resumed run kept the old key",
                    sc.name
                );
            }
            cuts += 1;
        }
    }
    cuts
}

fn cryptsetup(dir: &Path) -> Option<Command> {
    let found = [
        "/usr/sbin/cryptsetup",
        "/sbin/cryptsetup",
        "/usr/bin/cryptsetup",
    ]
    .iter()
    .any(|p| Path::new(p).is_file());
    if !found {
        if std::env::var("CRYPTBLK_SKIP_CRYPTSETUP").as_deref() == Ok("1") {
            return None;
        }
        panic!("cryptsetup is required (or set CRYPTBLK_SKIP_CRYPTSETUP=1)");
    }
    let mut c = Command::new("cryptsetup");
    c.arg("--batch-mode").current_dir(dir);
    Some(c)
}

/// cryptsetup finishes the cut image `img` (in `dir`): `reencrypt --resume-only`, and when
/// it refuses (a hotzone needs recovery) `repair` first. Returns the finished image.
fn cryptsetup_resume(dir: &Path, img: &[u8]) -> Option<Vec<u8>> {
    // The only None: cryptsetup is missing and CRYPTBLK_SKIP_CRYPTSETUP=1 (it panics
    // otherwise); below, every cryptsetup run either works or fails the test.
    cryptsetup(dir)?;
    let cs = |dir: &Path| cryptsetup(dir).expect("cryptsetup was found above");
    let path = dir.join("cut.img");
    std::fs::write(&path, img).unwrap();
    std::fs::write(dir.join("key"), PASS).unwrap();
    let h = Luks2Header::read(&MemIo::new(img.to_vec())).unwrap();
    if h.reencryption_in_progress() {
        let resume = |dir: &Path| {
            cs(dir)
                .args(["reencrypt", "--resume-only", "--force-offline-reencrypt"])
                .args(["--key-file", "key", "cut.img"])
                .output()
                .expect("cannot run cryptsetup")
        };
        let out = resume(dir);
        if !out.status.success() {
            let rep = cs(dir)
                .args(["repair", "--key-file", "key", "cut.img"])
                .output()
                .unwrap();
            assert!(
                rep.status.success(),
                "cryptsetup repair failed: {}",
                String::from_utf8_lossy(&rep.stderr)
            );
            let h = Luks2Header::read(&std::fs::File::open(&path).unwrap()).unwrap();
            if h.reencryption_in_progress() {
                let out = resume(dir);
                assert!(
                    out.status.success(),
                    "cryptsetup resume after repair failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
    let test = cs(dir)
        .args(["open", "--test-passphrase", "--key-file", "key", "cut.img"])
        .output()
        .unwrap();
    assert!(
        test.status.success(),
        "cryptsetup refuses the finished header"
    );
    Some(std::fs::read(&path).unwrap())
}

fn cryptsetup_sweep(every: usize) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let mut cuts = 0;
    for (i, sc) in SCENARIOS.iter().enumerate() {
        let (base, plain) = make(sc);
        let total = writes_of(&base, sc);
        for &torn in sc.tears {
            // This run's sample of the cuts: a rotating offset (seeded) within each stride.
            let at = sweep_offset(every, (i as u64) << 32 | torn as u64);
            for n in (0..total).filter(|n| n % every == at) {
                let img = cut(&base, sc, n, torn);
                let Some(done) = cryptsetup_resume(dir.path(), &img) else {
                    // cryptsetup is missing and CRYPTBLK_SKIP_CRYPTSETUP=1: nothing ran,
                    // and the callers accept 0 cuts only then.
                    return 0;
                };
                let (got, _) = plaintext(&done);
                assert!(
                    got == plain,
                    "{}: cut at write {n} (torn {torn}) lost data after cryptsetup's resume",
                    sc.name
                );
                cuts += 1;
            }
        }
    }
    eprintln!("cryptsetup resumed {cuts} cut points, 0 bytes lost");
    cuts
}

/// A sample of the cuts (every 47th write, from an offset the sweep seed picks per
/// scenario and tear) finished by cryptsetup; over many runs every cut is tried.
#[test]
fn a_sample_of_cuts_is_resumed_by_cryptsetup_without_loss() {
    let n = cryptsetup_sweep(47);
    assert!(
        n >= 15 || std::env::var("CRYPTBLK_SKIP_CRYPTSETUP").as_deref() == Ok("1"),
        "cryptsetup resumed only {n} cut points"
    );
}

/// Every cut finished by cryptsetup (slow: one cryptsetup run per cut).
#[test]
#[ignore]
fn every_cut_is_resumed_by_cryptsetup_without_loss() {
    let n = cryptsetup_sweep(1);
    assert!(n >= 1000, "only {n} cut points");
}
