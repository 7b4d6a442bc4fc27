//! The HTTP side's protections: `--web.config.file` (TLS, client certificates, basic
//! authentication, response headers, reloads) with real certificates made here and a real
//! rustls client, and the limits against bad clients (slow and hostile connections, a
//! hung NVML call).

use crate::helpers::*;
use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};
use serde_json::json;
use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
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

// ---------------------------------------------------------------------------------------
// TLS

#[test]
fn tls_serves_metrics_to_a_verifying_client() {
    let tls = TlsRig::new();
    tls.write_config("", "");
    let exporter = tls.start();
    let (response, presented) = tls_request(
        &tls.client(),
        exporter.address,
        "localhost",
        "/metrics",
        &[],
    )
    .unwrap();
    assert_metrics(&response);
    assert_eq!(presented, tls.server.der, "the configured certificate");
    // The certificate names the IP address too.
    let (response, _) = tls_request(
        &tls.client(),
        exporter.address,
        "127.0.0.1",
        "/-/healthy",
        &[],
    )
    .unwrap();
    assert_eq!(response.status, 200);
    // Plain HTTP on the TLS port gets no HTTP answer.
    let raw = raw_exchange(
        exporter.address,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(
        !String::from_utf8_lossy(&raw).contains("vram_nvml_up"),
        "metrics served over plain HTTP on a TLS port"
    );
    assert!(exporter.log().contains("tls=true"), "{}", exporter.log());
}

#[test]
fn min_version_tls13_refuses_a_tls12_client() {
    let tls = TlsRig::new();
    tls.write_config("  min_version: TLS13\n", "");
    let exporter = tls.start();
    assert_metrics(&tls_get(&tls.client(), &exporter, "/metrics").unwrap());
    let old = TestClient::new(&tls.ca.pem(), None).tls12_only();
    let error = tls_get(&old, &exporter, "/metrics").unwrap_err();
    assert!(error.to_lowercase().contains("version"), "{error}");
}

#[test]
fn expired_server_certificate_is_served_and_rejected_by_a_verifying_client() {
    let tls = TlsRig::new();
    let mut params = server_params(7);
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let expired = tls.ca.issue(params);
    fs::write(tls.rig.dir.path().join("server.crt"), &expired.cert_pem).unwrap();
    fs::write(tls.rig.dir.path().join("server.key"), &expired.key_pem).unwrap();
    tls.write_config("", "");
    // The exporter serves what it is told: it starts, presents the expired certificate
    // and answers over it (to a client that takes any certificate).
    let mut exporter = tls.start();
    let anything = TestClient::accepting_any_certificate();
    let (response, presented) =
        tls_request(&anything, exporter.address, "localhost", "/metrics", &[]).unwrap();
    assert_metrics(&response);
    assert_eq!(
        presented, expired.der,
        "the configured, expired certificate"
    );
    // A verifying client is the one to refuse it, for its date.
    let error = tls_get(&tls.client(), &exporter, "/metrics").unwrap_err();
    assert!(error.to_lowercase().contains("expired"), "{error}");
    // The refused handshake leaves the server serving.
    assert!(still_running(&mut exporter));
    let (response, _) =
        tls_request(&anything, exporter.address, "localhost", "/metrics", &[]).unwrap();
    assert_metrics(&response);
}

#[test]
fn certificate_for_another_name_is_rejected_by_a_verifying_client() {
    let tls = TlsRig::new();
    let mut params = CertificateParams::new(vec!["other.example".to_string()]).unwrap();
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let other = tls.ca.issue(params);
    fs::write(tls.rig.dir.path().join("server.crt"), &other.cert_pem).unwrap();
    fs::write(tls.rig.dir.path().join("server.key"), &other.key_pem).unwrap();
    tls.write_config("", "");
    let mut exporter = tls.start();
    // The server presents the certificate it was given, whatever name it carries.
    let (response, presented) = tls_request(
        &TestClient::accepting_any_certificate(),
        exporter.address,
        "localhost",
        "/metrics",
        &[],
    )
    .unwrap();
    assert_metrics(&response);
    assert_eq!(presented, other.der, "the configured certificate");
    // A verifying client that asks for localhost refuses it for its name...
    let error = tls_get(&tls.client(), &exporter, "/metrics").unwrap_err();
    assert!(error.contains("not valid for name"), "{error}");
    // ...and the same client asking for the name it carries takes it: the name alone
    // made the difference. The refusal left the server serving.
    let (response, _) = tls_request(
        &tls.client(),
        exporter.address,
        "other.example",
        "/metrics",
        &[],
    )
    .unwrap();
    assert_metrics(&response);
    assert!(still_running(&mut exporter));
}

#[test]
fn client_certificates_follow_client_auth_type() {
    let tls = TlsRig::new();
    let good = tls.ca.client("good");
    let stranger_ca = Ca::new("another CA");
    let stranger = stranger_ca.client("stranger");
    // (client_auth_type, no certificate, good certificate, certificate of another CA)
    let cases = [
        ("RequireAndVerifyClientCert", false, true, false),
        ("VerifyClientCertIfGiven", true, true, false),
        ("RequireAnyClientCert", false, true, true),
        ("NoClientCert", true, true, true),
    ];
    for (mode, anonymous, verified, foreign) in cases {
        let ca_line = if mode == "NoClientCert" || mode == "RequireAnyClientCert" {
            String::new()
        } else {
            "  client_ca_file: ca.crt\n".to_string()
        };
        tls.write_config(&format!("  client_auth_type: {mode}\n{ca_line}"), "");
        let exporter = tls.start();
        for (who, client, accepted) in [
            ("no certificate", tls.client(), anonymous),
            ("the CA's client", tls.client_with(&good), verified),
            ("another CA's client", tls.client_with(&stranger), foreign),
        ] {
            let result = tls_get(&client, &exporter, "/metrics");
            match (accepted, result) {
                (true, Ok(response)) => assert_metrics(&response),
                // Refused by the handshake, not by a server that is gone.
                (false, Err(error)) => assert!(
                    error.contains("received fatal alert"),
                    "{mode}: {who} not refused by TLS: {error}"
                ),
                (true, Err(error)) => panic!("{mode}: {who} refused: {error}"),
                (false, Ok(response)) => {
                    panic!("{mode}: {who} served: {}", response.status)
                }
            }
        }
    }
}

#[test]
fn client_allowed_sans_admit_only_listed_clients() {
    let tls = TlsRig::new();
    let listed = tls.ca.client("listed");
    let other = tls.ca.client("other");
    tls.write_config(
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n  client_allowed_sans:\n    - listed.clients.test\n",
        "",
    );
    let exporter = tls.start();
    assert_metrics(&tls_get(&tls.client_with(&listed), &exporter, "/metrics").unwrap());
    let refused = tls_get(&tls.client_with(&other), &exporter, "/metrics").unwrap_err();
    assert!(
        refused.contains("received fatal alert"),
        "not refused by TLS: {refused}"
    );
    // The listed client is still served after the refusal.
    assert_metrics(&tls_get(&tls.client_with(&listed), &exporter, "/metrics").unwrap());
}

#[test]
fn certificate_rotation_needs_no_restart() {
    let tls = TlsRig::new();
    tls.write_config("", "");
    let mut exporter = tls.start();
    let address = exporter.address;
    let (_, presented) = tls_request(&tls.client(), address, "localhost", "/-/ready", &[]).unwrap();
    assert_eq!(presented, tls.server.der);

    // A new certificate and key replace the old ones.
    let renewed = tls.ca.server(2);
    let dir = tls.rig.dir.path();
    write_atomically(&dir.join("server.key"), &renewed.key_pem);
    write_atomically(&dir.join("server.crt"), &renewed.cert_pem);
    let (response, presented) =
        tls_request(&tls.client(), address, "localhost", "/metrics", &[]).unwrap();
    assert_metrics(&response);
    assert_eq!(
        presented, renewed.der,
        "the next connection gets the new certificate"
    );

    // A broken certificate is refused; the last good one goes on being served.
    write_atomically(
        &dir.join("server.crt"),
        "-----BEGIN CERTIFICATE-----\ngarbage\n",
    );
    let (response, presented) =
        tls_request(&tls.client(), address, "localhost", "/metrics", &[]).unwrap();
    assert_metrics(&response);
    assert_eq!(presented, renewed.der);
    wait_until(
        "the failed reload is logged",
        Duration::from_secs(10),
        || exporter.log().contains("cannot reload the web config"),
    );
    // Once, not once per connection.
    tls_request(&tls.client(), address, "localhost", "/-/ready", &[]).unwrap();
    assert_eq!(
        exporter
            .log()
            .matches("cannot reload the web config")
            .count(),
        1,
        "{}",
        exporter.log()
    );

    // Fixed again: a third certificate, same listener, same process.
    let third = tls.ca.server(3);
    write_atomically(&dir.join("server.key"), &third.key_pem);
    write_atomically(&dir.join("server.crt"), &third.cert_pem);
    let (_, presented) = tls_request(&tls.client(), address, "localhost", "/-/ready", &[]).unwrap();
    assert_eq!(presented, third.der);
    assert!(still_running(&mut exporter));
    assert_eq!(
        exporter.log().matches("msg=listening").count(),
        1,
        "the listener never restarted:\n{}",
        exporter.log()
    );
}

// ---------------------------------------------------------------------------------------
// Basic authentication and headers

fn basic(user: &str, password: &str) -> String {
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Authorization: Basic {encoded}")
}

#[test]
fn basic_auth_admits_only_the_right_password() {
    let rig = Rig::new();
    // Cost 4 keeps the test quick; the exporter treats every cost the same.
    let hash = bcrypt::hash("s3cret", 4).unwrap();
    let config = rig.dir.path().join("web.yml");
    fs::write(
        &config,
        format!(
            "basic_auth_users:\n  alice: {hash}\nhttp_server_config:\n  headers:\n    X-Frame-Options: deny\n    X-Content-Type-Options: nosniff\n"
        ),
    )
    .unwrap();
    let exporter = rig.start(&["--web.config.file", config.to_str().unwrap()]);

    let good = basic("alice", "s3cret");
    let response = exporter.request("GET", "/metrics", &[&good]);
    assert_metrics(&response);
    assert_eq!(response.header("x-frame-options"), Some("deny"));
    assert_eq!(response.header("x-content-type-options"), Some("nosniff"));
    // Again: served from the cache of verified credentials, same answer.
    assert_metrics(&exporter.request("GET", "/metrics", &[&good]));

    let refusals = [
        ("wrong password", vec![basic("alice", "guess")]),
        ("no credentials", vec![]),
        ("unknown user", vec![basic("mallory", "s3cret")]),
        (
            "another scheme",
            vec!["Authorization: Bearer s3cret".to_string()],
        ),
        ("not base64", vec!["Authorization: Basic %%%".to_string()]),
    ];
    for (what, headers) in refusals {
        let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
        for path in ["/metrics", "/", "/-/healthy"] {
            let response = exporter.request("GET", path, &headers);
            assert_eq!(response.status, 401, "{what} on {path}");
            assert!(
                response
                    .header("www-authenticate")
                    .is_some_and(|value| value.starts_with("Basic")),
                "{what}: {:?}",
                response.headers
            );
            assert!(!response.body.contains("vram_"), "{what}");
            assert_eq!(response.header("x-frame-options"), Some("deny"));
        }
    }

    // A new password takes effect without a restart; the old one stops working at once,
    // although it was remembered as verified.
    let new_hash = bcrypt::hash("n3w", 4).unwrap();
    let renamed = rig.dir.path().join("web.yml.new");
    fs::write(
        &renamed,
        format!("basic_auth_users:\n  alice: {new_hash}\n"),
    )
    .unwrap();
    fs::rename(&renamed, &config).unwrap();
    assert_eq!(exporter.request("GET", "/metrics", &[&good]).status, 401);
    assert_metrics(&exporter.request("GET", "/metrics", &[&basic("alice", "n3w")]));
}

#[test]
fn rate_limit_answers_429_beyond_the_burst() {
    let rig = Rig::new();
    let config = rig.dir.path().join("web.yml");
    fs::write(&config, "rate_limit:\n  interval: 1h\n  burst: 3\n").unwrap();
    let exporter = rig.start(&["--web.config.file", config.to_str().unwrap()]);
    for _ in 0..3 {
        assert_eq!(exporter.get("/-/healthy").status, 200);
    }
    assert_eq!(exporter.get("/-/healthy").status, 429);
    assert_eq!(exporter.get("/metrics").status, 429);
}

#[test]
fn basic_auth_over_tls() {
    let tls = TlsRig::new();
    let hash = bcrypt::hash("s3cret", 4).unwrap();
    tls.write_config("", &format!("basic_auth_users:\n  prometheus: {hash}\n"));
    let exporter = tls.start();
    let good = basic("prometheus", "s3cret");
    let (response, _) = tls_request(
        &tls.client(),
        exporter.address,
        "localhost",
        "/metrics",
        &[&good],
    )
    .unwrap();
    assert_metrics(&response);
    let response = tls_get(&tls.client(), &exporter, "/metrics").unwrap();
    assert_eq!(response.status, 401);
}

// ---------------------------------------------------------------------------------------
// Start-up errors

#[test]
fn malformed_web_configs_stop_start_up_with_one_clear_line() {
    let tls = TlsRig::new();
    let dir = tls.rig.dir.path();
    let other_key = KeyPair::generate().unwrap().serialize_pem();
    fs::write(dir.join("other.key"), other_key).unwrap();
    let good_hash = bcrypt::hash("x", 4).unwrap();
    let cases: Vec<(&str, String, &str)> = vec![
        ("bad YAML", "tls_server_config: [cert_file: a\n".into(), "web config file"),
        (
            "unknown field",
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  certfile: x\n".into(),
            "unknown field `certfile`",
        ),
        (
            "missing key file",
            "tls_server_config:\n  cert_file: server.crt\n  key_file: missing.key\n".into(),
            "cannot read key_file",
        ),
        (
            "bad bcrypt hash",
            "basic_auth_users:\n  alice: not-a-hash\n".into(),
            "not a bcrypt hash",
        ),
        (
            "bad min_version",
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS14\n".into(),
            "invalid min_version",
        ),
        (
            "TLS 1.0",
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS10\n".into(),
            "only TLS12 and TLS13",
        ),
        (
            "key not matching the certificate",
            "tls_server_config:\n  cert_file: server.crt\n  key_file: other.key\n".into(),
            "does not match the certificate",
        ),
        (
            "header the toolkit refuses",
            format!("basic_auth_users:\n  a: {good_hash}\nhttp_server_config:\n  headers:\n    Server: x\n"),
            "can not be configured",
        ),
        (
            "bad header value",
            "http_server_config:\n  headers:\n    X-Frame-Options: allow-all\n".into(),
            "invalid value for X-Frame-Options",
        ),
        (
            "client CA without client_auth_type",
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_ca_file: ca.crt\n".into(),
            "without a Client Auth Policy",
        ),
        (
            "unknown client_auth_type",
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: Maybe\n".into(),
            "invalid client_auth_type",
        ),
        ("empty file", String::new(), "holds no settings"),
    ];
    for (what, text, expected) in cases {
        let config = dir.join("broken.yml");
        fs::write(&config, text).unwrap();
        let outcome = tls.rig.run(&[
            "--web.listen-address",
            "127.0.0.1:0",
            "--web.config.file",
            config.to_str().unwrap(),
        ]);
        assert_eq!(outcome.status, Some(2), "{what}: {outcome:?}");
        let lines: Vec<&str> = outcome
            .stderr
            .lines()
            .filter(|line| !line.is_empty())
            .collect();
        assert_eq!(lines.len(), 1, "{what}: one line, got {:?}", outcome.stderr);
        assert!(
            lines[0].starts_with("vram-exporter: ") && lines[0].contains(expected),
            "{what}: expected {expected:?} in {:?}",
            lines[0]
        );
    }
    let outcome = tls.rig.run(&[
        "--web.listen-address",
        "127.0.0.1:0",
        "--web.config.file",
        dir.join("nowhere.yml").to_str().unwrap(),
    ]);
    assert_eq!(outcome.status, Some(2));
    assert!(
        outcome.stderr.contains("cannot read web config file"),
        "{}",
        outcome.stderr
    );
}

// ---------------------------------------------------------------------------------------
// Bad clients

#[test]
fn slow_clients_do_not_stop_a_scrape() {
    const SLOW: usize = 100;
    const MAX_CONNECTIONS: usize = 64;
    const SCRAPES: usize = 5;
    let rig = Rig::new();
    let exporter = rig.start(&["--web.max-connections", &MAX_CONNECTIONS.to_string()]);
    let address = exporter.address;
    let mut slow: Vec<TcpStream> = (0..SLOW)
        .map(|_| {
            let stream = TcpStream::connect(address).expect("connect");
            stream
                .set_write_timeout(Some(Duration::from_secs(1)))
                .unwrap();
            stream
        })
        .collect();
    // Each sends its request headers one byte at a time (slowloris).
    let request = b"GET /metrics HTTP/1.1\r\nHost: slow\r\nUser-Agent: slowloris\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
    let stop = Arc::new(AtomicBool::new(false));
    let dripping = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            // One byte per stream every 50 ms: the whole request takes about 5 s, and
            // never ends its headers.
            let mut position = 0;
            while !stop.load(Ordering::SeqCst) && position < request.len() {
                for stream in &mut slow {
                    let _ = stream.write_all(&request[position..=position]);
                }
                position += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            slow
        })
    };
    wait_until(
        "the slow connections fill every slot",
        Duration::from_secs(20),
        || exporter.log().contains("connection limit reached"),
    );
    for _ in 0..SCRAPES {
        assert_metrics(&exporter.get("/metrics"));
    }
    stop.store(true, Ordering::SeqCst);
    let slow = dripping.join().unwrap();
    // Counted, not timed: the scrapes were served by closing the oldest slow connection
    // to make room, not by waiting for slow clients to hit their 10 s header deadline,
    // which would have closed them all (they connected together). So the exporter still
    // holds as many as it has slots, less at most one per scrape.
    let open = slow.iter().filter(|stream| still_open(stream)).count();
    assert!(
        (MAX_CONNECTIONS - SCRAPES..=MAX_CONNECTIONS).contains(&open),
        "{open} of {SLOW} slow connections are still open after {SCRAPES} scrapes with {MAX_CONNECTIONS} slots"
    );
}

/// Whether the other end has neither closed nor reset `stream` (nothing to read yet).
fn still_open(stream: &TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    matches!(stream.peek(&mut byte), Err(error) if error.kind() == std::io::ErrorKind::WouldBlock)
}

/// Requests a hostile or broken client might send, each with what it must get: a status,
/// or `None` when closing the connection (with or without an error status) is fine.
fn hostile_requests() -> Vec<(&'static str, Vec<u8>, Option<u16>)> {
    let huge_header = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let many_headers = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\n{}\r\n",
        (0..200)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect::<String>()
    );
    let huge_url = format!(
        "GET /{} HTTP/1.1\r\nHost: x\r\n\r\n",
        "a".repeat(100 * 1024)
    );
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    vec![
        ("oversized header", huge_header.into_bytes(), Some(431)),
        ("too many headers", many_headers.into_bytes(), Some(431)),
        ("huge URL", huge_url.into_bytes(), None),
        ("garbage bytes", garbage, None),
        (
            "HTTP/2 preface",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04\x00\x00\x00\x00\x00".to_vec(),
            None,
        ),
        (
            "path traversal",
            b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            Some(404),
        ),
        (
            "encoded traversal",
            b"GET /%2e%2e/%2e%2e/etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            Some(404),
        ),
        (
            "metrics traversal",
            b"GET /metrics/../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            Some(404),
        ),
        (
            "unknown method",
            b"BREW /metrics HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            Some(405),
        ),
        (
            "POST with a body",
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello".to_vec(),
            Some(405),
        ),
        (
            "GET with a body",
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nxxxx".to_vec(),
            Some(413),
        ),
        (
            "chunked GET",
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffff\r\n"
                .to_vec(),
            Some(413),
        ),
        (
            "bad content length",
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n".to_vec(),
            Some(400),
        ),
        (
            "NUL in a header",
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n".to_vec(),
            Some(400),
        ),
        ("bare newlines", b"\r\n\r\n\r\n\r\n".to_vec(), None),
        ("HTTP/0.9", b"GET /metrics\r\n\r\n".to_vec(), None),
        (
            "CONNECT",
            b"CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            Some(405),
        ),
        (
            "OPTIONS *",
            b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            Some(405),
        ),
        (
            "unicode path",
            "GET /m\u{e9}trics HTTP/1.1\r\nHost: x\r\n\r\n"
                .as_bytes()
                .to_vec(),
            None,
        ),
        ("truncated request", b"GET /metr".to_vec(), None),
    ]
}

#[test]
fn hostile_requests_leave_the_exporter_serving() {
    const REQUESTS: usize = 1000;
    const THREADS: usize = 8;
    let rig = Rig::new();
    let mut exporter = rig.start(&[]);
    let address = exporter.address;
    let kinds = Arc::new(hostile_requests());
    let workers: Vec<_> = (0..THREADS)
        .map(|worker| {
            let kinds = Arc::clone(&kinds);
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                for index in (worker..REQUESTS).step_by(THREADS) {
                    let (what, bytes, expected) = &kinds[index % kinds.len()];
                    let raw = raw_exchange(address, bytes, Duration::from_secs(15));
                    let text = String::from_utf8_lossy(&raw);
                    if text.contains("root:") {
                        failures.push(format!("{what}: leaked a file"));
                    }
                    if let Some(status) = expected {
                        let got = parse_response(&raw).map(|response| response.status);
                        if got != Some(*status) {
                            failures.push(format!("{what}: expected {status}, got {got:?}"));
                        }
                    }
                }
                failures
            })
        })
        .collect();
    // Correct metrics all along, not only at the end.
    for _ in 0..5 {
        assert_metrics(&exporter.get("/metrics"));
    }
    let mut failures = Vec::new();
    for worker in workers {
        failures.extend(worker.join().unwrap());
    }
    failures.sort();
    failures.dedup();
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(still_running(&mut exporter), "the exporter died");
    assert_metrics(&exporter.get("/metrics"));
    assert_eq!(exporter.get("/-/healthy").status, 200);
}

// ---------------------------------------------------------------------------------------
// A hung NVML call

const MEMORY_CALL: &str = "nvmlDeviceGetMemoryInfo_v2";

fn memory_calls(log: &Path) -> usize {
    fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|line| *line == MEMORY_CALL)
        .count()
}

#[test]
fn hung_nvml_call_is_answered_at_once_not_stacked_and_the_exporter_recovers() {
    const HANG_MS: u64 = 6000;
    let rig = Rig::new();
    let calls = rig.dir.path().join("calls.log");
    let mut command = rig.command();
    command.env("FAKE_NVML_CALL_LOG", &calls).args([
        "--web.listen-address",
        "127.0.0.1:0",
        "--web.collection-timeout",
        "500ms",
    ]);
    let exporter = start(command);
    assert_metrics(&exporter.get("/metrics"));

    // NVML's memory call starts hanging.
    let mut gpu = Gpu::idle(0);
    gpu.0["delays_ms"][MEMORY_CALL] = json!(HANG_MS);
    rig.write_scenario(&Gpus::new().gpu(gpu).into_json());
    let before = memory_calls(&calls);
    let not_answering = |response: &Response| {
        assert_eq!(response.status, 200, "{}", response.body);
        let metrics = Metrics::parse(&response.body);
        metrics.value("vram_gpu_error", &[("gpu", "0"), ("error", "timeout")]) == 1.0
    };
    // The scrape waits for the GPU for its share of the wait, then answers without it,
    // saying it does not answer.
    assert!(not_answering(&exporter.get("/metrics")));
    // Later scrapes do not ask it again while the call hangs: still one NVML memory call,
    // made while the stuck call had not yet returned (it would be reported answering).
    for _ in 0..3 {
        assert!(not_answering(&exporter.get("/metrics")));
    }
    assert_eq!(memory_calls(&calls) - before, 1, "one call in flight");
    // Health does not depend on NVML.
    assert_eq!(exporter.get("/-/healthy").status, 200);

    // NVML stops hanging: once the stuck call returns, the GPU is read again.
    rig.write_scenario(&Gpus::new().gpu(Gpu::idle(0)).into_json());
    wait_until("the GPU answers again", Duration::from_secs(20), || {
        !not_answering(&exporter.get("/metrics"))
    });
    assert_metrics(&exporter.get("/metrics"));
    let log = exporter.log();
    assert_eq!(
        log.matches("GPU does not answer NVML").count(),
        1,
        "logged once:\n{log}"
    );
}
