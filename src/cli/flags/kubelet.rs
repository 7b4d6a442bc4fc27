//! Where the kubelet's sources are, for every mode.

use crate::observe::kubernetes::{DEFAULT_POD_LOGS, DEFAULT_POD_RESOURCES_SOCKET};
use crate::units::parse_duration;
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// Where the kubelet's sources are, on a Kubernetes node: they name the pod each GPU is
/// assigned to and the pod a process runs in. Without them nothing else changes.
#[derive(Debug, Args)]
#[command(next_help_heading = "Kubernetes")]
pub struct KubeletArgs {
    /// The kubelet's pod-resources socket, which says which container each GPU is assigned
    /// to. In a container, mount its directory rather than the socket: a restarted kubelet
    /// makes a new socket.
    #[arg(
        long = "kubelet.pod-resources-path",
        value_name = "PATH",
        default_value = DEFAULT_POD_RESOURCES_SOCKET,
        global = true
    )]
    pub pod_resources_path: PathBuf,

    /// Time between two reads of the pod-resources socket and the pod log directories
    /// (never during a scrape).
    #[arg(long = "kubelet.refresh-interval", value_name = "DURATION", default_value = "10s", value_parser = parse_duration, global = true)]
    pub refresh_interval: Duration,

    /// The kubelet's pod log directories (NAMESPACE_POD_UID), which name the pod whose uid
    /// a process's cgroup carries.
    #[arg(
        long = "path.pod-logs",
        value_name = "PATH",
        default_value = DEFAULT_POD_LOGS,
        global = true
    )]
    pub pod_logs: PathBuf,

    /// Whether either path was given on the command line (not a flag: set from how the
    /// command line was read). A kubelet named there is expected, and its series are
    /// served even while it is absent; one found at the default paths shows once found.
    #[arg(skip)]
    pub given: bool,
}
