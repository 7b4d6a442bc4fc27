//! `tls_server_config` as a rustls server configuration (ring provider, HTTP/1.1 only).

use super::error::{invalid, ConfigError};
use super::file::{SourceReader, TlsServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use std::path::Path;
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
    let key = private_key(section, reader)?;
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
    let verifier: Option<Arc<dyn ClientCertVerifier>> = match client_auth {
        ClientAuth::NoClientCert => None,
        ClientAuth::RequestClientCert | ClientAuth::RequireAnyClientCert => {
            Some(Arc::new(AnyClientCert {
                mandatory: client_auth == ClientAuth::RequireAnyClientCert,
                algorithms: provider.signature_verification_algorithms,
            }))
        }
        ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert => {
            let roots = Arc::new(roots.expect("checked above"));
            let builder = WebPkiClientVerifier::builder_with_provider(roots, Arc::clone(&provider));
            let builder = if client_auth == ClientAuth::VerifyClientCertIfGiven {
                builder.allow_unauthenticated()
            } else {
                builder
            };
            Some(
                builder
                    .build()
                    .map_err(|error| invalid!("client CA: {error}"))?,
            )
        }
    };
    let verifier = match (verifier, &section.client_allowed_sans) {
        (Some(inner), Some(allowed)) => Some(Arc::new(AllowedSans {
            inner,
            allowed: allowed.clone(),
        }) as Arc<dyn ClientCertVerifier>),
        (verifier, _) => verifier,
    };
    let builder = match verifier {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
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

/// Inline PEM (`cert`) or a file (`cert_file`), not both, as the toolkit requires.
fn pem_source<'a>(
    inline: Option<&'a String>,
    file: Option<&'a Path>,
    inline_name: &str,
    file_name: &'static str,
    reader: &mut SourceReader,
) -> Result<Option<(Vec<u8>, String)>, ConfigError> {
    match (inline, file) {
        (Some(_), Some(_)) => Err(invalid!("set {inline_name} or {file_name}, not both")),
        (Some(text), None) => Ok(Some((text.as_bytes().to_vec(), inline_name.to_string()))),
        (None, Some(path)) => {
            let path = reader.resolve(path);
            let bytes = reader.read(&path).map_err(|source| ConfigError::Read {
                what: file_name,
                path: path.clone(),
                source,
            })?;
            Ok(Some((bytes, format!("{file_name} {}", path.display()))))
        }
        (None, None) => Ok(None),
    }
}

fn certificates(
    section: &TlsServerConfig,
    reader: &mut SourceReader,
) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let Some((pem, origin)) = pem_source(
        section.cert.as_ref(),
        section.cert_file.as_deref(),
        "cert",
        "cert_file",
        reader,
    )?
    else {
        return Err(invalid!("missing one of cert or cert_file"));
    };
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| invalid!("{origin}: not a PEM certificate ({error})"))?;
    let Some(first) = certs.first() else {
        return Err(invalid!("{origin}: holds no PEM certificate"));
    };
    webpki::EndEntityCert::try_from(first)
        .map_err(|error| invalid!("{origin}: not a valid X.509 certificate ({error})"))?;
    Ok(certs)
}

fn private_key(
    section: &TlsServerConfig,
    reader: &mut SourceReader,
) -> Result<PrivateKeyDer<'static>, ConfigError> {
    let Some((pem, origin)) = pem_source(
        section.key.as_ref(),
        section.key_file.as_deref(),
        "key",
        "key_file",
        reader,
    )?
    else {
        return Err(invalid!("missing one of key or key_file"));
    };
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|error| invalid!("{origin}: not a PEM private key ({error})"))
}

fn client_roots(
    section: &TlsServerConfig,
    reader: &mut SourceReader,
) -> Result<Option<RootCertStore>, ConfigError> {
    let Some((pem, origin)) = pem_source(
        section.client_ca.as_ref(),
        section.client_ca_file.as_deref(),
        "client_ca",
        "client_ca_file",
        reader,
    )?
    else {
        return Ok(None);
    };
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| invalid!("{origin}: not a PEM certificate ({error})"))?;
    if certs.is_empty() {
        return Err(invalid!("{origin}: holds no PEM certificate"));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|error| invalid!("{origin}: not a usable CA certificate ({error})"))?;
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

/// `RequestClientCert` and `RequireAnyClientCert`: any certificate is taken without
/// checking who issued it, but the client must still prove it holds the certificate's key.
#[derive(Debug)]
struct AnyClientCert {
    mandatory: bool,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for AnyClientCert {
    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        webpki::EndEntityCert::try_from(end_entity)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// `client_allowed_sans`: after the inner verifier, the certificate must carry one of the
/// listed subject alternative names exactly (DNS names, IP addresses and URIs; e-mail
/// addresses are not read, so an e-mail entry never matches).
#[derive(Debug)]
struct AllowedSans {
    inner: Arc<dyn ClientCertVerifier>,
    allowed: Vec<String>,
}

impl AllowedSans {
    fn matches(&self, end_entity: &CertificateDer<'_>) -> bool {
        let Ok(cert) = webpki::EndEntityCert::try_from(end_entity) else {
            return false;
        };
        let mut presented: Vec<&str> = cert.valid_dns_names().collect();
        presented.extend(cert.valid_uri_names());
        self.allowed.iter().any(|allowed| {
            presented.contains(&allowed.as_str())
                || allowed.parse::<std::net::IpAddr>().is_ok_and(|ip| {
                    cert.verify_is_valid_for_subject_name(&ServerName::IpAddress(ip.into()))
                        .is_ok()
                })
        })
    }
}

impl ClientCertVerifier for AllowedSans {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        if self.matches(end_entity) {
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
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
