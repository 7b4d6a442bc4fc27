//! One version of the web configuration, as loaded and checked, and what tells a later
//! change of the files it was read from.

use super::auth;
use crate::sync::lock;
use hyper::header::{HeaderName, HeaderValue};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
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
    pub(super) sources: Sources,
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
    /// How often a token is added.
    pub(super) interval: Duration,
    burst: u32,
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    pub(super) fn new(interval: Duration, burst: u32) -> RateLimiter {
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
