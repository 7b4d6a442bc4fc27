//! The flag groups, in the order `--help` lists them, and the flags of each subcommand.
//!
//! Flags shared by several modes are defined once, in a group of their own, and every mode
//! flattens one [`SharedArgs`] that names the groups it uses ([`Without`] for the others),
//! so each `--help` lists only what does something there. They are also accepted before
//! the subcommand (`vram-exporter --replay FILE check`): `Cli::from_command_line` reads
//! them as if they were given first after it. Values are `Option`s so that "not given" can
//! be told apart from a default; the defaults are applied in `Cli::into_config`.

mod containers;
mod judging;
mod kubelet;
mod logging;
mod metrics;
mod source;
mod subcommands;
mod web;

pub use containers::ContainersArgs;
pub use judging::{JudgementArgs, ScanArgs};
pub use kubelet::KubeletArgs;
pub use logging::LogArgs;
pub use metrics::CollectorArgs;
pub use source::SourceArgs;
pub use subcommands::{
    CheckArgs, CopyToArgs, ExitCodes, Numbering, OnlyVerdict, SnapshotArgs, TextfileArgs,
    TimeoutArgs,
};
pub use web::WebArgs;
// The tests of the resolved config hold its default against it.
#[cfg(test)]
pub use web::DEFAULT_PORT;

use clap::Args;

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
    pub(super) fn widen(self) -> SharedArgs<JudgementArgs, CollectorArgs> {
        SharedArgs {
            source: self.source,
            judgement: self.judgement.into(),
            scan: self.scan,
            collector: self.collector.into(),
            log: self.log,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::cli::testing::{help, listed_flags};
    use std::collections::BTreeMap;

    #[test]
    fn each_help_lists_only_the_flags_of_its_mode() {
        let shared = [
            "path.procfs",
            "path.state",
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
                &[
                    "json",
                    "summary",
                    "gpu",
                    "gpu.numbering",
                    "foreign",
                    "exit-codes",
                    "only-verdict",
                    "wait",
                    "wait.interval",
                    "timeout"
                ],
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
            (
                "Where to look",
                &["path.procfs", "path.state", "nvml.library", "replay"],
            ),
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
}
