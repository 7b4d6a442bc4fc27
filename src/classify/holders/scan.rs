//! What a holder scan saw of the host's processes, and why the holder of orphaned memory
//! cannot be named when it could not see enough.

use serde::Serialize;

/// Summary of a holder scan for the exporter's own health series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScanSummary {
    /// Stopped at its time budget.
    pub cut_short: bool,
    /// Processes whose descriptors could not be read.
    pub permission_errors: u64,
    /// Seconds it took.
    pub duration_seconds: f64,
    /// Whole seconds a `/proc` read had been blocked, when one kept the scan from
    /// running or cut it short.
    pub blocked_seconds: Option<u64>,
}

impl ScanSummary {
    /// Every process was looked at: no holder can be missing.
    pub fn complete(&self) -> bool {
        !self.cut_short && self.permission_errors == 0
    }
}

/// `check --json`'s `holder_scan`: `complete` beside what it is derived from, for scripts.
impl Serialize for ScanSummary {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct ScanJson {
            complete: bool,
            cut_short: bool,
            permission_errors: u64,
            duration_seconds: f64,
            #[serde(skip_serializing_if = "Option::is_none")]
            blocked_seconds: Option<u64>,
        }
        ScanJson {
            complete: self.complete(),
            cut_short: self.cut_short,
            permission_errors: self.permission_errors,
            duration_seconds: self.duration_seconds,
            blocked_seconds: self.blocked_seconds,
        }
        .serialize(serializer)
    }
}

/// Why the holder of orphaned memory cannot be named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "why", rename_all = "snake_case")]
pub enum Blindness {
    /// Processes hold the device file but their mappings could not be read.
    MappingsUnreadable {
        /// How many.
        processes: u64,
    },
    /// The culprits live in another PID namespace than this process's: `kill` here
    /// cannot reach them.
    CulpritsNotVisible,
    /// The left-behind workers live in another PID namespace than this process's: `kill`
    /// here cannot reach them.
    WorkersNotVisible,
    /// The scan for holders ran out of time before it saw every process.
    ScanCutShort,
    /// A `/proc` read of the scan (or of the look before it) blocked and has not
    /// returned: a process in uninterruptible sleep holding its memory map lock blocks
    /// reads of its maps. The scan saw only part of the processes, or none.
    ScanBlocked {
        /// Whole seconds the read had been blocked.
        seconds: u64,
    },
    /// The descriptors of some processes could not be read.
    ScanDenied {
        /// How many.
        processes: u64,
    },
    /// No scan for holders was made (a snapshot taken without one).
    NoScan,
}

impl Blindness {
    /// How running `check` again would see what this one could not; `None` where no run
    /// from here would (culprits in another PID namespace: only the host reaches them).
    pub fn look_again(self) -> Option<LookAgain> {
        match self {
            Blindness::MappingsUnreadable { .. } | Blindness::ScanDenied { .. } => {
                Some(LookAgain::AsRoot)
            }
            Blindness::ScanCutShort | Blindness::ScanBlocked { .. } | Blindness::NoScan => {
                Some(LookAgain::AsBefore)
            }
            Blindness::CulpritsNotVisible | Blindness::WorkersNotVisible => None,
        }
    }
}

/// How another look would see more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookAgain {
    /// With the privilege this one lacked: root, or the capabilities the reason names.
    AsRoot,
    /// As this one ran: a new scan with a budget of its own.
    AsBefore,
}

/// What a holder scan could not see, if anything.
pub fn scan_blindness(scan: Option<ScanSummary>) -> Option<Blindness> {
    match scan {
        None => Some(Blindness::NoScan),
        Some(ScanSummary {
            blocked_seconds: Some(seconds),
            ..
        }) => Some(Blindness::ScanBlocked { seconds }),
        Some(scan) if scan.cut_short => Some(Blindness::ScanCutShort),
        Some(scan) if scan.permission_errors > 0 => Some(Blindness::ScanDenied {
            processes: scan.permission_errors,
        }),
        Some(_) => None,
    }
}
