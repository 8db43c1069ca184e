//! The supernode's TLS: a certificate from PEM files, or a self-signed one
//! made at first start and kept in the data directory; rustls with the
//! `ring` provider passed explicitly, TLS 1.3 only, ALPN `http/1.1`.
//!
//! Clients verify the certificate by CA, or by its fingerprint
//! ([`bsp_api::tls::Fingerprint`]), which the supernode prints at start.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bsp_api::tls::Fingerprint;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why the supernode's TLS cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the TLS certificate file {}: {source}", path.display())]
    ReadCert {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error(
        "the TLS certificate file {} holds no certificate (PEM `-----BEGIN CERTIFICATE-----`)",
        path.display()
    )]
    NoCert { path: PathBuf },
    #[error(
        "cannot read the TLS key file {} (a PEM private key: PKCS#8, PKCS#1 or SEC1): {source}",
        path.display()
    )]
    ReadKey {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("the TLS certificate {} and key {} do not fit together: {source}", cert.display(), key.display())]
    Config {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("cannot make a self-signed TLS certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where the certificate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertificateSource {
    /// `--tls-cert` / `--tls-key`.
    Files,
    /// Self-signed, made at this start.
    Generated,
    /// Self-signed, made at an earlier start and read again.
    Reused,
}

/// The supernode's TLS set-up: the rustls configuration and what to tell
/// people about the certificate.
#[derive(Clone)]
pub struct ServerTls {
    config: Arc<rustls::ServerConfig>,
    fingerprint: Fingerprint,
    cert_path: PathBuf,
    source: CertificateSource,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("fingerprint", &self.fingerprint)
            .field("cert_path", &self.cert_path)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// The file names of a self-signed certificate in its directory.
pub const CERT_FILE: &str = "cert.pem";
pub const KEY_FILE: &str = "key.pem";
/// The names (SANs) a self-signed certificate was made for, one a line.
const NAMES_FILE: &str = "names";

impl ServerTls {
    /// The certificate chain in `cert` (PEM, leaf first) with the private
    /// key in `key` (PEM).
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<ServerTls, TlsError> {
        ServerTls::load(cert, key, CertificateSource::Files)
    }

    /// The self-signed certificate in `dir` (`cert.pem`, `key.pem`), made
    /// now if it is missing or was made without one of `names` (DNS names
    /// or IP addresses; `localhost`, 127.0.0.1 and ::1 are always in).
    pub fn self_signed(dir: &Path, names: &[String]) -> Result<ServerTls, TlsError> {
        let cert = dir.join(CERT_FILE);
        let key = dir.join(KEY_FILE);
        let mut wanted: Vec<String> = ["localhost", "127.0.0.1", "::1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        for n in names {
            let n = n.trim().to_ascii_lowercase();
            if !n.is_empty() && !wanted.contains(&n) {
                wanted.push(n);
            }
        }
        if cert.exists() && key.exists() {
            let had: Vec<String> = std::fs::read_to_string(dir.join(NAMES_FILE))
                .map(|s| s.lines().map(str::to_string).collect())
                .unwrap_or_default();
            // A certificate made elsewhere (no names file) is kept as it is.
            let covered = !dir.join(NAMES_FILE).exists() || wanted.iter().all(|n| had.contains(n));
            if covered {
                return ServerTls::load(&cert, &key, CertificateSource::Reused);
            }
            tracing::warn!(
                "the self-signed certificate in {} lacks some of the names {wanted:?}; making a new one (its fingerprint changes: pinned clients and peers need the new one)",
                dir.display()
            );
        }
        let mut params = rcgen::CertificateParams::new(wanted.clone())?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "bspweb supernode");
        // rcgen's default validity (1975 to 4096) stays: a pinned
        // certificate is replaced by hand, never by expiry.
        let key_pair = rcgen::KeyPair::generate()?;
        let certificate = params.self_signed(&key_pair)?;
        create_private_dir(dir)?;
        write_secret(&key, key_pair.serialize_pem().as_bytes())?;
        write_secret(&cert, certificate.pem().as_bytes())?;
        write_secret(&dir.join(NAMES_FILE), (wanted.join("\n") + "\n").as_bytes())?;
        ServerTls::load(&cert, &key, CertificateSource::Generated)
    }

    fn load(cert: &Path, key: &Path, source: CertificateSource) -> Result<ServerTls, TlsError> {
        let chain = CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|source| TlsError::ReadCert {
                path: cert.to_path_buf(),
                source,
            })?;
        let Some(leaf) = chain.first() else {
            return Err(TlsError::NoCert {
                path: cert.to_path_buf(),
            });
        };
        let fingerprint = Fingerprint::of_der(leaf.as_ref());
        let private = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::ReadKey {
            path: key.to_path_buf(),
            source,
        })?;
        let config_error = |source| TlsError::Config {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            source,
        };
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(config_error)?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(config_error)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(ServerTls {
            config: Arc::new(config),
            fingerprint,
            cert_path: cert.to_path_buf(),
            source,
        })
    }

    /// The SHA-256 fingerprint of the leaf certificate.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// The certificate file.
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// Where the certificate came from.
    pub fn source(&self) -> CertificateSource {
        self.source
    }

    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.clone())
    }
}

fn create_private_dir(dir: &Path) -> Result<(), TlsError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| TlsError::Write {
            path: dir.to_path_buf(),
            source,
        })
}

/// Write a file only its owner can read (mode 0600), replacing it in one
/// step: the supernode's key and the CLI's saved sessions and tokens.
pub fn write_private(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    // A leftover temp file would keep its mode: start afresh.
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(contents)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn write_secret(path: &Path, contents: &[u8]) -> Result<(), TlsError> {
    write_private(path, contents).map_err(|source| TlsError::Write {
        path: path.to_path_buf(),
        source,
    })
}
