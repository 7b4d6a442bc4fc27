//! How a source that the exporter asks on a thread of its own (the kubelet's, the
//! container engines') last answered: one shape for all of them, with each source's own
//! reasons (`E`).

use serde::{Deserialize, Serialize};

/// How a source's last call went, and when one last succeeded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
// Serde would ask `E: Default` for the defaulted field; `Option`'s default needs none.
#[serde(bound(deserialize = "E: Deserialize<'de>"))]
pub struct CallHealth<E> {
    /// Why the last call failed; `None` when it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<E>,
    /// The failure in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When a call last succeeded (for the kubelet: when the answer in use was taken), in
    /// seconds since the Unix epoch; `None` if never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success_unix_seconds: Option<f64>,
}

// By hand: the derive would ask `E: Default`, which no reason needs.
impl<E> Default for CallHealth<E> {
    fn default() -> Self {
        CallHealth {
            error: None,
            message: None,
            last_success_unix_seconds: None,
        }
    }
}

impl<E> CallHealth<E> {
    /// Whether the last call succeeded.
    pub fn up(&self) -> bool {
        self.error.is_none()
    }
}
