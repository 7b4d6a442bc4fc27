//! The cap on open connections (`--web.max-connections`).
//!
//! When every slot is taken, a new connection takes the slot of the connection that has
//! been idle longest (not serving a request, nothing written to its client: still in its
//! TLS handshake, still sending its headers, or between keep-alive requests), but only
//! once that connection has been idle for [`EVICTABLE_AFTER`]: slow and idle clients
//! make way, so a scraper is served promptly even while many of them hold connections
//! open. A connection in use is never closed under its client (between a response and
//! the next request, which may already be on the wire, the server cannot tell it was not
//! sent): when no connection has been idle that long, the oldest one is asked to close
//! after its current or next response (`Connection: close`, which HTTP clients follow
//! by reconnecting), so busy clients take turns instead of locking newcomers out. Until
//! a slot frees, the new connection waits, unanswered but open; later ones wait in the
//! kernel's backlog.

use crate::sync::lock;
use std::collections::BTreeMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// How long a connection must have been idle before a new one may take its slot. A
/// client that has not started a request within a second of its last response is not
/// in the middle of a burst; one that is may have its next request on the wire already,
/// and closing the connection would lose it (HTTP/1.1 cannot tell it was never read).
pub const EVICTABLE_AFTER: Duration = Duration::from_secs(1);

/// What the slot table and the connection share.
#[derive(Debug, Default)]
struct SlotState {
    /// Requests being served on this connection now.
    busy: AtomicUsize,
    /// When the connection last did something for its client (admitted, finished
    /// serving a request, wrote a byte of a response): milliseconds since the table's
    /// epoch.
    active_ms: AtomicU64,
    /// Set to have the connection close after the response it sends next, making room.
    close_after_response: AtomicBool,
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

    /// Whether the response being sent should be the connection's last, to make room.
    pub fn asked_to_close(&self) -> bool {
        self.state.close_after_response.load(Ordering::SeqCst)
    }

    /// The connection did something for its client just now.
    fn touch(&self) {
        self.state
            .active_ms
            .store(self.slots.now_ms(Instant::now()), Ordering::SeqCst);
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
        // Idle from now on, not since before the request: stamped before the count
        // drops, so an admission that sees the connection idle also sees when it went idle.
        self.state
            .active_ms
            .store(self.slots.now_ms(Instant::now()), Ordering::SeqCst);
        self.state.busy.fetch_sub(1, Ordering::SeqCst);
        // The connection may make way for a waiting one once it has been idle long enough.
        self.slots.changed.notify_waiters();
    }
}

/// A connection's byte stream, telling its slot whenever response bytes go out: a
/// response still being written to a slow reader is activity, not idleness, even after
/// the request's handler has returned.
pub struct Tracked<I> {
    io: I,
    slot: Arc<Slot>,
}

impl<I> Tracked<I> {
    /// `io`, reporting writes to `slot`.
    pub fn new(io: I, slot: Arc<Slot>) -> Tracked<I> {
        Tracked { io, slot }
    }

    fn wrote(&self, result: &Poll<io::Result<usize>>) {
        if matches!(result, Poll::Ready(Ok(written)) if *written > 0) {
            self.slot.touch();
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Tracked<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // Reading is not activity: a slowloris client sends bytes too.
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Tracked<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_write(cx, buf);
        this.wrote(&result);
        result
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.wrote(&result);
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// All slots.
#[derive(Debug)]
pub struct Slots {
    max: usize,
    next_id: AtomicU64,
    /// The zero of every slot's `active_ms`.
    epoch: Instant,
    /// Open connections by age (ids grow).
    open: Mutex<BTreeMap<u64, Arc<SlotState>>>,
    changed: Notify,
}

/// A connection let in.
#[derive(Debug)]
pub struct Admitted {
    /// Its slot, freed when the connection ends.
    pub slot: Slot,
    /// Whether an idle connection was closed to make room.
    pub evicted: bool,
    /// Whether it had to wait for room.
    pub waited: bool,
}

/// Why a connection cannot be admitted yet.
#[derive(Debug, PartialEq, Eq)]
enum Full {
    /// An idle connection may make way at this instant, if it stays idle.
    Until(Instant),
    /// Every connection is serving a request: wait until one finishes or closes.
    Busy,
}

impl Slots {
    /// Room for `max` connections.
    pub fn new(max: usize) -> Arc<Slots> {
        Slots::since(max, Instant::now())
    }

    fn since(max: usize, epoch: Instant) -> Arc<Slots> {
        Arc::new(Slots {
            max,
            next_id: AtomicU64::new(0),
            epoch,
            open: Mutex::new(BTreeMap::new()),
            changed: Notify::new(),
        })
    }

    /// Open connections (evicted ones are no longer counted).
    #[cfg(test)]
    pub fn open(&self) -> usize {
        lock(&self.open).len()
    }

    /// Admit a connection that was just accepted, once there is room for it: a free
    /// slot, or one whose connection has been idle for [`EVICTABLE_AFTER`] (that one is
    /// told to close); meanwhile the oldest connection is asked to close after its next
    /// response. The connection is never turned away.
    pub async fn admit(self: &Arc<Self>) -> Admitted {
        let mut waited = false;
        loop {
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            // Registered before looking, so a change in between is not missed.
            changed.as_mut().enable();
            match self.try_admit(Instant::now()) {
                Ok((slot, evicted)) => {
                    return Admitted {
                        slot,
                        evicted,
                        waited,
                    }
                }
                Err(Full::Until(at)) => {
                    tokio::select! {
                        _ = changed => {}
                        _ = tokio::time::sleep_until(at.into()) => {}
                    }
                }
                Err(Full::Busy) => changed.await,
            }
            waited = true;
        }
    }

    /// Admit a connection now if there is room at `now`, evicting the connection idle
    /// longest if it has been idle long enough.
    fn try_admit(self: &Arc<Self>, now: Instant) -> Result<(Slot, bool), Full> {
        let mut open = lock(&self.open);
        let mut evicted = false;
        if open.len() >= self.max {
            let idle_longest = open
                .iter()
                .filter(|(_, slot)| slot.busy.load(Ordering::SeqCst) == 0)
                .map(|(id, slot)| (slot.active_ms.load(Ordering::SeqCst), *id))
                .min();
            let now_ms = self.now_ms(now);
            let evictable_ms = idle_longest
                .map(|(active_ms, _)| active_ms.saturating_add(millis(EVICTABLE_AFTER)));
            let evictable = match (idle_longest, evictable_ms) {
                (Some((_, id)), Some(at)) if at <= now_ms => Some(id),
                _ => None,
            };
            let Some(id) = evictable else {
                // Nobody idle long enough: the oldest connection closes after its current
                // or next response, unless one is already on its way out.
                let leaving = open
                    .values()
                    .any(|slot| slot.close_after_response.load(Ordering::SeqCst));
                if !leaving {
                    if let Some(oldest) = open.values().next() {
                        oldest.close_after_response.store(true, Ordering::SeqCst);
                    }
                }
                return Err(match evictable_ms {
                    Some(at) => Full::Until(now + Duration::from_millis(at - now_ms)),
                    None => Full::Busy,
                });
            };
            if let Some(slot) = open.remove(&id) {
                slot.evict.notify_one();
            }
            evicted = true;
        }
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let state = Arc::new(SlotState {
            active_ms: AtomicU64::new(self.now_ms(now)),
            ..SlotState::default()
        });
        open.insert(id, Arc::clone(&state));
        Ok((
            Slot {
                id,
                state,
                slots: Arc::clone(self),
            },
            evicted,
        ))
    }

    fn now_ms(&self, now: Instant) -> u64 {
        millis(now.saturating_duration_since(self.epoch))
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admitted(slots: &Arc<Slots>, now: Instant) -> (Slot, bool) {
        slots.try_admit(now).expect("room")
    }

    /// An instant the test controls: `seconds` after the table was made.
    fn at(slots: &Slots, seconds: f64) -> Instant {
        slots.epoch + Duration::from_secs_f64(seconds)
    }

    fn set_active(slot: &Slot, slots: &Slots, seconds: f64) {
        slot.state
            .active_ms
            .store(slots.now_ms(at(slots, seconds)), Ordering::SeqCst);
    }

    #[tokio::test]
    async fn a_full_table_evicts_the_connection_idle_longest_once_idle_long_enough() {
        let slots = Slots::new(2);
        let (first, _) = admitted(&slots, at(&slots, 0.0));
        let (second, evicted) = admitted(&slots, at(&slots, 0.0));
        assert!(!evicted);
        // The older connection was active more recently: the newer one has idled longer.
        set_active(&first, &slots, 5.0);
        set_active(&second, &slots, 4.0);
        // Not idle long enough yet: the new connection must wait until the second one
        // has been idle for EVICTABLE_AFTER.
        assert_eq!(
            slots.try_admit(at(&slots, 4.5)).err(),
            Some(Full::Until(at(&slots, 4.0) + EVICTABLE_AFTER))
        );
        assert_eq!(slots.open(), 2);
        let (_third, evicted) = admitted(&slots, at(&slots, 5.0));
        assert!(evicted);
        tokio::time::timeout(Duration::from_secs(10), second.evicted())
            .await
            .expect("the connection idle longest is told to close");
        assert_eq!(slots.open(), 2);
        drop(first);
    }

    #[tokio::test]
    async fn a_connection_serving_a_request_is_never_evicted() {
        let slots = Slots::new(1);
        let (only, _) = admitted(&slots, at(&slots, 0.0));
        let serving = only.serving();
        assert_eq!(slots.try_admit(at(&slots, 3600.0)).err(), Some(Full::Busy));
        drop(serving);
        // Idle from the end of its request, not from its admission.
        let finished = Instant::now();
        assert!(matches!(
            slots.try_admit(finished).err(),
            Some(Full::Until(_))
        ));
        let (_next, evicted) = admitted(&slots, finished + EVICTABLE_AFTER);
        assert!(evicted);
    }

    #[tokio::test]
    async fn writing_a_response_counts_as_activity() {
        // Two connections admitted a while ago that served no request since.
        let long_ago = Instant::now()
            .checked_sub(EVICTABLE_AFTER * 10)
            .expect("a monotonic clock older than ten seconds");
        let slots = Slots::since(2, long_ago);
        let (first, _) = admitted(&slots, long_ago);
        let (second, _) = admitted(&slots, long_ago);
        let first = Arc::new(first);
        // The first writes a response to its client.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server_end, _) = listener.accept().await.unwrap();
        let mut tracked = Tracked::new(server_end, Arc::clone(&first));
        let written = std::future::poll_fn(|cx| {
            Pin::new(&mut tracked).poll_write(cx, b"HTTP/1.1 200 OK\r\n")
        })
        .await
        .unwrap();
        assert!(written > 0);
        // The second, idle all along, makes way; the writing one does not.
        let (third, evicted) = admitted(&slots, Instant::now());
        assert!(evicted);
        tokio::time::timeout(Duration::from_secs(10), second.evicted())
            .await
            .expect("the idle connection is told to close");
        let wrote = Instant::now();
        drop(third);
        let (_fourth, evicted) = admitted(&slots, wrote);
        assert!(!evicted, "a slot was free");
        assert!(matches!(slots.try_admit(wrote).err(), Some(Full::Until(_))));
        assert!(slots.try_admit(wrote + EVICTABLE_AFTER).is_ok());
    }

    #[tokio::test]
    async fn admission_waits_for_a_slot_instead_of_turning_the_connection_away() {
        let slots = Slots::new(1);
        let (only, _) = admitted(&slots, Instant::now());
        let serving = only.serving();
        let waiting = tokio::spawn({
            let slots = Arc::clone(&slots);
            async move { slots.admit().await }
        });
        // Still waiting while the one connection serves; freeing the slot lets it in.
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(serving);
        drop(only);
        let admitted = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("a freed slot admits the waiting connection")
            .unwrap();
        assert!(!admitted.evicted);
        assert!(admitted.waited);
    }

    #[test]
    fn a_table_in_use_asks_its_oldest_connection_to_close_after_a_response() {
        let slots = Slots::new(2);
        let now = Instant::now();
        let (oldest, _) = admitted(&slots, now);
        let (newer, _) = admitted(&slots, now);
        let _serving = newer.serving();
        // The oldest is idle, but not for long: it is not closed under its client, it is
        // asked to make its next response the last.
        assert_eq!(
            slots.try_admit(now).err(),
            Some(Full::Until(now + EVICTABLE_AFTER))
        );
        assert!(oldest.asked_to_close());
        assert!(!newer.asked_to_close());
        // One connection on its way out at a time.
        let _also_serving = oldest.serving();
        assert_eq!(slots.try_admit(now).err(), Some(Full::Busy));
        assert!(!newer.asked_to_close());
        // Once it has sent that response and closed, the new connection gets its slot.
        drop(_also_serving);
        drop(oldest);
        let (_new, evicted) = admitted(&slots, now);
        assert!(!evicted);
    }

    #[test]
    fn closed_connections_free_their_slot() {
        let slots = Slots::new(1);
        let (slot, _) = admitted(&slots, Instant::now());
        assert_eq!(slots.open(), 1);
        drop(slot);
        assert_eq!(slots.open(), 0);
    }
}
