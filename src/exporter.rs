//! Ties the flow together, once per scrape: [`Exporter::collect`] observes the host
//! (NVML, `/proc`, the holder scan where memory is orphaned, the exporter's own process)
//! and classifies what it saw into a finished [`Report`]; [`Exporter::encode`] then
//! renders that report and nothing else. The `/metrics` handler calls the one, then the
//! other (`web::collections`), and so does `textfile` ([`Exporter::encode_once`]).

use crate::classify::{classify, Report, Settings};
use crate::observe::procfs::OwnProcess;
use crate::observe::{
    one_line, Deadlines, NvmlFailure, NvmlReading, Observation, ObserveError, PidNamespace,
    ProcfsView, Source, Waiting,
};
use crate::render::json::check_document;
use crate::render::prometheus::{encode_report, BuildInfo, RenderOptions, ScrapeTiming};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// When to scan `/proc/*/fd` for device-file holders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HolderScanPolicy {
    /// Only when some GPU has orphaned memory: the scan reads every process's descriptors.
    WhenOrphaned,
    /// Every time (for `check` and `snapshot`).
    Always,
}

/// Exposition formats we can serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Format {
    /// Prometheus text format 0.0.4.
    PrometheusText,
    /// OpenMetrics text 1.0.0.
    OpenMetrics,
    /// The verdict as JSON, the document `check --json` prints, for every GPU.
    Verdict,
}

impl Format {
    /// The `Content-Type` header of this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::PrometheusText => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Verdict => "application/json",
        }
    }
}

/// One collection: what was seen, the verdict, and the time it took.
#[derive(Debug)]
pub struct Collection {
    /// What was seen.
    pub observation: Observation,
    /// The verdict.
    pub report: Report,
    /// Seconds spent scanning for holders in this collection (`None` when it made none;
    /// a replayed scan is not this one's).
    pub scan_seconds: Option<f64>,
    /// Seconds the whole collection took: observing, the holder scan and classifying.
    pub seconds: f64,
}

/// The exporter's state: where it looks and how it judges.
#[derive(Debug)]
pub struct Exporter {
    source: Source,
    settings: Settings,
    options: RenderOptions,
    build: BuildInfo,
    /// One collection at a time: each GPU and `/proc` has one reader thread, and a second
    /// collection would find it busy with the first's calls and report it stuck. Every
    /// collection ends by its deadline, so the next waits no longer than that.
    collecting: tokio::sync::Mutex<()>,
    /// The exporter's own process, read for its `process_*` series: a server's only.
    own_process: Option<OwnProcess>,
    /// The size of the last body encoded: the next is about as large, so its buffer is
    /// allocated once instead of grown by doubling.
    last_body_bytes: AtomicUsize,
}

impl Exporter {
    /// An exporter reading from `source`.
    pub fn new(source: Source, settings: Settings, options: RenderOptions) -> Exporter {
        Exporter {
            source,
            settings,
            options,
            build: BuildInfo::current(),
            collecting: tokio::sync::Mutex::const_new(()),
            own_process: None,
            last_body_bytes: AtomicUsize::new(16 * 1024),
        }
    }

    /// Also serves the `process_*` series of this process, read from `/proc/self` in
    /// each collection. For a server: a one-shot command's figures would describe a
    /// process that has exited by the time anyone reads them.
    pub fn with_own_process(mut self) -> Exporter {
        self.own_process = Some(OwnProcess::new(std::path::Path::new("/proc")));
        self
    }

    /// A scrape's collection, done by `until`: observe, scan for holders where memory is
    /// orphaned, classify. A replay file that cannot be read is served as NVML being
    /// down, with the reason in the log. Its waits are awaited: the calls that block run
    /// on the readers' threads (see `observe::worker`).
    pub async fn collect(&self, until: Instant) -> Collection {
        let started = Instant::now();
        match self
            .try_observe_and_classify(HolderScanPolicy::WhenOrphaned, until)
            .await
        {
            Ok(collection) => collection,
            Err(error) => {
                let error = one_line(&error);
                tracing::error!(error = %error, "cannot observe");
                let observation = Observation {
                    own_process: self.read_own_process(),
                    ..nvml_down(error)
                };
                Collection {
                    report: classify(&observation, &self.settings),
                    observation,
                    scan_seconds: None,
                    seconds: started.elapsed().as_secs_f64(),
                }
            }
        }
    }

    /// Observe and classify, scanning for holders as `policy` says, done by `until`: a
    /// source that has not answered by its share of the time is reported as such (see
    /// [`Deadlines`]).
    ///
    /// A replay file that cannot be read is an error here: one-shot commands report it.
    pub async fn try_observe_and_classify(
        &self,
        policy: HolderScanPolicy,
        until: Instant,
    ) -> Result<Collection, ObserveError> {
        let started = Instant::now();
        let _one_at_a_time = self.collecting.lock().await;
        let deadlines = Deadlines::between(started, until);
        let mut observation = self.source.observe(&deadlines).await?;
        // Read here, not on the /proc reader thread: only this process's own stat, limits
        // and descriptor directory, which no other process and no call stuck in the driver
        // can hold a lock on, within a budget of their own (see `OwnProcess::read`).
        observation.own_process = self.read_own_process();
        // Whether to scan is a verdict of its own only when it depends on one.
        let before_scan = match policy {
            HolderScanPolicy::Always => None,
            HolderScanPolicy::WhenOrphaned => Some(classify(&observation, &self.settings)),
        };
        let scan = observation.holder_scan.is_none()
            && before_scan
                .as_ref()
                .is_none_or(|report| report.orphaned_bytes() > 0);
        let mut scan_seconds = None;
        if scan {
            let started = Instant::now();
            self.source.scan_holders(&mut observation, &deadlines).await;
            scan_seconds = Some(started.elapsed().as_secs_f64());
        }
        let report = match before_scan {
            Some(report) if !scan => report,
            _ => classify(&observation, &self.settings),
        };
        let collection = Collection {
            observation,
            report,
            scan_seconds,
            seconds: started.elapsed().as_secs_f64(),
        };
        self.log_collection(&collection);
        Ok(collection)
    }

    fn read_own_process(&self) -> Option<crate::observe::procfs::OwnProcessReading> {
        self.own_process.as_ref().and_then(OwnProcess::read)
    }

    /// One debug line per collection: what a person debugging a scrape asks first.
    fn log_collection(&self, collection: &Collection) {
        let Collection {
            observation,
            report,
            scan_seconds,
            seconds,
        } = collection;
        let source = match &self.source {
            Source::Live(_) => "live".to_string(),
            Source::Replay(path) => format!("replay of {}", path.display()),
        };
        // A scan this collection made, one its snapshot recorded, or none.
        let holder_scan = match (scan_seconds, &report.holder_scan) {
            (Some(_), _) => "made",
            (None, Some(_)) => "replayed",
            (None, None) => "none",
        };
        tracing::debug!(
            seconds = *seconds,
            gpus = report.gpus.len(),
            owners = observation.owners.len(),
            orphaned_bytes = report.orphaned_bytes(),
            holder_scan,
            scan_seconds = *scan_seconds,
            scan_complete = report.holder_scan.map(|scan| scan.complete()),
            holders = observation.holder_scan.as_ref().map(|scan| scan.holders.len()),
            source = %source,
            "collected"
        );
    }

    /// `collection`'s report in `format`, with its timing; the collection comes back
    /// whole, for a caller whose exit status depends on its report, and for a server to
    /// free after the body has gone out rather than before. Renders what was collected
    /// and reads nothing: the registry's one collector holds the finished report.
    pub fn encode(&self, collection: Collection, format: Format) -> (String, Collection) {
        if format == Format::Verdict {
            return (verdict_json(&collection.report), collection);
        }
        let report = Arc::new(collection.report);
        let registry = report_registry(
            Arc::clone(&report),
            ScrapeTiming {
                total_seconds: collection.seconds,
                scan_seconds: collection.scan_seconds,
            },
            self.build.clone(),
            self.options,
        );
        let expected = self.last_body_bytes.load(Ordering::Relaxed);
        let body = encode_sized(&registry, format, expected + expected / 8);
        self.last_body_bytes.store(body.len(), Ordering::Relaxed);
        drop(registry);
        let report = Arc::try_unwrap(report).unwrap_or_else(|shared| (*shared).clone());
        (
            body,
            Collection {
                report,
                ..collection
            },
        )
    }

    /// One collection encoded in `format`, done by `until`, with its report: for a
    /// one-shot command whose exit status says what the file it writes carries.
    pub fn encode_once(&self, until: Instant, format: Format) -> (String, Report) {
        let (body, collection) = self.encode(self.collect_blocking(until), format);
        (body, collection.report)
    }

    /// [`Exporter::collect`] for a caller that is not a task (a one-shot command): its
    /// waits block this thread.
    pub fn collect_blocking(&self, until: Instant) -> Collection {
        crate::observe::block_on(self.collect(until))
    }

    /// [`Exporter::try_observe_and_classify`] for a caller that is not a task.
    pub fn try_observe_and_classify_blocking(
        &self,
        policy: HolderScanPolicy,
        until: Instant,
    ) -> Result<Collection, ObserveError> {
        crate::observe::block_on(self.try_observe_and_classify(policy, until))
    }

    /// Loads NVML now without waiting, so that a server logs a missing NVML at start.
    pub fn start_loading_nvml(&self) {
        self.source.start_loading_nvml();
    }

    /// The reader threads in a call now (what a look is waiting for); none for a replay.
    pub fn waiting(&self) -> Vec<Waiting> {
        self.source.waiting()
    }

    /// Which PID namespace the exporter runs in; `None` for a replay.
    pub fn host_pid_namespace(&self) -> Option<PidNamespace> {
        self.source.pid_namespace()
    }

    /// Whose PIDs the procfs read shows; `None` for a replay.
    pub fn procfs_view(&self) -> Option<ProcfsView> {
        self.source.procfs_view()
    }

    /// The name of the host observed.
    pub fn hostname(&self) -> String {
        self.source.hostname()
    }
}

/// What a collection that could not observe says: NVML down, for `error`.
fn nvml_down(error: String) -> Observation {
    Observation {
        nvml: NvmlReading::Down {
            error,
            reason: NvmlFailure::Failed,
            stuck: None,
        },
        host_pid_namespace: None,
        procfs_view: ProcfsView::Own,
        boot_time_unix_seconds: None,
        clock_ticks_per_second: 100,
        taken_at_unix_seconds: None,
        taken_at_unix_millis: None,
        owners: BTreeMap::new(),
        holder_scan: None,
        procfs_errors: 0,
        procfs_stuck: None,
        kubernetes: None,
        slurm: None,
        containers: None,
        witness: None,
        own_process: None,
    }
}

/// The verdict on every GPU of `report` as `check --json` prints it.
fn verdict_json(report: &Report) -> String {
    let every_gpu = report
        .select(&[])
        .expect("a selection of no GPU in particular takes them all");
    let mut json = serde_json::to_string_pretty(&check_document(&every_gpu))
        .expect("encoding a verdict into a String");
    json.push('\n');
    json
}

/// Encode `registry` in `format`.
pub fn encode(registry: &Registry, format: Format) -> String {
    encode_sized(registry, format, 16 * 1024)
}

/// Encode `registry` in `format` into a buffer of `capacity` bytes.
fn encode_sized(registry: &Registry, format: Format, capacity: usize) -> String {
    let mut body = String::with_capacity(capacity);
    let result = match format {
        Format::PrometheusText | Format::Verdict => {
            prometheus_client::encoding::prometheus_text::encode(&mut body, registry)
        }
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut body, registry),
    };
    // Writing into a String cannot fail; an error would be a bug in the encoder.
    result.expect("encoding metrics into a String");
    body
}

/// The registry [`Exporter::encode`] encodes: its one collector renders `report` and reads
/// nothing. Public for the benches, which encode a fixed report through it.
pub fn report_registry(
    report: Arc<Report>,
    timing: ScrapeTiming,
    build: BuildInfo,
    options: RenderOptions,
) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(FinishedReport {
        report,
        timing,
        build,
        options,
    }));
    registry
}

/// The prometheus-client collector of one finished report: it renders the report and
/// reads nothing.
#[derive(Debug)]
struct FinishedReport {
    report: Arc<Report>,
    timing: ScrapeTiming,
    build: BuildInfo,
    options: RenderOptions,
}

impl Collector for FinishedReport {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_report(
            &mut encoder,
            &self.report,
            &self.build,
            &self.options,
            self.timing,
        )
    }
}
