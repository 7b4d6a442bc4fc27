//! What the exporter says of itself: build info, NVML, what it can see of processes,
//! its holder scan, and its own process under the names every exporter serves them by.

use super::encode::{family, flag, gauge, single};
use super::labels::{BuildLabels, CallLabel, ErrorLabel};
use crate::classify::{ExporterProcess, ProcfsView, Report};
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;
use std::fmt;

/// What the exporter says about itself.
#[derive(Debug, Clone)]
pub struct BuildInfo {
    /// Crate version.
    pub version: &'static str,
    /// Source revision it was built from.
    pub revision: &'static str,
}

impl BuildInfo {
    /// This build's version and revision.
    pub fn current() -> BuildInfo {
        BuildInfo {
            version: env!("CARGO_PKG_VERSION"),
            revision: option_env!("VRAM_EXPORTER_REVISION").unwrap_or("unknown"),
        }
    }
}

/// The exporter's own process, under the names every exporter of the ecosystem serves
/// them by (node_exporter's, client_golang's), which dashboards and alerts expect.
pub(super) fn exporter_process(
    encoder: &mut DescriptorEncoder,
    process: &ExporterProcess,
) -> fmt::Result {
    family(
        encoder,
        (
            "process_cpu_seconds",
            "Seconds of CPU time the exporter's process has spent, in user and kernel mode.",
        ),
        MetricType::Counter,
        ConstCounter::new,
        single(process.cpu_seconds),
    )?;
    gauge(
        encoder,
        "process_resident_memory_bytes",
        "Resident memory of the exporter's process, in bytes.",
        single(process.resident_bytes),
    )?;
    gauge(
        encoder,
        "process_virtual_memory_bytes",
        "Virtual memory of the exporter's process, in bytes.",
        single(process.virtual_bytes),
    )?;
    let optional = [
        (
            "process_open_fds",
            "File descriptors the exporter's process has open.",
            process.open_fds,
        ),
        (
            "process_max_fds",
            "Most file descriptors the exporter's process may have open (its soft limit).",
            process.max_fds,
        ),
    ];
    for (name, help, value) in optional {
        if let Some(value) = value {
            gauge(encoder, name, help, single(value))?;
        }
    }
    match process.start_time_seconds {
        Some(start) => gauge(
            encoder,
            "process_start_time_seconds",
            "When the exporter's process started, in seconds since the Unix epoch.",
            single(start),
        ),
        None => Ok(()),
    }
}

/// Build info, NVML, and what the exporter can see of processes.
pub(super) fn exporter_health(
    encoder: &mut DescriptorEncoder,
    report: &Report,
    build: &BuildInfo,
) -> fmt::Result {
    gauge(
        encoder,
        "vram_build_info",
        "Version and revision of the exporter and the driver it talks to; always 1.",
        [(
            BuildLabels {
                version: build.version,
                revision: build.revision,
                driver_version: report.nvml.driver_version().unwrap_or_default().into(),
            },
            1i64,
        )],
    )?;
    gauge(
        encoder,
        "vram_nvml_up",
        "1 when NVML loaded and answered this scrape, 0 when it is missing, failed or does not answer (vram_nvml_error says which).",
        single(flag(report.nvml.is_up())),
    )?;
    gauge(
        encoder,
        "vram_nvml_error",
        "1 for the reason NVML gave no reading (missing, init_failed, not_answering, failed); absent while it answers.",
        report.nvml.failure().map(|kind| {
            (
                ErrorLabel {
                    error: kind.as_str(),
                },
                1i64,
            )
        }),
    )?;
    gauge(
        encoder,
        "vram_nvml_stuck_seconds",
        "Seconds NVML's library-level call (init, device count) has been running, while NVML does not answer; absent otherwise.",
        report.nvml.stuck().map(|stuck| {
            (
                CallLabel {
                    call: stuck.call.clone(),
                },
                stuck.stuck_seconds,
            )
        }),
    )?;
    gauge(
        encoder,
        "vram_host_pid_namespace",
        "1 when the exporter runs in the host PID namespace; 0 means NVML hides other namespaces' processes and unattributed memory is not called orphaned.",
        single(flag(!report.blind())),
    )?;
    gauge(
        encoder,
        "vram_procfs_own_pid_namespace",
        "1 when --path.procfs shows the exporter's own PID namespace, in which NVML names processes; 0 when it shows another, so owners are looked up through NSpid and those not found there are unknown.",
        single(flag(report.procfs_view == ProcfsView::Own)),
    )?;
    gauge(
        encoder,
        "vram_scrape_procfs_unreadable_entries",
        "Entries under /proc that existed but could not be read in this scrape: a gauge, counted afresh each scrape, not a running total.",
        single(report.procfs_errors),
    )?;
    gauge(
        encoder,
        "vram_procfs_stuck_seconds",
        "Seconds a /proc read has been blocked (a process in uninterruptible sleep blocks reads of its memory map), 0 when none is: owners it kept from being read are unknown, and the holder scan is incomplete.",
        single(
            report
                .procfs_stuck
                .as_ref()
                .map_or(0.0, |stuck| stuck.stuck_seconds),
        ),
    )
}

pub(super) fn holder_scan(
    encoder: &mut DescriptorEncoder,
    report: &Report,
    scan_seconds: Option<f64>,
) -> fmt::Result {
    gauge(
        encoder,
        "vram_holder_scan_complete",
        "0 when this scrape's scan for device-file holders was cut short (by its time budget or a blocked /proc read) or denied, so holders may be missing; 1 otherwise, also when no scan was needed.",
        single(flag(report.holders_all_seen())),
    )?;
    gauge(
        encoder,
        "vram_holder_scan_duration_seconds",
        "Seconds this scrape's scan for device-file holders took; 0 when no GPU had orphaned memory.",
        single(scan_seconds.unwrap_or(0.0)),
    )
}
