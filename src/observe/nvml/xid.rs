//! Critical Xid errors: a background thread owns an NVML event set and counts the events
//! per GPU and Xid, so a scrape only copies counts and never waits on the driver.
//!
//! Each NVML load starts a watcher of a new generation; a reload (or the driver going
//! away) ends the old one at its next wake-up, and only the current generation may
//! count, so an event is never counted twice. Counts live here, not in the watcher:
//! they survive reloads, as a Prometheus counter should.
//!
//! Starting a watcher waits, at most [`REGISTRATION_WAIT`], until it has registered the
//! GPUs: the collection that loaded NVML reads `vram_xid_watched` right after, and a
//! fresh exporter would otherwise say 0 on its first scrape and 1 on the next.

use super::reading::XidReading;
use crate::sync::lock;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{EventSet, Nvml};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Longest single wait for an event: how long a superseded watcher can linger (it
/// counts nothing meanwhile, and only holds the old library's handle). Each wake-up
/// costs the thread a cold start on a host that has no event to report: ten seconds
/// make it one wake where one second made ten.
const WAIT_MS: u32 = 10_000;
/// First pause before watching again after NVML failed us; doubles up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(300);
/// NVML's value for an Xid it cannot name.
const UNKNOWN_XID: u64 = 999;
/// Longest a start waits for the watcher to register the GPUs (a few milliseconds per GPU
/// on an H200 host); a driver that hangs in registration holds up one collection no
/// longer than this, and the GPUs read unwatched until the watcher gets through.
const REGISTRATION_WAIT: Duration = Duration::from_secs(2);

/// The counts, and which watcher may add to them.
#[derive(Debug, Default)]
pub(super) struct XidCounter {
    state: Mutex<State>,
    /// Signalled when a watcher has registered the GPUs (or given up trying).
    registered: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// The generation of the watcher allowed to count; bumped by every start and stop.
    generation: u64,
    /// The latest generation whose watcher has been through registering the GPUs.
    registered: u64,
    /// Per GPU UUID.
    gpus: BTreeMap<String, XidReading>,
    /// Events counted, of every GPU and generation: what the GPUs' threads compare to
    /// know that their health readings may be out of date.
    events: u64,
}

impl State {
    /// The entry of the GPU with `uuid`, made if it has none yet.
    fn gpu(&mut self, uuid: &str) -> &mut XidReading {
        self.gpus.entry(uuid.to_string()).or_default()
    }
}

impl XidCounter {
    /// Starts a watcher on `nvml`, superseding any earlier one, and waits until it has
    /// registered the GPUs, [`REGISTRATION_WAIT`] at most.
    pub(super) fn start(self: &Arc<Self>, nvml: Arc<Nvml>) {
        let generation = self.supersede();
        let counter = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("xid-events".into())
            .spawn(move || run(&nvml, &counter, generation));
        match spawned {
            Ok(_) => {
                if !self.wait_for_registration(generation, REGISTRATION_WAIT) {
                    tracing::warn!(
                        waited = ?REGISTRATION_WAIT,
                        "NVML has not finished registering the GPUs for critical Xid events; vram_xid_watched reads 0 until it does"
                    );
                }
            }
            Err(error) => {
                tracing::error!(error = %error, "cannot start the thread that counts critical Xid events");
            }
        }
    }

    /// Waits until the watcher of `generation` has been through registration, or has
    /// been superseded, for `timeout` at most; whether it got there in time.
    fn wait_for_registration(&self, generation: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = lock(&self.state);
        while state.generation == generation && state.registered < generation {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = match self.registered.wait_timeout(state, left) {
                Ok((state, _)) => state,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        true
    }

    /// The watcher of `generation` has registered what it could (or failed to).
    fn registration_done(&self, generation: u64) {
        let mut state = lock(&self.state);
        state.registered = state.registered.max(generation);
        self.registered.notify_all();
    }

    /// Ends the current watcher (NVML went away); the counts stay.
    pub(super) fn stop(&self) {
        self.supersede();
    }

    fn supersede(&self) -> u64 {
        let mut state = lock(&self.state);
        state.generation += 1;
        for gpu in state.gpus.values_mut() {
            gpu.watched = false;
        }
        state.generation
    }

    /// What is known of the GPU with `uuid`: unwatched and without events if nothing.
    pub(super) fn reading(&self, uuid: &str) -> XidReading {
        lock(&self.state)
            .gpus
            .get(uuid)
            .cloned()
            .unwrap_or_default()
    }

    /// Critical Xid events counted so far, over every GPU.
    pub(super) fn events(&self) -> u64 {
        lock(&self.state).events
    }

    /// Counts one event `xid` of the GPU with `uuid` if `generation` is still current.
    fn count(&self, generation: u64, uuid: &str, xid: u64) -> bool {
        self.if_current(generation, |state| {
            state.events += 1;
            *state.gpu(uuid).counts.entry(xid).or_default() += 1;
        })
    }

    fn is_current(&self, generation: u64) -> bool {
        lock(&self.state).generation == generation
    }

    /// Runs `change` on the GPU's entry if `generation` is still current.
    fn update(&self, generation: u64, uuid: &str, change: impl FnOnce(&mut XidReading)) -> bool {
        self.if_current(generation, |state| change(state.gpu(uuid)))
    }

    /// Runs `change` on the state if `generation` is still current; whether it ran.
    fn if_current(&self, generation: u64, change: impl FnOnce(&mut State)) -> bool {
        let mut state = lock(&self.state);
        let current = state.generation == generation;
        if current {
            change(&mut state);
        }
        current
    }

    fn unwatch_all(&self, generation: u64) {
        let mut state = lock(&self.state);
        if state.generation == generation {
            for gpu in state.gpus.values_mut() {
                gpu.watched = false;
            }
        }
    }
}

/// Watches until superseded; starts over, with back-off, when NVML fails.
fn run(nvml: &Nvml, counter: &XidCounter, generation: u64) {
    let mut backoff = FIRST_RETRY;
    while counter.is_current(generation) {
        match watch(nvml, counter, generation, &mut backoff) {
            Ok(()) => return,
            Err(error) => {
                counter.unwatch_all(generation);
                if !counter.is_current(generation) {
                    return;
                }
                tracing::warn!(error = %error, retry_in = ?backoff, "stopped watching critical Xid events; starting over");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(MAX_RETRY);
            }
        }
    }
}

/// One event set: register every GPU that supports critical Xid events, then count what
/// arrives. `Ok` once superseded (or when no GPU can be watched), `Err` when NVML fails.
fn watch(
    nvml: &Nvml,
    counter: &XidCounter,
    generation: u64,
    backoff: &mut Duration,
) -> Result<(), NvmlError> {
    // However registration ends, a start that waits for it may go on.
    let registered = nvml
        .create_event_set()
        .and_then(|set| Ok((register_all(nvml, &set, counter, generation)?, set)));
    counter.registration_done(generation);
    let (handles, set) = registered?;
    if handles.is_empty() {
        tracing::info!("no GPU reports critical Xid events; not watching them");
        return Ok(());
    }
    *backoff = FIRST_RETRY;
    loop {
        if !counter.is_current(generation) {
            return Ok(());
        }
        let event = match set.wait(WAIT_MS) {
            Ok(event) => event,
            Err(NvmlError::Timeout) => continue,
            Err(error) => return Err(error),
        };
        if !event.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
            continue;
        }
        let xid = match event.event_data {
            Some(XidError::Value(xid)) => xid,
            Some(XidError::Unknown) | None => UNKNOWN_XID,
        };
        // SAFETY: the handle is only compared with the handles registered above.
        let handle = unsafe { event.device.handle() } as usize;
        let Some(uuid) = handles
            .get(&handle)
            .cloned()
            .or_else(|| event.device.uuid().ok())
        else {
            continue;
        };
        if counter.count(generation, &uuid, xid) {
            tracing::warn!(uuid = %uuid, xid, "critical Xid error");
        }
    }
}

/// Registers each GPU that supports critical Xid events; a GPU that cannot be registered
/// is left unwatched, the others go on. Returns the registered handles with their UUIDs.
fn register_all(
    nvml: &Nvml,
    set: &EventSet<'_>,
    counter: &XidCounter,
    generation: u64,
) -> Result<HashMap<usize, String>, NvmlError> {
    // nvml-wrapper's `register_events` frees the whole set when one GPU refuses, so each
    // GPU is registered through the raw call and a refusal costs only that GPU.
    let register = nvml
        .lib()
        .nvmlDeviceRegisterEvents
        .as_ref()
        .map_err(|error| NvmlError::FailedToLoadSymbol(error.to_string()))?;
    let mut handles = HashMap::new();
    for index in 0..nvml.device_count()? {
        let Ok(device) = nvml.device_by_index(index) else {
            continue;
        };
        let Ok(uuid) = device.uuid() else {
            continue;
        };
        let supported = device
            .supported_event_types()
            .is_ok_and(|types| types.contains(EventTypes::CRITICAL_XID_ERROR));
        let registered = supported && {
            // SAFETY: both handles come from live objects of this library.
            let status = unsafe {
                register(
                    device.handle(),
                    EventTypes::CRITICAL_XID_ERROR.bits(),
                    set.handle(),
                )
            };
            match status {
                0 => true,
                // NVIDIA: after an unknown error the set is undefined; start over.
                999 => return Err(NvmlError::Unknown),
                _ => false,
            }
        };
        if registered {
            // SAFETY: the handle is only kept to recognise this GPU's events.
            handles.insert(unsafe { device.handle() } as usize, uuid.clone());
        }
        counter.update(generation, &uuid, |gpu| gpu.watched = registered);
    }
    Ok(handles)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_current_watcher_counts_and_counts_survive_it() {
        let counter = XidCounter::default();
        let first = counter.supersede();
        assert!(counter.update(first, "GPU-0", |gpu| gpu.watched = true));
        assert!(
            counter.update(first, "GPU-0", |gpu| *gpu.counts.entry(79).or_default() +=
                1)
        );
        assert_eq!(
            counter.reading("GPU-0"),
            XidReading {
                watched: true,
                counts: BTreeMap::from([(79, 1)])
            }
        );

        // NVML reloads: the old watcher may neither count nor claim to watch.
        let second = counter.supersede();
        assert!(
            !counter.update(first, "GPU-0", |gpu| *gpu.counts.entry(79).or_default() +=
                1)
        );
        assert!(!counter.is_current(first));
        let reading = counter.reading("GPU-0");
        assert!(!reading.watched);
        assert_eq!(reading.counts, BTreeMap::from([(79, 1)]));

        assert!(
            counter.update(second, "GPU-0", |gpu| *gpu.counts.entry(79).or_default() +=
                1)
        );
        counter.unwatch_all(first);
        counter.stop();
        assert_eq!(counter.reading("GPU-0").counts[&79], 2);
        assert_eq!(counter.reading("GPU-1"), XidReading::default());
    }

    #[test]
    fn the_events_total_counts_what_the_current_watcher_counts_on_every_gpu() {
        let counter = XidCounter::default();
        let first = counter.supersede();
        assert_eq!(counter.events(), 0);
        assert!(counter.count(first, "GPU-0", 79));
        assert!(counter.count(first, "GPU-1", 48));
        assert_eq!(counter.events(), 2);
        assert_eq!(counter.reading("GPU-1").counts, BTreeMap::from([(48, 1)]));

        // A superseded watcher's event is neither counted nor totalled.
        let second = counter.supersede();
        assert!(!counter.count(first, "GPU-0", 79));
        assert_eq!(counter.events(), 2);
        assert!(counter.count(second, "GPU-0", 79));
        assert_eq!(counter.events(), 3);
        assert_eq!(counter.reading("GPU-0").counts[&79], 2);
    }

    #[test]
    fn a_start_waits_for_registration_within_its_bound() {
        let counter = Arc::new(XidCounter::default());
        let short = Duration::from_millis(50);

        // Registration not done: the wait gives up at its bound.
        let first = counter.supersede();
        let started = Instant::now();
        assert!(!counter.wait_for_registration(first, short));
        assert!(started.elapsed() >= short);

        // Done while a start waits: the start goes on.
        let watcher = Arc::clone(&counter);
        let registering = std::thread::spawn(move || {
            watcher.update(first, "GPU-0", |gpu| gpu.watched = true);
            watcher.registration_done(first);
        });
        assert!(counter.wait_for_registration(first, Duration::from_secs(20)));
        assert!(counter.reading("GPU-0").watched);
        registering.join().unwrap();

        // Already done, or superseded (NVML went away): nothing to wait for.
        assert!(counter.wait_for_registration(first, Duration::ZERO));
        let second = counter.supersede();
        counter.stop();
        assert!(counter.wait_for_registration(second, Duration::from_secs(20)));
        // A late watcher of an older generation does not count as a newer one's.
        let third = counter.supersede();
        counter.registration_done(second);
        assert!(!counter.wait_for_registration(third, short));
    }
}
