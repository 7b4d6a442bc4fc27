//! Event sets: the one piece of state the fake keeps.
//!
//! A scenario file says which critical Xid events have happened (`xid_events`, each
//! with a sequence number). A set remembers the highest sequence number it has passed,
//! starting from the highest present when it was created, so it delivers each later
//! event once, as a real set delivers only what happens after it was created.

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};
use std::{ptr, thread};

use crate::ffi::{self, EventData, EVENT_TYPE_XID_CRITICAL, NO_INSTANCE_ID};
use crate::scenario::{Error, Scenario, XidEvent};

/// `nvmlEventSet_t`: an opaque handle holding the set's number.
pub type EventSet = *mut c_void;

/// How often a waiting call looks at the scenario file again.
const POLL: Duration = Duration::from_millis(10);

/// The wait call's symbol, which a scenario can make fail for a registered GPU.
const WAIT_SYMBOL: &str = "nvmlEventSetWait_v2";

/// One set's registrations and how far it has read the event history.
#[derive(Default)]
struct Set {
    /// Event-type mask per registered GPU index.
    registered: HashMap<usize, u64>,
    /// The highest sequence number already delivered or skipped.
    cursor: u64,
}

/// Every live set by number, and the next number to hand out.
struct Sets {
    sets: BTreeMap<usize, Set>,
    next: usize,
}

static SETS: Mutex<Sets> = Mutex::new(Sets {
    sets: BTreeMap::new(),
    next: 1,
});

/// Runs `body` on the set registry; a panic elsewhere must not wedge every later call.
fn with_sets<T>(body: impl FnOnce(&mut Sets) -> T) -> T {
    body(&mut SETS.lock().unwrap_or_else(PoisonError::into_inner))
}

/// A new set that will deliver the events appearing after `scenario`'s last one.
pub fn create(scenario: &Scenario) -> EventSet {
    let cursor = scenario.last_event();
    let number = with_sets(|sets| {
        let number = sets.next;
        sets.next += 1;
        sets.sets.insert(
            number,
            Set {
                cursor,
                ..Set::default()
            },
        );
        number
    });
    ptr::without_provenance_mut(number)
}

/// Registers GPU `index` in `set` for the event types `mask`.
pub fn register(set: EventSet, index: usize, mask: u64) -> Result<(), Error> {
    with_sets(|sets| {
        let set = sets.sets.get_mut(&set.addr()).ok_or(Error::InvalidArg)?;
        *set.registered.entry(index).or_default() |= mask;
        Ok(())
    })
}

/// Forgets `set`.
pub fn free(set: EventSet) -> Result<(), Error> {
    with_sets(|sets| sets.sets.remove(&set.addr()).map(drop)).ok_or(Error::InvalidArg)
}

/// Waits up to `timeout` for the next event of a GPU registered in `set`, polling the
/// scenario file, so a test can append an event while the call waits.
pub fn wait(set: EventSet, timeout: Duration) -> Result<EventData, Error> {
    // A registered GPU's `delays_ms` for the wait holds the call first, however short
    // its timeout: a driver stuck in the wait.
    let stuck = registered_delay(set, &*Scenario::load()?)?;
    if !stuck.is_zero() {
        thread::sleep(stuck);
    }
    let deadline = Instant::now() + timeout;
    loop {
        let scenario = Scenario::load()?;
        if let Some(data) = next_event(set, &scenario)? {
            return Ok(data);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Timeout);
        }
        // The registry is not held while sleeping: other sets and calls go on.
        thread::sleep(POLL.min(deadline - now));
    }
}

/// The longest delay the scenario sets for the wait call on a GPU registered in `set`.
fn registered_delay(set: EventSet, scenario: &Scenario) -> Result<Duration, Error> {
    with_sets(|sets| {
        let state = sets.sets.get(&set.addr()).ok_or(Error::InvalidArg)?;
        let longest = state
            .registered
            .keys()
            .filter_map(|&index| scenario.gpu(index).ok())
            .filter_map(|gpu| gpu.faults.delays_ms.get(WAIT_SYMBOL).copied())
            .max()
            .unwrap_or(0);
        Ok(Duration::from_millis(longest))
    })
}

/// The first undelivered event of a GPU registered for critical Xids in `set`, moving
/// the set's cursor past it (and past events of GPUs it does not watch).
fn next_event(set: EventSet, scenario: &Scenario) -> Result<Option<EventData>, Error> {
    with_sets(|sets| {
        let state = sets.sets.get_mut(&set.addr()).ok_or(Error::InvalidArg)?;
        for (&index, _) in state.registered.iter() {
            if let Ok(gpu) = scenario.gpu(index) {
                // A lost GPU makes the wait fail, as it does with the real driver.
                if let Some(&error) = gpu.faults.errors.get(WAIT_SYMBOL) {
                    return Err(error);
                }
            }
        }
        let mut pending: Vec<&XidEvent> = scenario
            .xid_events
            .iter()
            .filter(|event| event.seq > state.cursor)
            .collect();
        pending.sort_by_key(|event| event.seq);
        for event in pending {
            state.cursor = event.seq;
            let watched = state
                .registered
                .get(&event.gpu)
                .is_some_and(|mask| mask & EVENT_TYPE_XID_CRITICAL != 0);
            if watched {
                return Ok(Some(EventData {
                    device: ffi::handle(event.gpu),
                    event_type: EVENT_TYPE_XID_CRITICAL,
                    event_data: event.xid,
                    gpu_instance_id: event.gpu_instance_id.unwrap_or(NO_INSTANCE_ID),
                    compute_instance_id: event.compute_instance_id.unwrap_or(NO_INSTANCE_ID),
                }));
            }
        }
        Ok(None)
    })
}
