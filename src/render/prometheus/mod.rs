//! Render a [`Report`] as Prometheus metrics through prometheus-client's encoders, one
//! function per group of metric families. Every label set is a typed struct (its fields
//! in the order the labels are written); every figure and every label value comes from
//! the classifier.

mod encode;
mod exporter;
mod gpus;
mod health;
mod labels;
mod mig;
mod sources;

use encode::{gauge, single};
pub use exporter::BuildInfo;
use exporter::{exporter_health, exporter_process, holder_scan};
pub use gpus::MAX_HOLDER_SERIES_PER_GPU;
use gpus::{gpu_identity, left_behind, memory, orphans, owners, per_process};
use health::encode_gpu_health;
use mig::{encode_instance_verdicts, encode_mig};
use sources::{encode_container_engines, encode_kubernetes};

use crate::classify::Report;
use prometheus_client::encoding::DescriptorEncoder;
use std::fmt;

/// Choices that change which series are rendered.
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderOptions {
    /// Emit `vram_process_used_bytes` for at most this many processes; `None` for none.
    pub per_process_limit: Option<usize>,
}

/// What one scrape spent its time on.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScrapeTiming {
    /// Seconds spent reading NVML and /proc and classifying.
    pub total_seconds: f64,
    /// Seconds of that spent on the holder scan; `None` when this scrape made none (a
    /// replayed snapshot's scan was not made now).
    pub scan_seconds: Option<f64>,
}

/// Encode every series for one report.
pub fn encode_report(
    encoder: &mut DescriptorEncoder,
    report: &Report,
    build: &BuildInfo,
    options: &RenderOptions,
    timing: ScrapeTiming,
) -> fmt::Result {
    let measured: Vec<_> = report
        .gpus
        .iter()
        .filter_map(|gpu| gpu.account().map(|account| (gpu, account)))
        .collect();
    exporter_health(encoder, report, build)?;
    gpu_identity(encoder, &report.gpus)?;
    memory(encoder, &measured)?;
    owners(encoder, &measured)?;
    orphans(encoder, &measured)?;
    left_behind(encoder, &measured)?;
    holder_scan(encoder, report, timing.scan_seconds)?;
    if let Some(limit) = options.per_process_limit {
        per_process(encoder, &measured, limit)?;
    }
    if let Some(kubernetes) = &report.kubernetes {
        encode_kubernetes(encoder, kubernetes)?;
    }
    if let Some(engines) = &report.container_engines {
        encode_container_engines(encoder, engines)?;
    }
    let measured_instances: Vec<_> = report
        .gpus
        .iter()
        .flat_map(|gpu| {
            gpu.instances
                .iter()
                .filter_map(move |instance| Some((gpu, instance, instance.account()?)))
        })
        .collect();
    encode_mig(encoder, &report.gpus, &measured_instances)?;
    encode_instance_verdicts(encoder, &measured_instances)?;
    encode_gpu_health(encoder, &report.gpus)?;
    gauge(
        encoder,
        "vram_scrape_duration_seconds",
        "Seconds this scrape spent reading NVML and /proc and classifying.",
        single(timing.total_seconds),
    )?;
    match &report.exporter_process {
        Some(process) => exporter_process(encoder, process),
        None => Ok(()),
    }
}
