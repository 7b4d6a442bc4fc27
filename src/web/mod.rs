//! The HTTP side: the server (binding, connections, graceful stop), what it answers
//! (landing page, health endpoints, `/metrics` from collections that concurrent scrapes
//! share), and what protects it: the `--web.config.file` of the Prometheus
//! exporter-toolkit (TLS, client certificates, basic authentication, extra response
//! headers, a rate limit), reloaded when it or a file it names changes, and the cap on
//! open connections. Metrics come from [`crate::exporter`], the one door to the rest.

pub mod auth;
mod collections;
mod config;
pub mod connections;
mod endpoints;
mod error;
mod file;
mod server;
mod tls;

pub use error::ConfigError;
pub use server::{run, ServeConfig, ServeError};

use crate::sync::lock;
use hyper::header::{HeaderName, HeaderValue};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One version of the web configuration, fully loaded and checked.
#[derive(Default)]
pub struct WebSettings {
    /// TLS, when `tls_server_config` names a certificate.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// Basic authentication, when `basic_auth_users` lists anyone.
    pub users: Option<auth::Users>,
    /// Extra headers for every response.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The token bucket of `rate_limit`.
    pub rate_limit: Option<RateLimiter>,
    /// The files this version was read from, as they were then.
    sources: Sources,
}

impl std::fmt::Debug for WebSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebSettings")
            .field("tls", &self.tls.is_some())
            .field("users", &self.users.as_ref().map(auth::Users::len))
            .field("headers", &self.headers)
            .field("rate_limit", &self.rate_limit.is_some())
            .finish()
    }
}

/// The files a version of the configuration was read from, each as it was then.
pub(crate) type Sources = Vec<(PathBuf, Option<Stamp>)>;

/// What a file looked like: a rewrite, a rename over it or a touch changes this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    device: u64,
    inode: u64,
    size: u64,
    modified_ns: i128,
    changed_ns: i128,
}

impl Stamp {
    /// `None` when the file cannot be looked at (gone, say), which is a change as well.
    pub(crate) fn of(path: &Path) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let metadata = std::fs::metadata(path).ok()?;
        Some(Stamp {
            device: metadata.dev(),
            inode: metadata.ino(),
            size: metadata.size(),
            modified_ns: i128::from(metadata.mtime()) * 1_000_000_000
                + i128::from(metadata.mtime_nsec()),
            changed_ns: i128::from(metadata.ctime()) * 1_000_000_000
                + i128::from(metadata.ctime_nsec()),
        })
    }
}

/// The toolkit's `rate_limit`: a token bucket of `burst` requests, refilled by one every
/// `interval`; requests beyond it get 429.
#[derive(Debug)]
pub struct RateLimiter {
    interval: Duration,
    burst: u32,
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    fn new(interval: Duration, burst: u32) -> RateLimiter {
        RateLimiter {
            interval,
            burst,
            state: Mutex::new((f64::from(burst), Instant::now())),
        }
    }

    /// Take a token if there is one.
    pub fn allow(&self) -> bool {
        let mut state = lock(&self.state);
        let now = Instant::now();
        let refill = now.duration_since(state.1).as_secs_f64() / self.interval.as_secs_f64();
        state.0 = (state.0 + refill).min(f64::from(self.burst));
        state.1 = now;
        if state.0 >= 1.0 {
            state.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The web configuration in force, re-read when its file or a file it names changes.
///
/// Every new connection and every request asks for the current version, which costs a
/// `stat` of each file. A changed file is loaded and checked in full before it replaces
/// the version in force; a broken one is logged once and the old version kept, so a
/// half-written certificate never takes the listener down.
#[derive(Debug)]
pub struct WebConfig {
    path: Option<PathBuf>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    active: Arc<WebSettings>,
    /// The files a failed reload read, as they were then: not retried until one changes.
    rejected: Option<Sources>,
}

impl WebConfig {
    /// No file: plain HTTP, no authentication.
    pub fn none() -> WebConfig {
        WebConfig {
            path: None,
            state: Mutex::new(State {
                active: Arc::new(WebSettings::default()),
                rejected: None,
            }),
        }
    }

    /// Load `path` now; any mistake in it, or in a file it names, is an error to report
    /// at start-up.
    pub fn load(path: &Path) -> Result<WebConfig, ConfigError> {
        let settings = config::load(path).0?;
        Ok(WebConfig {
            path: Some(path.to_path_buf()),
            state: Mutex::new(State {
                active: Arc::new(settings),
                rejected: None,
            }),
        })
    }

    /// The version in force, after reloading if a file changed.
    pub fn current(&self) -> Arc<WebSettings> {
        let Some(path) = &self.path else {
            return Arc::clone(&lock(&self.state).active);
        };
        let mut state = lock(&self.state);
        let unchanged = |sources: &[(PathBuf, Option<Stamp>)]| {
            sources.iter().all(|(file, then)| Stamp::of(file) == *then)
        };
        if unchanged(&state.active.sources) || state.rejected.as_deref().is_some_and(unchanged) {
            return Arc::clone(&state.active);
        }
        match config::load(path) {
            (Ok(settings), _) => {
                tracing::info!(
                    file = %path.display(),
                    tls = settings.tls.is_some(),
                    basic_auth_users = settings.users.as_ref().map_or(0, auth::Users::len),
                    "reloaded the web config"
                );
                state.active = Arc::new(settings);
                state.rejected = None;
            }
            (Err(error), sources) => {
                tracing::error!(
                    file = %path.display(),
                    error = format!("{:#}", anyhow::Error::new(error)),
                    "cannot reload the web config; keeping the previous one"
                );
                state.rejected = Some(sources);
            }
        }
        Arc::clone(&state.active)
    }
}
