//! What `check` says on stderr while it waits: for a slow look, which reader waits in
//! which call; for `--wait`, how much memory is still held, and how the wait ended.

use crate::classify::HeldAs;
use crate::units::format_bytes;
use std::time::Duration;

/// What a look waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Awaited {
    /// NVML itself (loading it, or a library-level call).
    Nvml,
    /// One GPU, by NVML index.
    Gpu(u32),
    /// The `/proc` reader.
    Procfs,
}

/// A call a look has waited on for longer than a person waits without wondering.
#[derive(Debug, Clone, Copy)]
pub struct SlowCall<'a> {
    /// Who is in the call.
    pub awaited: Awaited,
    /// The call.
    pub call: &'a str,
    /// Seconds it has taken so far.
    pub seconds: f64,
}

/// `GPU 1 (in nvmlDeviceGetMemoryInfo_v2)` for each slow call: what the progress line is
/// about, which stays the same while the calls do.
pub fn slow_calls_key(slow: &[SlowCall]) -> String {
    let calls: Vec<String> = slow
        .iter()
        .map(|call| format!("{} (in {})", awaited_words(call.awaited), call.call))
        .collect();
    calls.join("; ")
}

/// `waiting for GPU 1 (in nvmlDeviceGetMemoryInfo_v2 for 3.0s); this look ends by 30s
/// (--timeout), reporting what has not answered`.
pub fn look_line(slow: &[SlowCall], timeout: Duration) -> String {
    let calls: Vec<String> = slow
        .iter()
        .map(|call| {
            format!(
                "{} (in {} for {:.1}s)",
                awaited_words(call.awaited),
                call.call,
                call.seconds
            )
        })
        .collect();
    format!(
        "waiting for {}; this look ends by {:.0}s (--timeout), reporting what has not answered",
        calls.join(", "),
        timeout.as_secs_f64()
    )
}

fn awaited_words(awaited: Awaited) -> String {
    match awaited {
        Awaited::Nvml => "NVML".to_string(),
        Awaited::Gpu(index) => format!("GPU {index}"),
        Awaited::Procfs => "/proc".to_string(),
    }
}

/// `orphaned` or `held`.
fn held_words(held: HeldAs) -> &'static str {
    match held {
        HeldAs::Orphaned => "orphaned",
        HeldAs::Held => "held",
    }
}

/// Where a wait stands.
#[derive(Debug, Clone, Copy)]
pub struct WaitProgress {
    /// Bytes still to be freed on the GPUs asked about.
    pub still_held: u64,
    /// How they are named, as the first look found them.
    pub held: HeldAs,
    /// Time waited so far.
    pub waited: Duration,
    /// Time the wait may take.
    pub wait: Duration,
}

impl WaitProgress {
    /// What the line is about: the bytes still held, as shown.
    pub fn figure(self) -> String {
        format_bytes(self.still_held)
    }

    /// `waiting: 8.6 GiB still orphaned (1.5s of 30s)`.
    pub fn line(self) -> String {
        format!(
            "waiting: {} still {} ({:.1}s of {:.0}s)",
            format_bytes(self.still_held),
            held_words(self.held),
            self.waited.as_secs_f64(),
            self.wait.as_secs_f64()
        )
    }

    /// How the wait ended: `orphaned memory freed after 1.5s`, or what is still held.
    pub fn end_line(self, freed: bool) -> String {
        let held = held_words(self.held);
        if freed {
            format!(
                "{held} memory freed after {:.1}s",
                self.waited.as_secs_f64()
            )
        } else {
            format!(
                "{} still {held} after {:.1}s",
                format_bytes(self.still_held),
                self.waited.as_secs_f64()
            )
        }
    }
}
