//! How memory is judged, and the holder scan.

use crate::units::{parse_bytes, parse_duration};
use clap::Args;
use std::time::Duration;

/// How memory is judged.
#[derive(Debug, Default, Args)]
#[command(next_help_heading = "Judging memory")]
pub struct JudgementArgs {
    /// Driver memory per listed context that no process is charged for (about 9 MiB on an
    /// H200); used memory below this floor per context is not called orphaned. A size
    /// with its unit (B, KiB, MiB, GiB, TiB, kB, MB, GB, TB), e.g. 9MiB [default: 16MiB].
    #[arg(long = "orphan.context-overhead", value_name = "SIZE", value_parser = parse_bytes)]
    pub context_overhead: Option<u64>,

    /// Command name of an NVML client (a monitoring agent) to never name as a holder of
    /// orphaned memory, besides the built-in NVIDIA daemons (repeatable).
    #[arg(long = "holders.ignore-comm", value_name = "NAME")]
    pub ignore_comm: Vec<String>,
}

/// The scan of `/proc/*/fd` for holders of a GPU's device file.
#[derive(Debug, Default, Args)]
#[command(next_help_heading = "Judging memory")]
pub struct ScanArgs {
    /// Time budget of one scan of /proc/*/fd for device-file holders; a scrape's scan also
    /// stops in time for the scrape (85 % of its wait) [default: 2s].
    #[arg(long = "holders.scan-timeout", value_name = "DURATION", value_parser = parse_duration)]
    pub scan_timeout: Option<Duration>,
}
