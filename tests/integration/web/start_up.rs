//! Malformed web configs: each stops start-up with one clear line.

use super::TlsRig;
use rcgen::KeyPair;
use std::fs;

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
