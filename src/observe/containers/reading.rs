//! What the container engines said: plain data, serialisable, so a snapshot taken on one
//! machine replays to the same names on another.

use crate::observe::health::CallHealth;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use strum::{EnumIter, IntoStaticStr};

/// A container engine. Its label value is its name in lower case; `Engine::iter()`
/// (strum's `IntoEnumIterator`) lists them in the order metrics do.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    IntoStaticStr,
    EnumIter,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Engine {
    /// Docker's Engine API (`GET /containers/<id>/json`).
    Docker,
    /// Podman's API (`GET /v4.0.0/libpod/containers/<id>/json`), which also names a
    /// container's pod.
    Podman,
}

impl Engine {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Why an engine's last call failed. Its label value is its name in snake case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum EngineError {
    /// Nothing at the socket's path: no such engine on this host, or not mounted.
    Absent,
    /// The socket is there but the connection failed (refused, denied, not HTTP).
    Unavailable,
    /// The engine did not answer in time.
    Timeout,
    /// The engine answered with an HTTP error other than "no such container".
    HttpError,
    /// The answer was not the JSON the API defines.
    Malformed,
}

impl EngineError {
    /// Every kind, in the order metrics list them.
    pub const ALL: [EngineError; 5] = [
        EngineError::Absent,
        EngineError::Unavailable,
        EngineError::Timeout,
        EngineError::HttpError,
        EngineError::Malformed,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// How an engine's last call went, and when one last succeeded.
pub type EngineHealth = CallHealth<EngineError>;

/// A container as its engine names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerName {
    /// The engine that named it.
    pub engine: Engine,
    /// Its name (`docker ps`'s NAMES, without Docker's leading `/`).
    pub name: String,
    /// The image it was started from, as given (`pytorch/pytorch:2.4.0-cuda12.4`); `None`
    /// for a container started from a root filesystem without an image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Its Compose project (`com.docker.compose.project`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compose_project: Option<String>,
    /// Its Podman pod's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

/// What the engines said, as of one observation.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ContainersReading {
    /// Each engine watched, with how its last call went.
    pub engines: BTreeMap<Engine, EngineHealth>,
    /// The names of the containers owners and holders run in, by full container id.
    #[serde(default)]
    pub names: BTreeMap<String, ContainerName>,
}
