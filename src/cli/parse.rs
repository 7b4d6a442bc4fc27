//! Reading the words of the command line: one mistake in one line, and the flags given
//! before a subcommand read as its own, or refused when they do nothing for it.

use super::command::Cli;
use super::errors::CliError;
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use std::ffi::OsString;

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
        let mut cli = Cli::from_arg_matches(&matches).map_err(parse_error)?;
        let given = |id: &str| given_on_command_line(&matches, id);
        cli.kubelet.given = given("pod_resources_path") || given("pod_logs");
        cli.containers.docker_given = given("docker_socket");
        cli.containers.podman_given = given("podman_socket");
        Ok(cli)
    }
}

/// Whether the flag `id` was given on the command line, before or after the subcommand,
/// rather than left at its default: a source named there is expected to be there.
fn given_on_command_line(matches: &clap::ArgMatches, id: &str) -> bool {
    let here = matches
        .try_get_raw(id)
        .is_ok_and(|_| matches.value_source(id) == Some(ValueSource::CommandLine));
    here || matches
        .subcommand()
        .is_some_and(|(_, subcommand)| given_on_command_line(subcommand, id))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::config::{Config, Mode};
    use crate::cli::testing::{listed_flags, parse};
    use crate::logging::{LogFormat, LogLevel};
    use std::path::{Path, PathBuf};
    use std::time::Duration;

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
        (&["--path.state", "/run/vram"], ALL, |c| {
            c.state == Path::new("/run/vram")
        }),
        (&["--test.procfs-stand-in"], ALL, |c| c.procfs_stand_in),
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
            Mode::Serve(_) | Mode::CopyTo { .. } => None,
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
            let own: &[&str] = &[
                "help",
                "output",
                "json",
                "summary",
                "gpu",
                "gpu.numbering",
                "foreign",
                "exit-codes",
                "only-verdict",
                "wait",
                "wait.interval",
            ];
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
}
