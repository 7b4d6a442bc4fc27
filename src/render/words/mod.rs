//! A verdict in words: the sentence, its notes and the suggested command, for `check`'s
//! text and for `check --json`'s `verdict`. Classify chose every case and every command;
//! each case has fixed words here.

mod notes;
mod phrases;
mod remedy;
mod verdict;

pub(in crate::render) use phrases::pids_shortly;
pub(in crate::render) use phrases::{plural, thousands};
pub use phrases::{seconds_words, size_words};
pub(in crate::render) use verdict::finding_shortly;
pub use verdict::{instance_verdict, verdict, verdicts, Verdict};
