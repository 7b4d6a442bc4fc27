//! Where the container engines' sockets are, and how long one call may take.

use super::reading::Engine;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

/// Docker's socket where dockerd makes it.
pub const DEFAULT_DOCKER_SOCKET: &str = "/var/run/docker.sock";
/// The socket of rootful Podman's API service (`podman.socket`).
pub const DEFAULT_PODMAN_SOCKET: &str = "/run/podman/podman.sock";

/// Where the engines' sockets are; an empty path leaves that engine out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainersConfig {
    /// Docker's Engine API socket.
    pub docker_socket: PathBuf,
    /// Podman's API socket (it serves Docker's API and its own).
    pub podman_socket: PathBuf,
    /// The longest one call to an engine may take.
    pub timeout: Duration,
    /// Time between two checks that an engine answers (`GET /_ping`).
    pub refresh_interval: Duration,
    /// The engines expected here: their sockets were given on the command line. Their
    /// series are served even while the socket is absent; another engine's appear once
    /// its socket is found.
    pub expected: BTreeSet<Engine>,
}

impl Default for ContainersConfig {
    fn default() -> Self {
        ContainersConfig {
            docker_socket: DEFAULT_DOCKER_SOCKET.into(),
            podman_socket: DEFAULT_PODMAN_SOCKET.into(),
            timeout: Duration::from_secs(1),
            refresh_interval: Duration::from_secs(10),
            expected: BTreeSet::new(),
        }
    }
}
