//! Reading one GPU through NVML: its identity, memory and process lists, its MIG devices
//! (each through its own handle), and what the driver says it needs. A call this driver
//! or GPU does not support leaves its part unknown, never fails the GPU.
//!
//! This runs on the GPU's own reader thread; each blocking call is named first
//! ([`calling`]), so a GPU stuck in one is reported with it.
//!
//! - this file: one GPU read whole, and what is kept of it between scrapes ([`Answers`]);
//! - `identity`: its UUID, name, PCI bus id and minor number, kept as last seen;
//! - `state`: the memory and process lists of a GPU or MIG device;
//! - `mig_devices`: the MIG mode and each MIG device;
//! - `health`: what the driver says the GPU needs.

mod health;
mod identity;
mod mig_devices;
mod state;

use self::health::HealthAnswers;
pub(super) use self::identity::Identity;
use self::mig_devices::KeptMigMode;
use crate::observe::nvml::reading::{GpuHealth, GpuReading, GpuState};
use crate::observe::worker::calling;
use crate::sync::lock;
use nvml_wrapper::Nvml;
use std::sync::Mutex;

/// What a GPU cannot answer, and its MIG mode, which changes only at a reset: kept so
/// that a scrape does not ask again. Measured on an H200 (driver 580), asked in a
/// scrape's order: `nvmlDeviceGetMigMode` takes 170 to 360 us and
/// `nvmlDeviceGetRetiredPagesPendingStatus` 90 to 300 us to say NotSupported, against
/// about 80 us for everything else a scrape asks of a GPU.
#[derive(Debug, Default)]
pub(super) struct Answers {
    /// The MIG mode (current, pending) and when it was read; `None` inside: no MIG.
    mig_mode: KeptMigMode,
    /// Whether the GPU's identity (UUID, name, PCI bus id, minor number) has been read
    /// whole: none of it changes while NVML stays loaded (these answers are forgotten
    /// when it is loaded again), so a scrape asks for it only until all four answered.
    identity_whole: bool,
    /// Which health calls the GPU cannot answer, and what the driver last said it needs.
    health: HealthAnswers,
}

/// GPU `index`, its identity kept in `known`: updated as soon as it is read, before the
/// calls that may hang, so a GPU stuck in one keeps its labels. `xid_events` is the
/// number of critical Xid events counted so far, 0 where nothing watches them.
pub(super) fn read_gpu(
    nvml: &Nvml,
    index: u32,
    known: &Mutex<Identity>,
    answers: &mut Answers,
    xid_events: u64,
) -> GpuReading {
    let mut cached = lock(known).clone();
    calling("nvmlDeviceGetHandleByIndex_v2");
    let (state, mig, health) = match nvml.device_by_index(index) {
        Ok(device) => {
            if !answers.identity_whole {
                identity::refresh_identity(&device, &mut cached);
                lock(known).clone_from(&cached);
                answers.identity_whole = cached.is_whole();
            }
            let mut state = state::read_state(&device);
            let mig = mig_devices::read_mig(&device, &mut answers.mig_mode);
            if let Some(mig) = &mig {
                mig_devices::complete_from_instances(&mut state, mig);
            }
            let answered = matches!(state, GpuState::Ok { .. });
            let health = health::health(&device, &mut answers.health, answered, xid_events);
            (state, mig, health)
        }
        Err(error) => (state::failed(error), None, GpuHealth::default()),
    };
    GpuReading {
        mig,
        health,
        ..cached.reading(index, state)
    }
}
