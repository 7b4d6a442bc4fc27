//! The command line as clap derives it: the modes and the flag groups each takes, whose
//! doc comments are the `--help` text, with the exit statuses each help ends with.

use super::flags::{
    CheckArgs, CollectorArgs, ContainersArgs, CopyToArgs, JudgementArgs, KubeletArgs, SharedArgs,
    SnapshotArgs, TextfileArgs, WebArgs,
};
use clap::{Parser, Subcommand};

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
  4  memory left behind: held for a server that has exited, or by a killed process stuck in the driver
  5  in use: with --foreign, live processes in no running Slurm job hold memory

With --exit-codes plugin, as node-problem-detector and Nagios-style callers read it:
  0  OK: no memory left over
  1  problem: memory orphaned, left behind, stuck in the driver, or (--foreign) in use outside the running jobs
  3  unknown: cannot tell, the look did not complete, NVML missing, or a bad flag";

/// Exit statuses of `snapshot` and `textfile`: each code with its meaning as
/// [`crate::exit_codes::written_meaning`] says it (a test holds the two together).
const WRITE_EXIT_STATUS: &str = "\
Exit status:
  0  written
  2  error: a bad flag, a file that cannot be written; or NVML missing (the file is still written, and says so)
  3  written, but NVML, a GPU or a /proc read did not answer within --timeout (the file says which)";

/// Exit statuses of `copy-to`.
const COPY_EXIT_STATUS: &str = "\
Exit status:
  0  copied
  2  error: a folder that does not exist or cannot be written";

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
    /// Copy this program into a folder, atomically, and exit: how a Kubernetes init
    /// container hands `vram-exporter check` to a sidecar of another image
    /// (node-problem-detector's), as this image has no shell and no cp.
    #[command(name = "copy-to", after_help = COPY_EXIT_STATUS)]
    CopyTo(CopyToArgs),
}

#[cfg(test)]
mod tests {
    use crate::cli::testing::help;

    #[test]
    fn help_lists_the_exit_statuses() {
        use crate::exit_codes::{
            meaning, plugin, plugin_meaning, written_meaning, CANNOT_TELL, ERROR, IN_USE,
            LEFT_BEHIND, ORPHANED, SUCCESS,
        };
        let check = help(&["check"]);
        for code in [SUCCESS, ORPHANED, ERROR, CANNOT_TELL, LEFT_BEHIND, IN_USE] {
            let status = format!("  {code}  {}", meaning(code));
            assert!(check.contains(&status), "{status:?} missing from:\n{check}");
        }
        let (_, plugins) = check.split_once("With --exit-codes plugin").unwrap();
        for code in [plugin::OK, plugin::PROBLEM, plugin::UNKNOWN] {
            let status = format!("  {code}  {}", plugin_meaning(code));
            assert!(
                plugins.contains(&status),
                "{status:?} missing from:\n{check}"
            );
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
}
