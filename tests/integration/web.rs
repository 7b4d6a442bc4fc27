//! The HTTP side's protections: `--web.config.file` (TLS, client certificates, basic
//! authentication, response headers, reloads) with real certificates made here and a real
//! rustls client, and the limits against bad clients (slow and hostile connections, a
//! hung NVML call).
//!
//! This module makes the certificates and the verifying client the tests share; the
//! tests are in `tls.rs` (certificates, client certificates, rotation), `auth.rs` (basic
//! authentication, headers, the rate limit), `start_up.rs` (malformed web configs) and
//! `bad_clients.rs` (slow and hostile clients, a hung NVML call).

mod auth;
mod bad_clients;
mod start_up;
mod tls;

use crate::helpers::*;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};
use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_rustls::rustls;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_rustls::rustls::{DigitallySignedStruct, SignatureScheme};

// ---------------------------------------------------------------------------------------
// Certificates

/// A certificate authority made for one test.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A certificate and its key, in PEM.
struct Issued {
    cert_pem: String,
    key_pem: String,
    der: Vec<u8>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    fn pem(&self) -> String {
        self.cert.pem()
    }

    fn issue(&self, mut params: CertificateParams) -> Issued {
        let key = KeyPair::generate().unwrap();
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }

    /// A server certificate for 127.0.0.1 and localhost.
    fn server(&self, serial: u64) -> Issued {
        self.issue(server_params(serial))
    }

    /// A client certificate.
    fn client(&self, name: &str) -> Issued {
        let mut params = CertificateParams::new(vec![format!("{name}.clients.test")]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params)
    }
}

fn server_params(serial: u64) -> CertificateParams {
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params
        .subject_alt_names
        .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
    params.distinguished_name.push(
        DnType::CommonName,
        format!("vram-exporter test server {serial}"),
    );
    params.serial_number = Some(SerialNumber::from(serial));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params
}

/// Write `text` to `path` atomically, as a deployment tool would.
fn write_atomically(path: &Path, text: &str) {
    let temporary = path.with_extension("tmp");
    fs::write(&temporary, text).unwrap();
    fs::rename(&temporary, path).unwrap();
}

/// A rig with a CA, a server certificate and a web config file in its folder.
struct TlsRig {
    rig: Rig,
    ca: Ca,
    server: Issued,
    config: PathBuf,
}

impl TlsRig {
    fn new() -> TlsRig {
        let rig = Rig::new();
        let ca = Ca::new("vram-exporter test CA");
        let server = ca.server(1);
        let dir = rig.dir.path();
        fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
        fs::write(dir.join("server.crt"), &server.cert_pem).unwrap();
        fs::write(dir.join("server.key"), &server.key_pem).unwrap();
        TlsRig {
            config: dir.join("web.yml"),
            rig,
            ca,
            server,
        }
    }

    /// Write the web config: `tls_server_config` with the server certificate (paths
    /// relative to the file, as the toolkit resolves them) plus `extra` lines.
    fn write_config(&self, tls_extra: &str, rest: &str) {
        let text = format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n{tls_extra}{rest}"
        );
        write_atomically(&self.config, &text);
    }

    fn start(&self) -> Exporter {
        self.rig
            .start(&["--web.config.file", self.config.to_str().unwrap()])
    }

    fn client(&self) -> TestClient {
        TestClient::new(&self.ca.pem(), None)
    }

    fn client_with(&self, identity: &Issued) -> TestClient {
        TestClient::new(
            &self.ca.pem(),
            Some(ClientCertificate {
                cert_pem: identity.cert_pem.clone(),
                key_pem: identity.key_pem.clone(),
            }),
        )
    }
}

fn assert_metrics(response: &Response) {
    assert_eq!(response.status, 200, "{}", response.body);
    let metrics = Metrics::parse(&response.body);
    assert_eq!(metrics.value("vram_nvml_up", &[]), 1.0);
    assert_eq!(
        metrics.value("vram_total_bytes", &[("gpu", "0")]),
        TOTAL as f64
    );
}

fn tls_get(client: &TestClient, exporter: &Exporter, path: &str) -> Result<Response, String> {
    tls_request(client, exporter.address, "localhost", path, &[]).map(|(response, _)| response)
}

/// One HTTPS request; the response and the certificate the server presented.
fn tls_request(
    client: &TestClient,
    address: SocketAddr,
    server_name: &str,
    path: &str,
    headers: &[&str],
) -> Result<(Response, Vec<u8>), String> {
    let request = request_head("GET", path, server_name, headers);
    let (raw, presented) = client.exchange(address, server_name, request.as_bytes())?;
    let response = parse_response(&raw).ok_or_else(|| "no HTTP response".to_string())?;
    Ok((response, presented))
}

/// Send raw bytes, close our side, and read what comes back within `timeout`.
fn raw_exchange(address: SocketAddr, bytes: &[u8], timeout: Duration) -> Vec<u8> {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(timeout)).unwrap();
    stream.set_write_timeout(Some(timeout)).unwrap();
    // The server may answer and close before reading everything (431, 413): fine.
    let _ = stream.write_all(bytes);
    let _ = stream.shutdown(Shutdown::Write);
    let mut raw = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(read) => raw.extend_from_slice(&chunk[..read]),
            Err(error) if error.kind() == ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    raw
}

fn still_running(exporter: &mut Exporter) -> bool {
    exporter.child.try_wait().unwrap().is_none()
}

// ---------------------------------------------------------------------------------------
// A verifying TLS client (rustls, blocking)

/// A client certificate and its key, in PEM.
struct ClientCertificate {
    cert_pem: String,
    key_pem: String,
}

/// A TLS client that trusts one CA, optionally with a client certificate.
struct TestClient {
    ca_pem: String,
    identity: Option<ClientCertificate>,
    config: Arc<rustls::ClientConfig>,
}

impl TestClient {
    fn new(ca_pem: &str, identity: Option<ClientCertificate>) -> TestClient {
        let config = Self::config(ca_pem, identity.as_ref(), rustls::DEFAULT_VERSIONS);
        TestClient {
            ca_pem: ca_pem.to_string(),
            identity,
            config,
        }
    }

    /// A client that takes whatever certificate the server presents (still checking the
    /// handshake's signature against it, so the server holds its key): it sees what the
    /// server serves, where a verifying client would refuse it.
    fn accepting_any_certificate() -> TestClient {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(rustls::DEFAULT_VERSIONS)
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
            .with_no_client_auth();
        TestClient {
            ca_pem: String::new(),
            identity: None,
            config: Arc::new(config),
        }
    }

    /// The same client, speaking TLS 1.2 only.
    fn tls12_only(self) -> TestClient {
        let config = Self::config(
            &self.ca_pem,
            self.identity.as_ref(),
            &[&rustls::version::TLS12],
        );
        TestClient { config, ..self }
    }

    fn config(
        ca_pem: &str,
        identity: Option<&ClientCertificate>,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots);
        let config = match identity {
            Some(identity) => builder
                .with_client_auth_cert(
                    CertificateDer::pem_slice_iter(identity.cert_pem.as_bytes())
                        .collect::<Result<Vec<_>, _>>()
                        .unwrap(),
                    PrivateKeyDer::from_pem_slice(identity.key_pem.as_bytes()).unwrap(),
                )
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        Arc::new(config)
    }

    /// Connect, handshake (verifying the server for `server_name`), send `request` and
    /// read until the server closes. The raw response and the certificate presented.
    fn exchange(
        &self,
        address: SocketAddr,
        server_name: &str,
        request: &[u8],
    ) -> Result<(Vec<u8>, Vec<u8>), String> {
        let mut tcp = TcpStream::connect(address).map_err(|error| error.to_string())?;
        tcp.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        tcp.set_write_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        let name =
            ServerName::try_from(server_name.to_string()).map_err(|error| error.to_string())?;
        let mut connection = rustls::ClientConnection::new(Arc::clone(&self.config), name)
            .map_err(|error| error.to_string())?;
        while connection.is_handshaking() {
            connection
                .complete_io(&mut tcp)
                .map_err(|error| format!("handshake: {error}"))?;
        }
        let presented = connection
            .peer_certificates()
            .and_then(|certs| certs.first())
            .map(|cert| cert.to_vec())
            .unwrap_or_default();
        let mut stream = rustls::Stream::new(&mut connection, &mut tcp);
        stream
            .write_all(request)
            .map_err(|error| format!("write: {error}"))?;
        let mut raw = Vec::new();
        match stream.read_to_end(&mut raw) {
            Ok(_) => {}
            // A peer that closes without close_notify after a full response is fine here.
            Err(error) if error.kind() == ErrorKind::UnexpectedEof && !raw.is_empty() => {}
            Err(error) => return Err(format!("read: {error}")),
        }
        if raw.is_empty() {
            return Err("the server closed the connection without a response".into());
        }
        Ok((raw, presented))
    }
}

/// Takes any server certificate; see [`TestClient::accepting_any_certificate`].
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            signature,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            signature,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
