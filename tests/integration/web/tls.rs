//! TLS with real certificates: a verifying client served, the minimum version, an
//! expired certificate or one for another name presented and refused by the client,
//! `client_auth_type` and `client_allowed_sans`, and certificates rotated without a
//! restart.

use super::{
    assert_metrics, raw_exchange, server_params, still_running, tls_get, tls_request,
    write_atomically, Ca, TestClient, TlsRig,
};
use crate::helpers::*;
use rcgen::{CertificateParams, ExtendedKeyUsagePurpose};
use std::fs;
use std::time::Duration;

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
