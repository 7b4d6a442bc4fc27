//! The flags of each subcommand: its own, how long its look waits, and the groups it
//! shares.

use super::{CollectorArgs, JudgementArgs, SharedArgs, Without};
use crate::cli::values::{parse_gpu, GpuArg};
use crate::units::parse_duration;
use clap::{Args, ValueEnum};
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

/// How `--gpu` numbers the GPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Numbering {
    /// NVML's index, as nvidia-smi numbers them.
    #[default]
    Nvml,
    /// The minor number of the device file, /dev/nvidia<N>: Slurm's GPU IDs where
    /// gres.conf lists /dev/nvidia0 to /dev/nvidia<N-1> (or AutoDetect finds them).
    Minor,
}

/// Which exit statuses `check` ends with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum ExitCodes {
    /// A status per finding (the table below).
    #[default]
    Detailed,
    /// 0 OK, 1 a problem, 3 unknown: what node-problem-detector's custom plugins and
    /// Nagios-style checks read.
    Plugin,
}

/// The verdict a plugin's rule is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnlyVerdict {
    /// Orphaned memory.
    Orphaned,
    /// Memory left behind by workers, or a kill stuck in the driver.
    LeftBehind,
    /// In use outside the running jobs (with --foreign).
    InUse,
    /// Memory that cannot be judged, a look that did not complete, NVML missing.
    CannotTell,
}

/// Flags of `check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Print JSON for scripts instead of the table.
    #[arg(long, conflicts_with = "summary")]
    pub json: bool,

    /// Print the verdict in one line of at most 80 bytes on standard output (for a
    /// drain reason, a node condition, a Nagios status) and the tables and verdicts on
    /// standard error.
    #[arg(long)]
    pub summary: bool,

    /// Only look at these GPUs: indices (see --gpu.numbering), UUIDs (GPU-...), or a
    /// comma list of them, e.g. --gpu "$SLURM_JOB_GPUS" (repeatable).
    #[arg(long = "gpu", value_name = "GPU", value_delimiter = ',', value_parser = parse_gpu)]
    pub gpus: Vec<GpuArg>,

    /// What --gpu's numbers are.
    #[arg(
        long = "gpu.numbering",
        value_name = "NUMBERING",
        value_enum,
        default_value_t
    )]
    pub numbering: Numbering,

    /// Also count memory that live processes in no running Slurm job hold (exit status
    /// 5): a Slurm prolog's or health check's look at GPUs a job is about to get.
    #[arg(long)]
    pub foreign: bool,

    /// Which exit statuses to end with.
    #[arg(
        long = "exit-codes",
        value_name = "CONVENTION",
        value_enum,
        default_value_t
    )]
    pub exit_codes: ExitCodes,

    /// With --exit-codes plugin: 1 for this verdict alone, 0 for anything else (never
    /// 3), and the summary names a GPU with it: a node-problem-detector rule per verdict,
    /// each with its own reason.
    #[arg(long = "only-verdict", value_name = "VERDICT", value_enum)]
    pub only_verdict: Option<OnlyVerdict>,

    /// Poll until no GPU has orphaned memory or this much time has passed (e.g. 30s).
    /// Memory being freed is waited for too; it returns as soon as the memory is free.
    /// The whole command ends within --wait and twice --timeout (the first and the last
    /// look).
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

/// The argument of `copy-to`.
#[derive(Debug, Args)]
pub struct CopyToArgs {
    /// The folder (an emptyDir the sidecar mounts); the copy is FOLDER/vram-exporter.
    #[arg(value_name = "FOLDER")]
    pub folder: PathBuf,
}
