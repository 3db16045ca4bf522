//! The orchestration of a `reencrypt` action in the library
//! (`cryptblk_volume::reencrypt::operate`): which run a request becomes, the option checks
//! cryptsetup makes before it touches a disk (with its messages and exit classes), and a
//! whole offline re-key through the request (`--init-only`, then `--resume-only`) on a real
//! image file, the data read back with the new key. Secrets come from a test input that
//! records what was asked; it hands out a passphrase only when the run needs one.

use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::kdf::PbkdfRequest;
use cryptblk_format::luks2::{FormatParams, KeyslotParams, Luks2Header, UnlockPurpose};
use cryptblk_volume::progress::NoProgress;
use cryptblk_volume::reencrypt::{
    self, Mode, ReencryptInput, ReencryptNotice, ReencryptOutcome, ReencryptRequest, TokenUse,
};
use cryptblk_volume::{ErrorClass, LuksType, Volume};
use std::path::{Path, PathBuf};

const PASS: &[u8] = b"request-pass";
const MIB: u64 = 1 << 20;
const DATA_OFFSET: u64 = 2 * MIB;
const DATA: u64 = MIB;

/// Answers with [`PASS`], records every prompt and notice.
#[derive(Default)]
struct TestInput {
    prompts: Vec<String>,
    notices: Vec<ReencryptNotice>,
}

impl ReencryptInput for TestInput {
    fn secret(&mut self, prompt: &str) -> cryptblk_volume::Result<SecretBytes> {
        self.prompts.push(prompt.to_string());
        Ok(SecretBytes::from_slice(PASS))
    }
    fn key_file_given(&self) -> bool {
        false
    }
    fn tokens(
        &mut self,
        _h: &Luks2Header,
        _device: &Path,
        _which: TokenUse,
        _open: &mut dyn FnMut(&[u8], usize) -> cryptblk_volume::Result<()>,
    ) -> cryptblk_volume::Result<bool> {
        Ok(false)
    }
    fn confirm(&mut self, question: &str) -> cryptblk_volume::Result<()> {
        self.prompts.push(question.to_string());
        Ok(())
    }
    fn pbkdf(&mut self, _luks1: bool) -> cryptblk_volume::Result<PbkdfRequest> {
        Ok(PbkdfRequest::pbkdf2(HashAlgorithm::Sha256).with_forced_iterations(1000))
    }
    fn volume_key(&mut self, _key_bytes: usize) -> cryptblk_volume::Result<Option<SecretBytes>> {
        Ok(None)
    }
    fn notice(&mut self, notice: ReencryptNotice) {
        self.notices.push(notice);
    }
}

fn plaintext() -> Vec<u8> {
    (0..DATA)
        .map(|i| (i.wrapping_mul(2654435761) >> 7) as u8)
        .collect()
}

/// A LUKS2 image file (header and 1 MiB of data holding [`plaintext`]) in `dir`.
fn luks2_image(dir: &Path) -> PathBuf {
    let path = dir.join("vol.img");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    f.set_len(DATA_OFFSET + DATA).unwrap();
    let p = FormatParams {
        metadata_size: 16 << 10,
        keyslots_size: Some(MIB),
        data_offset: Some(DATA_OFFSET),
        keyslot: KeyslotParams::new(
            PbkdfRequest::pbkdf2(HashAlgorithm::Sha256).with_forced_iterations(1000),
        ),
        ..FormatParams::default()
    };
    let (h, vk, _) = Luks2Header::format(&f, &p, PASS).unwrap();
    let mut ct = plaintext();
    h.open_segment_cipher(&vk)
        .unwrap()
        .encrypt(0, &mut ct)
        .unwrap();
    f.write_at(DATA_OFFSET, &ct).unwrap();
    f.sync().unwrap();
    path
}

fn request(device: &Path) -> ReencryptRequest {
    ReencryptRequest {
        device: Some(device.to_path_buf()),
        luks_type: Some(LuksType::Any),
        pbkdf_chosen: true,
        ..ReencryptRequest::default()
    }
}

/// Runs `req`, expecting an error of `class` with `message`, no secret asked and the image
/// `device` unchanged.
fn refused_on(req: &ReencryptRequest, device: &Path, class: ErrorClass, message: &str) {
    let before = std::fs::read(device).unwrap();
    let mut input = TestInput::default();
    let err = reencrypt::reencrypt(req, &mut input, &mut NoProgress).unwrap_err();
    assert_eq!(err.message, message);
    assert_eq!(err.code, class);
    assert!(input.prompts.is_empty(), "asked {:?}", input.prompts);
    assert_eq!(std::fs::read(device).unwrap(), before, "the image changed");
}

/// [`refused_on`] the request's own device.
fn refused(req: &ReencryptRequest, class: ErrorClass, message: &str) {
    refused_on(req, req.device.as_deref().unwrap(), class, message);
}

#[test]
fn option_combinations_are_refused_before_the_disk_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let img = luks2_image(dir.path());
    refused(
        &ReencryptRequest {
            init_only: true,
            resume_only: true,
            ..request(&img)
        },
        ErrorClass::WrongParameters,
        "Options --init-only and --resume-only cannot be combined.",
    );
    refused(
        &ReencryptRequest {
            encrypt: true,
            decrypt: true,
            ..request(&img)
        },
        ErrorClass::WrongParameters,
        "Options --encrypt and --decrypt cannot be combined.",
    );
    refused(
        &ReencryptRequest {
            reduce_device_size: Some("4M".into()),
            ..request(&img)
        },
        ErrorClass::WrongParameters,
        &format!(
            "Reduced device size 4194304 bytes is not smaller than the data area of {} \
             (1048576 bytes).",
            img.display()
        ),
    );
    refused(
        &ReencryptRequest {
            decrypt: true,
            ..request(&img)
        },
        ErrorClass::WrongParameters,
        "LUKS2 decryption requires --header option.",
    );
    // cryptsetup refuses 0 at once; a size off the zone alignment (e.g. 1000, read as
    // 512) only when the run starts, after the reencryption is initialized.
    refused(
        &ReencryptRequest {
            hotzone_size: Some("0".into()),
            ..request(&img)
        },
        ErrorClass::WrongParameters,
        "Invalid max reencryption hotzone size specification.",
    );
    refused(
        &ReencryptRequest {
            resume_only: true,
            ..request(&img)
        },
        ErrorClass::WrongParameters,
        "Device reencryption not in progress.",
    );
    refused(
        &ReencryptRequest {
            sector_size: Some(4096),
            ..request(&img)
        },
        ErrorClass::WrongParameters,
        "Encryption sector size increase on offline device is not supported.\n\
         Activate the device first or use --force-offline-reencrypt option (dangerous!).",
    );
    refused_on(
        &ReencryptRequest {
            device: None,
            ..request(&img)
        },
        &img,
        ErrorClass::WrongParameters,
        "reencrypt needs a device",
    );
}

#[test]
fn a_busy_device_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let img = luks2_image(dir.path());
    // A daemon serving the file holds its data lock exclusively.
    let _held = cryptblk_volume::lock::DataLock::take(&img, true).unwrap();
    let req = ReencryptRequest {
        force_offline: true,
        ..request(&img)
    };
    let err = reencrypt::reencrypt(&req, &mut TestInput::default(), &mut NoProgress).unwrap_err();
    assert_eq!(err.code, ErrorClass::Busy, "{}", err.message);
}

#[test]
fn modes_follow_the_options_and_the_header() {
    let dir = tempfile::tempdir().unwrap();
    let img = luks2_image(dir.path());
    assert_eq!(
        reencrypt::offline_mode(&request(&img)).unwrap(),
        Mode::Rekey
    );
    // A plain file to encrypt, with a new detached header or a data shift.
    let plain = dir.path().join("plain.img");
    std::fs::write(&plain, vec![7u8; (4 * MIB) as usize]).unwrap();
    let enc = ReencryptRequest {
        encrypt: true,
        header: Some(dir.path().join("new.hdr")),
        ..request(&plain)
    };
    assert_eq!(reencrypt::offline_mode(&enc).unwrap(), Mode::Encrypt);
    // --decrypt --header NEW_FILE of the attached header exports it.
    let export = ReencryptRequest {
        decrypt: true,
        header: Some(dir.path().join("exported.hdr")),
        ..request(&img)
    };
    assert_eq!(
        reencrypt::offline_mode(&export).unwrap(),
        Mode::DecryptExport
    );
    assert!(!dir.path().join("exported.hdr").exists());
}

#[test]
fn init_only_then_resume_only_rekeys_the_volume() {
    let dir = tempfile::tempdir().unwrap();
    let img = luks2_image(dir.path());
    let old_key = {
        let Volume::Luks2(h, f) = Volume::load(&img, LuksType::Luks2, false).unwrap() else {
            panic!("not LUKS2")
        };
        h.unlock(&f, PASS, None, UnlockPurpose::Activate)
            .unwrap()
            .key
    };

    let mut input = TestInput::default();
    let init_only = ReencryptRequest {
        init_only: true,
        hotzone_size: Some("64k".into()),
        ..request(&img)
    };
    match reencrypt::reencrypt(&init_only, &mut input, &mut NoProgress).unwrap() {
        ReencryptOutcome::Initialized { device, init } => {
            assert_eq!(device, img);
            let init = init.expect("a re-key's keyslots");
            assert_eq!(init.keyslots, vec![(0, 1)]);
            assert_ne!(init.old_key.as_bytes(), init.new_key.as_bytes());
        }
        other => panic!("expected Initialized, got {other:?}"),
    }
    assert_eq!(input.prompts, vec!["Enter passphrase for key slot 0: "]);
    assert_eq!(input.notices, vec![ReencryptNotice::KeyslotCreated(1)]);

    // The header is mid-reencryption now: a plain run resumes it, a second --init-only
    // is refused.
    assert_eq!(
        reencrypt::offline_mode(&request(&img)).unwrap(),
        Mode::Resume
    );
    refused(
        &init_only,
        ErrorClass::WrongParameters,
        "LUKS2 reencryption already initialized. Aborting operation.",
    );

    let mut input = TestInput::default();
    let resume = ReencryptRequest {
        resume_only: true,
        hotzone_size: Some("64k".into()),
        ..request(&img)
    };
    let run = match reencrypt::reencrypt(&resume, &mut input, &mut NoProgress).unwrap() {
        ReencryptOutcome::Finished { run, init, .. } => {
            assert!(init.is_none());
            run
        }
        other => panic!("expected Finished, got {other:?}"),
    };
    assert_eq!(
        input.prompts,
        vec![format!("Enter passphrase for {}: ", img.display())]
    );
    assert_eq!(run.data_size, DATA);
    assert_eq!(run.hotzone, 64 << 10);
    assert_eq!(run.steps, DATA / (64 << 10));

    // Finished: a re-key again, and the data reads back under the new key.
    assert_eq!(
        reencrypt::offline_mode(&request(&img)).unwrap(),
        Mode::Rekey
    );
    let Volume::Luks2(h, f) = Volume::load(&img, LuksType::Luks2, false).unwrap() else {
        panic!("not LUKS2")
    };
    assert!(!h.reencryption_in_progress());
    let u = h.unlock(&f, PASS, None, UnlockPurpose::Activate).unwrap();
    assert_ne!(u.key.as_bytes(), old_key.as_bytes());
    let mut buf = vec![0u8; DATA as usize];
    f.read_at(DATA_OFFSET, &mut buf).unwrap();
    h.open_segment_cipher(&u.key)
        .unwrap()
        .decrypt(0, &mut buf)
        .unwrap();
    assert!(buf == plaintext(), "the plaintext changed");
}
