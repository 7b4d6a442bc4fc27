//! Container engines: the names of the containers owners and holders run in, from the
//! engine's API on its Unix socket (Docker's, and Podman's, which serves the same API and
//! its own), read on a thread of their own.
//!
//! - `engine`: one call over a socket (hyper's HTTP/1 client), bounded by a timeout.
//! - `watch`: the thread that pings each engine and names containers, once per id
//!   (`ContainerWatch`).
//! - `reading`: what the engines said ([`ContainersReading`]), plain serialisable data.
//! - `config`: where the sockets are ([`ContainersConfig`]).
//!
//! A process's cgroup gives its container's id and the runtime that named it; which
//! engine to ask for which id is decided where the sources meet (`observe`). Without an
//! engine (no socket) its health says `absent` and containers keep their ids.

mod config;
mod engine;
mod reading;
mod watch;

pub use config::{ContainersConfig, DEFAULT_DOCKER_SOCKET, DEFAULT_PODMAN_SOCKET};
pub use reading::{ContainerName, ContainersReading, Engine, EngineError, EngineHealth};
pub(crate) use watch::{ContainerWatch, Wanted};
