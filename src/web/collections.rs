//! The collections behind `/metrics`: one at a time per format, shared by every scrape
//! that arrives while it runs, each scrape waiting for it at most as long as it may.

use crate::exporter::{Exporter, Format};
use crate::sync::lock;
use hyper::body::Bytes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The exporter, and the collection in flight for each format.
pub(super) struct Collections {
    exporter: Arc<Exporter>,
    in_flight: Mutex<HashMap<Format, InFlight>>,
}

/// One collection in flight, shared by every scrape that arrives while it runs.
#[derive(Clone)]
struct InFlight {
    body: watch::Receiver<Option<Bytes>>,
    started: Instant,
    /// Whether a scrape already gave up on this collection (and logged it).
    overran: Arc<AtomicBool>,
}

/// What a scrape got from the collection it waited for.
pub(super) enum Collected {
    /// The metrics, encoded.
    Body(Bytes),
    /// The collection panicked.
    Failed,
    /// The collection has run this long, longer than the scrape would wait.
    Overran(Duration),
}

impl Collections {
    /// No collection in flight yet.
    pub(super) fn new(exporter: Arc<Exporter>) -> Collections {
        Collections {
            exporter,
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// The metrics body, from a collection already in flight when there is one: scrapes
    /// that arrive together share it instead of queueing NVML calls behind each other.
    /// A scrape waits at most `timeout`, and the collection it starts is done by then: it
    /// waits for NVML and `/proc` only until their share of it, and reports what has not
    /// answered (`crate::observe::Deadlines`). One that overruns all the same (a starved
    /// host) stays the one in flight, so later scrapes wait for it too instead of starting
    /// more collections behind it.
    pub(super) async fn metrics(self: &Arc<Self>, format: Format, timeout: Duration) -> Collected {
        let in_flight = {
            let mut in_flight = lock(&self.in_flight);
            match in_flight.get(&format) {
                Some(running) => running.clone(),
                None => {
                    let running = self.start(format, timeout);
                    in_flight.insert(format, running.clone());
                    running
                }
            }
        };
        let mut receiver = in_flight.body.clone();
        let waited = tokio::time::timeout(timeout, async {
            receiver
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|body| body.clone())
        })
        .await;
        match waited {
            Ok(Some(body)) => Collected::Body(body),
            Ok(None) => Collected::Failed,
            Err(_) => {
                let running = in_flight.started.elapsed();
                if !in_flight.overran.swap(true, Ordering::SeqCst) {
                    tracing::warn!(
                        seconds = running.as_secs_f64(),
                        timeout_seconds = timeout.as_secs_f64(),
                        "a collection is taking longer than scrapes wait, although it gives up on NVML and /proc in time (is the exporter starved of CPU?); scrapes get 503 and join it until it ends (logged once per collection)"
                    );
                }
                Collected::Overran(running)
            }
        }
    }

    /// Start a collection for a scrape that waits `timeout`, as a task of its own: it
    /// awaits the reader threads, which make the calls that block (NVML's, `/proc`'s),
    /// so the async thread serves other requests meanwhile, and it goes on to its end
    /// when the scrape that started it stops waiting.
    fn start(self: &Arc<Self>, format: Format, timeout: Duration) -> InFlight {
        let (sender, receiver) = watch::channel(None);
        let running = InFlight {
            body: receiver,
            started: Instant::now(),
            overran: Arc::new(AtomicBool::new(false)),
        };
        let collections = Arc::clone(self);
        let overran = Arc::clone(&running.overran);
        let started = running.started;
        // Scrapes that join later may wait longer; the collection is done by the time the
        // scrape that started it gives up: each source is waited for only until its share
        // of the wait (`crate::observe::Deadlines`).
        tracing::debug!(
            wait_seconds = timeout.as_secs_f64(),
            "collecting for a scrape"
        );
        tokio::spawn(async move {
            let done = InFlightGuard {
                collections: &collections,
                format,
            };
            let exporter = &collections.exporter;
            let collection = exporter.collect(started + timeout).await;
            let (body, collection) = exporter.encode(collection, format);
            let body = Bytes::from(body);
            if overran.load(Ordering::SeqCst) {
                tracing::info!(
                    seconds = started.elapsed().as_secs_f64(),
                    "the collection that overran --web.collection-timeout has finished"
                );
            }
            // Out of the table before the body goes out: a scrape that arrives from now on
            // starts a fresh collection instead of getting this one.
            drop(done);
            let _ = sender.send(Some(body));
            // Freed once the body is on its way: the scrape waits for none of it.
            drop(collection);
        });
        running
    }
}

/// Ends a collection's turn, also when it panics, so the next scrape starts a new one.
struct InFlightGuard<'a> {
    collections: &'a Collections,
    format: Format,
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        lock(&self.collections.in_flight).remove(&self.format);
    }
}
