//! How long the exporter observes, which decides what a source does beyond one look.

/// Whether the exporter serves scrapes or looks once. A server keeps threads of its own
/// (counting critical Xid events, refreshing the kubelet's sources) and says in its log,
/// once, what it cannot read; a one-shot command reads once and its output says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifespan {
    /// The server: one observation per scrape, for as long as it runs.
    Serving,
    /// A one-shot command (`check`, `snapshot`, `textfile`): one observation, or a few.
    OneShot,
}
