//! NVML as a source: loaded lazily, loaded again with back-off while it cannot be, and
//! loaded anew once it stops answering (a driver unloaded or upgraded under us).

use super::device::{read_all, Answers, Identity};
use super::reading::NvmlReading;
use super::xid::XidCounter;
use crate::observe::error_line::one_line;
use crate::observe::lifespan::Lifespan;
use crate::sync::lock;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use thiserror::Error;

/// First wait before loading NVML again after a failure; doubles up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(300);

/// The library NVML is loaded from when no path is given.
const SYSTEM_LIBRARY: &str = "libnvidia-ml.so.1";

/// Why NVML gave no reading.
#[derive(Debug, Error)]
enum Failure {
    /// The library could not be loaded or initialised.
    #[error("cannot load NVML from {library}")]
    Load {
        /// The library's path, as given.
        library: String,
        /// NVML's answer.
        source: NvmlError,
    },
    /// The library was loaded, then a call that every reading makes failed.
    #[error("NVML stopped answering")]
    StoppedAnswering(#[source] NvmlError),
}

#[derive(Debug)]
enum Library {
    /// Shared with the thread that counts Xid events.
    Loaded(Arc<Nvml>),
    Failed {
        /// Why, in one line: what the reading says while NVML is down.
        error: String,
        retry_at: Instant,
        backoff: Duration,
    },
}

#[derive(Debug)]
struct State {
    library: Option<Library>,
    identities: HashMap<u32, Identity>,
    /// By device index, for the library loaded now.
    answers: HashMap<u32, Answers>,
}

/// A handle on NVML that loads it lazily and retries with back-off when it cannot.
#[derive(Debug)]
pub(crate) struct NvmlSource {
    path: Option<PathBuf>,
    /// A server says once, loudly, that it keeps going without NVML; a one-shot command
    /// reports the failure in its own output instead.
    lifespan: Lifespan,
    state: Mutex<State>,
    /// The counts of critical Xid events, kept across NVML reloads; only a server
    /// watches them (a one-shot command would see none).
    xid: Option<Arc<XidCounter>>,
}

impl NvmlSource {
    /// A source loading `path`, or the system's `libnvidia-ml.so.1` when `None`.
    pub(crate) fn new(path: Option<PathBuf>, lifespan: Lifespan) -> NvmlSource {
        NvmlSource {
            path,
            lifespan,
            state: Mutex::new(State {
                library: None,
                identities: HashMap::new(),
                answers: HashMap::new(),
            }),
            xid: (lifespan == Lifespan::Serving).then(|| Arc::new(XidCounter::default())),
        }
    }

    /// Read every GPU; NVML's own failures become a `Down` reading, never a panic.
    pub(crate) fn read(&self) -> NvmlReading {
        let mut state = lock(&self.state);
        let State {
            library,
            identities,
            answers,
        } = &mut *state;
        let now = Instant::now();
        let must_load = match library {
            None => true,
            Some(Library::Failed { retry_at, .. }) => now >= *retry_at,
            Some(Library::Loaded(_)) => false,
        };
        if must_load {
            let previous_backoff = match library {
                Some(Library::Failed { backoff, .. }) => Some(*backoff),
                _ => None,
            };
            *library = Some(match self.load() {
                Ok(nvml) => {
                    // Another library (a driver upgraded under us) may answer otherwise.
                    answers.clear();
                    if previous_backoff.is_some() {
                        tracing::info!("NVML loaded after earlier failures");
                    }
                    let nvml = Arc::new(nvml);
                    if let Some(xid) = &self.xid {
                        xid.start(Arc::clone(&nvml));
                    }
                    Library::Loaded(nvml)
                }
                Err(failure) => {
                    let error = one_line(&failure);
                    let backoff = previous_backoff.map_or(FIRST_RETRY, |b| (b * 2).min(MAX_RETRY));
                    if previous_backoff.is_none() && self.lifespan == Lifespan::Serving {
                        tracing::error!(error = %error, retry_in = ?backoff, "cannot load NVML; serving vram_nvml_up 0 and retrying");
                    } else {
                        tracing::debug!(error = %error, retry_in = ?backoff, "NVML still not loadable");
                    }
                    Library::Failed {
                        error,
                        retry_at: now + backoff,
                        backoff,
                    }
                }
            });
        }
        match library {
            Some(Library::Loaded(nvml)) => {
                match read_all(nvml, identities, answers, self.xid.as_deref()) {
                    Ok(reading) => reading,
                    Err(error) => {
                        // The driver went away under us (unloaded, upgraded): start over.
                        tracing::error!(error = %error, "NVML stopped answering; reloading on a later scrape");
                        if let Some(xid) = &self.xid {
                            xid.stop();
                        }
                        let message = one_line(&Failure::StoppedAnswering(error));
                        *library = Some(Library::Failed {
                            error: message.clone(),
                            retry_at: now + FIRST_RETRY,
                            backoff: FIRST_RETRY,
                        });
                        NvmlReading::Down { error: message }
                    }
                }
            }
            Some(Library::Failed { error, .. }) => NvmlReading::Down {
                error: error.clone(),
            },
            None => unreachable!("the library was set above"),
        }
    }

    /// The UUID of the GPU each of these MIG devices (`MIG-...` UUIDs, as the kubelet
    /// names them) is part of. Devices NVML does not know, and any answer while NVML is
    /// not loaded, are left out: those devices stay unplaced rather than guessed.
    pub(crate) fn mig_parents(&self, mig_uuids: &[String]) -> BTreeMap<String, String> {
        let state = lock(&self.state);
        let Some(Library::Loaded(nvml)) = &state.library else {
            return BTreeMap::new();
        };
        mig_uuids
            .iter()
            .filter_map(|uuid| {
                let device = nvml.device_by_uuid(uuid.as_str()).ok()?;
                let parent = device.mig_parent_device().ok()?;
                Some((uuid.clone(), parent.uuid().ok()?))
            })
            .collect()
    }

    fn load(&self) -> Result<Nvml, Failure> {
        let library = match &self.path {
            Some(path) => path.as_os_str(),
            None => OsStr::new(SYSTEM_LIBRARY),
        };
        Nvml::builder()
            .lib_path(library)
            .init()
            .map_err(|source| Failure::Load {
                library: library.to_string_lossy().into_owned(),
                source,
            })
    }
}
