//! `vram-exporter check`: the table and the one verdict sentence per GPU that a person
//! reads after `kill -9`, its JSON for scripts, its exit status, `--gpu` and `--wait`.
//!
//! This module reads the table and the last line for the tests: `verdicts.rs` checks the
//! table and the sentence of each kind of GPU, `json.rs` the JSON document, `errors.rs`
//! exit status 2, and `options.rs` `--gpu` and `--wait`.

mod errors;
mod json;
mod options;
mod verdicts;

use crate::helpers::*;

const MIB: u64 = 1 << 20;

/// Whether `sentence` describes the model fork-orphan child `pid` (named `dataloader`,
/// adopted by this test process) as the culprit of `dead_owner`'s memory, with its start
/// date and the evidence against it.
fn describes_culprit(sentence: &str, pid: u32, dead_owner: u32) -> bool {
    let user = user_name(effective_uid())
        .map(|name| format!(", user {name}"))
        .unwrap_or_default();
    let start = format!("still held by PID {pid} (dataloader, sleeping, started ");
    let evidence = format!(
        " UTC{user}, parent {}, holds a context on GPU 0: maps its device file, inherited: NVML lists it on no GPU, in the process group and session of exited PID {dead_owner}) - killing {pid} should free it.",
        std::process::id()
    );
    sentence.contains(&start) && sentence.ends_with(&evidence)
}

/// The last line `check` prints: its exit status in words.
fn exit_line(code: u8) -> String {
    let meaning = match code {
        0 => "nothing orphaned",
        1 => "orphaned memory found",
        3 => "cannot tell: some memory cannot be judged",
        _ => "error",
    };
    format!("\nexit status {code}: {meaning}\n")
}

/// The table lines of one GPU: from its `GPU N  ` header up to the blank line.
fn table_of(stdout: &str, gpu: u32) -> Vec<&str> {
    let header = format!("GPU {gpu}  ");
    stdout
        .lines()
        .skip_while(|line| !line.starts_with(&header))
        .take_while(|line| !line.is_empty())
        .collect()
}

/// The rows of a table's section that starts with a `PID  COMMAND ...` header line,
/// split into cells.
fn rows_after<'a>(table: &[&'a str], header: &[&str]) -> Vec<Vec<&'a str>> {
    table
        .iter()
        .skip_while(|line| columns(line) != header)
        .skip(1)
        .take_while(|line| columns(line)[0].parse::<u32>().is_ok())
        .map(|line| columns(line))
        .collect()
}

const OWNER_COLUMNS: [&str; 4] = ["PID", "COMMAND", "STATE", "MEMORY"];
const HOLDER_COLUMNS: [&str; 4] = ["PID", "COMMAND", "STATE", "PARENT"];
