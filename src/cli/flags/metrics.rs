//! Optional metric families.

use clap::Args;

/// Optional metric families.
#[derive(Debug, Default, Args)]
#[command(next_help_heading = "Metrics")]
pub struct CollectorArgs {
    /// Also export vram_process_used_bytes per process (one series per PID: label churn).
    #[arg(long = "collector.processes")]
    pub per_process: bool,

    /// At most this many vram_process_used_bytes series per scrape [default: 256].
    #[arg(long = "collector.processes.limit", value_name = "N")]
    pub per_process_limit: Option<usize>,
}
