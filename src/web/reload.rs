//! The web configuration in force, reloaded when its file or a file it names changes.

use super::auth;
use super::config;
use super::error::ConfigError;
use super::settings::{Sources, Stamp, WebSettings};
use crate::observe::one_line;
use crate::sync::lock;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

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
                    error = one_line(&error),
                    "cannot reload the web config; keeping the previous one"
                );
                state.rejected = Some(sources);
            }
        }
        Arc::clone(&state.active)
    }
}
