//! `tls_server_config` as a rustls server configuration (ring provider, HTTP/1.1 only).

use super::error::{invalid, ConfigError};
use super::file::{SourceReader, TlsServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use std::sync::Arc;
use tokio_rustls::rustls::client::danger::HandshakeSignatureValid;
use tokio_rustls::rustls::crypto::{ring as provider, CryptoProvider, WebPkiSupportedAlgorithms};
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{
    self, CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig,
    SignatureScheme, SupportedProtocolVersion,
};

/// How the server asks for client certificates (Go's `tls.ClientAuthType` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientAuth {
    NoClientCert,
    RequestClientCert,
    RequireAnyClientCert,
    VerifyClientCertIfGiven,
    RequireAndVerifyClientCert,
}

impl ClientAuth {
    fn parse(name: Option<&str>) -> Result<ClientAuth, ConfigError> {
        Ok(match name.unwrap_or("") {
            "" | "NoClientCert" => ClientAuth::NoClientCert,
            "RequestClientCert" => ClientAuth::RequestClientCert,
            // The second spelling is the toolkit's, kept for backwards compatibility.
            "RequireAnyClientCert" | "RequireClientCert" => ClientAuth::RequireAnyClientCert,
            "VerifyClientCertIfGiven" => ClientAuth::VerifyClientCertIfGiven,
            "RequireAndVerifyClientCert" => ClientAuth::RequireAndVerifyClientCert,
            other => return Err(invalid!(
                "invalid client_auth_type {other:?} (use NoClientCert, RequestClientCert, RequireAnyClientCert, VerifyClientCertIfGiven or RequireAndVerifyClientCert)"
            )),
        })
    }

    fn verifies(self) -> bool {
        matches!(
            self,
            ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert
        )
    }
}

/// Build the server configuration, reading every file it names now: a missing file, a
/// certificate that does not parse or a key that does not match it is an error here, not
/// a failed handshake later.
pub(crate) fn server_config(
    section: &TlsServerConfig,
    reader: &mut SourceReader,
) -> Result<tokio_rustls::TlsAcceptor, ConfigError> {
    let certs = certificates(section, reader)?;
    let key = PemItem::Key.require(section, reader)?.private_key()?;
    let client_auth = ClientAuth::parse(section.client_auth_type.as_deref())?;
    let roots = client_roots(section, reader)?;
    if roots.is_some() && client_auth == ClientAuth::NoClientCert {
        return Err(invalid!(
            "client CA's have been configured without a Client Auth Policy (client_auth_type)"
        ));
    }
    if client_auth.verifies() && roots.is_none() {
        return Err(invalid!("client_auth_type {client_auth:?} needs client_ca_file (or client_ca) to verify client certificates against"));
    }
    if section.client_allowed_sans.is_some()
        && !matches!(
            client_auth,
            ClientAuth::RequireAnyClientCert | ClientAuth::RequireAndVerifyClientCert
        )
    {
        return Err(invalid!("client_allowed_sans requires client_auth_type to be one of RequireAnyClientCert or RequireAndVerifyClientCert"));
    }
    let provider = Arc::new(crypto_provider(section)?);
    let versions = protocol_versions(section)?;

    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&versions)
        .map_err(|error| invalid!("{error}"))?;
    let check = match client_auth {
        ClientAuth::NoClientCert => None,
        ClientAuth::RequestClientCert | ClientAuth::RequireAnyClientCert => {
            Some(ClientCheck::Any {
                mandatory: client_auth == ClientAuth::RequireAnyClientCert,
                algorithms: provider.signature_verification_algorithms,
            })
        }
        ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert => {
            let roots = Arc::new(roots.expect("checked above"));
            let builder = WebPkiClientVerifier::builder_with_provider(roots, Arc::clone(&provider));
            let builder = if client_auth == ClientAuth::VerifyClientCertIfGiven {
                builder.allow_unauthenticated()
            } else {
                builder
            };
            let verifier = builder
                .build()
                .map_err(|error| invalid!("client CA: {error}"))?;
            Some(ClientCheck::Verified(verifier))
        }
    };
    let builder = match check {
        Some(check) => builder.with_client_cert_verifier(Arc::new(ClientVerifier {
            check,
            allowed_sans: section.client_allowed_sans.clone(),
        })),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|error| match error {
            rustls::Error::InconsistentKeys(_) => {
                invalid!("the private key does not match the certificate ({error})")
            }
            error => invalid!("cannot use the certificate and key: {error}"),
        })?;
    config.ignore_client_order = section.prefer_server_cipher_suites.unwrap_or(true);
    // HTTP/1.1 only: the exporter has no HTTP/2 server (the toolkit's http2 key is accepted
    // and has no effect).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// The PEM items of `tls_server_config`, each given inline or in a file.
#[derive(Debug, Clone, Copy)]
enum PemItem {
    /// The server's certificate chain.
    Cert,
    /// The server's private key.
    Key,
    /// The CAs that client certificates are verified against.
    ClientCa,
}

/// PEM text as read, and where it came from, for messages.
struct Pem {
    text: Vec<u8>,
    origin: String,
}

impl PemItem {
    /// The item's inline key and file key.
    fn keys(self) -> (&'static str, &'static str) {
        match self {
            PemItem::Cert => ("cert", "cert_file"),
            PemItem::Key => ("key", "key_file"),
            PemItem::ClientCa => ("client_ca", "client_ca_file"),
        }
    }

    /// The item inline or from its file (relative to the configuration), not both, as the
    /// toolkit requires; `None` when neither is set.
    fn read(
        self,
        section: &TlsServerConfig,
        reader: &mut SourceReader,
    ) -> Result<Option<Pem>, ConfigError> {
        let (inline_key, file_key) = self.keys();
        let (inline, file) = match self {
            PemItem::Cert => (&section.cert, &section.cert_file),
            PemItem::Key => (&section.key, &section.key_file),
            PemItem::ClientCa => (&section.client_ca, &section.client_ca_file),
        };
        match (inline, file) {
            (Some(_), Some(_)) => Err(invalid!("set {inline_key} or {file_key}, not both")),
            (Some(text), None) => Ok(Some(Pem {
                text: text.as_bytes().to_vec(),
                origin: inline_key.to_string(),
            })),
            (None, Some(path)) => {
                let path = reader.resolve(path);
                let text = reader.read(&path).map_err(|source| ConfigError::Read {
                    what: file_key,
                    path: path.clone(),
                    source,
                })?;
                Ok(Some(Pem {
                    text,
                    origin: format!("{file_key} {}", path.display()),
                }))
            }
            (None, None) => Ok(None),
        }
    }

    /// As [`PemItem::read`], for an item that must be set.
    fn require(
        self,
        section: &TlsServerConfig,
        reader: &mut SourceReader,
    ) -> Result<Pem, ConfigError> {
        let (inline_key, file_key) = self.keys();
        self.read(section, reader)?
            .ok_or_else(|| invalid!("missing one of {inline_key} or {file_key}"))
    }
}

impl Pem {
    /// The certificates in this text: at least one.
    fn certificates(&self) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
        let origin = &self.origin;
        let certs = CertificateDer::pem_slice_iter(&self.text)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| invalid!("{origin}: not a PEM certificate ({error})"))?;
        if certs.is_empty() {
            return Err(invalid!("{origin}: holds no PEM certificate"));
        }
        Ok(certs)
    }

    /// The private key in this text.
    fn private_key(&self) -> Result<PrivateKeyDer<'static>, ConfigError> {
        PrivateKeyDer::from_pem_slice(&self.text)
            .map_err(|error| invalid!("{}: not a PEM private key ({error})", self.origin))
    }
}

/// The server's certificate chain; the first must be a valid end-entity certificate.
fn certificates(
    section: &TlsServerConfig,
    reader: &mut SourceReader,
) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let pem = PemItem::Cert.require(section, reader)?;
    let certs = pem.certificates()?;
    webpki::EndEntityCert::try_from(&certs[0])
        .map_err(|error| invalid!("{}: not a valid X.509 certificate ({error})", pem.origin))?;
    Ok(certs)
}

/// The CAs client certificates are verified against, when there are any.
fn client_roots(
    section: &TlsServerConfig,
    reader: &mut SourceReader,
) -> Result<Option<RootCertStore>, ConfigError> {
    let Some(pem) = PemItem::ClientCa.read(section, reader)? else {
        return Ok(None);
    };
    let mut roots = RootCertStore::empty();
    for cert in pem.certificates()? {
        roots
            .add(cert)
            .map_err(|error| invalid!("{}: not a usable CA certificate ({error})", pem.origin))?;
    }
    Ok(Some(roots))
}

/// TLS 1.2 and 1.3 are all rustls speaks; older versions are refused by name.
fn version(name: &str, key: &str) -> Result<u8, ConfigError> {
    match name {
        "TLS12" => Ok(12),
        "TLS13" => Ok(13),
        "TLS10" | "TLS11" => Err(invalid!(
            "{key} {name} is not supported: only TLS12 and TLS13 are"
        )),
        other => Err(invalid!("invalid {key} {other:?} (use TLS12 or TLS13)")),
    }
}

fn protocol_versions(
    section: &TlsServerConfig,
) -> Result<Vec<&'static SupportedProtocolVersion>, ConfigError> {
    let min = match &section.min_version {
        Some(name) => version(name, "min_version")?,
        None => 12,
    };
    let max = match &section.max_version {
        Some(name) => version(name, "max_version")?,
        None => 13,
    };
    if min > max {
        return Err(invalid!(
            "min_version TLS{min} is above max_version TLS{max}"
        ));
    }
    let mut versions = Vec::new();
    if max >= 13 {
        versions.push(&rustls::version::TLS13);
    }
    if min <= 12 {
        versions.push(&rustls::version::TLS12);
    }
    Ok(versions)
}

/// ring's provider, narrowed to the configured TLS 1.2 cipher suites (Go's names; TLS 1.3
/// suites are not configurable, as in Go) and key-exchange curves.
fn crypto_provider(section: &TlsServerConfig) -> Result<CryptoProvider, ConfigError> {
    let mut crypto = provider::default_provider();
    if let Some(names) = &section.cipher_suites {
        let mut suites: Vec<_> = crypto
            .cipher_suites
            .iter()
            .filter(|suite| suite.version() == &rustls::version::TLS13)
            .copied()
            .collect();
        for name in names {
            // Go also names the ChaCha20 suites without the hash.
            let wanted = match name.as_str() {
                "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305" => {
                    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"
                }
                "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305" => {
                    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"
                }
                other => other,
            };
            let suite = provider::ALL_CIPHER_SUITES
                .iter()
                .find(|suite| {
                    suite.version() == &rustls::version::TLS12
                        && format!("{:?}", suite.suite()) == wanted
                })
                .ok_or_else(|| {
                    invalid!("cipher suite {name:?} is not supported (only the ECDHE AES-GCM and ChaCha20-Poly1305 suites are)")
                })?;
            suites.push(*suite);
        }
        crypto.cipher_suites = suites;
    }
    if let Some(names) = &section.curve_preferences {
        let mut groups = Vec::new();
        for name in names {
            groups.push(match name.as_str() {
                "X25519" => provider::kx_group::X25519,
                "CurveP256" => provider::kx_group::SECP256R1,
                "CurveP384" => provider::kx_group::SECP384R1,
                "CurveP521" => {
                    return Err(invalid!(
                        "curve CurveP521 is not supported (use X25519, CurveP256 or CurveP384)"
                    ))
                }
                other => {
                    return Err(invalid!(
                        "unknown curve {other:?} (use X25519, CurveP256 or CurveP384)"
                    ))
                }
            });
        }
        if groups.is_empty() {
            return Err(invalid!("curve_preferences is empty"));
        }
        crypto.kx_groups = groups;
    }
    Ok(crypto)
}

/// How a client certificate is checked: by the `client_auth_type` policy, then, when
/// `client_allowed_sans` is set, by its subject alternative names.
#[derive(Debug)]
struct ClientVerifier {
    check: ClientCheck,
    /// The names one of which the certificate must carry exactly (DNS names, IP addresses
    /// and URIs; e-mail addresses are not read, so an e-mail entry never matches).
    allowed_sans: Option<Vec<String>>,
}

/// The `client_auth_type` policies that ask for a certificate.
#[derive(Debug)]
enum ClientCheck {
    /// `RequestClientCert` and `RequireAnyClientCert`: any certificate is taken without
    /// checking who issued it, but the client must still prove it holds the certificate's
    /// key.
    Any {
        mandatory: bool,
        algorithms: WebPkiSupportedAlgorithms,
    },
    /// `VerifyClientCertIfGiven` and `RequireAndVerifyClientCert`: rustls's verifier,
    /// against the client CAs.
    Verified(Arc<dyn ClientCertVerifier>),
}

impl ClientVerifier {
    fn has_allowed_san(&self, end_entity: &CertificateDer<'_>) -> bool {
        let Some(allowed) = &self.allowed_sans else {
            return true;
        };
        let Ok(cert) = webpki::EndEntityCert::try_from(end_entity) else {
            return false;
        };
        let mut presented: Vec<&str> = cert.valid_dns_names().collect();
        presented.extend(cert.valid_uri_names());
        allowed.iter().any(|allowed| {
            presented.contains(&allowed.as_str())
                || allowed.parse::<std::net::IpAddr>().is_ok_and(|ip| {
                    cert.verify_is_valid_for_subject_name(&ServerName::IpAddress(ip.into()))
                        .is_ok()
                })
        })
    }
}

impl ClientCertVerifier for ClientVerifier {
    fn offer_client_auth(&self) -> bool {
        match &self.check {
            ClientCheck::Any { .. } => true,
            ClientCheck::Verified(inner) => inner.offer_client_auth(),
        }
    }

    fn client_auth_mandatory(&self) -> bool {
        match &self.check {
            ClientCheck::Any { mandatory, .. } => *mandatory,
            ClientCheck::Verified(inner) => inner.client_auth_mandatory(),
        }
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        match &self.check {
            ClientCheck::Any { .. } => &[],
            ClientCheck::Verified(inner) => inner.root_hint_subjects(),
        }
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = match &self.check {
            ClientCheck::Any { .. } => {
                webpki::EndEntityCert::try_from(end_entity).map_err(|_| {
                    rustls::Error::InvalidCertificate(CertificateError::BadEncoding)
                })?;
                ClientCertVerified::assertion()
            }
            ClientCheck::Verified(inner) => {
                inner.verify_client_cert(end_entity, intermediates, now)?
            }
        };
        if self.has_allowed_san(end_entity) {
            Ok(verified)
        } else {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        match &self.check {
            ClientCheck::Any { algorithms, .. } => {
                rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
            }
            ClientCheck::Verified(inner) => inner.verify_tls12_signature(message, cert, dss),
        }
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        match &self.check {
            ClientCheck::Any { algorithms, .. } => {
                rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
            }
            ClientCheck::Verified(inner) => inner.verify_tls13_signature(message, cert, dss),
        }
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        match &self.check {
            ClientCheck::Any { algorithms, .. } => algorithms.supported_schemes(),
            ClientCheck::Verified(inner) => inner.supported_verify_schemes(),
        }
    }

    fn requires_raw_public_keys(&self) -> bool {
        match &self.check {
            ClientCheck::Any { .. } => false,
            ClientCheck::Verified(inner) => inner.requires_raw_public_keys(),
        }
    }
}
