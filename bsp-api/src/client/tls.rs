//! The TLS side of every bspweb HTTP client: the CLI and the Rust
//! [`Client`](super::Client), and the peers' control-plane client.
//!
//! rustls with the `ring` provider, passed explicitly (no process-wide
//! default is needed). A supernode's certificate is verified in one of two
//! ways ([`TlsOptions`]):
//!
//! - **by CA**: a chain to one of Mozilla's roots (`webpki-roots`) or to a
//!   CA of one's own (`--ca-cert FILE`), for the URL's host name, within
//!   its validity period;
//! - **by a pinned fingerprint** (`--supernode-fingerprint sha256:…`): the
//!   leaf certificate must have exactly that SHA-256, and nothing else is
//!   accepted (no CA, no other certificate). Names and dates are not
//!   checked, as the certificate is named exactly; the handshake's
//!   signature is still verified with the certificate's key.
//!
//! A refused certificate becomes [`ClientError::Tls`](super::ClientError::Tls)
//! with a message that says what to do ([`tls_failure`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, OtherError, RootCertStore, SignatureScheme};

use crate::tls::Fingerprint;

/// The environment variable that pins the supernode's certificate.
pub const FINGERPRINT_ENV: &str = "BSPWEB_SUPERNODE_FINGERPRINT";
/// The environment variable that names a CA certificate file (PEM).
pub const CA_CERT_ENV: &str = "BSPWEB_CA_CERT";

/// How a client verifies the supernode's certificate.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// Accept exactly the leaf certificate with this fingerprint, and
    /// nothing else. Takes precedence over the CAs.
    pub fingerprint: Option<Fingerprint>,
    /// CA certificates trusted besides Mozilla's roots.
    pub ca_certs: Vec<CertificateDer<'static>>,
}

/// A CA certificate file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    #[error("cannot read the CA certificate file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the CA certificate file {} is not PEM: {reason}", path.display())]
    Pem { path: PathBuf, reason: String },
    #[error(
        "the CA certificate file {} holds no certificate (PEM `-----BEGIN CERTIFICATE-----`)",
        path.display()
    )]
    Empty { path: PathBuf },
}

impl TlsOptions {
    /// Verify by Mozilla's roots only.
    pub fn new() -> TlsOptions {
        TlsOptions::default()
    }

    /// Accept exactly the certificate with `fingerprint`.
    pub fn pinned(fingerprint: Fingerprint) -> TlsOptions {
        TlsOptions {
            fingerprint: Some(fingerprint),
            ca_certs: Vec::new(),
        }
    }

    /// Also trust the CA certificates in the PEM file at `path`.
    pub fn with_ca_file(mut self, path: &Path) -> Result<TlsOptions, TlsConfigError> {
        let pem = std::fs::read(path).map_err(|source| TlsConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsConfigError::Pem {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
        if certs.is_empty() {
            return Err(TlsConfigError::Empty {
                path: path.to_path_buf(),
            });
        }
        self.ca_certs.extend(certs);
        Ok(self)
    }
}

/// The `ring` provider, which every bspweb TLS configuration uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Make `ring` the process's default rustls provider, unless one is set.
///
/// bspweb's own clients never need this (they pass the provider
/// explicitly); a program that also builds plain `reqwest::Client`s of its
/// own in a process that links this crate does, since reqwest then has TLS
/// without a provider of its own.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The rustls configuration of a client that verifies as `options` says;
/// HTTP/1.1 only (ALPN `http/1.1`), TLS 1.3 and 1.2 with rustls's safe
/// defaults.
pub fn client_config(options: &TlsOptions) -> rustls::ClientConfig {
    let provider = provider();
    let verifier = SupernodeVerifier::new(options, provider.clone());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        // The ring provider supports every safe default version.
        .unwrap_or_else(|_| unreachable!("ring supports TLS 1.2 and 1.3"))
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

/// A `reqwest` client builder with bspweb's TLS configuration, the given
/// connect timeout, and idle connections let go before the supernode
/// closes them (after 20 s without a request).
pub fn http_builder(options: &TlsOptions, connect_timeout: Duration) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .use_preconfigured_tls(client_config(options))
        .connect_timeout(connect_timeout)
        .pool_idle_timeout(Duration::from_secs(10))
}

/// A certificate this client refused, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum CertificateRefused {
    /// The pinned fingerprint is not the certificate's.
    #[error(
        "the supernode's certificate has fingerprint {got}, not the pinned {pinned}: if the supernode's certificate was replaced on purpose, pin the new fingerprint it prints at start (--supernode-fingerprint or {FINGERPRINT_ENV}); otherwise something between you and the supernode may be intercepting the connection"
    )]
    PinMismatch {
        got: Fingerprint,
        pinned: Fingerprint,
    },
    /// The certificate does not chain to a trusted CA (self-signed, say).
    #[error(
        "the supernode's certificate (fingerprint {got}) is not signed by a trusted CA ({reason}); if the supernode made its own certificate, pin the fingerprint it printed at start with --supernode-fingerprint (or {FINGERPRINT_ENV}) after checking that it is {got}; or give its CA's certificate with --ca-cert FILE (or {CA_CERT_ENV})"
    )]
    Untrusted { got: Fingerprint, reason: String },
    /// The certificate chains to a trusted CA but is not valid for this
    /// host, or not at this time.
    #[error("the supernode's certificate (fingerprint {got}) is not valid for {server}: {reason}")]
    Invalid {
        got: Fingerprint,
        server: String,
        reason: String,
    },
}

/// The supernode certificate verifier: a pin, or a CA store.
#[derive(Debug)]
struct SupernodeVerifier {
    pin: Option<Fingerprint>,
    webpki: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl SupernodeVerifier {
    fn new(options: &TlsOptions, provider: Arc<CryptoProvider>) -> SupernodeVerifier {
        let webpki = match options.fingerprint {
            Some(_) => None,
            None => {
                let mut roots = RootCertStore {
                    roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
                };
                // A CA certificate webpki cannot read is left out: the
                // supernode's certificate then does not verify, which says so.
                let _ = roots.add_parsable_certificates(options.ca_certs.iter().cloned());
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .ok()
            }
        };
        SupernodeVerifier {
            pin: options.fingerprint,
            webpki,
            provider,
        }
    }
}

fn refused(r: CertificateRefused) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(r))))
}

impl ServerCertVerifier for SupernodeVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let got = Fingerprint::of_der(end_entity.as_ref());
        if let Some(pinned) = self.pin {
            return if got == pinned {
                Ok(ServerCertVerified::assertion())
            } else {
                Err(refused(CertificateRefused::PinMismatch { got, pinned }))
            };
        }
        let Some(webpki) = &self.webpki else {
            return Err(refused(CertificateRefused::Untrusted {
                got,
                reason: "no CA certificates could be loaded".to_string(),
            }));
        };
        webpki
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
            .map_err(|e| match e {
                rustls::Error::InvalidCertificate(
                    c @ (CertificateError::UnknownIssuer
                    | CertificateError::BadSignature
                    | CertificateError::UnsupportedSignatureAlgorithmContext { .. }
                    | CertificateError::InvalidPurpose),
                ) => refused(CertificateRefused::Untrusted {
                    got,
                    reason: certificate_error_text(&c),
                }),
                rustls::Error::InvalidCertificate(c) => refused(CertificateRefused::Invalid {
                    got,
                    server: server_name.to_str().into_owned(),
                    reason: certificate_error_text(&c),
                }),
                e => e,
            })
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn certificate_error_text(e: &CertificateError) -> String {
    match e {
        CertificateError::UnknownIssuer => "unknown issuer; it may be self-signed".to_string(),
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            format!("the certificate is for other names ({e})")
        }
        e => e.to_string(),
    }
}

/// If `error` (anywhere in its chain of sources) is a TLS failure, what
/// went wrong and what to do about it.
pub fn tls_failure(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    if let Some(t) = as_rustls(error) {
        return Some(describe(t));
    }
    if let Some(r) = error.downcast_ref::<CertificateRefused>() {
        return Some(r.to_string());
    }
    // `io::Error::source` skips the error it wraps (itself often another
    // `io::Error`, as reqwest's connector nests them); look into it too.
    if let Some(inner) = error
        .downcast_ref::<std::io::Error>()
        .and_then(std::io::Error::get_ref)
        && let Some(found) = tls_failure(inner)
    {
        return Some(found);
    }
    tls_failure(error.source()?)
}

fn as_rustls<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    e.downcast_ref::<rustls::Error>()
}

fn describe(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(inner))) => {
            match inner.downcast_ref::<CertificateRefused>() {
                Some(r) => r.to_string(),
                None => format!("the supernode's certificate is refused: {inner}"),
            }
        }
        rustls::Error::InvalidCertificate(c) => {
            format!(
                "the supernode's certificate is refused: {}",
                certificate_error_text(c)
            )
        }
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            format!(
                "the TLS handshake failed ({e}); does the supernode speak plain HTTP? then use an http:// URL"
            )
        }
        e => format!("the TLS handshake failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DER blob standing in for a certificate: the pin compares bytes only.
    fn fake_cert(b: &[u8]) -> CertificateDer<'static> {
        CertificateDer::from(b.to_vec())
    }

    fn verify(options: &TlsOptions, cert: &CertificateDer<'_>) -> Result<(), rustls::Error> {
        let v = SupernodeVerifier::new(options, provider());
        let name = ServerName::try_from("localhost").unwrap();
        v.verify_server_cert(cert, &[], &name, &[], UnixTime::now())
            .map(|_| ())
    }

    #[test]
    fn a_pin_accepts_exactly_its_certificate() {
        let cert = fake_cert(b"the supernode's certificate");
        let pin = Fingerprint::of_der(cert.as_ref());
        assert!(verify(&TlsOptions::pinned(pin), &cert).is_ok());

        let other = fake_cert(b"another certificate");
        let e = verify(&TlsOptions::pinned(pin), &other).unwrap_err();
        let text = describe(&e);
        let got = Fingerprint::of_der(other.as_ref());
        assert!(
            text.starts_with(&format!(
                "the supernode's certificate has fingerprint {got}, not the pinned {pin}: "
            )),
            "{text}"
        );
    }

    #[test]
    fn a_pin_takes_precedence_over_cas() {
        let cert = fake_cert(b"x");
        let mut options = TlsOptions::pinned(Fingerprint::of_der(b"y"));
        options.ca_certs.push(cert.clone());
        assert!(verify(&options, &cert).is_err());
    }

    #[test]
    fn without_a_pin_an_unknown_certificate_is_refused_saying_what_to_do() {
        // Not even a certificate: webpki refuses it before anything else.
        let cert = fake_cert(b"not DER");
        let e = verify(&TlsOptions::new(), &cert).unwrap_err();
        let text = describe(&e);
        assert!(text.contains("the supernode's certificate"), "{text}");
    }

    #[test]
    fn tls_failures_are_found_inside_io_errors() {
        let r = CertificateRefused::PinMismatch {
            got: Fingerprint::of_der(b"a"),
            pinned: Fingerprint::of_der(b"b"),
        };
        // As reqwest's connector nests them.
        let io = std::io::Error::other(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            refused(r),
        ));
        let text = tls_failure(&io).expect("found");
        assert!(text.contains("not the pinned"), "{text}");
        let plain = std::io::Error::other("connection refused");
        assert_eq!(tls_failure(&plain), None);
    }

    /// A self-signed certificate for `names` and its key, as rcgen makes
    /// them (the supernode makes its own the same way).
    fn self_signed(
        names: &[&str],
    ) -> (
        CertificateDer<'static>,
        rustls::pki_types::PrivateKeyDer<'static>,
    ) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let c = rcgen::generate_simple_self_signed(names).unwrap();
        let key = rustls::pki_types::PrivatePkcs8KeyDer::from(c.signing_key.serialize_der());
        (c.cert.der().clone(), key.into())
    }

    /// A TLS handshake in memory between a client with `options` and a
    /// server presenting `cert`, signing with `key`.
    fn handshake(
        options: &TlsOptions,
        cert: CertificateDer<'static>,
        key: rustls::pki_types::PrivateKeyDer<'static>,
    ) -> Result<(), rustls::Error> {
        /// Presents its certificate and key whether they match or not.
        #[derive(Debug)]
        struct Fixed(Arc<rustls::sign::CertifiedKey>);
        impl rustls::server::ResolvesServerCert for Fixed {
            fn resolve(
                &self,
                _: rustls::server::ClientHello<'_>,
            ) -> Option<Arc<rustls::sign::CertifiedKey>> {
                Some(self.0.clone())
            }
        }
        let signing = provider().key_provider.load_private_key(key).unwrap();
        let certified = rustls::sign::CertifiedKey::new(vec![cert], signing);
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Fixed(Arc::new(certified))));
        let mut server = rustls::ServerConnection::new(Arc::new(server)).unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let mut client =
            rustls::ClientConnection::new(Arc::new(client_config(options)), name).unwrap();
        for _ in 0..10 {
            let mut buf = Vec::new();
            while client.wants_write() {
                client.write_tls(&mut buf).unwrap();
            }
            let mut rd = &buf[..];
            while !rd.is_empty() {
                server.read_tls(&mut rd).unwrap();
            }
            server.process_new_packets()?;
            let mut buf = Vec::new();
            while server.wants_write() {
                server.write_tls(&mut buf).unwrap();
            }
            let mut rd = &buf[..];
            while !rd.is_empty() {
                client.read_tls(&mut rd).unwrap();
            }
            client.process_new_packets()?;
            if !client.is_handshaking() && !server.is_handshaking() {
                return Ok(());
            }
        }
        panic!("the handshake did not finish");
    }

    #[test]
    fn a_pinned_self_signed_certificate_completes_a_real_handshake() {
        let (cert, key) = self_signed(&["localhost", "127.0.0.1"]);
        let pin = Fingerprint::of_der(cert.as_ref());
        handshake(&TlsOptions::pinned(pin), cert, key).expect("pinned handshake");
    }

    #[test]
    fn a_pin_still_checks_the_handshake_signature() {
        // The pinned certificate, but the server signs with another key:
        // the certificate matches the pin, the signature does not.
        let (cert, _) = self_signed(&["localhost"]);
        let (_, other_key) = self_signed(&["localhost"]);
        let pin = Fingerprint::of_der(cert.as_ref());
        let e = handshake(&TlsOptions::pinned(pin), cert, other_key).unwrap_err();
        assert!(
            matches!(
                e,
                rustls::Error::InvalidCertificate(CertificateError::BadSignature)
                    | rustls::Error::PeerMisbehaved(_)
                    | rustls::Error::General(_)
            ) || e.to_string().contains("signature"),
            "{e:?}"
        );
    }

    #[test]
    fn an_unpinned_self_signed_certificate_is_refused_naming_its_fingerprint_and_the_fixes() {
        let (cert, key) = self_signed(&["localhost"]);
        let got = Fingerprint::of_der(cert.as_ref());
        let e = handshake(&TlsOptions::new(), cert, key).unwrap_err();
        let text = describe(&e);
        assert!(
            text.contains(&format!(
                "(fingerprint {got}) is not signed by a trusted CA"
            )),
            "{text}"
        );
        assert!(text.contains("--supernode-fingerprint"), "{text}");
        assert!(text.contains("--ca-cert"), "{text}");
    }

    #[test]
    fn a_certificate_given_as_ca_is_trusted_for_its_names_only() {
        let (cert, key) = self_signed(&["localhost"]);
        let dir = std::env::temp_dir().join(format!("bsp-api-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("ca.pem");
        let pem = rustls::pki_types::pem::PemObject::pem_slice_iter(b"" as &[u8])
            .collect::<Result<Vec<CertificateDer<'static>>, _>>()
            .unwrap();
        assert!(pem.is_empty());
        std::fs::write(
            &file,
            format!(
                "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
                base64::Engine::encode(&base64::engine::general_purpose::STANDARD, cert.as_ref())
            ),
        )
        .unwrap();
        let options = TlsOptions::new().with_ca_file(&file).unwrap();
        assert_eq!(options.ca_certs, vec![cert.clone()]);
        handshake(&options, cert.clone(), key).expect("trusted by the CA file");
        // The same certificate for another name: refused, saying why.
        let (other, other_key) = self_signed(&["bsp.example.org"]);
        let options = TlsOptions {
            fingerprint: None,
            ca_certs: vec![other.clone()],
        };
        let e = handshake(&options, other, other_key).unwrap_err();
        let text = describe(&e);
        assert!(text.contains("is not valid for localhost"), "{text}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_ca_file_must_hold_pem_certificates() {
        let dir = std::env::temp_dir().join(format!("bsp-api-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "no certificates here\n").unwrap();
        let e = TlsOptions::new().with_ca_file(&empty).unwrap_err();
        assert!(matches!(e, TlsConfigError::Empty { .. }), "{e}");
        let e = TlsOptions::new()
            .with_ca_file(&dir.join("missing.pem"))
            .unwrap_err();
        assert!(matches!(e, TlsConfigError::Read { .. }), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
