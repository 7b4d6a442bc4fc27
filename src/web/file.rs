//! The shape of the `--web.config.file` (the Prometheus exporter-toolkit format) as it is
//! written, and the reading of the files it names. Turning it into settings is
//! `config.rs`'s and `tls.rs`'s business; both read from here, never from each other.

use super::settings::{Sources, Stamp};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileConfig {
    #[serde(default)]
    pub tls_server_config: Option<TlsServerConfig>,
    #[serde(default)]
    pub http_server_config: Option<HttpServerConfig>,
    #[serde(default)]
    pub basic_auth_users: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub rate_limit: Option<RateLimitConfig>,
}

/// `tls_server_config`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TlsServerConfig {
    pub cert: Option<String>,
    pub key: Option<String>,
    pub client_ca: Option<String>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub client_auth_type: Option<String>,
    pub client_ca_file: Option<PathBuf>,
    pub client_allowed_sans: Option<Vec<String>>,
    pub min_version: Option<String>,
    pub max_version: Option<String>,
    pub cipher_suites: Option<Vec<String>>,
    pub prefer_server_cipher_suites: Option<bool>,
    pub curve_preferences: Option<Vec<String>>,
}

impl TlsServerConfig {
    /// As the toolkit's `IsEnabled`: any certificate, key or client-auth setting turns TLS
    /// on; a section with only version or cipher settings does not.
    pub fn is_enabled(&self) -> bool {
        self.cert.is_some()
            || self.cert_file.is_some()
            || self.key.is_some()
            || self.key_file.is_some()
            || self.client_ca.is_some()
            || self.client_ca_file.is_some()
            || self.client_auth_type.is_some()
    }
}

/// `http_server_config`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HttpServerConfig {
    /// Accepted for compatibility; the exporter speaks HTTP/1.1 only.
    #[allow(dead_code)]
    pub http2: Option<bool>,
    pub headers: Option<BTreeMap<String, String>>,
}

/// `rate_limit`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RateLimitConfig {
    pub interval: Option<GoDuration>,
    pub burst: Option<u32>,
}

/// A Go `time.Duration` in YAML: a string such as `1s`, or an integer of nanoseconds.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum GoDuration {
    Nanoseconds(u64),
    Text(String),
}

/// Reads the files a configuration names, relative to the configuration's folder, and
/// remembers what each looked like when read, so a later change can be noticed.
pub(crate) struct SourceReader {
    dir: PathBuf,
    pub sources: Sources,
}

impl SourceReader {
    /// A reader for the files named by the configuration at `config`.
    pub fn new(config: &Path) -> SourceReader {
        SourceReader {
            dir: config
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from(".")),
            sources: Vec::new(),
        }
    }

    /// `path` relative to the configuration file's folder, as the toolkit resolves it.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.dir.join(path)
        }
    }

    /// Read `path`, stamping it first: a change between the stamp and the read only
    /// causes one reload too many, never a missed one.
    pub fn read(&mut self, path: &Path) -> std::io::Result<Vec<u8>> {
        let stamp = Stamp::of(path);
        self.sources.push((path.to_path_buf(), stamp));
        std::fs::read(path)
    }
}
