//! Command-line flags (node_exporter's naming), resolved into a plain [`Config`].

use crate::classify::Settings;
use crate::logging::{LogFormat, LogLevel};
use crate::observe::containers::{ContainersConfig, DEFAULT_DOCKER_SOCKET, DEFAULT_PODMAN_SOCKET};
use crate::observe::kubernetes::{
    KubernetesConfig, DEFAULT_POD_LOGS, DEFAULT_POD_RESOURCES_SOCKET,
};
use crate::units::{parse_bytes, parse_duration};
use crate::web::ServeConfig;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use std::ffi::OsString;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;

/// The port we listen on by default: below the 9100-9999 exporter range, which is fully
/// allocated, and unlike other GPU exporters' ports, so both can run side by side.
pub const DEFAULT_PORT: u16 = 9077;

/// Exit statuses of the server, in its `--help`.
const SERVE_EXIT_STATUS: &str = "\
Exit status:
  0  stopped by SIGTERM or Ctrl-C
  2  error: a bad flag, a mistake in --web.config.file, a port in use, an unreadable snapshot

check has its own: see vram-exporter check --help.";

/// Exit statuses of `check`, in its `--help`: each code with its meaning as
/// [`crate::exit_codes::meaning`] says it (a test holds the two together).
const CHECK_EXIT_STATUS: &str = "\
Exit status:
  0  nothing orphaned
  1  orphaned memory found (with --wait: still there when the time is up)
  2  error: a bad flag, an unreadable snapshot, NVML missing
  3  cannot tell: some memory cannot be judged (a GPU lost or not answering NVML within --timeout, owners that cannot be read, a blind exporter with unattributed memory)
  4  memory left behind: held for a server that has exited, or by a killed process stuck in the driver";

/// Exit statuses of `snapshot` and `textfile`: each code with its meaning as
/// [`crate::exit_codes::written_meaning`] says it (a test holds the two together).
const WRITE_EXIT_STATUS: &str = "\
Exit status:
  0  written
  2  error: a bad flag, a file that cannot be written; or NVML missing (the file is still written, and says so)
  3  written, but NVML, a GPU or a /proc read did not answer within --timeout (the file says which)";

/// How long a one-shot command waits when `--timeout` is not given: long enough for a
/// healthy NVML to initialise eight GPUs without persistence mode (seconds), short enough
/// that a person at night knows the tool is not hung.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// What `--version` prints: the version and the source revision that
/// `vram_build_info{revision}` reports, so a binary names its commit without serving.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (revision ",
    env!("VRAM_EXPORTER_REVISION"),
    ")"
);

/// Tells GPU memory owned by a live process from memory that no live process owns.
///
/// Without a subcommand it serves Prometheus metrics. `check` explains one GPU host to a
/// person, `snapshot` saves what it sees for a bug report, and `textfile` writes the
/// metrics once for node_exporter's textfile collector.
#[derive(Debug, Parser)]
#[command(name = "vram-exporter", version = VERSION, about, long_about, after_help = SERVE_EXIT_STATUS)]
pub struct Cli {
    /// The mode, when it is not serving.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// The server's own flags.
    #[command(flatten)]
    pub web: WebArgs,

    /// The server's shared flags; a subcommand has its own.
    #[command(flatten)]
    pub shared: SharedArgs<JudgementArgs, CollectorArgs>,

    /// The kubelet's sources, for every mode.
    #[command(flatten)]
    pub kubelet: KubeletArgs,

    /// The container engines' sockets, for every mode.
    #[command(flatten)]
    pub containers: ContainersArgs,
}

/// Subcommands; serving metrics is the default.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Explain each GPU's memory: who owns it, what is orphaned, and what would free it.
    #[command(after_help = CHECK_EXIT_STATUS)]
    Check(CheckArgs),
    /// Write what the exporter sees (NVML and /proc facts) as JSON, for a bug report.
    #[command(after_help = WRITE_EXIT_STATUS)]
    Snapshot(SnapshotArgs),
    /// Write the metrics once to a file, atomically, for node_exporter's textfile collector.
    #[command(after_help = WRITE_EXIT_STATUS)]
    Textfile(TextfileArgs),
}

// Flags shared by several modes are defined once, in the groups below, and every mode
// flattens one `SharedArgs` that names the groups it uses (`Without` for the others), so
// each `--help` lists only what does something there. They are also accepted before the
// subcommand (`vram-exporter --replay FILE check`): `Cli::from_command_line` reads them
// as if they were given first after it. Values are `Option`s so that "not given" can be
// told apart from a default; the defaults are applied in `Cli::into_config`.

/// The flag groups of one mode, in the order `--help` lists them: where to look, how
/// memory is judged (`J`), the holder scan, the optional metrics (`C`) and logging.
#[derive(Debug, Default, Args)]
#[group(skip)]
pub struct SharedArgs<J: Args, C: Args> {
    /// Where to look.
    #[command(flatten)]
    pub source: SourceArgs,

    /// How memory is judged, or `Without`.
    #[command(flatten)]
    pub judgement: J,

    /// The holder scan.
    #[command(flatten)]
    pub scan: ScanArgs,

    /// Optional metric families, or `Without`.
    #[command(flatten)]
    pub collector: C,

    /// Logging.
    #[command(flatten)]
    pub log: LogArgs,
}

/// A group a mode has no use for: no flags, and the group's defaults.
#[derive(Debug, Default, Args)]
#[group(skip)]
pub struct Without {}

impl From<Without> for JudgementArgs {
    fn from(_: Without) -> JudgementArgs {
        JudgementArgs::default()
    }
}

impl From<Without> for CollectorArgs {
    fn from(_: Without) -> CollectorArgs {
        CollectorArgs::default()
    }
}

impl<J: Args + Into<JudgementArgs>, C: Args + Into<CollectorArgs>> SharedArgs<J, C> {
    /// Every group, those this mode has not with their defaults.
    fn widen(self) -> SharedArgs<JudgementArgs, CollectorArgs> {
        SharedArgs {
            source: self.source,
            judgement: self.judgement.into(),
            scan: self.scan,
            collector: self.collector.into(),
            log: self.log,
        }
    }
}

/// Where observations come from.
#[derive(Debug, Default, Args)]
#[command(next_help_heading = "Where to look")]
pub struct SourceArgs {
    /// procfs mount point (use the host's /proc, e.g. /host/proc, inside a container)
    /// [default: /proc].
    #[arg(long = "path.procfs", value_name = "PATH")]
    pub procfs: Option<PathBuf>,

    /// NVML library to load [default: the system's libnvidia-ml.so.1].
    #[arg(long = "nvml.library", value_name = "PATH")]
    pub nvml_library: Option<PathBuf>,

    /// Read the observation from a snapshot file instead of the system.
    #[arg(long = "replay", value_name = "FILE")]
    pub replay: Option<PathBuf>,

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

/// How memory is judged.
#[derive(Debug, Default, Args)]
#[command(next_help_heading = "Judging memory")]
pub struct JudgementArgs {
    /// Driver memory per listed context that no process is charged for (about 9 MiB on an
    /// H200); used memory below this floor per context is not called orphaned. A size
    /// with its unit (B, KiB, MiB, GiB, TiB, kB, MB, GB, TB), e.g. 9MiB [default: 16MiB].
    #[arg(long = "orphan.context-overhead", value_name = "SIZE", value_parser = parse_bytes)]
    pub context_overhead: Option<u64>,

    /// Command name of an NVML client (a monitoring agent) to never name as a holder of
    /// orphaned memory, besides the built-in NVIDIA daemons (repeatable).
    #[arg(long = "holders.ignore-comm", value_name = "NAME")]
    pub ignore_comm: Vec<String>,
}

/// The scan of `/proc/*/fd` for holders of a GPU's device file.
#[derive(Debug, Default, Args)]
#[command(next_help_heading = "Judging memory")]
pub struct ScanArgs {
    /// Time budget of one scan of /proc/*/fd for device-file holders; a scrape's scan also
    /// stops in time for the scrape (85 % of its wait) [default: 2s].
    #[arg(long = "holders.scan-timeout", value_name = "DURATION", value_parser = parse_duration)]
    pub scan_timeout: Option<Duration>,
}

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

/// Logging.
#[derive(Debug, Default, Args)]
#[command(next_help_heading = "Logging")]
pub struct LogArgs {
    /// Only log messages at or above this level [default: info].
    #[arg(long = "log.level", value_enum)]
    pub log_level: Option<LogLevel>,

    /// Log line format, on standard error [default: logfmt].
    #[arg(long = "log.format", value_enum)]
    pub log_format: Option<LogFormat>,
}

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

    /// Longest a scrape waits for a collection (a hung NVML call) before it gets 503;
    /// the collection goes on, and later scrapes wait for it rather than start another.
    #[arg(long = "web.collection-timeout", value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub collection_timeout: Duration,
}

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
}

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
}

/// A socket's path; empty (which clap's path parser refuses) turns its engine off.
fn socket_path(value: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(value))
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

/// Why the command line does not lead to a run.
#[derive(Debug, Error)]
pub enum CliError {
    /// `--help`, `--version` or `help`: not a mistake. Print it on standard output and
    /// exit 0.
    #[error("{0}")]
    Info(clap::Error),
    /// A mistake clap found: said in one line from its kind and context, with the
    /// `--help` of the mode it was made in.
    #[error("{}; see {help}", one_line(.error))]
    Parse {
        /// What clap found.
        error: clap::Error,
        /// Where to read more: `vram-exporter check --help`, say.
        help: String,
    },
    /// A flag given before the subcommand that does nothing for it.
    #[error("--{flag} does nothing for `{subcommand}`; see vram-exporter {subcommand} --help")]
    NothingFor {
        /// The flag, without its dashes.
        flag: String,
        /// The subcommand.
        subcommand: String,
    },
    /// Words before the subcommand that cannot be told apart from it.
    #[error("cannot tell where `{subcommand}` begins; give its flags after it; see vram-exporter {subcommand} --help")]
    Unplaced {
        /// The subcommand.
        subcommand: String,
    },
    /// A flag whose value parses but cannot work.
    #[error(transparent)]
    Invalid(#[from] InvalidFlag),
}

/// A flag whose value parses but cannot work.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InvalidFlag {
    /// A count that has to be at least 1 is 0.
    #[error("--{flag} must be at least 1")]
    Zero {
        /// The flag, without its dashes.
        flag: &'static str,
    },
    /// A duration that has to be longer than 0 is 0.
    #[error("--{flag} must be longer than 0")]
    NoTime {
        /// The flag, without its dashes.
        flag: &'static str,
    },
    /// `--web.listen-address` names no socket address.
    #[error("--web.listen-address '{0}' is not HOST:PORT, [IPv6]:PORT or :PORT")]
    ListenAddress(String),
    /// `--web.telemetry-path` is not an absolute path below `/`.
    #[error("--web.telemetry-path '{0}' must start with / and name a path other than /")]
    TelemetryPath(String),
    /// `--web.telemetry-path` is one of the health endpoints.
    #[error("--web.telemetry-path '{0}' is reserved")]
    ReservedPath(String),
}

impl Cli {
    /// Parse `args` (the program's name first). A mistake becomes one line that names
    /// the flag and says what is wrong, as the README promises, instead of clap's usage
    /// block; so does a flag given before a subcommand that does nothing for it.
    pub fn from_command_line<I, T>(args: I) -> Result<Cli, CliError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let command = Cli::command();
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let subcommand = subcommand_in(&command, &args);
        let help = match &subcommand {
            Some((_, name)) => format!("vram-exporter {name} --help"),
            None => "vram-exporter --help".to_string(),
        };
        let parse_error = |error: clap::Error| {
            if error.use_stderr() {
                CliError::Parse {
                    error,
                    help: help.clone(),
                }
            } else {
                CliError::Info(error)
            }
        };
        let matches = command
            .clone()
            .try_get_matches_from(&args)
            .map_err(parse_error)?;
        let matches = match (matches.subcommand_name(), subcommand) {
            (None, _) => matches,
            (Some(name), Some((at, found))) if name == found => {
                refuse_flags_that_do_nothing(&command, &matches, name)?;
                // The flags given before the subcommand, read as if they came first after
                // it: the subcommand's own value, given later, wins over them, and
                // repeated flags add up, as they would in one list.
                let mut moved = vec![args[0].clone(), args[at].clone()];
                moved.extend_from_slice(&args[1..at]);
                moved.extend_from_slice(&args[at + 1..]);
                command
                    .mut_subcommand(name, |subcommand| subcommand.args_override_self(true))
                    .try_get_matches_from(moved)
                    .map_err(parse_error)?
            }
            // `subcommand_in` reads the words as clap does, so this is not expected; but
            // flags before a subcommand that cannot be placed must not be dropped.
            (Some(name), _) => {
                return Err(CliError::Unplaced {
                    subcommand: name.to_string(),
                })
            }
        };
        Cli::from_arg_matches(&matches).map_err(parse_error)
    }
}

/// Refuse a flag given before the subcommand `name` that does nothing for it, rather than
/// ignore it.
fn refuse_flags_that_do_nothing(
    command: &clap::Command,
    matches: &clap::ArgMatches,
    name: &str,
) -> Result<(), CliError> {
    let Some(subcommand) = command.find_subcommand(name) else {
        return Ok(());
    };
    for argument in command.get_arguments() {
        let id = argument.get_id();
        let given = matches.value_source(id.as_str()) == Some(ValueSource::CommandLine);
        // A global flag (the kubelet's sources) serves every mode.
        let known =
            argument.is_global_set() || subcommand.get_arguments().any(|own| own.get_id() == id);
        if given && !known {
            return Err(CliError::NothingFor {
                flag: argument.get_long().unwrap_or(id.as_str()).to_string(),
                subcommand: name.to_string(),
            });
        }
    }
    Ok(())
}

/// Where in `args` the subcommand stands, and its name, found as clap finds it: the first
/// word that is neither a top-level flag nor the value of one.
fn subcommand_in(command: &clap::Command, args: &[OsString]) -> Option<(usize, String)> {
    let mut words = args
        .iter()
        .map(|arg| arg.to_string_lossy())
        .enumerate()
        .skip(1);
    while let Some((at, word)) = words.next() {
        if word == "--" {
            return None;
        }
        if let Some(long) = word.strip_prefix("--") {
            let takes_value = !long.contains('=')
                && command
                    .get_arguments()
                    .find(|argument| argument.get_long() == Some(long))
                    .is_some_and(|argument| argument.get_action().takes_values());
            if takes_value {
                words.next();
            }
            continue;
        }
        if word.starts_with('-') {
            continue;
        }
        return command
            .get_subcommands()
            .find(|subcommand| subcommand.get_name() == word)
            .map(|subcommand| (at, subcommand.get_name().to_string()));
    }
    None
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
        /// Longest the look waits for NVML and `/proc`.
        timeout: Duration,
    },
    /// Write metrics to a file once.
    Textfile {
        /// The file.
        output: PathBuf,
        /// Longest the look waits for NVML and `/proc`.
        timeout: Duration,
    },
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
    /// Longest one look waits for NVML and `/proc`.
    pub timeout: Duration,
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
    /// Read the GPUs one after another (a benchmark's baseline only).
    pub nvml_one_gpu_at_a_time: bool,
    /// Per-process series limit, `None` when off.
    pub per_process_limit: Option<usize>,
    /// Log level.
    pub log_level: LogLevel,
    /// Log format.
    pub log_format: LogFormat,
    /// Where the kubelet's sources are.
    pub kubernetes: KubernetesConfig,
    /// Where the container engines' sockets are.
    pub containers: ContainersConfig,
}

impl Cli {
    /// Resolve flags into a [`Config`], rejecting values that cannot work.
    pub fn into_config(self) -> Result<Config, InvalidFlag> {
        use std::os::unix::ffi::OsStringExt;
        let (mode, shared) = match self.command {
            None => (Mode::Serve(self.web.into_config()?), self.shared),
            Some(Command::Check(args)) => {
                let check = CheckConfig {
                    json: args.json,
                    gpus: args.gpus,
                    wait: args.wait,
                    wait_interval: longer_than_zero(args.wait_interval, "wait.interval")?,
                    timeout: args.timeout.resolve()?,
                };
                (Mode::Check(check), args.shared.widen())
            }
            Some(Command::Snapshot(args)) => (
                Mode::Snapshot {
                    output: args.output,
                    timeout: args.timeout.resolve()?,
                },
                args.shared.widen(),
            ),
            Some(Command::Textfile(args)) => (
                Mode::Textfile {
                    output: args.output,
                    timeout: args.timeout.resolve()?,
                },
                args.shared,
            ),
        };
        let SharedArgs {
            source,
            judgement,
            scan,
            collector,
            log,
        } = shared;
        let scan_timeout = longer_than_zero(
            scan.scan_timeout.unwrap_or(Duration::from_secs(2)),
            "holders.scan-timeout",
        )?;
        let refresh_interval =
            longer_than_zero(self.kubelet.refresh_interval, "kubelet.refresh-interval")?;
        let containers_timeout = longer_than_zero(self.containers.timeout, "containers.timeout")?;
        let defaults = Settings::default();
        Ok(Config {
            mode,
            procfs: source.procfs.unwrap_or_else(|| PathBuf::from("/proc")),
            nvml_library: source.nvml_library,
            replay: source.replay,
            settings: Settings {
                context_overhead_bytes: judgement
                    .context_overhead
                    .unwrap_or(defaults.context_overhead_bytes),
                agent_comms: judgement.ignore_comm,
            },
            scan_timeout,
            device_prefix: source
                .device_prefix
                .map(|prefix| prefix.into_os_string().into_vec())
                .unwrap_or_else(|| crate::observe::procfs::DEVICE_PREFIX.to_vec()),
            mig_minors: source.mig_minors,
            nvml_one_gpu_at_a_time: source.one_gpu_at_a_time,
            per_process_limit: collector
                .per_process
                .then_some(collector.per_process_limit.unwrap_or(256)),
            log_level: log.log_level.unwrap_or(LogLevel::Info),
            log_format: log.log_format.unwrap_or(LogFormat::Logfmt),
            kubernetes: KubernetesConfig {
                pod_resources_socket: self.kubelet.pod_resources_path,
                pod_logs: self.kubelet.pod_logs,
                refresh_interval,
            },
            containers: ContainersConfig {
                docker_socket: self.containers.docker_socket,
                podman_socket: self.containers.podman_socket,
                timeout: containers_timeout,
                ..ContainersConfig::default()
            },
        })
    }
}

impl TimeoutArgs {
    /// `--timeout`, or its default; 0 cannot work.
    fn resolve(self) -> Result<Duration, InvalidFlag> {
        longer_than_zero(self.timeout.unwrap_or(DEFAULT_TIMEOUT), "timeout")
    }
}

impl WebArgs {
    /// The server's settings, or the first flag that cannot work.
    fn into_config(self) -> Result<ServeConfig, InvalidFlag> {
        if self.max_connections == 0 {
            return Err(InvalidFlag::Zero {
                flag: "web.max-connections",
            });
        }
        Ok(ServeConfig {
            collection_timeout: longer_than_zero(
                self.collection_timeout,
                "web.collection-timeout",
            )?,
            listen: parse_listen_address(&self.listen_address)?,
            telemetry_path: parse_telemetry_path(self.telemetry_path)?,
            web_config_file: self.config_file,
            max_connections: self.max_connections,
        })
    }
}

/// `duration`, unless it is zero: a wait, budget or interval of 0 cannot work.
fn longer_than_zero(duration: Duration, flag: &'static str) -> Result<Duration, InvalidFlag> {
    if duration.is_zero() {
        Err(InvalidFlag::NoTime { flag })
    } else {
        Ok(duration)
    }
}

/// A clap error in one line, built from its kind and context: the mistake, then any tip
/// (the values there are, a similar flag), without the usage block.
fn one_line(error: &clap::Error) -> String {
    let joined = |kind, separator| items(error.get(kind)).join(separator);
    let (arg, value) = (
        joined(ContextKind::InvalidArg, ", "),
        joined(ContextKind::InvalidValue, ""),
    );
    let mut parts = vec![match error.kind() {
        ErrorKind::UnknownArgument => format!("unexpected argument '{arg}' found"),
        ErrorKind::InvalidSubcommand => format!(
            "unrecognized subcommand '{}'",
            joined(ContextKind::InvalidSubcommand, "")
        ),
        ErrorKind::InvalidValue if value.is_empty() => {
            format!("a value is required for '{arg}' but none was supplied")
        }
        ErrorKind::InvalidValue => format!("invalid value '{value}' for '{arg}'"),
        // Our value parsers' errors (`crate::units`) say what is wrong with the value.
        ErrorKind::ValueValidation => match std::error::Error::source(error) {
            Some(reason) => format!(
                "invalid value '{value}' for '{arg}': {}",
                crate::observe::one_line(reason)
            ),
            None => format!("invalid value '{value}' for '{arg}'"),
        },
        ErrorKind::TooManyValues => {
            format!("unexpected value '{value}' for '{arg}' found; no more were expected")
        }
        ErrorKind::MissingRequiredArgument => {
            format!("the following required arguments were not provided: {arg}")
        }
        ErrorKind::ArgumentConflict
            if error.get(ContextKind::PriorArg) == error.get(ContextKind::InvalidArg) =>
        {
            format!("the argument '{arg}' cannot be used multiple times")
        }
        ErrorKind::ArgumentConflict => format!(
            "the argument '{arg}' cannot be used with '{}'",
            joined(ContextKind::PriorArg, "', '")
        ),
        kind => kind.to_string(),
    }];
    let values = joined(ContextKind::ValidValue, ", ");
    if !values.is_empty() {
        parts.push(format!("[possible values: {values}]"));
    }
    for (kind, what) in [
        (ContextKind::SuggestedSubcommand, "subcommand"),
        (ContextKind::SuggestedArg, "argument"),
        (ContextKind::SuggestedValue, "value"),
    ] {
        match items(error.get(kind)).as_slice() {
            [] => {}
            [similar] => parts.push(format!("tip: a similar {what} exists: '{similar}'")),
            similar => parts.push(format!(
                "tip: some similar {what}s exist: '{}'",
                similar.join("', '")
            )),
        }
    }
    let tips = items(error.get(ContextKind::Suggested));
    parts.extend(tips.iter().map(|tip| format!("tip: {tip}")));
    parts.join("; ")
}

/// The words of a piece of clap's context: one, a list, or none.
fn items(value: Option<&ContextValue>) -> Vec<String> {
    match value {
        Some(ContextValue::String(item)) => vec![item.clone()],
        Some(ContextValue::Strings(items)) => items.clone(),
        Some(ContextValue::StyledStrs(items)) => items.iter().map(ToString::to_string).collect(),
        _ => Vec::new(),
    }
}

/// `:9077` means every interface, IPv6 and IPv4, as in other Prometheus exporters: the
/// unspecified IPv6 address, which the server listens on with both families.
fn parse_listen_address(text: &str) -> Result<SocketAddr, InvalidFlag> {
    let spelled = if text.starts_with(':') {
        format!("[::]{text}")
    } else {
        text.to_string()
    };
    spelled
        .to_socket_addrs()
        .ok()
        .and_then(|mut addresses| addresses.next())
        .ok_or_else(|| InvalidFlag::ListenAddress(text.to_string()))
}

fn parse_telemetry_path(path: String) -> Result<String, InvalidFlag> {
    if !path.starts_with('/') || path.len() < 2 {
        return Err(InvalidFlag::TelemetryPath(path));
    }
    if path == "/-/healthy" || path == "/-/ready" {
        return Err(InvalidFlag::ReservedPath(path));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::path::Path;

    fn parse(args: &[&str]) -> Result<Config, String> {
        let mut argv = vec!["vram-exporter"];
        argv.extend_from_slice(args);
        match Cli::from_command_line(argv).and_then(|cli| Ok(cli.into_config()?)) {
            Ok(config) => Ok(config),
            Err(CliError::Info(info)) => panic!("help instead of a parse: {info}"),
            Err(mistake) => Err(mistake.to_string()),
        }
    }

    /// The text of `--help` for `args` (a subcommand, or nothing for the server).
    fn help(args: &[&str]) -> String {
        let mut argv = vec!["vram-exporter"];
        argv.extend_from_slice(args);
        argv.push("--help");
        match Cli::from_command_line(argv) {
            Err(CliError::Info(info)) => info.render().to_string(),
            other => panic!("--help did not give help: {other:?}"),
        }
    }

    /// The long flags a mode's `--help` lists.
    fn listed_flags(args: &[&str]) -> Vec<String> {
        let mut flags: Vec<String> = help(args)
            .lines()
            .filter_map(|line| {
                let line = line.trim_start();
                // `-h, --help` and `-o, --output <OUTPUT>` have a short form first.
                let line = line.split_once(", ").map_or(line, |(_, long)| long);
                line.strip_prefix("--")
            })
            .map(|rest| rest.split([' ', '=']).next().unwrap().to_string())
            .collect();
        flags.sort();
        flags
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
        // `:PORT` is every interface of both families: the server listens on `[::]`
        // with IPv4 too.
        for every in [":9077", "[::]:9077"] {
            let Mode::Serve(serve) = parse(&["--web.listen-address", every]).unwrap().mode else {
                panic!()
            };
            assert_eq!(serve.listen, "[::]:9077".parse().unwrap(), "{every}");
        }
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
        assert_eq!(check.timeout, DEFAULT_TIMEOUT);
        assert!(parse(&["check", "--wait", "30"]).is_err());
    }

    #[test]
    fn one_shot_commands_wait_their_timeout() {
        let Mode::Check(check) = parse(&["check", "--timeout", "5s"]).unwrap().mode else {
            panic!()
        };
        assert_eq!(check.timeout, Duration::from_secs(5));
        let Mode::Snapshot { timeout, .. } = parse(&["snapshot", "--timeout", "2s"]).unwrap().mode
        else {
            panic!()
        };
        assert_eq!(timeout, Duration::from_secs(2));
        let Mode::Textfile { timeout, .. } = parse(&["textfile", "-o", "x.prom"]).unwrap().mode
        else {
            panic!()
        };
        assert_eq!(timeout, DEFAULT_TIMEOUT);
        let error = parse(&["check", "--timeout", "0s"]).unwrap_err();
        assert!(
            error.contains("--timeout") && error.contains("longer than 0"),
            "{error}"
        );
        // The server has --web.collection-timeout instead.
        assert!(parse(&["--timeout", "5s"]).is_err());
    }

    #[test]
    fn container_engine_flags() {
        let config = parse(&[]).unwrap();
        assert_eq!(config.containers, ContainersConfig::default());
        let config = parse(&[
            "check",
            "--containers.docker-socket",
            "",
            "--containers.podman-socket",
            "/host/run/podman/podman.sock",
            "--containers.timeout",
            "250ms",
        ])
        .unwrap();
        assert_eq!(config.containers.docker_socket, PathBuf::new());
        assert_eq!(
            config.containers.podman_socket,
            PathBuf::from("/host/run/podman/podman.sock")
        );
        assert_eq!(config.containers.timeout, Duration::from_millis(250));
        let error = parse(&["--containers.timeout", "0s"]).unwrap_err();
        assert!(error.contains("containers.timeout"), "{error}");
    }

    #[test]
    fn kubelet_flags() {
        let config = parse(&[]).unwrap();
        assert_eq!(config.kubernetes, KubernetesConfig::default());
        assert_eq!(
            config.kubernetes.pod_resources_socket,
            PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock")
        );
        assert_eq!(config.kubernetes.pod_logs, PathBuf::from("/var/log/pods"));
        let config = parse(&[
            "check",
            "--kubelet.pod-resources-path",
            "/host/pod-resources/kubelet.sock",
            "--kubelet.refresh-interval",
            "30s",
            "--path.pod-logs",
            "/host/log/pods",
        ])
        .unwrap();
        assert_eq!(
            config.kubernetes,
            KubernetesConfig {
                pod_resources_socket: "/host/pod-resources/kubelet.sock".into(),
                pod_logs: "/host/log/pods".into(),
                refresh_interval: Duration::from_secs(30),
            }
        );
        let error = parse(&["--kubelet.refresh-interval", "0s"]).unwrap_err();
        assert!(error.contains("longer than 0"), "{error}");
    }

    /// A flag the subcommands share: its words on the command line, the subcommands
    /// that take it, and whether a `Config` carries what it says.
    type SharedFlag = (
        &'static [&'static str],
        &'static [&'static str],
        fn(&Config) -> bool,
    );

    /// Every flag that more than one mode takes, with a value unlike its default.
    const SHARED_FLAGS: &[SharedFlag] = &[
        (&["--replay", "snap.json"], ALL, |c| {
            c.replay == Some(PathBuf::from("snap.json"))
        }),
        (&["--path.procfs", "/host/proc"], ALL, |c| {
            c.procfs == Path::new("/host/proc")
        }),
        (&["--nvml.library", "/opt/libnvidia-ml.so.1"], ALL, |c| {
            c.nvml_library == Some(PathBuf::from("/opt/libnvidia-ml.so.1"))
        }),
        (&["--test.device-prefix", "/fixture/dev/nvidia"], ALL, |c| {
            c.device_prefix == b"/fixture/dev/nvidia"
        }),
        (&["--test.mig-minors", "mig-minors"], ALL, |c| {
            c.mig_minors == Some(PathBuf::from("mig-minors"))
        }),
        (&["--orphan.context-overhead", "9MiB"], JUDGING, |c| {
            c.settings.context_overhead_bytes == 9 << 20
        }),
        (&["--holders.ignore-comm", "agent"], JUDGING, |c| {
            c.settings.agent_comms == ["agent"]
        }),
        (&["--holders.scan-timeout", "500ms"], ALL, |c| {
            c.scan_timeout == Duration::from_millis(500)
        }),
        (&["--log.level", "debug"], ALL, |c| {
            c.log_level == LogLevel::Debug
        }),
        (&["--log.format", "json"], ALL, |c| {
            c.log_format == LogFormat::Json
        }),
        (
            &["--kubelet.pod-resources-path", "/host/kubelet.sock"],
            ALL,
            |c| c.kubernetes.pod_resources_socket == Path::new("/host/kubelet.sock"),
        ),
        (&["--kubelet.refresh-interval", "30s"], ALL, |c| {
            c.kubernetes.refresh_interval == Duration::from_secs(30)
        }),
        (&["--path.pod-logs", "/host/log/pods"], ALL, |c| {
            c.kubernetes.pod_logs == Path::new("/host/log/pods")
        }),
        (
            &["--containers.docker-socket", "/host/docker.sock"],
            ALL,
            |c| c.containers.docker_socket == Path::new("/host/docker.sock"),
        ),
        (
            &["--containers.podman-socket", "/host/podman.sock"],
            ALL,
            |c| c.containers.podman_socket == Path::new("/host/podman.sock"),
        ),
        (&["--containers.timeout", "3s"], ALL, |c| {
            c.containers.timeout == Duration::from_secs(3)
        }),
        (&["--timeout", "5s"], ALL, |c| {
            one_shot_timeout(c) == Some(Duration::from_secs(5))
        }),
        (&["--collector.processes"], &["textfile"], |c| {
            c.per_process_limit == Some(256)
        }),
        (
            &["--collector.processes", "--collector.processes.limit", "8"],
            &["textfile"],
            |c| c.per_process_limit == Some(8),
        ),
    ];
    const ALL: &[&str] = &["check", "snapshot", "textfile"];

    /// How long the one-shot command of `config` waits for NVML and `/proc`.
    fn one_shot_timeout(config: &Config) -> Option<Duration> {
        match &config.mode {
            Mode::Serve(_) => None,
            Mode::Check(check) => Some(check.timeout),
            Mode::Snapshot { timeout, .. } | Mode::Textfile { timeout, .. } => Some(*timeout),
        }
    }
    const JUDGING: &[&str] = &["check", "textfile"];

    /// What a subcommand needs besides the flag under test.
    fn required(subcommand: &str) -> &'static [&'static str] {
        match subcommand {
            "textfile" => &["-o", "vram.prom"],
            _ => &[],
        }
    }

    #[test]
    fn global_flags_work_after_the_subcommand() {
        for subcommand in ALL {
            for (words, modes, carried) in SHARED_FLAGS {
                let without: Vec<&str> = [*subcommand]
                    .iter()
                    .chain(required(subcommand))
                    .copied()
                    .collect();
                // The default does not already say what the flag says.
                assert!(!carried(&parse(&without).unwrap()), "{words:?}");
                let mut with = without.clone();
                with.extend_from_slice(words);
                if modes.contains(subcommand) {
                    let config = parse(&with).unwrap_or_else(|error| panic!("{with:?}: {error}"));
                    assert!(carried(&config), "{with:?} did not land in the config");
                } else {
                    let error = parse(&with).unwrap_err();
                    assert!(
                        error.starts_with("unexpected argument"),
                        "{with:?}: {error}"
                    );
                }
            }
            // The table holds every flag this subcommand shares with another mode.
            let own: &[&str] = &["help", "output", "json", "gpu", "wait", "wait.interval"];
            let mut shared: Vec<String> = listed_flags(&[subcommand])
                .into_iter()
                .filter(|flag| !own.contains(&flag.as_str()))
                .collect();
            let mut tabled: Vec<String> = SHARED_FLAGS
                .iter()
                .filter(|(words, modes, _)| {
                    modes.contains(subcommand) && !words[0].starts_with("--test.")
                })
                .flat_map(|(words, _, _)| words.iter())
                .filter_map(|word| word.strip_prefix("--"))
                .map(str::to_string)
                .collect();
            shared.sort();
            tabled.sort();
            tabled.dedup();
            assert_eq!(shared, tabled, "{subcommand}");
        }
    }

    #[test]
    fn flags_given_before_the_subcommand_apply_to_it() {
        let config = parse(&[
            "--replay",
            "before.json",
            "--holders.ignore-comm",
            "agent-a",
            "--log.level",
            "debug",
            "check",
            "--holders.ignore-comm",
            "agent-b",
        ])
        .unwrap();
        assert!(matches!(config.mode, Mode::Check(_)));
        assert_eq!(config.replay, Some(PathBuf::from("before.json")));
        assert_eq!(config.log_level, LogLevel::Debug);
        assert_eq!(
            config.settings.agent_comms,
            ["agent-a".to_string(), "agent-b".to_string()]
        );
        // The subcommand's own value wins over the one given before it.
        let config =
            parse(&["--replay", "before.json", "check", "--replay", "after.json"]).unwrap();
        assert_eq!(config.replay, Some(PathBuf::from("after.json")));
        let config = parse(&["--collector.processes", "textfile", "-o", "vram.prom"]).unwrap();
        assert_eq!(config.per_process_limit, Some(256));
    }

    #[test]
    fn a_value_given_before_the_subcommand_may_be_any_bytes() {
        use std::os::unix::ffi::OsStringExt;
        let file = OsString::from_vec(b"snap\xff.json".to_vec());
        let args = [
            "vram-exporter".into(),
            "--replay".into(),
            file.clone(),
            "check".into(),
        ];
        let config = Cli::from_command_line(args).unwrap().into_config().unwrap();
        assert!(matches!(config.mode, Mode::Check(_)));
        assert_eq!(config.replay, Some(PathBuf::from(file)));
    }

    #[test]
    fn other_mistakes_are_one_line_with_their_tips() {
        assert_eq!(
            parse(&["--log.format", "jsn"]).unwrap_err(),
            "invalid value 'jsn' for '--log.format <LOG_FORMAT>'; [possible values: logfmt, json]; tip: a similar value exists: 'json'; see vram-exporter --help"
        );
        assert_eq!(
            parse(&["--json", "check"]).unwrap_err(),
            "unexpected argument '--json' found; tip: 'check --json' exists; see vram-exporter check --help"
        );
        assert_eq!(
            parse(&["check", "--replay", "a", "--replay", "b"]).unwrap_err(),
            "the argument '--replay <FILE>' cannot be used multiple times; see vram-exporter check --help"
        );
        assert_eq!(
            parse(&["--log.level"]).unwrap_err(),
            "a value is required for '--log.level <LOG_LEVEL>' but none was supplied; [possible values: error, warn, info, debug]; see vram-exporter --help"
        );
    }

    #[test]
    fn a_flag_that_does_nothing_for_the_subcommand_is_refused() {
        assert_eq!(
            parse(&["--collector.processes", "check"]).unwrap_err(),
            "--collector.processes does nothing for `check`; see vram-exporter check --help"
        );
        assert_eq!(
            parse(&["--web.listen-address", ":1", "snapshot"]).unwrap_err(),
            "--web.listen-address does nothing for `snapshot`; see vram-exporter snapshot --help"
        );
        assert_eq!(
            parse(&["--orphan.context-overhead", "9MiB", "snapshot"]).unwrap_err(),
            "--orphan.context-overhead does nothing for `snapshot`; see vram-exporter snapshot --help"
        );
        let error = parse(&["check", "--collector.processes"]).unwrap_err();
        assert!(
            error.starts_with("unexpected argument '--collector.processes' found"),
            "{error}"
        );
    }

    #[test]
    fn each_help_lists_only_the_flags_of_its_mode() {
        let shared = [
            "path.procfs",
            "nvml.library",
            "replay",
            "holders.scan-timeout",
            "log.level",
            "log.format",
            "help",
        ];
        let with = |own: &[&str], groups: &[&[&str]]| {
            let mut flags: Vec<String> = shared
                .iter()
                .chain(own)
                .chain(groups.iter().flat_map(|group| group.iter()))
                .map(|flag| flag.to_string())
                .collect();
            flags.sort();
            flags
        };
        let judgement: &[&str] = &["orphan.context-overhead", "holders.ignore-comm"];
        let collector: &[&str] = &["collector.processes", "collector.processes.limit"];
        let web: &[&str] = &[
            "web.listen-address",
            "web.telemetry-path",
            "web.config.file",
            "web.max-connections",
            "web.collection-timeout",
            "version",
        ];
        // Every mode names pods and containers, so every mode takes the kubelet's sources
        // and the container engines' sockets.
        let kubelet: &[&str] = &[
            "kubelet.pod-resources-path",
            "kubelet.refresh-interval",
            "path.pod-logs",
            "containers.docker-socket",
            "containers.podman-socket",
            "containers.timeout",
        ];
        assert_eq!(
            listed_flags(&[]),
            with(&[], &[judgement, collector, web, kubelet])
        );
        assert_eq!(
            listed_flags(&["check"]),
            with(
                &["json", "gpu", "wait", "wait.interval", "timeout"],
                &[judgement, kubelet]
            )
        );
        assert_eq!(
            listed_flags(&["snapshot"]),
            with(&["output", "timeout"], &[kubelet])
        );
        assert_eq!(
            listed_flags(&["textfile"]),
            with(&["output", "timeout"], &[judgement, collector, kubelet])
        );
    }

    /// The heading each long flag of a mode's `--help` is listed under (`Options` for
    /// those before the first heading).
    fn flag_headings(args: &[&str]) -> BTreeMap<String, String> {
        let mut heading = String::new();
        let mut headings = BTreeMap::new();
        for line in help(args).lines() {
            if !line.starts_with(' ') && line.ends_with(':') {
                heading = line.trim_end_matches(':').to_string();
                continue;
            }
            let line = line.trim_start();
            let line = line.split_once(", ").map_or(line, |(_, long)| long);
            if let Some(rest) = line.strip_prefix("--") {
                let flag = rest.split([' ', '=']).next().unwrap().to_string();
                headings.insert(flag, heading.clone());
            }
        }
        headings
    }

    #[test]
    fn every_help_lists_each_flag_under_the_heading_of_its_group() {
        let groups: &[(&str, &[&str])] = &[
            ("Where to look", &["path.procfs", "nvml.library", "replay"]),
            (
                "Judging memory",
                &[
                    "orphan.context-overhead",
                    "holders.ignore-comm",
                    "holders.scan-timeout",
                ],
            ),
            (
                "Metrics",
                &["collector.processes", "collector.processes.limit"],
            ),
            ("Logging", &["log.level", "log.format"]),
            (
                "Kubernetes",
                &[
                    "kubelet.pod-resources-path",
                    "kubelet.refresh-interval",
                    "path.pod-logs",
                ],
            ),
            (
                "Containers",
                &[
                    "containers.docker-socket",
                    "containers.podman-socket",
                    "containers.timeout",
                ],
            ),
            (
                "Web server",
                &[
                    "web.listen-address",
                    "web.telemetry-path",
                    "web.config.file",
                    "web.max-connections",
                    "web.collection-timeout",
                ],
            ),
        ];
        for mode in [&[][..], &["check"], &["snapshot"], &["textfile"]] {
            let headings = flag_headings(mode);
            for (flag, heading) in &headings {
                let group = groups
                    .iter()
                    .find(|(_, flags)| flags.contains(&flag.as_str()))
                    .map_or("Options", |(group, _)| group);
                assert_eq!(heading, group, "{mode:?}: --{flag}");
            }
            // Every mode names pods, so every mode has the kubelet's heading, with them alone.
            let kubernetes: Vec<&String> = headings
                .iter()
                .filter(|(_, heading)| *heading == "Kubernetes")
                .map(|(flag, _)| flag)
                .collect();
            assert_eq!(kubernetes.len(), 3, "{mode:?}: {kubernetes:?}");
        }
    }

    #[test]
    fn help_lists_the_exit_statuses() {
        use crate::exit_codes::{
            meaning, written_meaning, CANNOT_TELL, ERROR, LEFT_BEHIND, ORPHANED, SUCCESS,
        };
        let check = help(&["check"]);
        for code in [SUCCESS, ORPHANED, ERROR, CANNOT_TELL, LEFT_BEHIND] {
            let status = format!("  {code}  {}", meaning(code));
            assert!(check.contains(&status), "{status:?} missing from:\n{check}");
        }
        for mode in ["snapshot", "textfile"] {
            let text = help(&[mode]);
            for code in [SUCCESS, ERROR, CANNOT_TELL] {
                let status = format!("  {code}  {}", written_meaning(code));
                assert!(text.contains(&status), "{status:?} missing from:\n{text}");
            }
        }
        let serve = help(&[]);
        assert!(
            serve.contains("Exit status:\n  0  stopped by SIGTERM"),
            "{serve}"
        );
        assert!(serve.contains("vram-exporter check --help"), "{serve}");
    }

    #[test]
    fn mistakes_are_one_line_that_names_the_flag() {
        assert_eq!(
            parse(&["--bogus"]).unwrap_err(),
            "unexpected argument '--bogus' found; see vram-exporter --help"
        );
        assert_eq!(
            parse(&["check", "--wait", "30"]).unwrap_err(),
            "invalid value '30' for '--wait <DURATION>': '30' needs a unit: ms, s, m, h, d, w or y; see vram-exporter check --help"
        );
        assert_eq!(
            parse(&["check", "--jsn"]).unwrap_err(),
            "unexpected argument '--jsn' found; tip: a similar argument exists: '--json'; see vram-exporter check --help"
        );
        assert_eq!(
            parse(&["textfile"]).unwrap_err(),
            "the following required arguments were not provided: --output <OUTPUT>; see vram-exporter textfile --help"
        );
        assert_eq!(
            parse(&["chek"]).unwrap_err(),
            "unrecognized subcommand 'chek'; tip: a similar subcommand exists: 'check'; see vram-exporter --help"
        );
        for args in [&["--bogus"][..], &["check", "--gpu", "x"], &["textfile"]] {
            let line = parse(args).unwrap_err();
            assert!(!line.contains('\n'), "{args:?}: {line}");
        }
    }
}
