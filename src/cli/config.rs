//! The flags resolved into a plain [`Config`]: each default applied, each value that
//! cannot work refused.

use super::command::{Cli, Command};
use super::errors::InvalidFlag;
use super::flags::{ExitCodes, Numbering, OnlyVerdict, SharedArgs, TimeoutArgs, WebArgs};
use super::values::{longer_than_zero, parse_listen_address, parse_telemetry_path, GpuArg};
use crate::classify::{GpuName, Settings};
use crate::exit_codes::{Convention, Verdict};
use crate::logging::{LogFormat, LogLevel};
use crate::observe::containers::{ContainersConfig, Engine};
use crate::observe::kubernetes::KubernetesConfig;
use crate::web::ServeConfig;
use std::path::PathBuf;
use std::time::Duration;

/// How long a one-shot command waits when `--timeout` is not given: long enough for a
/// healthy NVML to initialise eight GPUs without persistence mode (seconds), short enough
/// that a person at night knows the tool is not hung.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

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
    /// Copy the program into a folder.
    CopyTo {
        /// The folder.
        folder: PathBuf,
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
    /// The verdict in one line on standard output, the rest on standard error.
    pub summary: bool,
    /// The GPUs to look at; empty for all.
    pub gpus: Vec<GpuName>,
    /// Live owners in no running Slurm job make the GPUs in use.
    pub foreign: bool,
    /// Which exit statuses it ends with.
    pub exit_codes: Convention,
    /// With the plugin convention, the one verdict that is a problem.
    pub only_verdict: Option<Verdict>,
    /// Whether the look is a snapshot's (`--replay`), not this host's.
    pub replayed: bool,
    /// `--wait` was given with `--replay`: it does not wait, and says so.
    pub wait_on_replay: bool,
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
    /// Whether `procfs` is a tree of files standing in for one (tests only).
    pub procfs_stand_in: bool,
    /// The directory of the witness state.
    pub state: PathBuf,
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
                let replayed = args.shared.source.replay.is_some();
                let check = CheckConfig {
                    json: args.json,
                    summary: args.summary,
                    replayed,
                    gpus: gpu_names(args.gpus, args.numbering),
                    foreign: args.foreign,
                    exit_codes: match args.exit_codes {
                        ExitCodes::Detailed => Convention::Detailed,
                        ExitCodes::Plugin => Convention::Plugin,
                    },
                    only_verdict: match (args.only_verdict, args.exit_codes) {
                        (None, _) => None,
                        (Some(_), ExitCodes::Detailed) => {
                            return Err(InvalidFlag::Needs {
                                flag: "only-verdict",
                                needs: "--exit-codes plugin",
                            })
                        }
                        (Some(only), ExitCodes::Plugin) => Some(match only {
                            OnlyVerdict::Orphaned => Verdict::Orphaned,
                            OnlyVerdict::LeftBehind => Verdict::LeftBehind,
                            OnlyVerdict::InUse => Verdict::InUse,
                            OnlyVerdict::CannotTell => Verdict::CannotTell,
                        }),
                    },
                    // A snapshot cannot change: its answer is final, not polled for.
                    wait: args.wait.filter(|_| !replayed),
                    wait_on_replay: replayed && args.wait.is_some(),
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
            // Nothing to look at: the shared flags keep their defaults.
            Some(Command::CopyTo(args)) => (
                Mode::CopyTo {
                    folder: args.folder,
                },
                SharedArgs::default(),
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
            procfs_stand_in: source.procfs_stand_in,
            state: source
                .state
                .unwrap_or_else(|| PathBuf::from(crate::observe::witness::DEFAULT_DIRECTORY)),
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
                expected: self.kubelet.given,
            },
            containers: ContainersConfig {
                docker_socket: self.containers.docker_socket,
                podman_socket: self.containers.podman_socket,
                timeout: containers_timeout,
                expected: [
                    (Engine::Docker, self.containers.docker_given),
                    (Engine::Podman, self.containers.podman_given),
                ]
                .into_iter()
                .filter_map(|(engine, given)| given.then_some(engine))
                .collect(),
                ..ContainersConfig::default()
            },
        })
    }
}

/// `--gpu`'s GPUs as `--gpu.numbering` numbers them, each once.
fn gpu_names(gpus: Vec<GpuArg>, numbering: Numbering) -> Vec<GpuName> {
    let mut names: Vec<GpuName> = Vec::new();
    for gpu in gpus {
        let name = match (gpu, numbering) {
            (GpuArg::Number(number), Numbering::Nvml) => GpuName::Index(number),
            (GpuArg::Number(number), Numbering::Minor) => GpuName::Minor(number),
            (GpuArg::Uuid(uuid), _) => GpuName::Uuid(uuid),
        };
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::flags::DEFAULT_PORT;
    use crate::cli::testing::parse;

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
        assert_eq!(check.gpus, vec![GpuName::Index(2)]);
        assert_eq!(check.wait, Some(Duration::from_secs(30)));
        assert_eq!(check.timeout, DEFAULT_TIMEOUT);
        assert!(parse(&["check", "--wait", "30"]).is_err());
    }

    #[test]
    fn check_takes_gpus_as_slurm_and_cuda_name_them() {
        let check = |args: &[&str]| {
            let mut words = vec!["check"];
            words.extend_from_slice(args);
            match parse(&words).map(|config| config.mode) {
                Ok(Mode::Check(check)) => Ok(check),
                Ok(other) => panic!("{other:?}"),
                Err(error) => Err(error),
            }
        };
        let uuid = "GPU-6f1c2a51-0001-4000-8000-000000000000";
        // $SLURM_JOB_GPUS is a comma list; --gpu repeats; each GPU once.
        let both = check(&["--gpu", "0,2", "--gpu", uuid, "--gpu", "2"]).unwrap();
        assert_eq!(
            both.gpus,
            vec![
                GpuName::Index(0),
                GpuName::Index(2),
                GpuName::Uuid(uuid.into())
            ]
        );
        let minors = check(&["--gpu", "1,3", "--gpu.numbering", "minor"]).unwrap();
        assert_eq!(minors.gpus, vec![GpuName::Minor(1), GpuName::Minor(3)]);
        for (bad, said) in [
            ("", "an empty GPU"),
            ("0,", "an empty GPU"),
            (
                "MIG-4f1c2a51-0000-4000-8000-000000000000",
                "is a MIG instance",
            ),
            ("first", "neither a GPU index nor a GPU UUID"),
        ] {
            let error = check(&["--gpu", bad]).unwrap_err();
            assert!(error.contains(said), "{bad:?}: {error}");
        }
        let plain = check(&[]).unwrap();
        assert!(!plain.summary && !plain.foreign);
        assert_eq!(plain.exit_codes, Convention::Detailed);
        let plugin = check(&["--summary", "--foreign", "--exit-codes", "plugin"]).unwrap();
        assert!(plugin.summary && plugin.foreign);
        assert_eq!(plugin.exit_codes, Convention::Plugin);
        // One line or a document: not both.
        assert!(check(&["--summary", "--json"]).is_err());
        let only = check(&["--exit-codes", "plugin", "--only-verdict", "left-behind"]).unwrap();
        assert_eq!(only.only_verdict, Some(Verdict::LeftBehind));
        let error = check(&["--only-verdict", "orphaned"]).unwrap_err();
        assert_eq!(error, "--only-verdict needs --exit-codes plugin");
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
                expected: true,
            }
        );
        // Given after the subcommand, or only the pod log directories: expected too.
        let config = parse(&["check", "--path.pod-logs", "/host/log/pods"]).unwrap();
        assert!(config.kubernetes.expected);
        // The interval alone names no kubelet.
        let config = parse(&["check", "--kubelet.refresh-interval", "30s"]).unwrap();
        assert!(!config.kubernetes.expected);
        let error = parse(&["--kubelet.refresh-interval", "0s"]).unwrap_err();
        assert!(error.contains("longer than 0"), "{error}");
    }
}
