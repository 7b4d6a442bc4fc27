//! Where the kubelet's sources are, and how often to read them.

use std::path::PathBuf;
use std::time::Duration;

/// The pod-resources socket where the kubelet makes it.
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// Where the kubelet makes one directory per pod.
pub const DEFAULT_POD_LOGS: &str = "/var/log/pods";

/// Where the kubelet's sources are, and how often to read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesConfig {
    /// The pod-resources socket (in a directory mounted from the host).
    pub pod_resources_socket: PathBuf,
    /// The directory of pod log directories.
    pub pod_logs: PathBuf,
    /// Time between two refreshes.
    pub refresh_interval: Duration,
    /// Whether a kubelet is expected here: its paths were given on the command line.
    /// Its sources' series are then served even while it is absent; otherwise they
    /// appear once one of them is found.
    pub expected: bool,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            pod_resources_socket: DEFAULT_POD_RESOURCES_SOCKET.into(),
            pod_logs: DEFAULT_POD_LOGS.into(),
            refresh_interval: Duration::from_secs(10),
            expected: false,
        }
    }
}
