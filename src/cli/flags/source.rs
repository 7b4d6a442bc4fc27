//! Where to look: the procfs, NVML, or a snapshot to replay instead, and the hidden
//! flags with which tests and benchmarks point them at fixtures.

use clap::Args;
use std::path::PathBuf;

/// Where observations come from.
#[derive(Debug, Default, Args)]
#[command(next_help_heading = "Where to look")]
pub struct SourceArgs {
    /// procfs mount point (use the host's /proc, e.g. /host/proc, inside a container)
    /// [default: /proc].
    #[arg(long = "path.procfs", value_name = "PATH")]
    pub procfs: Option<PathBuf>,

    /// Directory of the witness state: what a serving exporter saw that a later look
    /// cannot (a server's parent alive, a kill pending), which check beside it and the
    /// exporter after a restart read [default: /run/vram-exporter].
    #[arg(long = "path.state", value_name = "DIR")]
    pub state: Option<PathBuf>,

    /// NVML library to load [default: the system's libnvidia-ml.so.1].
    #[arg(long = "nvml.library", value_name = "PATH")]
    pub nvml_library: Option<PathBuf>,

    /// Read the observation from a snapshot file instead of the system.
    #[arg(long = "replay", value_name = "FILE")]
    pub replay: Option<PathBuf>,

    /// Read --path.procfs as a tree of files standing in for a procfs: it is not refused
    /// for not being one, and, without a `self` entry, shows this process's own PID
    /// namespace. Tests point it at a tree they write for what no process can be made to
    /// do without a GPU driver.
    #[arg(long = "test.procfs-stand-in", hide = true)]
    pub procfs_stand_in: bool,

    /// Byte prefix of NVIDIA device paths; tests point it at files they create.
    #[arg(long = "test.device-prefix", hide = true)]
    pub device_prefix: Option<PathBuf>,

    /// The driver's table of MIG capability minors [default: PROCFS/driver/nvidia-caps/mig-minors];
    /// tests point it at a fixture.
    #[arg(long = "test.mig-minors", hide = true)]
    pub mig_minors: Option<PathBuf>,

    /// Read the GPUs one after another rather than side by side; only the benchmark that
    /// measures what reading them side by side saves uses it.
    #[arg(long = "test.nvml-one-gpu-at-a-time", hide = true)]
    pub one_gpu_at_a_time: bool,
}
