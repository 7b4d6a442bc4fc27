//! The commands a remedy comes with: what a person runs, in order, and the look that
//! tells whether it worked, as data. The renderers print them and choose none.

use super::remedy::{Remedy, WaitOn};
use crate::classify::holders::scan::LookAgain;
use crate::classify::processes::KillTarget;
use serde::Serialize;

/// A remedy's commands: the ones to run and the look that tells whether they worked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Suggestion {
    /// The commands, in the order to run them; empty when none would help.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<Command>,
    /// The look that tells whether they worked, when one follows them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub then: Option<Command>,
    /// Seconds the suggested look waits for the memory to be freed, when it waits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_seconds: Option<u64>,
}

impl Suggestion {
    /// Whether there is anything to run.
    pub fn is_empty(&self) -> bool {
        self.commands.is_empty() && self.then.is_none()
    }
}

/// Seconds the look after a kill or an MPS restart waits for the memory to be freed.
const AFTER_ACTING_WAIT_SECONDS: u64 = 30;
/// Seconds the look waits for a kill that waits in the driver, or after stopping owners.
const STUCK_WAIT_SECONDS: u64 = 60;
/// Seconds the look waits for memory the driver is freeing (see
/// [`FREEING_MEASURED`](crate::classify::owners::FREEING_MEASURED)).
const FREEING_WAIT_SECONDS: u64 = 5;

/// The commands of `remedy` on GPU `gpu` (a MIG instance's GPU for its own account), and
/// the look that tells whether they worked, with how long it waits.
pub(super) fn suggest(remedy: &Remedy, gpu: u32) -> Suggestion {
    let look = |seconds: u64| Command::look(gpu, Some(seconds), false);
    let pids = |targets: &[KillTarget]| targets.iter().map(|target| target.pid).collect::<Vec<_>>();
    // What a person runs, and how long the look after it waits (None: no look follows).
    let (commands, then_waits) = match remedy {
        Remedy::None => (vec![], None),
        Remedy::Kill { targets } | Remedy::KillLeftBehind { targets } => (
            vec![Command::kill(pids(targets))],
            Some(AFTER_ACTING_WAIT_SECONDS),
        ),
        Remedy::CancelJobs { jobs, targets } => {
            let mut commands = vec![Command::scancel(jobs.iter().map(|job| job.job_id))];
            if !targets.is_empty() {
                commands.push(Command::kill(pids(targets)));
            }
            (commands, Some(AFTER_ACTING_WAIT_SECONDS))
        }
        Remedy::Wait { on } => {
            let seconds = match on {
                WaitOn::Free => FREEING_WAIT_SECONDS,
                WaitOn::Kill(_) => STUCK_WAIT_SECONDS,
            };
            // The look is the command itself: there is nothing to run before it.
            return Suggestion {
                commands: vec![look(seconds)],
                then: None,
                wait_seconds: Some(seconds),
            };
        }
        Remedy::ResetOrReboot { .. } | Remedy::ResetGpu { .. } => {
            (vec![Command::reset_gpu(gpu)], None)
        }
        Remedy::RestartMps { .. } => (
            vec![Command::quit_mps(), Command::start_mps()],
            Some(AFTER_ACTING_WAIT_SECONDS),
        ),
        Remedy::StopOwners { .. } => (vec![], Some(STUCK_WAIT_SECONDS)),
        Remedy::Reboot => (vec![Command::reboot()], None),
        Remedy::CannotTell { reason } => (
            reason
                .look_again()
                .map(|how| Command::look(gpu, None, how == LookAgain::AsRoot))
                .into_iter()
                .collect(),
            None,
        ),
    };
    Suggestion {
        commands,
        then: then_waits.map(look),
        wait_seconds: then_waits,
    }
}

/// A command the exporter suggests and never runs, as a script would run it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Command {
    /// The program.
    pub program: &'static str,
    /// Its arguments.
    pub args: Vec<String>,
    /// What it reads on standard input, when it reads a command there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdin: Option<&'static str>,
}

impl Command {
    fn new(program: &'static str, args: impl IntoIterator<Item = String>) -> Command {
        Command {
            program,
            args: args.into_iter().collect(),
            stdin: None,
        }
    }

    /// `kill PID...`
    pub(crate) fn kill(pids: impl IntoIterator<Item = u32>) -> Command {
        Command::new("kill", pids.into_iter().map(|pid| pid.to_string()))
    }

    /// `scancel JOB...`
    pub(crate) fn scancel(jobs: impl IntoIterator<Item = u64>) -> Command {
        Command::new("scancel", jobs.into_iter().map(|job| job.to_string()))
    }

    /// `vram-exporter check --gpu INDEX [--wait SECONDSs]`, as root where `as_root`.
    pub(crate) fn look(gpu: u32, wait_seconds: Option<u64>, as_root: bool) -> Command {
        let mut args = vec!["check".to_string(), "--gpu".to_string(), gpu.to_string()];
        if let Some(seconds) = wait_seconds {
            args.extend(["--wait".to_string(), format!("{seconds}s")]);
        }
        if as_root {
            Command::new(
                "sudo",
                std::iter::once("vram-exporter".to_string()).chain(args),
            )
        } else {
            Command::new("vram-exporter", args)
        }
    }

    /// `nvidia-smi --gpu-reset -i INDEX`
    pub(crate) fn reset_gpu(gpu: u32) -> Command {
        Command::new(
            "nvidia-smi",
            ["--gpu-reset".to_string(), "-i".to_string(), gpu.to_string()],
        )
    }

    /// `echo quit | nvidia-cuda-mps-control`: ends the MPS control daemon and its servers.
    pub(crate) fn quit_mps() -> Command {
        Command {
            stdin: Some("quit"),
            ..Command::new("nvidia-cuda-mps-control", [])
        }
    }

    /// `nvidia-cuda-mps-control -d`: starts the MPS control daemon.
    pub(crate) fn start_mps() -> Command {
        Command::new("nvidia-cuda-mps-control", ["-d".to_string()])
    }

    /// `systemctl reboot`
    pub(crate) fn reboot() -> Command {
        Command::new("systemctl", ["reboot".to_string()])
    }
}
