//! The metrics server's own flags.

use crate::units::parse_duration;
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// The port we listen on by default: below the 9100-9999 exporter range, which is fully
/// allocated, and unlike other GPU exporters' ports, so both can run side by side.
pub const DEFAULT_PORT: u16 = 9077;

/// Flags of the metrics server.
#[derive(Debug, Args)]
#[command(next_help_heading = "Web server")]
pub struct WebArgs {
    /// Address to listen on (the help says its forms: rustdoc would read their brackets
    /// as links).
    #[arg(
        long = "web.listen-address",
        value_name = "ADDRESS",
        default_value_t = format!(":{DEFAULT_PORT}"),
        help = "Address to listen on: HOST:PORT, [IPv6]:PORT, or :PORT (or [::]:PORT) for every interface, IPv6 and IPv4 (IPv4 alone on a host without IPv6)"
    )]
    pub listen_address: String,

    /// Path under which to expose metrics.
    #[arg(
        long = "web.telemetry-path",
        value_name = "PATH",
        default_value = "/metrics"
    )]
    pub telemetry_path: String,

    /// Web configuration file in the Prometheus exporter-toolkit format: TLS, client
    /// certificates, basic authentication, extra response headers. Re-read when it or a
    /// file it names changes.
    #[arg(long = "web.config.file", value_name = "FILE")]
    pub config_file: Option<PathBuf>,

    /// Most connections open at once; when all are taken, the connection idle longest
    /// (for a second at least) is closed to make room, or the oldest after its next
    /// response.
    #[arg(long = "web.max-connections", value_name = "N", default_value_t = 64)]
    pub max_connections: usize,

    /// Longest a scrape waits for its collection. A hung NVML or /proc call does not fail
    /// the scrape: what has not answered by its share of this wait is served as not
    /// answering (vram_gpu_error{error="timeout"}), with the rest, as a 200. Only a
    /// collection that overruns it all the same (a starved host) gets 503; later scrapes
    /// wait for the one in flight rather than start another.
    #[arg(long = "web.collection-timeout", value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub collection_timeout: Duration,
}
