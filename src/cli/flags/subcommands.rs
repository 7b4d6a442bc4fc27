//! The flags of each subcommand: its own, how long its look waits, and the groups it
//! shares.

use super::{CollectorArgs, JudgementArgs, SharedArgs, Without};
use crate::units::parse_duration;
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// How long a one-shot command waits for NVML and `/proc`.
#[derive(Debug, Default, Args)]
pub struct TimeoutArgs {
    /// Longest one look waits for NVML and /proc: the GPUs are read side by side, NVML is
    /// waited for during half of it, and a GPU (or NVML, or a /proc read) that has not
    /// answered by then is reported as not answering while the rest is judged as usual
    /// [default: 30s].
    #[arg(long = "timeout", value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
}

/// Flags of `check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Print JSON for scripts instead of the table.
    #[arg(long)]
    pub json: bool,

    /// Only look at this GPU index (repeatable).
    #[arg(long = "gpu", value_name = "INDEX")]
    pub gpus: Vec<u32>,

    /// Poll until no GPU has orphaned memory or this much time has passed (e.g. 30s).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub wait: Option<Duration>,

    /// Time between two looks while waiting.
    #[arg(long = "wait.interval", value_name = "DURATION", default_value = "250ms", value_parser = parse_duration)]
    pub wait_interval: Duration,

    /// How long one look waits.
    #[command(flatten)]
    pub timeout: TimeoutArgs,

    /// Where to look, how to judge, the scan and logging.
    #[command(flatten)]
    pub shared: SharedArgs<JudgementArgs, Without>,
}

/// Flags of `snapshot`: what it records is facts, so nothing about judging them.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// File to write [default: standard output].
    #[arg(long, short)]
    pub output: Option<PathBuf>,

    /// How long the look waits.
    #[command(flatten)]
    pub timeout: TimeoutArgs,

    /// Where to look, the scan and logging.
    #[command(flatten)]
    pub shared: SharedArgs<Without, Without>,
}

/// Flags of `textfile`: the server's metrics, without the server.
#[derive(Debug, Args)]
pub struct TextfileArgs {
    /// File to write, e.g. /var/lib/prometheus/node-exporter/vram-exporter.prom.
    #[arg(long, short)]
    pub output: PathBuf,

    /// How long the look waits.
    #[command(flatten)]
    pub timeout: TimeoutArgs,

    /// The server's shared flags.
    #[command(flatten)]
    pub shared: SharedArgs<JudgementArgs, CollectorArgs>,
}
