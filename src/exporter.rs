//! Ties the flow together: observe -> classify -> render, once per scrape.

use crate::classify::{classify, exporter_process, Report, Settings};
use crate::observe::procfs::OwnProcess;
use crate::observe::{
    one_line, Deadlines, NvmlFailure, NvmlReading, Observation, ObserveError, PidNamespace,
    ProcfsView, Source, Waiting,
};
use crate::render::prometheus::{encode_report, BuildInfo, RenderOptions, ScrapeTiming};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
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
}

impl Format {
    /// The `Content-Type` header of this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::PrometheusText => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// One collection: what was seen, the verdict, and the time this collection spent on
/// the holder scan (`None` when it made none; a replayed scan is not this one's).
#[derive(Debug)]
pub struct Collected {
    /// What was seen.
    pub observation: Observation,
    /// The verdict.
    pub report: Report,
    /// Seconds spent scanning for holders in this collection.
    pub scan_seconds: Option<f64>,
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
    collecting: Mutex<()>,
    /// The exporter's own process, read for its `process_*` series: a server's only.
    own_process: Option<OwnProcess>,
}

impl Exporter {
    /// An exporter reading from `source`.
    pub fn new(source: Source, settings: Settings, options: RenderOptions) -> Exporter {
        Exporter {
            source,
            settings,
            options,
            build: BuildInfo::current(),
            collecting: Mutex::new(()),
            own_process: None,
        }
    }

    /// Also serves the `process_*` series of this process, read from `/proc/self` after
    /// each collection. For a server: a one-shot command's figures would describe a
    /// process that has exited by the time anyone reads them.
    pub fn with_own_process(mut self) -> Exporter {
        self.own_process = Some(OwnProcess::new(std::path::Path::new("/proc")));
        self
    }

    /// Observe and classify, scanning for holders as `policy` says, done by `until`: a
    /// source that has not answered by its share of the time is reported as such (see
    /// [`Deadlines`]).
    ///
    /// A replay file that cannot be read is an error here: one-shot commands report it.
    pub fn try_observe_and_classify(
        &self,
        policy: HolderScanPolicy,
        until: Instant,
    ) -> Result<Collected, ObserveError> {
        let _one_at_a_time = crate::sync::lock(&self.collecting);
        let started = Instant::now();
        let deadlines = Deadlines::between(started, until);
        let mut observation = self.source.observe(&deadlines)?;
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
            self.source.scan_holders(&mut observation, &deadlines);
            scan_seconds = Some(started.elapsed().as_secs_f64());
        }
        let report = match before_scan {
            Some(report) if !scan => report,
            _ => classify(&observation, &self.settings),
        };
        let collected = Collected {
            observation,
            report,
            scan_seconds,
        };
        self.log_collection(&collected, started);
        Ok(collected)
    }

    /// One debug line per collection: what a person debugging a scrape asks first.
    fn log_collection(&self, collected: &Collected, started: Instant) {
        let Collected {
            observation,
            report,
            scan_seconds,
        } = collected;
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
            seconds = started.elapsed().as_secs_f64(),
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

    /// Like [`Exporter::try_observe_and_classify`], for a scrape: a replay file that
    /// cannot be read is served as NVML being down, with the reason in the log.
    pub fn observe_and_classify(&self, policy: HolderScanPolicy, until: Instant) -> Collected {
        match self.try_observe_and_classify(policy, until) {
            Ok(collected) => collected,
            Err(error) => {
                // The error and its causes, each once, in one line.
                let error = one_line(&error);
                tracing::error!(error = %error, "cannot observe");
                let observation = Observation {
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
                    owners: BTreeMap::new(),
                    holder_scan: None,
                    procfs_errors: 0,
                    procfs_stuck: None,
                    kubernetes: None,
                    slurm: None,
                    containers: None,
                };
                Collected {
                    report: classify(&observation, &self.settings),
                    observation,
                    scan_seconds: None,
                }
            }
        }
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

    /// The name of the host observed.
    pub fn hostname(&self) -> String {
        self.source.hostname()
    }

    /// A registry whose one collector observes the host afresh on every encode, for a
    /// collection that must be done by `until` (a scrape's wait, `textfile --timeout`).
    pub fn registry_until(self: &Arc<Self>, until: Instant) -> Registry {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ScrapeCollector {
            exporter: Arc::clone(self),
            until,
            keep: None,
        }));
        registry
    }
}

impl Exporter {
    /// One collection encoded in `format`, done by `until`, with its report: for a
    /// one-shot command whose exit status says what the file it writes carries.
    pub fn encode_once(self: &Arc<Self>, until: Instant, format: Format) -> (String, Report) {
        let kept = Arc::new(Mutex::new(None));
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ScrapeCollector {
            exporter: Arc::clone(self),
            until,
            keep: Some(Arc::clone(&kept)),
        }));
        let body = encode(&registry, format);
        let report = crate::sync::lock(&kept)
            .take()
            .expect("encoding a registry runs its collector");
        (body, report)
    }
}

/// Encode `registry` in `format`.
pub fn encode(registry: &Registry, format: Format) -> String {
    let mut body = String::with_capacity(16 * 1024);
    let result = match format {
        Format::PrometheusText => {
            prometheus_client::encoding::prometheus_text::encode(&mut body, registry)
        }
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut body, registry),
    };
    // Writing into a String cannot fail; an error would be a bug in the encoder.
    result.expect("encoding metrics into a String");
    body
}

/// The prometheus-client collector: one fresh observation per encode, scanning for
/// holders only where memory is orphaned.
#[derive(Debug)]
struct ScrapeCollector {
    exporter: Arc<Exporter>,
    until: Instant,
    /// Where to keep the report of the collection, when someone wants it.
    keep: Option<Arc<Mutex<Option<Report>>>>,
}

impl Collector for ScrapeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let started = Instant::now();
        let exporter = &self.exporter;
        let mut collected =
            exporter.observe_and_classify(HolderScanPolicy::WhenOrphaned, self.until);
        // Read here, not on the /proc reader thread: only this process's own stat, limits
        // and descriptor directory, which no other process and no call stuck in the driver
        // can hold a lock on, within a budget of their own (see `OwnProcess::read`).
        collected.report.exporter_process = exporter
            .own_process
            .as_ref()
            .and_then(OwnProcess::read)
            .map(|reading| exporter_process(&reading));
        let timing = ScrapeTiming {
            total_seconds: started.elapsed().as_secs_f64(),
            scan_seconds: collected.scan_seconds,
        };
        encode_report(
            &mut encoder,
            &collected.report,
            &exporter.build,
            &exporter.options,
            timing,
        )?;
        if let Some(keep) = &self.keep {
            *crate::sync::lock(keep) = Some(collected.report);
        }
        Ok(())
    }
}
