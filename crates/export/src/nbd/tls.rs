//! TLS for the NBD server: `NBD_OPT_STARTTLS` with rustls on the AWS-LC provider.
//!
//! Certificates are found as nbdkit finds them with `--tls-certificates DIR`: the server's
//! chain in `DIR/server-cert.pem`, its key in `DIR/server-key.pem`, and the certificate
//! authority that signs client certificates in `DIR/ca-cert.pem` (read only when client
//! certificates are verified). Each is read only if no other user could have written it
//! (and the key only if others cannot read it): see `cryptblk_dm`'s `tls_files`.
//!
//! After STARTTLS a connection's bytes go through `cryptblk_dm`'s `TlsSession`, which the
//! NBD client backing shares: one worker reads while reply jobs write.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

pub(crate) use cryptblk_dm::backing::nbd::tls::TlsSession;
use cryptblk_dm::backing::nbd::tls_files::{check_tls_dir, read_tls_file, TlsFile};

use crate::error::ExportError;

/// Whether and how an NBD server offers TLS, with nbdkit's meaning of `--tls`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// No TLS: `NBD_OPT_STARTTLS` is not supported.
    Off,
    /// TLS offered, plaintext clients served too.
    On,
    /// Every client must start TLS before anything else (other options get
    /// `NBD_REP_ERR_TLS_REQD`, `NBD_OPT_EXPORT_NAME` closes the connection).
    Require,
}

impl std::str::FromStr for TlsMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "off" => Ok(TlsMode::Off),
            "on" => Ok(TlsMode::On),
            "require" => Ok(TlsMode::Require),
            _ => Err(format!("invalid TLS mode '{text}': use off, on or require")),
        }
    }
}

/// The TLS an NBD server offers ([`super::NbdConfig::tls`]): settings, which serialise
/// (the certificates are named, not carried), and the server configuration loaded from them
/// ([`NbdTls::load`], done by the server when it starts if not before).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct NbdTls {
    /// The directory of `server-cert.pem`, `server-key.pem` and (with `verify_peer`)
    /// `ca-cert.pem`.
    pub certificates: PathBuf,
    /// Plaintext clients are refused ([`TlsMode::Require`]) or served too ([`TlsMode::On`]).
    pub require: bool,
    /// Client certificates are verified against the CA (nbdkit's `--tls-verify-peer`).
    pub verify_peer: bool,
    /// The rustls server configuration every STARTTLS uses, once loaded.
    #[serde(skip)]
    loaded: Option<Arc<ServerConfig>>,
}

impl NbdTls {
    /// TLS from the certificates in `dir`, not loaded yet.
    pub fn new(dir: impl Into<PathBuf>, require: bool, verify_peer: bool) -> NbdTls {
        NbdTls {
            certificates: dir.into(),
            require,
            verify_peer,
            loaded: None,
        }
    }

    /// Loads `dir/server-cert.pem` and `dir/server-key.pem` (and `dir/ca-cert.pem` when
    /// `verify_peer`: then a client without a certificate that CA signed fails the TLS
    /// handshake, before any option is read).
    pub fn from_dir(dir: &Path, require: bool, verify_peer: bool) -> Result<NbdTls, ExportError> {
        let mut tls = NbdTls::new(dir, require, verify_peer);
        tls.load()?;
        Ok(tls)
    }

    /// Loads the certificates (see [`NbdTls::from_dir`]) unless already loaded.
    pub fn load(&mut self) -> Result<(), ExportError> {
        if self.loaded.is_none() {
            let config = load_server_config(&self.certificates, self.verify_peer)?;
            self.loaded = Some(Arc::new(config));
        }
        Ok(())
    }

    /// The loaded server configuration; `None` before [`NbdTls::load`].
    pub(crate) fn server_config(&self) -> Option<&Arc<ServerConfig>> {
        self.loaded.as_ref()
    }
}

/// The rustls server configuration of the certificates in `dir`.
fn load_server_config(dir: &Path, verify_peer: bool) -> Result<ServerConfig, ExportError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    check_tls_dir(dir).map_err(ExportError::Config)?;
    let certs = load_certs(&dir.join("server-cert.pem"))?;
    let key_path = dir.join("server-key.pem");
    let key_pem = read_tls_file(&key_path, TlsFile::PrivateKey).map_err(ExportError::Config)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| ExportError::Config(format!("reading TLS key {}: {e}", key_path.display())))?;
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| ExportError::Config(format!("TLS setup: {e}")))?;
    let builder = if verify_peer {
        let ca_path = dir.join("ca-cert.pem");
        let mut roots = RootCertStore::empty();
        for cert in load_certs(&ca_path)? {
            roots
                .add(cert)
                .map_err(|e| ExportError::Config(format!("TLS CA {}: {e}", ca_path.display())))?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| ExportError::Config(format!("TLS client verifier: {e}")))?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let config = builder.with_single_cert(certs, key).map_err(|e| {
        ExportError::Config(format!("TLS certificate and key in {}: {e}", dir.display()))
    })?;
    Ok(config)
}

/// Every certificate in a PEM file (at least one).
pub(crate) fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, ExportError> {
    let bad =
        |e: String| ExportError::Config(format!("reading TLS certificate {}: {e}", path.display()));
    let pem = read_tls_file(path, TlsFile::Certificate).map_err(ExportError::Config)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no certificate in it".to_string()));
    }
    Ok(certs)
}
