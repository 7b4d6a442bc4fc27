//! Basic authentication (with and without TLS), the configured response headers and the
//! rate limit.

use super::{assert_metrics, tls_get, tls_request, TlsRig};
use crate::helpers::*;
use base64::Engine;
use std::fs;

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
