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

/// The exit status `check` ends with for `status`.
pub fn of(status: CheckStatus) -> u8 {
    match status {
        CheckStatus::Clear => SUCCESS,
        CheckStatus::Orphaned => ORPHANED,
        CheckStatus::LeftBehind => LEFT_BEHIND,
        CheckStatus::CannotTell | CheckStatus::NotAnswering => CANNOT_TELL,
        CheckStatus::NvmlDown => ERROR,
    }
}

/// What an exit status of `check` means, in words.
pub fn meaning(code: u8) -> &'static str {
    match code {
        SUCCESS => "nothing orphaned",
        ORPHANED => "orphaned memory found",
        CANNOT_TELL => "cannot tell: some memory cannot be judged",
        LEFT_BEHIND => "memory left behind: held for a server that has exited, or by a killed process stuck in the driver",
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
