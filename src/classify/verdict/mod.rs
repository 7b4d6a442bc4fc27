//! The verdict on one GPU (or MIG instance), decided from its finished account: what it
//! amounts to with the facts its sentence names (`finding.rs`), what would give the
//! memory back with the commands to run (`remedy.rs`, `commands.rs`), and the facts worth
//! a line each (`notes.rs`). Each decider owns its types; none reads another's output but
//! the remedy, which follows from the finding.

pub(super) mod commands;
pub(super) mod finding;
pub(super) mod notes;
pub(super) mod remedy;

use super::account::GpuAccount;
use super::holders::scan::ScanSummary;
use crate::observe::RecoveryAction;
use commands::Suggestion;
use finding::Finding;
use notes::Note;
use remedy::Remedy;
use serde::Serialize;

/// The verdict on one GPU or MIG instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// What the account amounts to, with the facts its sentence names (`finding` in JSON
    /// is its kind).
    #[serde(serialize_with = "finding_kind")]
    pub finding: Finding,
    /// What would give the memory back.
    pub remedy: Remedy,
    /// The remedy's commands, as a person runs them (`verdict` in `check --json`).
    #[serde(skip)]
    pub suggestion: Suggestion,
    /// Facts worth a line each.
    pub notes: Vec<Note>,
}

/// What the verdict on one account is judged with beside the account itself.
#[derive(Debug, Clone, Copy)]
pub(super) struct Circumstances {
    /// The holder scan the account's holders were found by.
    pub scan: Option<ScanSummary>,
    /// The driver's recovery action for the GPU.
    pub recovery: Option<RecoveryAction>,
    /// When the look was made, in seconds since the Unix epoch.
    pub taken_at: Option<u64>,
    /// The GPU the commands act on (a MIG instance's GPU for its own account).
    pub gpu: u32,
    /// The look went by no witness state: it cannot have seen a server killed.
    pub unwatched: bool,
}

impl Verdict {
    /// The verdict on `account`.
    pub(super) fn of(account: &GpuAccount, circumstances: Circumstances) -> Verdict {
        let finding = finding::decide(account);
        let remedy = remedy::decide(
            account,
            finding.kind(),
            circumstances.scan,
            circumstances.recovery,
            circumstances.taken_at,
        );
        Verdict {
            suggestion: commands::suggest(&remedy, circumstances.gpu),
            notes: notes::decide(
                account,
                circumstances.scan,
                circumstances.recovery,
                circumstances.unwatched,
            ),
            finding,
            remedy,
        }
    }
}

fn finding_kind<S: serde::Serializer>(finding: &Finding, serializer: S) -> Result<S::Ok, S::Error> {
    finding.kind().serialize(serializer)
}
