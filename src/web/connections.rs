//! The cap on open connections (`--web.max-connections`).
//!
//! When every slot is taken, a new connection takes the slot of the oldest connection
//! that is not serving a request (still in its TLS handshake, still sending its headers,
//! or idle between keep-alive requests): slow or idle clients make way, and a scraper,
//! which sends its request at once, is served promptly even while many slow clients hold
//! connections open. Only when every slot is serving a request does the exporter stop
//! accepting; new connections then wait in the kernel's backlog until a slot frees.

use crate::sync::lock;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// What the slot table and the connection share.
#[derive(Debug, Default)]
struct SlotState {
    /// Requests being served on this connection now.
    busy: AtomicUsize,
    /// Fired to close the connection and free its slot for a newer one.
    evict: Notify,
}

/// One open connection's slot, freed when dropped.
#[derive(Debug)]
pub struct Slot {
    id: u64,
    state: Arc<SlotState>,
    slots: Arc<Slots>,
}

impl Slot {
    /// Resolves when the connection should close to make room.
    pub async fn evicted(&self) {
        self.state.evict.notified().await;
    }

    /// Mark a request as being served until the guard is dropped.
    pub fn serving(&self) -> Serving {
        self.state.busy.fetch_add(1, Ordering::SeqCst);
        Serving {
            state: Arc::clone(&self.state),
            slots: Arc::clone(&self.slots),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.slots.open).remove(&self.id);
        self.slots.changed.notify_waiters();
    }
}

/// A request being served; the connection cannot be evicted meanwhile.
pub struct Serving {
    state: Arc<SlotState>,
    slots: Arc<Slots>,
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.state.busy.fetch_sub(1, Ordering::SeqCst);
        // The connection may now make way for a waiting one.
        self.slots.changed.notify_waiters();
    }
}

/// All slots.
#[derive(Debug)]
pub struct Slots {
    max: usize,
    next_id: AtomicU64,
    /// Open connections by age (ids grow).
    open: Mutex<BTreeMap<u64, Arc<SlotState>>>,
    changed: Notify,
}

/// What happened when a connection came in.
pub enum Admission {
    /// Admitted; `evicted` says whether an idle connection was closed to make room.
    Admitted { slot: Slot, evicted: bool },
    /// Every slot is serving a request (a race with [`Slots::wait_for_room`]).
    Refused,
}

impl Slots {
    /// Room for `max` connections.
    pub fn new(max: usize) -> Arc<Slots> {
        Arc::new(Slots {
            max,
            next_id: AtomicU64::new(0),
            open: Mutex::new(BTreeMap::new()),
            changed: Notify::new(),
        })
    }

    /// Open connections (evicted ones are no longer counted).
    pub fn open(&self) -> usize {
        lock(&self.open).len()
    }

    /// Wait until a new connection could be admitted: a free slot, or one that is not
    /// serving a request.
    pub async fn wait_for_room(&self) {
        loop {
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            if self.has_room() {
                return;
            }
            changed.await;
        }
    }

    fn has_room(&self) -> bool {
        let open = lock(&self.open);
        open.len() < self.max
            || open
                .values()
                .any(|slot| slot.busy.load(Ordering::SeqCst) == 0)
    }

    /// Admit a connection that was just accepted, evicting the oldest idle one if full.
    pub fn admit(self: &Arc<Self>) -> Admission {
        let mut open = lock(&self.open);
        let mut evicted = false;
        if open.len() >= self.max {
            let oldest_idle = open
                .iter()
                .find(|(_, slot)| slot.busy.load(Ordering::SeqCst) == 0)
                .map(|(id, _)| *id);
            let Some(id) = oldest_idle else {
                return Admission::Refused;
            };
            if let Some(slot) = open.remove(&id) {
                slot.evict.notify_one();
            }
            evicted = true;
        }
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let state = Arc::new(SlotState::default());
        open.insert(id, Arc::clone(&state));
        Admission::Admitted {
            slot: Slot {
                id,
                state,
                slots: Arc::clone(self),
            },
            evicted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admitted(admission: Admission) -> (Slot, bool) {
        match admission {
            Admission::Admitted { slot, evicted } => (slot, evicted),
            Admission::Refused => panic!("refused"),
        }
    }

    #[tokio::test]
    async fn full_slots_evict_the_oldest_idle_connection() {
        let slots = Slots::new(2);
        let (first, evicted) = admitted(slots.admit());
        assert!(!evicted);
        let (second, _) = admitted(slots.admit());
        let _serving = second.serving();
        // Full: the idle first connection makes way.
        let (third, evicted) = admitted(slots.admit());
        assert!(evicted);
        tokio::time::timeout(std::time::Duration::from_secs(1), first.evicted())
            .await
            .expect("the oldest idle connection is told to close");
        assert_eq!(slots.open(), 2);
        // Both remaining ones busy: no room.
        let _also_serving = third.serving();
        assert!(matches!(slots.admit(), Admission::Refused));
        assert!(!slots.has_room());
        drop(_also_serving);
        tokio::time::timeout(std::time::Duration::from_secs(1), slots.wait_for_room())
            .await
            .expect("a finished request makes room");
    }

    #[test]
    fn closed_connections_free_their_slot() {
        let slots = Slots::new(1);
        let (slot, _) = admitted(slots.admit());
        assert_eq!(slots.open(), 1);
        drop(slot);
        assert_eq!(slots.open(), 0);
    }
}
