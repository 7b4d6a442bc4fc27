//! Command-line flags (node_exporter's naming), resolved into a plain [`Config`].

use crate::classify::Settings;
use crate::units::{parse_bytes, parse_duration};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

/// The port we listen on by default: below the 9100-9999 exporter range, which is fully
/// allocated, and unlike other GPU exporters' ports, so both can run side by side.
pub const DEFAULT_PORT: u16 = 9077;

/// Tells GPU memory owned by a live process from memory that no live process owns.
///
/// Without a subcommand it serves Prometheus metrics. `check` explains one GPU host to a
/// person, `snapshot` saves what it sees for a bug report, and `textfile` writes the
/// metrics once for node_exporter's textfile collector.
#[derive(Debug, Parser)]
#[command(name = "vram-exporter", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub common: CommonArgs,

    #[command(flatten)]
    pub web: WebArgs,
}

/// Subcommands; serving metrics is the default.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Explain each GPU's memory: who owns it, what is orphaned, and what would free it.
    ///
    /// Exit status: 0 when no GPU has orphaned memory, 1 when one has, 2 on error.
    Check(CheckArgs),
    /// Write what the exporter sees (NVML and /proc facts) as JSON, for a bug report.
    Snapshot(SnapshotArgs),
    /// Write the metrics once to a file, atomically, for node_exporter's textfile collector.
    Textfile(TextfileArgs),
}

/// Flags every mode shares.
#[derive(Debug, Args)]
pub struct CommonArgs {
    /// procfs mount point (use the host's /proc, e.g. /host/proc, inside a container).
    #[arg(
        long = "path.procfs",
        value_name = "PATH",
        default_value = "/proc",
        global = true
    )]
    pub procfs: PathBuf,

    /// NVML library to load [default: the system's libnvidia-ml.so.1].
    #[arg(long = "nvml.library", value_name = "PATH", global = true)]
    pub nvml_library: Option<PathBuf>,

    /// Read the observation from a snapshot file instead of the system.
    #[arg(long = "replay", value_name = "FILE", global = true)]
    pub replay: Option<PathBuf>,

    /// Driver memory per listed context that no process is charged for (about 9 MiB on an
    /// H200); used memory below this floor per context is not called orphaned.
    #[arg(long = "orphan.context-overhead", value_name = "SIZE", default_value = "16MiB", value_parser = parse_bytes, global = true)]
    pub context_overhead: u64,

    /// Time budget of one scan of /proc/*/fd for device-file holders.
    #[arg(long = "holders.scan-timeout", value_name = "DURATION", default_value = "2s", value_parser = parse_duration, global = true)]
    pub scan_timeout: Duration,

    /// Command name of an NVML client (a monitoring agent) to never name as a holder of
    /// orphaned memory, besides the built-in NVIDIA daemons (repeatable).
    #[arg(long = "holders.ignore-comm", value_name = "NAME", global = true)]
    pub ignore_comm: Vec<String>,

    /// Only log messages at or above this level.
    #[arg(long = "log.level", value_enum, default_value_t = LogLevel::Info, global = true)]
    pub log_level: LogLevel,

    /// Log line format.
    #[arg(long = "log.format", value_enum, default_value_t = LogFormat::Logfmt, global = true)]
    pub log_format: LogFormat,

    /// Byte prefix of NVIDIA device paths; tests point it at files they create.
    #[arg(long = "test.device-prefix", hide = true, global = true)]
    pub device_prefix: Option<PathBuf>,

    /// The driver's table of MIG capability minors [default: PROCFS/driver/nvidia-caps/mig-minors];
    /// tests point it at a fixture.
    #[arg(long = "test.mig-minors", hide = true, global = true)]
    pub mig_minors: Option<PathBuf>,
}

/// Flags of the metrics server (and what `textfile` renders).
#[derive(Debug, Args)]
pub struct WebArgs {
    /// Address to listen on: HOST:PORT, [IPv6]:PORT, or :PORT for all IPv4 interfaces.
    #[arg(long = "web.listen-address", value_name = "ADDRESS", default_value_t = format!(":{DEFAULT_PORT}"))]
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

    /// Most connections open at once; when all are taken, the oldest connection that is
    /// not serving a request is closed to make room.
    #[arg(long = "web.max-connections", value_name = "N", default_value_t = 64)]
    pub max_connections: usize,

    /// Longest a scrape waits for a collection (a hung NVML call) before it gets 503;
    /// the collection goes on, and later scrapes wait for it rather than start another.
    #[arg(long = "web.collection-timeout", value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub collection_timeout: Duration,

    /// Also export vram_process_used_bytes per process (one series per PID: label churn).
    #[arg(long = "collector.processes", global = true)]
    pub per_process: bool,

    /// At most this many vram_process_used_bytes series per scrape.
    #[arg(
        long = "collector.processes.limit",
        value_name = "N",
        default_value_t = 256,
        global = true
    )]
    pub per_process_limit: usize,
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
}

/// Flags of `snapshot`.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// File to write [default: standard output].
    #[arg(long, short)]
    pub output: Option<PathBuf>,
}

/// Flags of `textfile`.
#[derive(Debug, Args)]
pub struct TextfileArgs {
    /// File to write, e.g. /var/lib/node_exporter/textfile/vram.prom.
    #[arg(long, short)]
    pub output: PathBuf,
}

/// Log levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Warnings and errors.
    Warn,
    /// Normal operation.
    Info,
    /// Everything.
    Debug,
}

/// Log formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// `key=value` pairs, as Prometheus components log.
    Logfmt,
    /// One JSON object per line.
    Json,
}

/// What to do.
#[derive(Debug, Clone)]
pub enum Mode {
    /// Serve metrics over HTTP.
    Serve(ServeConfig),
    /// Explain the host once (or until `wait` runs out).
    Check(CheckConfig),
    /// Write a snapshot to a file or standard output.
    Snapshot {
        /// `None` for standard output.
        output: Option<PathBuf>,
    },
    /// Write metrics to a file once.
    Textfile {
        /// The file.
        output: PathBuf,
    },
}

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Socket address to bind.
    pub listen: SocketAddr,
    /// Path of the metrics endpoint.
    pub telemetry_path: String,
    /// The exporter-toolkit web configuration file, if any.
    pub web_config_file: Option<PathBuf>,
    /// Cap on open connections.
    pub max_connections: usize,
    /// Longest wait of a scrape for its collection.
    pub collection_timeout: Duration,
}

/// `check` settings.
#[derive(Debug, Clone)]
pub struct CheckConfig {
    /// JSON instead of a table.
    pub json: bool,
    /// GPU indices to look at; empty for all.
    pub gpus: Vec<u32>,
    /// How long to wait for orphaned memory to go.
    pub wait: Option<Duration>,
    /// Poll interval while waiting.
    pub wait_interval: Duration,
}

/// Everything the program needs, resolved from flags.
#[derive(Debug, Clone)]
pub struct Config {
    /// What to do.
    pub mode: Mode,
    /// procfs mount point.
    pub procfs: PathBuf,
    /// NVML library path, `None` for the system's.
    pub nvml_library: Option<PathBuf>,
    /// Snapshot to read instead of the system.
    pub replay: Option<PathBuf>,
    /// Classification tunables.
    pub settings: Settings,
    /// Holder scan budget.
    pub scan_timeout: Duration,
    /// Device path prefix (`/dev/nvidia` outside tests).
    pub device_prefix: Vec<u8>,
    /// The MIG capability minors table, when not the procfs's own (tests only).
    pub mig_minors: Option<PathBuf>,
    /// Per-process series limit, `None` when off.
    pub per_process_limit: Option<usize>,
    /// Log level.
    pub log_level: LogLevel,
    /// Log format.
    pub log_format: LogFormat,
}

impl Cli {
    /// Resolve flags into a [`Config`], rejecting values that cannot work.
    pub fn into_config(self) -> Result<Config, String> {
        use std::os::unix::ffi::OsStringExt;
        let mode = match self.command {
            None => {
                if self.web.max_connections == 0 {
                    return Err("--web.max-connections must be at least 1".into());
                }
                if self.web.collection_timeout.is_zero() {
                    return Err("--web.collection-timeout must be longer than 0".into());
                }
                Mode::Serve(ServeConfig {
                    listen: parse_listen_address(&self.web.listen_address)?,
                    telemetry_path: parse_telemetry_path(&self.web.telemetry_path)?,
                    web_config_file: self.web.config_file,
                    max_connections: self.web.max_connections,
                    collection_timeout: self.web.collection_timeout,
                })
            }
            Some(Command::Check(args)) => {
                if args.wait_interval.is_zero() {
                    return Err("--wait.interval must be longer than 0".into());
                }
                Mode::Check(CheckConfig {
                    json: args.json,
                    gpus: args.gpus,
                    wait: args.wait,
                    wait_interval: args.wait_interval,
                })
            }
            Some(Command::Snapshot(args)) => Mode::Snapshot {
                output: args.output,
            },
            Some(Command::Textfile(args)) => Mode::Textfile {
                output: args.output,
            },
        };
        if self.common.scan_timeout.is_zero() {
            return Err("--holders.scan-timeout must be longer than 0".into());
        }
        Ok(Config {
            mode,
            procfs: self.common.procfs,
            nvml_library: self.common.nvml_library,
            replay: self.common.replay,
            settings: Settings {
                context_overhead_bytes: self.common.context_overhead,
                ignored_holder_comms: self.common.ignore_comm,
            },
            scan_timeout: self.common.scan_timeout,
            device_prefix: self
                .common
                .device_prefix
                .map(|prefix| prefix.into_os_string().into_vec())
                .unwrap_or_else(|| crate::observe::procfs::DEVICE_PREFIX.to_vec()),
            mig_minors: self.common.mig_minors,
            per_process_limit: self.web.per_process.then_some(self.web.per_process_limit),
            log_level: self.common.log_level,
            log_format: self.common.log_format,
        })
    }
}

/// `:9077` means every IPv4 interface, as in other Prometheus exporters.
fn parse_listen_address(text: &str) -> Result<SocketAddr, String> {
    let spelled = if text.starts_with(':') {
        format!("0.0.0.0{text}")
    } else {
        text.to_string()
    };
    spelled
        .to_socket_addrs()
        .ok()
        .and_then(|mut addresses| addresses.next())
        .ok_or_else(|| {
            format!("--web.listen-address '{text}' is not HOST:PORT, [IPv6]:PORT or :PORT")
        })
}

fn parse_telemetry_path(path: &str) -> Result<String, String> {
    if !path.starts_with('/') || path.len() < 2 {
        return Err(format!(
            "--web.telemetry-path '{path}' must start with / and name a path other than /"
        ));
    }
    for reserved in ["/-/healthy", "/-/ready"] {
        if path == reserved {
            return Err(format!("--web.telemetry-path '{path}' is reserved"));
        }
    }
    Ok(path.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, String> {
        let mut argv = vec!["vram-exporter"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)
            .map_err(|error| error.to_string())?
            .into_config()
    }

    #[test]
    fn defaults_serve_on_the_documented_port() {
        let config = parse(&[]).unwrap();
        let Mode::Serve(serve) = config.mode else {
            panic!("default mode serves")
        };
        assert_eq!(serve.listen.port(), DEFAULT_PORT);
        assert!(serve.listen.ip().is_unspecified());
        assert_eq!(serve.telemetry_path, "/metrics");
        assert_eq!(serve.web_config_file, None);
        assert_eq!(serve.max_connections, 64);
        assert_eq!(serve.collection_timeout, Duration::from_secs(10));
        assert_eq!(config.procfs, PathBuf::from("/proc"));
        assert_eq!(config.device_prefix, b"/dev/nvidia");
        assert_eq!(config.settings.context_overhead_bytes, 16 << 20);
        assert_eq!(config.per_process_limit, None);
    }

    #[test]
    fn listen_address_forms() {
        for (flag, port) in [("127.0.0.1:1234", 1234), ("[::1]:99", 99), (":8080", 8080)] {
            let config = parse(&["--web.listen-address", flag]).unwrap();
            let Mode::Serve(serve) = config.mode else {
                panic!()
            };
            assert_eq!(serve.listen.port(), port);
        }
        let error = parse(&["--web.listen-address", "nonsense"]).unwrap_err();
        assert!(error.contains("is not HOST:PORT"), "{error}");
    }

    #[test]
    fn telemetry_path_must_be_a_path() {
        assert!(parse(&["--web.telemetry-path", "metrics"]).is_err());
        assert!(parse(&["--web.telemetry-path", "/"]).is_err());
        assert!(parse(&["--web.telemetry-path", "/-/ready"]).is_err());
        assert!(parse(&["--web.telemetry-path", "/vram"]).is_ok());
    }

    #[test]
    fn web_limits() {
        let config = parse(&[
            "--web.config.file",
            "web.yml",
            "--web.max-connections",
            "8",
            "--web.collection-timeout",
            "2s",
        ])
        .unwrap();
        let Mode::Serve(serve) = config.mode else {
            panic!()
        };
        assert_eq!(serve.web_config_file, Some(PathBuf::from("web.yml")));
        assert_eq!(serve.max_connections, 8);
        assert_eq!(serve.collection_timeout, Duration::from_secs(2));
        let error = parse(&["--web.max-connections", "0"]).unwrap_err();
        assert!(error.contains("at least 1"), "{error}");
        let error = parse(&["--web.collection-timeout", "0s"]).unwrap_err();
        assert!(error.contains("longer than 0"), "{error}");
    }

    #[test]
    fn sizes_and_durations_are_parsed_in_flags() {
        let config = parse(&[
            "--orphan.context-overhead",
            "9MiB",
            "--holders.scan-timeout",
            "500ms",
            "--collector.processes",
        ])
        .unwrap();
        assert_eq!(config.settings.context_overhead_bytes, 9 << 20);
        assert_eq!(config.scan_timeout, Duration::from_millis(500));
        assert_eq!(config.per_process_limit, Some(256));
        assert!(parse(&["--orphan.context-overhead", "lots"]).is_err());
    }

    #[test]
    fn check_flags() {
        let config = parse(&["check", "--json", "--gpu", "2", "--wait", "30s"]).unwrap();
        let Mode::Check(check) = config.mode else {
            panic!()
        };
        assert!(check.json);
        assert_eq!(check.gpus, vec![2]);
        assert_eq!(check.wait, Some(Duration::from_secs(30)));
        assert!(parse(&["check", "--wait", "30"]).is_err());
    }

    #[test]
    fn global_flags_work_after_the_subcommand() {
        let config = parse(&["check", "--replay", "snap.json"]).unwrap();
        assert_eq!(config.replay, Some(PathBuf::from("snap.json")));
    }
}
