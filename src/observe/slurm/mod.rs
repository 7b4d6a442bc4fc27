//! Slurm: which job steps still run on this node, from Slurm's own processes (a
//! `slurmstepd` per step, for as long as Slurm runs it).
//!
//! - `slurmstepds`: finding them in `/proc` and remembering them from one look to the
//!   next ([`Slurmstepds`]).
//! - `reading`: which steps run ([`SlurmReading`]), plain serialisable data.
//!
//! Which step a process runs in comes from its cgroup, which `procfs` reads; which steps
//! to ask about is decided where the sources meet (`observe`), and whether a step that
//! ended left a process behind is classification (`classify::slurm`).

mod reading;
mod slurmstepds;

pub use reading::{RunningStep, SlurmReading};
pub(crate) use slurmstepds::Slurmstepds;
