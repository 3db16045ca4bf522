//! NBD over TLS (`--tls`, `--tls-certificates`, `--tls-verify-peer`) checked with libnbd's
//! nbdinfo and nbdcopy and with qemu-img, and the refusal of plaintext TCP beyond loopback.
//! Certificates are made with openssl in the test's directory.

mod common;

use common::*;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A CA, a server certificate for localhost/127.0.0.1 and a client certificate, laid out
/// as nbdkit (server) and libnbd/qemu (client) look for them.
struct Pki {
    /// ca-cert.pem, server-cert.pem, server-key.pem.
    server: PathBuf,
    /// ca-cert.pem, client-cert.pem, client-key.pem.
    client: PathBuf,
    /// ca-cert.pem only: trusts the server, has no client certificate.
    anonymous: PathBuf,
    /// Another CA's ca-cert.pem: does not trust the server.
    stranger: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    run_ok(Command::new("openssl").current_dir(dir).args(args), b"");
}

/// A self-signed CA `name` in `dir` (name.key, name.pem).
fn make_ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

/// A leaf `name` signed by CA `ca`, with the extensions in `ext` (name.key, name.pem).
fn make_leaf(dir: &Path, ca: &str, name: &str, ext: &str) {
    std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={name}"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &format!("{name}.pem"),
            "-extfile",
            &format!("{name}.ext"),
        ],
    );
}

fn pki(dir: &Path) -> Option<Pki> {
    tool("openssl")?;
    let work = dir.join("pki");
    std::fs::create_dir_all(&work).unwrap();
    make_ca(&work, "ca");
    make_ca(&work, "other-ca");
    make_leaf(
        &work,
        "ca",
        "server",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    );
    make_leaf(&work, "ca", "client", "extendedKeyUsage=clientAuth\n");
    let layout = |name: &str, files: &[(&str, &str)]| {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for (from, to) in files {
            std::fs::copy(work.join(from), d.join(to)).unwrap();
        }
        d
    };
    Some(Pki {
        server: layout(
            "server",
            &[
                ("ca.pem", "ca-cert.pem"),
                ("server.pem", "server-cert.pem"),
                ("server.key", "server-key.pem"),
            ],
        ),
        client: layout(
            "client",
            &[
                ("ca.pem", "ca-cert.pem"),
                ("client.pem", "client-cert.pem"),
                ("client.key", "client-key.pem"),
            ],
        ),
        anonymous: layout("anonymous", &[("ca.pem", "ca-cert.pem")]),
        stranger: layout("stranger", &[("other-ca.pem", "ca-cert.pem")]),
    })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A 32 MiB LUKS2 volume `name` served on 127.0.0.1:PORT with `tls_args`.
fn serve(dir: &Path, name: &str, tls_args: &[&dyn AsRef<std::ffi::OsStr>]) -> (Served, u16) {
    let key = write_file(dir, &format!("{name}.key"), b"tls test passphrase");
    let img = dir.join(format!("{name}.img"));
    cryptblk_luks2(&img, &key, 32 << 20);
    let port = free_port();
    let mut open = cryptblk();
    open.args(["open", "--key-file"])
        .arg(&key)
        .arg(&img)
        .arg(name)
        .arg("--nbd")
        .arg(format!("127.0.0.1:{port}"));
    for a in tls_args {
        open.arg(a);
    }
    run_ok(&mut open, b"");
    (Served::volume(name), port)
}

fn nbds(port: u16, certs: &Path) -> String {
    format!(
        "nbds://localhost:{port}/?tls-certificates={}",
        certs.display()
    )
}

/// nbdinfo --size on `uri`: the size, or the error text.
fn nbdinfo_size(uri: &str) -> Result<u64, String> {
    let out = run(Command::new("nbdinfo").args(["--size", uri]), b"");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().parse().unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn tls_require_serves_trusting_clients_only_and_carries_data() {
    assert!(
        tool("nbdinfo").is_some() && tool("nbdcopy").is_some(),
        "a tool this test needs is missing (scripts/install-deps.sh installs it)"
    );
    let dir = tempdir();
    let Some(pki) = pki(dir.path()) else { return };
    let (_served, port) = serve(
        dir.path(),
        "tlsreq",
        &[&"--tls", &"require", &"--tls-certificates", &pki.server],
    );
    // The volume's data area: 32 MiB less the LUKS2 header.
    let size = nbdinfo_size(&nbds(port, &pki.anonymous)).expect("TLS client with the CA");
    assert!(size > 0 && size < 32 << 20, "size {size}");
    let e = nbdinfo_size(&nbds(port, &pki.stranger)).unwrap_err();
    assert!(!e.is_empty());
    // Plaintext is refused: the server answers every option with TLS required.
    let e = nbdinfo_size(&format!("nbd://localhost:{port}/")).unwrap_err();
    assert!(e.to_lowercase().contains("tls"), "{e}");

    // Data through TLS: nbdcopy (several requests in flight, several connections) writes a
    // pattern and reads it back.
    let pattern = dir.path().join("pattern");
    write_pattern(&pattern, size as usize, 7);
    let uri = nbds(port, &pki.anonymous);
    run_ok(Command::new("nbdcopy").arg(&pattern).arg(&uri), b"");
    let back = dir.path().join("back");
    run_ok(Command::new("nbdcopy").arg(&uri).arg(&back), b"");
    assert_eq!(sha256(&pattern), sha256(&back));
}

#[test]
fn tls_verify_peer_refuses_clients_without_a_certificate() {
    assert!(
        tool("nbdinfo").is_some(),
        "a tool this test needs is missing (scripts/install-deps.sh installs it)"
    );
    let dir = tempdir();
    let Some(pki) = pki(dir.path()) else { return };
    let (_served, port) = serve(
        dir.path(),
        "tlspeer",
        &[
            &"--tls",
            &"require",
            &"--tls-certificates",
            &pki.server,
            &"--tls-verify-peer",
        ],
    );
    assert!(nbdinfo_size(&nbds(port, &pki.client)).is_ok());
    // Without a client certificate the TLS handshake fails, before any option is answered.
    let e = nbdinfo_size(&nbds(port, &pki.anonymous)).unwrap_err();
    assert!(!e.is_empty());
    // A client certificate is no help with a CA that does not sign the server's.
    assert!(nbdinfo_size(&nbds(port, &pki.stranger)).is_err());

    // qemu with its own TLS stack reads through the same export.
    assert!(
        tool("qemu-img").is_some(),
        "a tool this test needs is missing (scripts/install-deps.sh installs it)"
    );
    let out = run(
        Command::new("qemu-img").args([
            "info",
            "--output=json",
            "--object",
            &format!(
                "tls-creds-x509,id=tls0,endpoint=client,dir={}",
                pki.client.display()
            ),
            "--image-opts",
            &format!("driver=nbd,host=localhost,port={port},tls-creds=tls0"),
        ]),
        b"",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("virtual-size"), "{text}");
}

#[test]
fn tls_on_serves_both_plaintext_and_tls() {
    assert!(
        tool("nbdinfo").is_some(),
        "a tool this test needs is missing (scripts/install-deps.sh installs it)"
    );
    let dir = tempdir();
    let Some(pki) = pki(dir.path()) else { return };
    let (_served, port) = serve(
        dir.path(),
        "tlson",
        &[&"--tls", &"on", &"--tls-certificates", &pki.server],
    );
    let tls = nbdinfo_size(&nbds(port, &pki.anonymous)).unwrap();
    let plain = nbdinfo_size(&format!("nbd://localhost:{port}/")).unwrap();
    assert_eq!(tls, plain);
    let facts = status("tlson");
    let uri = facts["export"]["uri"].as_str().unwrap_or_default();
    assert!(uri.starts_with("nbds://"), "{facts}");
}

#[test]
fn plaintext_tcp_beyond_loopback_needs_an_explicit_flag() {
    let dir = tempdir();
    let key = write_file(dir.path(), "k", b"pass");
    let img = dir.path().join("v.img");
    cryptblk_luks2(&img, &key, 32 << 20);
    let open = |extra: &[&str]| {
        let mut c = cryptblk();
        c.args(["open", "--key-file"])
            .arg(&key)
            .arg(&img)
            .arg("insecure")
            .args(["--nbd", "0.0.0.0:0"])
            .args(extra);
        code(&mut c)
    };
    let (rc, err) = open(&[]);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("--allow-insecure-tcp"), "{err}");
    let (rc, err) = open(&["--tls", "on"]);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("--tls-certificates"), "{err}");
    let (rc, err) = open(&["--tls-verify-peer"]);
    assert_eq!(rc, 1, "{err}");
    // With the flag it serves (and is closed again at once).
    let (rc, err) = open(&["--allow-insecure-tcp"]);
    assert_eq!(rc, 0, "{err}");
    let _served = Served::volume("insecure");
}

/// A `dm create` of a linear table over `dev`, serving on `sock`: (exit code, stderr).
fn linear_over(name: &str, dev: &str, sectors: u64, dir: &Path, sock: &Path) -> (i32, String) {
    let table = write_file(
        dir,
        &format!("{name}.table"),
        format!("0 {sectors} linear {dev} 0\n").as_bytes(),
    );
    code(
        cryptblk()
            .args(["dm", "create", name, "--table-file"])
            .arg(table)
            .arg("--nbd")
            .arg(sock),
    )
}

#[test]
fn nbds_backing_on_nbdkit_with_tls_and_client_certificates() {
    assert!(
        tool("nbdkit").is_some() && tool("nbdcopy").is_some(),
        "a tool this test needs is missing (scripts/install-deps.sh installs it)"
    );
    let dir = tempdir();
    let Some(pki) = pki(dir.path()) else { return };
    let img = dir.path().join("remote.img");
    sparse_file(&img, 8 << 20);
    let port = free_port();
    let nbdkit = Killed(spawn_captured(
        Command::new("nbdkit")
            .args(["-f", "-i", "127.0.0.1", "-p", &port.to_string()])
            .args(["--tls=require", "--tls-verify-peer"])
            .arg(format!("--tls-certificates={}", pki.server.display()))
            .arg("file")
            .arg(&img),
    ));
    let start = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(start.elapsed().as_secs() < 10, "nbdkit did not listen");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let sectors = (8 << 20) / 512;
    // The wrong CA and a missing client certificate are both refused at load.
    for (certs, why) in [
        (&pki.stranger, "untrusted server"),
        (&pki.anonymous, "no client cert"),
    ] {
        let dev = format!(
            "nbds://localhost:{port}/?tls-certificates={}",
            certs.display()
        );
        let (rc, err) = linear_over(
            "tlsbad",
            &dev,
            sectors,
            dir.path(),
            &dir.path().join("bad.sock"),
        );
        assert_ne!(rc, 0, "{why}: {err}");
    }
    // Plaintext to a server that requires TLS is refused too.
    let plain = format!("nbd://localhost:{port}/");
    let (rc, err) = linear_over(
        "tlsplain",
        &plain,
        sectors,
        dir.path(),
        &dir.path().join("p.sock"),
    );
    assert_ne!(rc, 0, "{err}");
    assert!(err.contains("TLS"), "{err}");

    let dev = format!(
        "nbds://localhost:{port}/?tls-certificates={}",
        pki.client.display()
    );
    let sock = dir.path().join("export.sock");
    let (rc, err) = linear_over("tlsremote", &dev, sectors, dir.path(), &sock);
    assert_eq!(rc, 0, "{err}");
    let _served = Served::volume("tlsremote");
    let pattern = dir.path().join("pattern");
    write_pattern(&pattern, 8 << 20, 3);
    run_ok(
        Command::new("nbdcopy")
            .arg(&pattern)
            .arg(nbd_uri(&sock))
            .arg("--flush"),
        b"",
    );
    assert_eq!(sha256(&pattern), sha256(&img));
    drop(nbdkit);
}

/// A server process killed when the test ends, passing or not.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A copy of the certificate directory `from` at `to`, each file keeping its mode.
fn copy_certs(from: &Path, to: &Path) -> PathBuf {
    std::fs::create_dir(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
    to.to_path_buf()
}

fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Certificate files anyone else could have written (a CA of their own, with
/// `--tls-verify-peer`, lets in their client certificate), or a private key others can
/// read, are refused as ssh refuses loose keys: exit 1, one line naming the file and the
/// fix, nothing served and the volume untouched. A correct directory, with the key shared
/// with its group only (Debian's ssl-cert layout), serves.
#[test]
fn loose_certificate_files_are_refused_naming_the_file() {
    let dir = tempdir();
    let pki = pki(dir.path()).expect("openssl makes the certificates");
    let (other, other_gid) = other_user();
    let key = write_file(dir.path(), "loose.key", b"tls test passphrase");
    let img = dir.path().join("loose.img");
    cryptblk_luks2(&img, &key, 32 << 20);
    let before = sha256(&img);
    let chown_other = |p: &Path| chown(p, other, Some(other_gid));
    type Spoil<'a> = &'a dyn Fn(&Path);
    let cases: &[(&str, Spoil, &str, &str)] = &[
        (
            "ca-cert.pem",
            &|d| chmod(&d.join("ca-cert.pem"), 0o666),
            "writable by other users",
            "chmod go-w",
        ),
        (
            "ca-cert.pem",
            &|d| chmod(&d.join("ca-cert.pem"), 0o664),
            "writable by other users",
            "chmod go-w",
        ),
        (
            "server-key.pem",
            &|d| chmod(&d.join("server-key.pem"), 0o644),
            "accessible to all users",
            "chmod 600",
        ),
        (
            "server-key.pem",
            &|d| chmod(&d.join("server-key.pem"), 0o604),
            "accessible to all users",
            "chmod 600",
        ),
        (
            "server-cert.pem",
            &|d| chown_other(&d.join("server-cert.pem")),
            "owned by uid",
            "chown",
        ),
        (
            "ca-cert.pem",
            &|d| chown_other(&d.join("ca-cert.pem")),
            "owned by uid",
            "chown",
        ),
        (
            "",
            &|d| chmod(d, 0o777),
            "writable by other users",
            "chmod go-w",
        ),
        ("", &|d| chown_other(d), "owned by uid", "chown"),
    ];
    for (i, (file, spoil, why, fix)) in cases.iter().enumerate() {
        let certs = copy_certs(&pki.server, &dir.path().join(format!("loose{i}")));
        spoil(&certs);
        let named = if file.is_empty() {
            certs.clone()
        } else {
            certs.join(file)
        };
        let mut open = cryptblk();
        open.args(["open", "--key-file"])
            .arg(&key)
            .arg(&img)
            .arg("loose")
            .args([
                "--nbd",
                "127.0.0.1:0",
                "--tls",
                "require",
                "--tls-verify-peer",
            ])
            .arg("--tls-certificates")
            .arg(&certs);
        let (rc, err) = code(&mut open);
        let served = run(cryptblk().args(["status", "loose"]), b"")
            .status
            .success();
        if served {
            let _ = Served::volume("loose");
        }
        assert_eq!(rc, 1, "case {i} ({file} {why}): {err}");
        assert_eq!(err.trim().lines().count(), 1, "case {i}: one line: {err}");
        assert!(
            err.contains(&named.display().to_string()) && err.contains(why) && err.contains(fix),
            "case {i}: names {} and says {why} / {fix}: {err}",
            named.display()
        );
        assert!(!served, "case {i}: served anyway");
        assert_eq!(sha256(&img), before, "case {i}: the volume changed");
    }
    // The same files, correct: served, with the key readable by its group only.
    let good = copy_certs(&pki.server, &dir.path().join("good"));
    chmod(&good.join("server-key.pem"), 0o640);
    chmod(&good.join("ca-cert.pem"), 0o644);
    let (_served, port) = serve(
        dir.path(),
        "goodcerts",
        &[
            &"--tls",
            &"require",
            &"--tls-verify-peer",
            &"--tls-certificates",
            &good,
        ],
    );
    assert!(nbdinfo_size(&nbds(port, &pki.client)).is_ok());
}

/// The NBD client side (nbds:// backings) checks its files the same way: a client key
/// others can read, or a CA another user owns, is refused naming the file, before any
/// connection is tried.
#[test]
fn nbds_backing_refuses_loose_client_files() {
    let dir = tempdir();
    let pki = pki(dir.path()).expect("openssl makes the certificates");
    let (other, other_gid) = other_user();
    type Spoil<'a> = &'a dyn Fn(&Path);
    let cases: &[(&str, Spoil, &str)] = &[
        (
            "client-key.pem",
            &|d| chmod(&d.join("client-key.pem"), 0o644),
            "accessible to all users",
        ),
        (
            "ca-cert.pem",
            &|d| chmod(&d.join("ca-cert.pem"), 0o646),
            "writable by other users",
        ),
        (
            "ca-cert.pem",
            &|d| chown(&d.join("ca-cert.pem"), other, Some(other_gid)),
            "owned by uid",
        ),
    ];
    // Nothing listens on this port: a refusal that names the file came before connecting.
    let port = free_port();
    for (i, (file, spoil, why)) in cases.iter().enumerate() {
        let certs = copy_certs(&pki.client, &dir.path().join(format!("client{i}")));
        spoil(&certs);
        let dev = format!(
            "nbds://localhost:{port}/?tls-certificates={}",
            certs.display()
        );
        let (rc, err) = linear_over(
            "tlsloose",
            &dev,
            16,
            dir.path(),
            &dir.path().join(format!("c{i}.sock")),
        );
        if rc == 0 {
            let _ = Served::volume("tlsloose");
        }
        assert_ne!(rc, 0, "case {i}: {err}");
        let named = certs.join(file).display().to_string();
        assert!(
            err.contains(&named) && err.contains(why),
            "case {i}: names {named} and says {why}: {err}"
        );
    }
}
