//! NVML as a source: loaded lazily, loaded again with back-off while it cannot be, and
//! loaded anew once it stops answering (a driver unloaded or upgraded under us); every
//! call made on a reader thread that a look waits for only until its deadline.
//!
//! One thread makes the library-level calls (init, device count, driver version, the
//! parents of MIG devices) and one thread per GPU reads that GPU (see
//! `crate::observe::worker`). NVML may be called from several threads at once (its
//! handles are thread-safe, and nvml-wrapper's `Nvml` is `Send + Sync`), so the GPUs
//! are read side by side: one GPU that hangs (fallen off the bus, a wedged driver) costs
//! a look no more than its deadline, and every later look reports it at once, with the
//! call it is stuck in, while the other GPUs are read as on a healthy host. It is asked
//! nothing more until that call returns, so threads never stack. Reading side by side is
//! also faster on a host of 8 GPUs (docs/benchmarks.md).

use super::device::{read_gpu, Answers, Identity};
use super::reading::{GpuError, GpuReading, GpuState, NvmlFailure, NvmlReading, StuckCall};
use super::xid::XidCounter;
use crate::observe::error_line::one_line;
use crate::observe::lifespan::Lifespan;
use crate::observe::worker::{answer, calling, InCall, NoAnswer, Worker};
use crate::sync::lock;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use std::collections::BTreeMap;
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

/// How long the library-level answers (the device count, the driver version) are served
/// without asking again while every GPU answers. Neither changes while NVML stays loaded
/// (NVML counts the devices at init), and a GPU that fails makes the look ask at once.
const LIBRARY_ANSWERS_FOR: Duration = Duration::from_secs(30);

/// What a library-level job says before its first call: loading is init.
const LOADING: &str = "nvmlInit_v2";

/// Why NVML gave no reading.
#[derive(Debug, Error)]
enum Failure {
    /// The dynamic loader could not open the library. nvml-wrapper calls this "a
    /// libloading error occurred", which tells a user nothing: the message says what was
    /// tried, what the loader answered and what to do about it instead.
    #[error("cannot load NVML from {library} ({}): {loader}; {}", tried(*.given), remedy(*.given))]
    Open {
        /// The library's path, as given or the default name.
        library: String,
        /// Whether `--nvml.library` named it.
        given: bool,
        /// The dynamic loader's answer (dlerror).
        loader: String,
    },
    /// The library loaded, but could not be initialised.
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
    /// Shared with the GPUs' threads and the thread that counts Xid events.
    Loaded(Arc<Nvml>),
    Failed {
        /// Why, in one line: what the reading says while NVML is down.
        error: String,
        reason: NvmlFailure,
        retry_at: Instant,
        backoff: Duration,
    },
}

/// What the library's thread keeps.
#[derive(Debug, Default)]
struct LibraryState {
    library: Option<Library>,
    /// Counts the loads, so that a GPU's thread forgets what another library answered.
    generation: u64,
}

/// What the library-level calls answered last while NVML was up, and when.
#[derive(Debug, Clone)]
struct LibraryUp {
    nvml: Arc<Nvml>,
    generation: u64,
    count: u32,
    driver_version: String,
    asked_at: Instant,
}

/// What the library-level calls answered.
enum LibraryAnswer {
    Up {
        nvml: Arc<Nvml>,
        generation: u64,
        count: u32,
        driver_version: String,
    },
    Down {
        error: String,
        reason: NvmlFailure,
    },
}

/// How the library's thread loads NVML.
#[derive(Debug, Clone)]
struct Loading {
    path: Option<PathBuf>,
    lifespan: Lifespan,
    xid: Option<Arc<XidCounter>>,
}

/// What a GPU's thread keeps.
#[derive(Debug, Default)]
struct GpuMemo {
    /// The library generation `answers` came from.
    generation: u64,
    answers: Answers,
}

/// One GPU's reader thread and what is known of the GPU even while it hangs.
#[derive(Debug)]
struct GpuSlot {
    worker: Worker<GpuMemo>,
    /// Its identity as last read, written by its thread before the calls that may hang.
    identity: Arc<Mutex<Identity>>,
    /// Whether it was stuck at the last look, so that each episode is logged once.
    stuck: Mutex<bool>,
}

/// A reader thread of NVML, and the call it is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NvmlThread {
    /// The library-level calls.
    Library,
    /// GPU of this index.
    Gpu(u32),
}

/// A handle on NVML that loads it lazily, retries with back-off when it cannot, and
/// makes every call on a reader thread.
#[derive(Debug)]
pub(crate) struct NvmlSource {
    loading: Loading,
    library: Worker<LibraryState>,
    /// Whether the library was stuck at the last look, so that it is logged once.
    library_stuck: Mutex<bool>,
    /// The library's last answers while it was up; `None` once it was not.
    library_up: Mutex<Option<LibraryUp>>,
    /// By device index; grows with the device count.
    gpus: Mutex<Vec<Arc<GpuSlot>>>,
    /// Read the GPUs side by side (`true`, what the exporter does) or one after another
    /// (to measure what reading them side by side saves).
    side_by_side: bool,
}

impl NvmlSource {
    /// A source loading `path`, or the system's `libnvidia-ml.so.1` when `None`.
    pub(crate) fn new(path: Option<PathBuf>, lifespan: Lifespan) -> NvmlSource {
        NvmlSource {
            loading: Loading {
                path,
                lifespan,
                // The counts of critical Xid events, kept across NVML reloads; only a
                // server watches them (a one-shot command would see none).
                xid: (lifespan == Lifespan::Serving).then(|| Arc::new(XidCounter::default())),
            },
            library: Worker::start("nvml-library", LibraryState::default()),
            library_stuck: Mutex::new(false),
            library_up: Mutex::new(None),
            gpus: Mutex::new(Vec::new()),
            side_by_side: true,
        }
    }

    /// Reads the GPUs one after another instead of side by side (for a benchmark).
    pub(crate) fn one_gpu_at_a_time(mut self) -> NvmlSource {
        self.side_by_side = false;
        self
    }

    /// Loads NVML now, without waiting: a server says at start, not at the first scrape,
    /// that NVML is missing.
    pub(crate) fn start_loading(&self) {
        let loading = self.loading.clone();
        // A look that comes while this runs waits for it, or reports it stuck.
        let _ = self
            .library
            .submit(LOADING, move |state| state.look(&loading));
    }

    /// Read every GPU, waiting for NVML until `until`; NVML's own failures become a
    /// `Down` reading, a GPU that does not answer by then a `NotAnswering` one, never a
    /// panic.
    ///
    /// The library-level calls are made when their last answers are older than
    /// [`LIBRARY_ANSWERS_FOR`], and after the GPUs whenever one of them did not answer
    /// well: a driver that went away fails every GPU's calls, and is then reported as
    /// NVML down in the same look, as if the library had been asked first. A look of a
    /// healthy host thus hands work to one thread fewer.
    pub(crate) async fn read(&self, until: Instant) -> NvmlReading {
        let recent = lock(&self.library_up)
            .clone()
            .filter(|up| up.asked_at.elapsed() < LIBRARY_ANSWERS_FOR);
        let asked_first = recent.is_none();
        let up = match recent {
            Some(up) => up,
            None => match self.ask_library(until).await {
                Ok(up) => up,
                Err(down) => return down,
            },
        };
        let gpus = self.read_gpus(&up, until).await;
        if !asked_first
            && gpus
                .iter()
                .any(|gpu| !matches!(gpu.state, GpuState::Ok { .. }))
        {
            if let Err(down) = self.ask_library(until).await {
                return down;
            }
        }
        NvmlReading::Up {
            driver_version: up.driver_version,
            gpus,
        }
    }

    /// The library-level answers, asked of its thread until `until` (loading NVML if it
    /// is not loaded); the `Down` reading to serve when NVML is not up.
    async fn ask_library(&self, until: Instant) -> Result<LibraryUp, NvmlReading> {
        let loading = self.loading.clone();
        let answer = self
            .library
            .run(LOADING, until, move |state| state.look(&loading))
            .await;
        let looked_at = Instant::now();
        let up = match answer {
            Ok(LibraryAnswer::Up {
                nvml,
                generation,
                count,
                driver_version,
            }) => {
                self.library_answers();
                LibraryUp {
                    nvml,
                    generation,
                    count,
                    driver_version,
                    asked_at: looked_at,
                }
            }
            Ok(LibraryAnswer::Down { error, reason }) => {
                self.library_answers();
                *lock(&self.library_up) = None;
                return Err(NvmlReading::Down {
                    error,
                    reason,
                    stuck: None,
                });
            }
            Err(NoAnswer::Stuck(in_call)) => {
                *lock(&self.library_up) = None;
                let stuck = stuck_call(in_call, looked_at);
                if !std::mem::replace(&mut *lock(&self.library_stuck), true)
                    && self.loading.lifespan == Lifespan::Serving
                {
                    tracing::error!(
                        call = %stuck.call,
                        stuck_seconds = stuck.stuck_seconds,
                        "NVML does not answer; serving vram_nvml_up 0 and asking it nothing more until the call returns"
                    );
                }
                return Err(NvmlReading::Down {
                    error: format!("NVML does not answer: {} has not returned", stuck.call),
                    reason: NvmlFailure::NotAnswering,
                    stuck: Some(stuck),
                });
            }
            Err(NoAnswer::Failed(why)) => {
                *lock(&self.library_up) = None;
                return Err(NvmlReading::Down {
                    error: why,
                    reason: NvmlFailure::Failed,
                    stuck: None,
                });
            }
        };
        *lock(&self.library_up) = Some(up.clone());
        Ok(up)
    }

    /// Each GPU's reading, from its own thread, waited for until `until`.
    async fn read_gpus(&self, up: &LibraryUp, until: Instant) -> Vec<GpuReading> {
        let (count, generation) = (up.count, up.generation);
        let slots = self.slots(count);
        let xid_events = self.loading.xid.as_ref().map_or(0, |xid| xid.events());
        let job = |index: u32, slot: &GpuSlot| {
            let (nvml, known) = (Arc::clone(&up.nvml), Arc::clone(&slot.identity));
            slot.worker.submit(
                "nvmlDeviceGetHandleByIndex_v2",
                move |memo: &mut GpuMemo| {
                    if memo.generation != generation {
                        // Another library (a driver upgraded under us) may answer otherwise.
                        *memo = GpuMemo {
                            generation,
                            answers: Answers::default(),
                        };
                    }
                    read_gpu(&nvml, index, &known, &mut memo.answers, xid_events)
                },
            )
        };
        let mut answers: Vec<Result<GpuReading, NoAnswer>> = Vec::with_capacity(count as usize);
        if self.side_by_side {
            let pending: Vec<_> = (0..count).zip(&slots).map(|(i, s)| job(i, s)).collect();
            for handed in pending {
                answers.push(answer(handed, until).await);
            }
        } else {
            for (index, slot) in (0..count).zip(&slots) {
                answers.push(answer(job(index, slot), until).await);
            }
        }
        let looked_at = Instant::now();
        (0..count)
            .zip(&slots)
            .zip(answers)
            .map(|((index, slot), answer)| {
                let mut gpu = self.gpu_reading(index, slot, answer, looked_at);
                gpu.health.xid = self.loading.xid.as_ref().map(|xid| xid.reading(&gpu.uuid));
                gpu
            })
            .collect()
    }

    /// The reading of GPU `index` from its thread's answer, logging when it stops and
    /// starts answering.
    fn gpu_reading(
        &self,
        index: u32,
        slot: &GpuSlot,
        answer: Result<GpuReading, NoAnswer>,
        looked_at: Instant,
    ) -> GpuReading {
        let was_stuck = {
            let mut stuck = lock(&slot.stuck);
            std::mem::replace(&mut *stuck, matches!(answer, Err(NoAnswer::Stuck(_))))
        };
        match answer {
            Ok(gpu) => {
                if was_stuck && self.loading.lifespan == Lifespan::Serving {
                    tracing::info!(gpu = index, "GPU answers NVML again");
                }
                gpu
            }
            Err(NoAnswer::Stuck(in_call)) => {
                let stuck = stuck_call(in_call, looked_at);
                // A one-shot command says it in its output instead.
                if !was_stuck && self.loading.lifespan == Lifespan::Serving {
                    tracing::error!(
                        gpu = index,
                        call = %stuck.call,
                        stuck_seconds = stuck.stuck_seconds,
                        "GPU does not answer NVML; serving the other GPUs and asking it nothing more until the call returns"
                    );
                }
                lock(&slot.identity).reading(
                    index,
                    GpuState::NotAnswering {
                        call: stuck.call,
                        stuck_seconds: stuck.stuck_seconds,
                    },
                )
            }
            Err(NoAnswer::Failed(message)) => lock(&slot.identity).reading(
                index,
                GpuState::Failed {
                    error: GpuError::Unknown,
                    message,
                },
            ),
        }
    }

    /// The first `count` GPU slots, started as needed.
    fn slots(&self, count: u32) -> Vec<Arc<GpuSlot>> {
        let mut gpus = lock(&self.gpus);
        while gpus.len() < count as usize {
            let index = gpus.len();
            gpus.push(Arc::new(GpuSlot {
                worker: Worker::start(&format!("nvml-gpu-{index}"), GpuMemo::default()),
                identity: Arc::new(Mutex::new(Identity::default())),
                stuck: Mutex::new(false),
            }));
        }
        gpus[..count as usize].to_vec()
    }

    fn library_answers(&self) {
        let was_stuck = std::mem::replace(&mut *lock(&self.library_stuck), false);
        if was_stuck && self.loading.lifespan == Lifespan::Serving {
            tracing::info!("NVML answers again");
        }
    }

    /// The UUID of the GPU each of these MIG devices (`MIG-...` UUIDs, as the kubelet
    /// names them) is part of, asked until `until`. Devices NVML does not know, and any
    /// answer while NVML is not loaded or does not answer, are left out: those devices
    /// stay unplaced rather than guessed.
    pub(crate) async fn mig_parents(
        &self,
        mig_uuids: &[String],
        until: Instant,
    ) -> BTreeMap<String, String> {
        let mig_uuids = mig_uuids.to_vec();
        let asked = self
            .library
            .run("nvmlDeviceGetHandleByUUID", until, move |state| {
                let Some(Library::Loaded(nvml)) = &state.library else {
                    return BTreeMap::new();
                };
                mig_uuids
                    .iter()
                    .filter_map(|uuid| {
                        calling("nvmlDeviceGetHandleByUUID");
                        let device = nvml.device_by_uuid(uuid.as_str()).ok()?;
                        calling("nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
                        let parent = device.mig_parent_device().ok()?;
                        calling("nvmlDeviceGetUUID");
                        Some((uuid.clone(), parent.uuid().ok()?))
                    })
                    .collect()
            })
            .await;
        asked.unwrap_or_default()
    }

    /// Each NVML reader thread that is in a call now, with the call.
    pub(crate) fn in_calls(&self) -> Vec<(NvmlThread, InCall)> {
        let library = self
            .library
            .in_call()
            .map(|in_call| (NvmlThread::Library, in_call));
        let gpus: Vec<_> = lock(&self.gpus)
            .iter()
            .enumerate()
            .filter_map(|(index, slot)| {
                Some((NvmlThread::Gpu(index as u32), slot.worker.in_call()?))
            })
            .collect();
        library.into_iter().chain(gpus).collect()
    }
}

impl LibraryState {
    /// Load NVML if it is not loaded (and its back-off allows), then make the
    /// library-level calls every look needs.
    fn look(&mut self, loading: &Loading) -> LibraryAnswer {
        let now = Instant::now();
        let must_load = match &self.library {
            None => true,
            Some(Library::Failed { retry_at, .. }) => now >= *retry_at,
            Some(Library::Loaded(_)) => false,
        };
        if must_load {
            self.load(loading, now);
        }
        let nvml = match &self.library {
            Some(Library::Loaded(nvml)) => Arc::clone(nvml),
            Some(Library::Failed { error, reason, .. }) => {
                return LibraryAnswer::Down {
                    error: error.clone(),
                    reason: *reason,
                }
            }
            None => unreachable!("the library was set above"),
        };
        calling("nvmlDeviceGetCount_v2");
        let count = match nvml.device_count() {
            Ok(count) => count,
            Err(error) => {
                // The driver went away under us (unloaded, upgraded): start over.
                tracing::error!(error = %error, "NVML stopped answering; reloading on a later scrape");
                if let Some(xid) = &loading.xid {
                    xid.stop();
                }
                let message = one_line(&Failure::StoppedAnswering(error));
                self.library = Some(Library::Failed {
                    error: message.clone(),
                    reason: NvmlFailure::Failed,
                    retry_at: now + FIRST_RETRY,
                    backoff: FIRST_RETRY,
                });
                return LibraryAnswer::Down {
                    error: message,
                    reason: NvmlFailure::Failed,
                };
            }
        };
        calling("nvmlSystemGetDriverVersion");
        let driver_version = nvml.sys_driver_version().unwrap_or_default();
        LibraryAnswer::Up {
            nvml,
            generation: self.generation,
            count,
            driver_version,
        }
    }

    fn load(&mut self, loading: &Loading, now: Instant) {
        let previous_backoff = match &self.library {
            Some(Library::Failed { backoff, .. }) => Some(*backoff),
            _ => None,
        };
        calling(LOADING);
        self.library = Some(match load(loading.path.as_deref()) {
            Ok(nvml) => {
                self.generation += 1;
                if previous_backoff.is_some() {
                    tracing::info!("NVML loaded after earlier failures");
                }
                let nvml = Arc::new(nvml);
                if let Some(xid) = &loading.xid {
                    xid.start(Arc::clone(&nvml));
                }
                Library::Loaded(nvml)
            }
            Err(failure) => {
                let reason = match &failure {
                    Failure::Open { .. } => NvmlFailure::Missing,
                    Failure::Load { .. } => NvmlFailure::InitFailed,
                    Failure::StoppedAnswering(_) => NvmlFailure::Failed,
                };
                let error = one_line(&failure);
                let backoff = previous_backoff.map_or(FIRST_RETRY, |b| (b * 2).min(MAX_RETRY));
                if previous_backoff.is_none() && loading.lifespan == Lifespan::Serving {
                    // Said once, at start, so that a mistyped path does not pass for a
                    // healthy start: what is served meanwhile, and that it keeps trying.
                    let library = match &loading.path {
                        Some(path) => path.to_string_lossy(),
                        None => SYSTEM_LIBRARY.into(),
                    };
                    tracing::error!(
                        error = %error,
                        "cannot load NVML from {library}; retrying until it loads ({} s, doubling to {} s), serving vram_nvml_up 0 with vram_nvml_error{{error=\"{}\"}} 1 meanwhile, and /-/ready answers 200",
                        FIRST_RETRY.as_secs(),
                        MAX_RETRY.as_secs(),
                        reason.as_str(),
                    );
                } else {
                    tracing::debug!(error = %error, retry_in = ?backoff, "NVML still not loadable");
                }
                Library::Failed {
                    error,
                    reason,
                    retry_at: now + backoff,
                    backoff,
                }
            }
        });
    }
}

/// Where the library was looked for, as [`Failure::Open`] says it.
fn tried(given: bool) -> &'static str {
    if given {
        "the path --nvml.library gives"
    } else {
        "looked up where the dynamic loader looks: ldconfig's cache, LD_LIBRARY_PATH"
    }
}

/// What to do when the library cannot be opened.
fn remedy(given: bool) -> &'static str {
    if given {
        "point --nvml.library at the NVIDIA driver's libnvidia-ml.so.1 (`ldconfig -p | grep libnvidia-ml` shows where it is), or leave the flag out"
    } else {
        "install the NVIDIA driver's NVML library (Debian: libnvidia-ml1; Ubuntu: libnvidia-compute-<driver version>), or give its path with --nvml.library"
    }
}

fn load(path: Option<&std::path::Path>) -> Result<Nvml, Failure> {
    let library = match path {
        Some(path) => path.as_os_str(),
        None => OsStr::new(SYSTEM_LIBRARY),
    };
    Nvml::builder()
        .lib_path(library)
        .init()
        .map_err(|source| match source {
            NvmlError::LibloadingError(loader) => Failure::Open {
                library: library.to_string_lossy().into_owned(),
                given: path.is_some(),
                loader: loader.to_string(),
            },
            source => Failure::Load {
                library: library.to_string_lossy().into_owned(),
                source,
            },
        })
}

/// The call a thread is stuck in, as a reading made at `looked_at` says it.
fn stuck_call(in_call: InCall, looked_at: Instant) -> StuckCall {
    StuckCall {
        call: in_call.call.to_string(),
        stuck_seconds: looked_at
            .saturating_duration_since(in_call.since)
            .as_secs_f64(),
    }
}
