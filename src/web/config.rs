//! The file of `--web.config.file`, in the Prometheus exporter-toolkit format: parsed
//! strictly (an unknown or misspelt key is an error, as the toolkit's `UnmarshalStrict`),
//! validated, and turned into [`WebSettings`].

use super::auth::Users;
use super::tls;
use super::{RateLimiter, Stamp, WebSettings};
use anyhow::{anyhow, bail, Context};
use hyper::header::{HeaderName, HeaderValue};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    fn is_enabled(&self) -> bool {
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

/// Response headers the toolkit lets a web config set, with the values it allows (none
/// listed: any value).
const EXTRA_HEADERS: [(&str, &[&str]); 5] = [
    ("Strict-Transport-Security", &[]),
    ("X-Content-Type-Options", &["nosniff"]),
    ("X-Frame-Options", &["deny", "sameorigin"]),
    ("X-XSS-Protection", &[]),
    ("Content-Security-Policy", &[]),
];

/// Reads the files a configuration names, relative to the configuration's folder, and
/// remembers what each looked like when read, so a later change can be noticed.
pub(crate) struct SourceReader {
    dir: PathBuf,
    pub sources: Vec<(PathBuf, Option<Stamp>)>,
}

impl SourceReader {
    fn new(config: &Path) -> SourceReader {
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

/// Load and validate the web configuration at `path`: everything it names is read and
/// checked now, so a mistake is reported at start-up (or a broken reload is refused).
/// Also returns the files read, as they were, successful or not.
pub(crate) fn load(path: &Path) -> (anyhow::Result<WebSettings>, Vec<(PathBuf, Option<Stamp>)>) {
    let mut reader = SourceReader::new(path);
    let result = reader
        .read(path)
        .with_context(|| format!("cannot read web config file {}", path.display()))
        .and_then(|text| {
            parse(&text, &mut reader).with_context(|| format!("web config file {}", path.display()))
        });
    let sources = reader.sources.clone();
    let result = result.map(|settings| WebSettings {
        sources: reader.sources,
        ..settings
    });
    (result, sources)
}

fn parse(text: &[u8], reader: &mut SourceReader) -> anyhow::Result<WebSettings> {
    // An empty file (or one of comments only) is refused rather than read as "no TLS and
    // no authentication": a file caught half-written must not switch security off.
    let document: serde_norway::Value =
        serde_norway::from_slice(text).map_err(|error| anyhow!("{}", one_line(&error)))?;
    if document.is_null() {
        bail!("the file holds no settings; to serve plain HTTP without authentication, leave out --web.config.file");
    }
    // Parsed again from the text, not from the value, so errors say where they are.
    let config: FileConfig =
        serde_norway::from_slice(text).map_err(|error| anyhow!("{}", one_line(&error)))?;

    let tls = match &config.tls_server_config {
        Some(section) if section.is_enabled() => {
            Some(tls::server_config(section, reader).context("tls_server_config")?)
        }
        Some(section) => {
            // Settings that only make sense with TLS, without a certificate to serve.
            if section.client_allowed_sans.is_some()
                || section.min_version.is_some()
                || section.max_version.is_some()
                || section.cipher_suites.is_some()
                || section.curve_preferences.is_some()
            {
                bail!("tls_server_config: missing one of cert or cert_file");
            }
            None
        }
        None => None,
    };
    let headers = match config
        .http_server_config
        .as_ref()
        .and_then(|http| http.headers.as_ref())
    {
        Some(headers) => validate_headers(headers).context("http_server_config.headers")?,
        None => Vec::new(),
    };
    let users = match &config.basic_auth_users {
        Some(users) if !users.is_empty() => Some(Users::new(users).context("basic_auth_users")?),
        _ => None,
    };
    let rate_limit = match &config.rate_limit {
        Some(limit) => rate_limiter(limit).context("rate_limit")?,
        None => None,
    };
    Ok(WebSettings {
        tls,
        users,
        headers,
        rate_limit,
        sources: Vec::new(),
    })
}

/// The toolkit's header rules: only the five security headers, and for two of them only
/// the values browsers understand. A blank value leaves the header unset.
fn validate_headers(
    headers: &BTreeMap<String, String>,
) -> anyhow::Result<Vec<(HeaderName, HeaderValue)>> {
    let mut valid = Vec::new();
    for (name, value) in headers {
        let Some((canonical, allowed)) = EXTRA_HEADERS.iter().find(|(known, _)| known == name)
        else {
            let names: Vec<&str> = EXTRA_HEADERS.iter().map(|(known, _)| *known).collect();
            bail!(
                "HTTP header {name:?} can not be configured (allowed: {})",
                names.join(", ")
            );
        };
        if value.is_empty() {
            continue;
        }
        if !allowed.is_empty() && !allowed.contains(&value.as_str()) {
            bail!("invalid value for {canonical}: expected one of {allowed:?}, but got {value:?}");
        }
        let value = HeaderValue::from_str(value)
            .map_err(|_| anyhow!("the value of {canonical} is not a valid header value"))?;
        valid.push((HeaderName::from_static(lowercase(canonical)), value));
    }
    Ok(valid)
}

fn lowercase(name: &'static str) -> &'static str {
    match name {
        "Strict-Transport-Security" => "strict-transport-security",
        "X-Content-Type-Options" => "x-content-type-options",
        "X-Frame-Options" => "x-frame-options",
        "X-XSS-Protection" => "x-xss-protection",
        _ => "content-security-policy",
    }
}

fn rate_limiter(config: &RateLimitConfig) -> anyhow::Result<Option<RateLimiter>> {
    let interval = match &config.interval {
        Some(GoDuration::Nanoseconds(nanoseconds)) => Duration::from_nanos(*nanoseconds),
        Some(GoDuration::Text(text)) => parse_go_duration(text).context("interval")?,
        None => Duration::ZERO,
    };
    if interval.is_zero() {
        return Ok(None);
    }
    let burst = config.burst.unwrap_or(0);
    if burst == 0 {
        bail!("burst must be at least 1 when interval is set (a burst of 0 refuses every request)");
    }
    Ok(Some(RateLimiter::new(interval, burst)))
}

/// A Go duration as the toolkit's YAML reads it: `0`, or numbers with units (`ns`, `us`,
/// `µs`, `ms`, `s`, `m`, `h`), e.g. `1s`, `1m30s`, `0.5s`.
pub(crate) fn parse_go_duration(text: &str) -> anyhow::Result<Duration> {
    let invalid = || anyhow!("{text:?} is not a duration such as 1s, 500ms or 1m30s");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = text;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(invalid());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let number: f64 = rest[..digits].parse().map_err(|_| invalid())?;
        rest = &rest[digits..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(invalid()),
        };
        total += number * scale;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| invalid())
}

/// Parser messages can span lines; a start-up error must be one.
fn one_line(error: &impl std::fmt::Display) -> String {
    error
        .to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_go_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_go_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(
            parse_go_duration("250ms").unwrap(),
            Duration::from_millis(250)
        );
        for bad in ["", "1", "s", "1x", "-1s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_the_toolkit_headers_with_their_values() {
        let headers = |pairs: &[(&str, &str)]| {
            validate_headers(
                &pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        let valid = headers(&[
            ("X-Frame-Options", "deny"),
            ("X-Content-Type-Options", "nosniff"),
            ("Content-Security-Policy", "default-src 'self'"),
            ("X-XSS-Protection", ""),
        ])
        .unwrap();
        assert_eq!(valid.len(), 3);
        assert!(headers(&[("X-Frame-Options", "allow")]).is_err());
        assert!(headers(&[("X-Content-Type-Options", "sniff")]).is_err());
        assert!(headers(&[("Server", "nginx")]).is_err());
        assert!(headers(&[("Set-Cookie", "a=b")]).is_err());
        assert!(headers(&[("Content-Security-Policy", "a\nb")]).is_err());
    }

    fn parse_text(text: &str) -> anyhow::Result<WebSettings> {
        let dir = tempfile::tempdir().unwrap();
        let mut reader = SourceReader::new(&dir.path().join("web.yml"));
        parse(text.as_bytes(), &mut reader)
    }

    #[test]
    fn strict_parsing() {
        let error = parse_text("basic_auth_user:\n  a: b\n").unwrap_err();
        assert!(format!("{error:#}").contains("unknown field"), "{error:#}");
        let error = parse_text("tls_server_config:\n  cert_fil: x\n").unwrap_err();
        assert!(format!("{error:#}").contains("unknown field"), "{error:#}");
        assert!(parse_text("").is_err());
        assert!(parse_text("# nothing\n").is_err());
        assert!(parse_text(": : :\n  - [").is_err());
    }

    #[test]
    fn empty_sections_are_plain_http_without_authentication() {
        let settings = parse_text("tls_server_config: {}\nbasic_auth_users: {}\n").unwrap();
        assert!(settings.tls.is_none());
        assert!(settings.users.is_none());
        let settings = parse_text("http_server_config:\n  http2: false\n").unwrap();
        assert!(settings.tls.is_none());
    }

    #[test]
    fn rate_limit() {
        let settings = parse_text("rate_limit:\n  interval: 1s\n  burst: 2\n").unwrap();
        assert!(settings.rate_limit.is_some());
        let settings = parse_text("rate_limit:\n  interval: 0\n  burst: 2\n").unwrap();
        assert!(settings.rate_limit.is_none());
        assert!(parse_text("rate_limit:\n  interval: 1s\n").is_err());
        assert!(parse_text("rate_limit:\n  interval: soon\n  burst: 1\n").is_err());
    }
}
