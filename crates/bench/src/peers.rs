//! Peers: other userspace LUKS implementations served over NBD, driven by the same fio nbd
//! transport: nbdkit's `luks` filter and qemu-nbd's `luks` block driver, both over one LUKS1
//! image made by `cryptsetup luksFormat --type luks1` (AES-256-XTS, plain64 IVs, cryptsetup's
//! default) with a fixed PBKDF2 iteration count. `qemu-img create -f luks` would calibrate
//! its iterations by CPU time and dies with "Unable to get accurate CPU usage" on a busy
//! machine; it has no option for a fixed count. Passphrases travel in files, never on
//! command lines.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cryptblk_cipher::SecretBytes;

use crate::BenchError;

/// Which peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerKind {
    /// `nbdkit --filter=luks file <image> passphrase=+<file>`.
    NbdkitLuks,
    /// `qemu-nbd --object secret,... --image-opts driver=luks,...`.
    QemuNbdLuks,
}

impl PeerKind {
    /// Both peers.
    pub const ALL: [PeerKind; 2] = [PeerKind::NbdkitLuks, PeerKind::QemuNbdLuks];

    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            PeerKind::NbdkitLuks => "peer-nbdkit-luks",
            PeerKind::QemuNbdLuks => "peer-qemu-nbd-luks",
        }
    }

    /// One-line description.
    pub fn description(self) -> &'static str {
        match self {
            PeerKind::NbdkitLuks => {
                "nbdkit luks filter over a LUKS1 aes-xts-plain64 image on tmpfs"
            }
            PeerKind::QemuNbdLuks => "qemu-nbd luks driver over the same LUKS1 image on tmpfs",
        }
    }

    /// Ok if the programs it needs are installed, else why not.
    pub fn available(self) -> Result<(), String> {
        let runs = |prog: &str, arg: &str| {
            Command::new(prog)
                .arg(arg)
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .output()
                .ok()
                .filter(|o| o.status.success())
        };
        if runs("cryptsetup", "--version").is_none() {
            return Err("cryptsetup (needed to make the LUKS1 image) is not installed".into());
        }
        match self {
            PeerKind::NbdkitLuks => {
                let out = runs("nbdkit", "--dump-config").ok_or("nbdkit is not installed")?;
                let cfg = String::from_utf8_lossy(&out.stdout).into_owned();
                let dir = cfg
                    .lines()
                    .find_map(|l| l.strip_prefix("filterdir="))
                    .ok_or("nbdkit --dump-config shows no filterdir")?;
                if !Path::new(dir).join("nbdkit-luks-filter.so").exists() {
                    return Err(format!("nbdkit has no luks filter in {dir}"));
                }
                Ok(())
            }
            PeerKind::QemuNbdLuks => runs("qemu-nbd", "--version")
                .map(|_| ())
                .ok_or_else(|| "qemu-nbd is not installed".into()),
        }
    }
}

/// A LUKS1 image and the file holding its passphrase.
pub struct PeerImage {
    /// The image.
    pub path: PathBuf,
    /// The passphrase file (mode 0600).
    pub passphrase_file: PathBuf,
    /// Payload size in bytes.
    pub size: u64,
}

impl Drop for PeerImage {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_file(&self.passphrase_file);
    }
}

fn run_tool(cmd: &mut Command, what: &str) -> Result<(), BenchError> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| BenchError::Tool(format!("cannot run {what}: {e}")))?;
    if !out.status.success() {
        return Err(BenchError::Tool(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// LUKS1's payload offset for a 512-bit key with cryptsetup's default 1 MiB alignment: the
/// header and 8 keyslots of 4000 stripes fit below 2 MiB, so the payload starts there.
const LUKS1_PAYLOAD_OFFSET: u64 = 2 << 20;

/// PBKDF2 iterations of the peers' keyslot: cryptsetup's minimum, so opening costs
/// nothing measurable (unlocking speed is not what is measured) and no calibration runs.
const PEER_PBKDF2_ITERATIONS: &str = "1000";

/// Makes a LUKS1 image of `size` payload bytes in `dir` (ideally tmpfs) with a random
/// passphrase and a fixed PBKDF2 iteration count.
pub fn make_image(dir: &Path, size: u64) -> Result<PeerImage, BenchError> {
    let passphrase_file = dir.join("peer-passphrase");
    let path = dir.join("peer-luks1.img");
    let pass = SecretBytes::from_slice(SecretBytes::random(24).to_hex().as_bytes());
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&passphrase_file)
            .map_err(|e| BenchError::Io(format!("writing {}: {e}", passphrase_file.display())))?;
        f.write_all(pass.as_bytes())
            .map_err(|e| BenchError::Io(format!("writing {}: {e}", passphrase_file.display())))?;
    }
    let image = PeerImage {
        path,
        passphrase_file,
        size,
    };
    std::fs::File::create(&image.path)
        .and_then(|f| f.set_len(LUKS1_PAYLOAD_OFFSET + size))
        .map_err(|e| BenchError::Io(format!("creating {}: {e}", image.path.display())))?;
    run_tool(
        Command::new("cryptsetup")
            .args(["luksFormat", "-q", "--type", "luks1"])
            .args([
                "--cipher",
                "aes-xts-plain64",
                "--key-size",
                "512",
                "--hash",
                "sha256",
            ])
            .args(["--pbkdf-force-iterations", PEER_PBKDF2_ITERATIONS])
            .arg("--key-file")
            .arg(&image.passphrase_file)
            .arg(&image.path),
        "cryptsetup luksFormat --type luks1",
    )?;
    Ok(image)
}

/// A running peer server.
pub struct PeerServer {
    /// Which peer.
    pub kind: PeerKind,
    /// The command line (no secrets on it: the passphrase is in a file).
    pub command: String,
    /// NBD URI to connect to.
    pub uri: String,
    child: Child,
}

impl PeerServer {
    /// Starts `kind` serving `image` on a Unix socket in `dir`, and waits until it listens.
    pub fn start(kind: PeerKind, image: &PeerImage, dir: &Path) -> Result<PeerServer, BenchError> {
        let sock = dir.join(format!("{}.sock", kind.name()));
        let _ = std::fs::remove_file(&sock);
        let mut cmd = match kind {
            PeerKind::NbdkitLuks => {
                let mut c = Command::new("nbdkit");
                c.arg("-U")
                    .arg(&sock)
                    .args([
                        "--foreground",
                        "--exit-with-parent",
                        "--filter=luks",
                        "file",
                    ])
                    .arg(&image.path)
                    .arg(format!("passphrase=+{}", image.passphrase_file.display()));
                c
            }
            PeerKind::QemuNbdLuks => {
                let mut c = Command::new("qemu-nbd");
                c.arg("-k")
                    .arg(&sock)
                    .args(["--persistent", "--shared=16", "--object"])
                    .arg(format!(
                        "secret,id=sec0,file={},format=raw",
                        image.passphrase_file.display()
                    ))
                    .arg("--image-opts")
                    .arg(format!(
                        "driver=luks,key-secret=sec0,file.driver=file,file.filename={}",
                        image.path.display()
                    ));
                c
            }
        };
        let command = format!(
            "{} {}",
            cmd.get_program().to_string_lossy(),
            cmd.get_args()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ")
        );
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| BenchError::Tool(format!("cannot start {}: {e}", kind.name())))?;
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let mut msg = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut msg);
                }
                return Err(BenchError::Tool(format!(
                    "{} exited ({status}): {}",
                    kind.name(),
                    msg.trim()
                )));
            }
            if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(BenchError::Tool(format!(
                    "{} did not start listening",
                    kind.name()
                )));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        Ok(PeerServer {
            kind,
            command,
            uri: format!("nbd+unix:///?socket={}", sock.display()),
            child,
        })
    }

    /// The server's process id (for its CPU time).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for PeerServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
