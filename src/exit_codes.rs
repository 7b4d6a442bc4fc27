//! The exit statuses every command shares, as `check --help` and the README list them.

use crate::classify::{CheckStatus, Written};

/// Nothing orphaned (for `check`); done (for the other commands).
pub const SUCCESS: u8 = 0;
/// `check`: some GPU holds memory without a live owner.
pub const ORPHANED: u8 = 1;
/// Any command: bad flags, an unreadable snapshot or file, NVML not available.
pub const ERROR: u8 = 2;
/// `check`: nothing is proven orphaned, but some GPU's memory cannot be judged (a lost
/// GPU, owners that cannot be read, a blind exporter); or NVML or a GPU did not answer
/// within `--timeout`, whatever else was found.
pub const CANNOT_TELL: u8 = 3;
/// `check`: nothing is orphaned, but some GPU's memory is held by workers a killed server
/// left behind (seen, or possibly), or by owners killed and stuck in the driver.
pub const LEFT_BEHIND: u8 = 4;
/// `check --foreign`: nothing is orphaned or left behind, but live processes in no
/// running Slurm job hold memory on a GPU chosen.
pub const IN_USE: u8 = 5;

/// The convention a plugin follows, as node-problem-detector's custom plugins and
/// Nagios-style checks (the Monitoring Plugins' guidelines) read an exit status: 0 OK,
/// 1 a problem (NPD's NonOK, Nagios's WARNING), 3 unknown (NPD takes every status but 0
/// and 1 for unknown; 3 is Nagios's UNKNOWN). 2, Nagios's CRITICAL, is never used: its
/// NPD meaning (unknown) would contradict it.
pub mod plugin {
    /// No memory left over.
    pub const OK: u8 = 0;
    /// Memory left over: orphaned, left behind, killed and stuck, or (with `--foreign`)
    /// in use outside the running jobs.
    pub const PROBLEM: u8 = 1;
    /// Cannot tell: some memory cannot be judged, the look did not complete, NVML is
    /// missing, or the command line is wrong.
    pub const UNKNOWN: u8 = 3;
}

/// Which exit statuses `check` ends with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Convention {
    /// Its own: a status per finding (the constants above).
    #[default]
    Detailed,
    /// A plugin's: OK, problem or unknown ([`plugin`]).
    Plugin,
}

impl Convention {
    /// The exit status of a mistake or a failure: an error, or unknown for a plugin.
    pub fn error(self) -> u8 {
        match self {
            Convention::Detailed => ERROR,
            Convention::Plugin => plugin::UNKNOWN,
        }
    }
}

/// The convention a command line asks for, read from its words alone: a line that does
/// not parse still ends with the status its caller reads (`--exit-codes plugin` or
/// `--exit-codes=plugin`, anywhere).
pub fn asked_in(args: &[std::ffi::OsString]) -> Convention {
    let words: Vec<&str> = args.iter().filter_map(|arg| arg.to_str()).collect();
    let plugin = words.iter().enumerate().any(|(at, word)| {
        *word == "--exit-codes=plugin"
            || (*word == "--exit-codes" && words.get(at + 1) == Some(&"plugin"))
    });
    if plugin {
        Convention::Plugin
    } else {
        Convention::Detailed
    }
}

/// The exit status `check` ends with for `status`.
pub fn of(status: CheckStatus) -> u8 {
    match status {
        CheckStatus::Clear => SUCCESS,
        CheckStatus::Orphaned => ORPHANED,
        CheckStatus::StillHeld => LEFT_BEHIND,
        CheckStatus::CannotTell | CheckStatus::NotAnswering => CANNOT_TELL,
        CheckStatus::NvmlDown => ERROR,
    }
}

/// One verdict a plugin's rule is about (`--only-verdict`): node-problem-detector takes a
/// rule's reason from its config, so a reason per verdict is a rule per verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Orphaned memory.
    Orphaned,
    /// Left behind, or a kill stuck in the driver.
    LeftBehind,
    /// In use outside the running jobs (`--foreign`).
    InUse,
    /// Cannot tell: memory not judged, a look that did not complete, NVML missing.
    CannotTell,
}

impl Verdict {
    /// Whether `check`'s own exit status `detailed` says this verdict.
    fn says(self, detailed: u8) -> bool {
        match self {
            Verdict::Orphaned => detailed == ORPHANED,
            Verdict::LeftBehind => detailed == LEFT_BEHIND,
            Verdict::InUse => detailed == IN_USE,
            Verdict::CannotTell => matches!(detailed, CANNOT_TELL | ERROR),
        }
    }

    /// Whether a GPU whose status is `status` has this verdict (not [`Verdict::InUse`],
    /// which is the selection's).
    pub fn of_status(self, status: CheckStatus) -> bool {
        self.says(of(status))
    }
}

/// The exit status `check` ends with for `status` in `convention`, the GPUs being `in_use`
/// (`--foreign` found live processes in no running job holding memory, and nothing
/// worse). With `only`, a plugin's status is a problem for that verdict alone and OK for
/// anything else, unknown included: a rule per verdict never fires for another's.
pub fn of_check(
    status: CheckStatus,
    in_use: bool,
    convention: Convention,
    only: Option<Verdict>,
) -> u8 {
    let detailed = if in_use { IN_USE } else { of(status) };
    match (convention, only) {
        (Convention::Detailed, _) => detailed,
        (Convention::Plugin, Some(verdict)) if verdict.says(detailed) => plugin::PROBLEM,
        (Convention::Plugin, Some(_)) => plugin::OK,
        (Convention::Plugin, None) => match detailed {
            SUCCESS => plugin::OK,
            ORPHANED | LEFT_BEHIND | IN_USE => plugin::PROBLEM,
            _ => plugin::UNKNOWN,
        },
    }
}

/// What an exit status of `check` means, in words (its own convention).
pub fn meaning(code: u8) -> &'static str {
    match code {
        SUCCESS => "nothing orphaned",
        ORPHANED => "orphaned memory found",
        CANNOT_TELL => "cannot tell: some memory cannot be judged",
        LEFT_BEHIND => "memory left behind: held for a server that has exited, or by a killed process stuck in the driver",
        IN_USE => "in use: with --foreign, live processes in no running Slurm job hold memory",
        _ => "error",
    }
}

/// The exit status `snapshot` and `textfile` end with, once their file is written.
pub fn of_written(written: Written) -> u8 {
    match written {
        Written::Complete => SUCCESS,
        Written::NvmlDown => ERROR,
        Written::NotAnswered => CANNOT_TELL,
    }
}

/// What an exit status of `snapshot` and `textfile` means, in words: the help's table
/// (`--help` of both), which a test holds to these codes.
#[cfg(test)]
pub fn written_meaning(code: u8) -> &'static str {
    match code {
        SUCCESS => "written",
        CANNOT_TELL => "written, but NVML, a GPU or a /proc read did not answer within --timeout (the file says which)",
        _ => "error: a bad flag, a file that cannot be written; or NVML missing (the file is still written, and says so)",
    }
}

/// What an exit status of `check --exit-codes=plugin` means, in words: its `--help`.
pub fn plugin_meaning(code: u8) -> &'static str {
    match code {
        plugin::OK => "OK: no memory left over",
        plugin::PROBLEM => "problem: memory orphaned, left behind, stuck in the driver, or (--foreign) in use outside the running jobs",
        _ => "unknown: cannot tell, the look did not complete, NVML missing, or a bad flag",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_convention_is_ok_problem_or_unknown() {
        use CheckStatus::*;
        let plugin = |status, in_use| of_check(status, in_use, Convention::Plugin, None);
        assert_eq!(plugin(Clear, false), 0);
        for problem in [Orphaned, StillHeld] {
            assert_eq!(plugin(problem, false), 1, "{problem:?}");
        }
        assert_eq!(plugin(Clear, true), 1);
        assert_eq!(plugin(CannotTell, true), 1);
        for unknown in [CannotTell, NotAnswering, NvmlDown] {
            assert_eq!(plugin(unknown, false), 3, "{unknown:?}");
        }
        assert_eq!(Convention::Plugin.error(), 3);
        let words =
            |line: &str| -> Vec<std::ffi::OsString> { line.split(' ').map(Into::into).collect() };
        assert_eq!(
            asked_in(&words("vram-exporter check --exit-codes plugin --gpu x")),
            Convention::Plugin
        );
        assert_eq!(
            asked_in(&words("vram-exporter check --exit-codes=plugin")),
            Convention::Plugin
        );
        assert_eq!(
            asked_in(&words("vram-exporter check --gpu x")),
            Convention::Detailed
        );
        assert_eq!(Convention::Detailed.error(), ERROR);
        // The detailed convention keeps its own statuses, and names in use apart.
        assert_eq!(of_check(Clear, true, Convention::Detailed, None), IN_USE);
        assert_eq!(
            of_check(StillHeld, false, Convention::Detailed, None),
            LEFT_BEHIND
        );
        // A rule per verdict: a problem for its own, OK for every other, never unknown.
        let only = |status, verdict| of_check(status, false, Convention::Plugin, Some(verdict));
        assert_eq!(only(Orphaned, Verdict::Orphaned), 1);
        assert_eq!(only(StillHeld, Verdict::Orphaned), 0);
        assert_eq!(only(NvmlDown, Verdict::Orphaned), 0);
        assert_eq!(only(NotAnswering, Verdict::CannotTell), 1);
        assert_eq!(only(NvmlDown, Verdict::CannotTell), 1);
        assert_eq!(only(Clear, Verdict::CannotTell), 0);
        assert_eq!(only(StillHeld, Verdict::LeftBehind), 1);
        assert_eq!(
            of_check(Clear, true, Convention::Plugin, Some(Verdict::InUse)),
            1
        );
    }
}
