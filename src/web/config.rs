//! The file of `--web.config.file`, in the Prometheus exporter-toolkit format: parsed
//! strictly (an unknown or misspelt key is an error, as the toolkit's `UnmarshalStrict`),
//! validated, and turned into [`WebSettings`]. Its shape is in `file.rs`; TLS is built
//! by `tls.rs`.

use super::auth::Users;
use super::error::{invalid, ConfigError};
use super::file::{FileConfig, GoDuration, RateLimitConfig, SourceReader};
use super::settings::{RateLimiter, Sources, WebSettings};
use super::tls;
use hyper::header::{HeaderName, HeaderValue};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// Response headers the toolkit lets a web config set, with the values it allows (none
/// listed: any value).
const EXTRA_HEADERS: [(&str, &[&str]); 5] = [
    ("Strict-Transport-Security", &[]),
    ("X-Content-Type-Options", &["nosniff"]),
    ("X-Frame-Options", &["deny", "sameorigin"]),
    ("X-XSS-Protection", &[]),
    ("Content-Security-Policy", &[]),
];

/// Load and validate the web configuration at `path`: everything it names is read and
/// checked now, so a mistake is reported at start-up (or a broken reload is refused).
/// Also returns the files read, as they were, successful or not.
pub(crate) fn load(path: &Path) -> (Result<WebSettings, ConfigError>, Sources) {
    let mut reader = SourceReader::new(path);
    let result = reader
        .read(path)
        .map_err(|source| ConfigError::Read {
            what: "web config file",
            path: path.to_path_buf(),
            source,
        })
        .and_then(|text| {
            parse(&text, &mut reader)
                .map_err(|error| error.within(format!("web config file {}", path.display())))
        });
    let sources = reader.sources.clone();
    let result = result.map(|settings| WebSettings {
        sources: reader.sources,
        ..settings
    });
    (result, sources)
}

fn parse(text: &[u8], reader: &mut SourceReader) -> Result<WebSettings, ConfigError> {
    // An empty file (or one of comments only) is refused rather than read as "no TLS and
    // no authentication": a file caught half-written must not switch security off.
    let document: serde_norway::Value =
        serde_norway::from_slice(text).map_err(|error| invalid!("{}", one_line(&error)))?;
    if document.is_null() {
        return Err(invalid!("the file holds no settings; to serve plain HTTP without authentication, leave out --web.config.file"));
    }
    // Parsed again from the text, not from the value, so errors say where they are.
    let config: FileConfig =
        serde_norway::from_slice(text).map_err(|error| invalid!("{}", one_line(&error)))?;

    let tls = match &config.tls_server_config {
        Some(section) if section.is_enabled() => {
            Some(tls::server_config(section, reader).map_err(|e| e.within("tls_server_config"))?)
        }
        Some(section) => {
            // Settings that only make sense with TLS, without a certificate to serve.
            if section.client_allowed_sans.is_some()
                || section.min_version.is_some()
                || section.max_version.is_some()
                || section.cipher_suites.is_some()
                || section.curve_preferences.is_some()
            {
                return Err(invalid!(
                    "tls_server_config: missing one of cert or cert_file"
                ));
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
        Some(headers) => {
            validate_headers(headers).map_err(|e| e.within("http_server_config.headers"))?
        }
        None => Vec::new(),
    };
    let users = match &config.basic_auth_users {
        Some(users) if !users.is_empty() => {
            Some(Users::new(users).map_err(|e| e.within("basic_auth_users"))?)
        }
        _ => None,
    };
    let rate_limit = match &config.rate_limit {
        Some(limit) => rate_limiter(limit).map_err(|e| e.within("rate_limit"))?,
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
) -> Result<Vec<(HeaderName, HeaderValue)>, ConfigError> {
    let mut valid = Vec::new();
    for (name, value) in headers {
        let Some((canonical, allowed)) = EXTRA_HEADERS.iter().find(|(known, _)| known == name)
        else {
            let names: Vec<&str> = EXTRA_HEADERS.iter().map(|(known, _)| *known).collect();
            return Err(invalid!(
                "HTTP header {name:?} can not be configured (allowed: {})",
                names.join(", ")
            ));
        };
        if value.is_empty() {
            continue;
        }
        if !allowed.is_empty() && !allowed.contains(&value.as_str()) {
            return Err(invalid!(
                "invalid value for {canonical}: expected one of {allowed:?}, but got {value:?}"
            ));
        }
        let value = HeaderValue::from_str(value)
            .map_err(|_| invalid!("the value of {canonical} is not a valid header value"))?;
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

fn rate_limiter(config: &RateLimitConfig) -> Result<Option<RateLimiter>, ConfigError> {
    let interval = match &config.interval {
        Some(GoDuration::Nanoseconds(nanoseconds)) => Duration::from_nanos(*nanoseconds),
        Some(GoDuration::Text(text)) => {
            crate::units::parse_duration(text).map_err(|message| invalid!("interval: {message}"))?
        }
        None => Duration::ZERO,
    };
    if interval.is_zero() {
        return Ok(None);
    }
    let burst = config.burst.unwrap_or(0);
    if burst == 0 {
        return Err(invalid!(
            "burst must be at least 1 when interval is set (a burst of 0 refuses every request)"
        ));
    }
    Ok(Some(RateLimiter::new(interval, burst)))
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
    fn durations_are_read_as_go_writes_them() {
        let interval = |text: &str| {
            let config = RateLimitConfig {
                interval: Some(GoDuration::Text(text.into())),
                burst: Some(1),
            };
            rate_limiter(&config).map(|limit| limit.map(|limit| limit.interval))
        };
        assert_eq!(interval("1m30s").unwrap(), Some(Duration::from_secs(90)));
        assert_eq!(interval("250ms").unwrap(), Some(Duration::from_millis(250)));
        assert_eq!(interval("0").unwrap(), None);
        for bad in ["", "1", "s", "1x", "-1s"] {
            let error = interval(bad).unwrap_err().to_string();
            assert!(error.starts_with("interval: "), "{bad}: {error}");
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

    fn parse_text(text: &str) -> Result<WebSettings, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let mut reader = SourceReader::new(&dir.path().join("web.yml"));
        parse(text.as_bytes(), &mut reader)
    }

    #[test]
    fn strict_parsing() {
        let error = parse_text("basic_auth_user:\n  a: b\n").unwrap_err();
        assert!(error.to_string().contains("unknown field"), "{error}");
        let error = parse_text("tls_server_config:\n  cert_fil: x\n").unwrap_err();
        assert!(error.to_string().contains("unknown field"), "{error}");
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
