//! Where the container engines' sockets are, for every mode.

use crate::cli::values::socket_path;
use crate::observe::containers::{DEFAULT_DOCKER_SOCKET, DEFAULT_PODMAN_SOCKET};
use crate::units::parse_duration;
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// Where the container engines' sockets are, on a Docker or Podman host: they name the
/// container a process runs in (name, image, Compose project or Podman pod). A socket that
/// is not there is left alone; an empty path leaves its engine out.
#[derive(Debug, Args)]
#[command(next_help_heading = "Containers")]
pub struct ContainersArgs {
    /// Docker's Engine API socket.
    #[arg(
        long = "containers.docker-socket",
        value_name = "PATH",
        value_parser = socket_path,
        default_value = DEFAULT_DOCKER_SOCKET,
        global = true
    )]
    pub docker_socket: PathBuf,

    /// Podman's API socket (rootful podman.socket's by default).
    #[arg(
        long = "containers.podman-socket",
        value_name = "PATH",
        value_parser = socket_path,
        default_value = DEFAULT_PODMAN_SOCKET,
        global = true
    )]
    pub podman_socket: PathBuf,

    /// Longest one call to an engine may take. Calls run on a thread of their own, never
    /// during a scrape; check waits for its lookups at most five times this long.
    #[arg(id = "containers.timeout", long = "containers.timeout", value_name = "DURATION", default_value = "1s", value_parser = parse_duration, global = true)]
    pub timeout: Duration,

    /// Whether `--containers.docker-socket` was given on the command line (set from how
    /// the command line was read): an engine named there is expected, and its series are
    /// served even while its socket is absent.
    #[arg(skip)]
    pub docker_given: bool,

    /// Whether `--containers.podman-socket` was given on the command line.
    #[arg(skip)]
    pub podman_given: bool,
}
