//! Ties the flow together: observe -> classify -> render, once per scrape.

use crate::classify::{classify, exporter_process, Report, Settings};
use crate::observe::procfs::OwnProcess;
use crate::observe::{NvmlReading, Observation, ObserveError, PidNamespace, ProcfsView, Source};
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
    /// As `WhenOrphaned`, for a scrape that waits until shortly after this instant: a
    /// scan stops at it, even within its own budget, and says it was cut short.
    WhenOrphanedUntil(Instant),
}

impl HolderScanPolicy {
    /// The instant by which a holder scan must be done, when a scrape waits for it.
    pub fn deadline(self) -> Option<Instant> {
        match self {
            HolderScanPolicy::WhenOrphanedUntil(deadline) => Some(deadline),
            HolderScanPolicy::WhenOrphaned | HolderScanPolicy::Always => None,
        }
    }
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
    /// NVML and the holder scan are not made for concurrent callers: one collection at a time.
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

    /// Observe and classify, scanning for holders as `policy` says.
    ///
    /// A replay file that cannot be read is an error here: one-shot commands report it.
    pub fn try_observe_and_classify(
        &self,
        policy: HolderScanPolicy,
    ) -> Result<Collected, ObserveError> {
        let _one_at_a_time = crate::sync::lock(&self.collecting);
        let started = Instant::now();
        let mut observation = self.source.observe()?;
        let mut report = classify(&observation, &self.settings);
        let scan = match policy {
            HolderScanPolicy::Always => true,
            HolderScanPolicy::WhenOrphaned | HolderScanPolicy::WhenOrphanedUntil(_) => {
                report.orphaned_bytes() > 0
            }
        };
        let mut scan_seconds = None;
        if scan && observation.holder_scan.is_none() {
            let started = Instant::now();
            self.source
                .scan_holders(&mut observation, policy.deadline());
            report = classify(&observation, &self.settings);
            scan_seconds = Some(started.elapsed().as_secs_f64());
        }
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
    pub fn observe_and_classify(&self, policy: HolderScanPolicy) -> Collected {
        match self.try_observe_and_classify(policy) {
            Ok(collected) => collected,
            Err(error) => {
                // The error and its causes, each once, in one line.
                let error = format!("{:#}", anyhow::Error::new(error));
                tracing::error!(error = %error, "cannot observe");
                let observation = Observation {
                    nvml: NvmlReading::Down { error },
                    host_pid_namespace: None,
                    procfs_view: ProcfsView::Own,
                    boot_time_unix_seconds: None,
                    clock_ticks_per_second: 100,
                    owners: BTreeMap::new(),
                    holder_scan: None,
                    procfs_errors: 0,
                    kubernetes: None,
                };
                Collected {
                    report: classify(&observation, &self.settings),
                    observation,
                    scan_seconds: None,
                }
            }
        }
    }

    /// Which PID namespace the exporter runs in; `None` for a replay.
    pub fn host_pid_namespace(&self) -> Option<PidNamespace> {
        self.source.pid_namespace()
    }

    /// The name of the host observed.
    pub fn hostname(&self) -> String {
        self.source.hostname()
    }

    /// A registry whose one collector observes the host afresh on every encode.
    pub fn registry(self: &Arc<Self>) -> Registry {
        self.registry_with(HolderScanPolicy::WhenOrphaned)
    }

    /// Like [`Exporter::registry`], for one scrape that stops waiting at `deadline`.
    pub fn registry_until(self: &Arc<Self>, deadline: Instant) -> Registry {
        self.registry_with(HolderScanPolicy::WhenOrphanedUntil(deadline))
    }

    fn registry_with(self: &Arc<Self>, policy: HolderScanPolicy) -> Registry {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ScrapeCollector {
            exporter: Arc::clone(self),
            policy,
        }));
        registry
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

/// The prometheus-client collector: one fresh observation per encode.
#[derive(Debug)]
struct ScrapeCollector {
    exporter: Arc<Exporter>,
    policy: HolderScanPolicy,
}

impl Collector for ScrapeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let started = Instant::now();
        let exporter = &self.exporter;
        let mut collected = exporter.observe_and_classify(self.policy);
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
        )
    }
}
