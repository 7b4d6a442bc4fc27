//! One call to a container engine: `GET` over its Unix socket with hyper's HTTP/1 client,
//! one connection per call (an engine that restarts and makes a new socket is simply
//! found there next time), bounded by a timeout, the answer read as JSON.
//!
//! Docker answers `GET /containers/<id>/json` with the container's `Name` (`/trainer`),
//! `Config.Image` as given and `Config.Labels`; Podman answers its own
//! `GET /v4.0.0/libpod/containers/<id>/json` with `Name`, `ImageName` and `Pod` (an id,
//! named by `GET /v4.0.0/libpod/pods/<id>/json`). Both say 404 for a container they do
//! not know.

use super::reading::{ContainerName, Engine, EngineError};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

/// The most bytes of an answer worth reading: an inspect answer is a few KiB.
const MAX_ANSWER_BYTES: usize = 1024 * 1024;

/// The label Compose gives every container of a project.
const COMPOSE_PROJECT: &str = "com.docker.compose.project";

/// Why an engine could not be asked, or what it answered instead.
#[derive(Debug, Error)]
pub(super) enum CallError {
    /// Nothing at the socket's path.
    #[error("no container engine socket at {}", path.display())]
    Absent {
        /// The socket's path.
        path: PathBuf,
    },
    /// The socket exists but the call failed on the way.
    #[error("cannot talk to the container engine at {}", path.display())]
    Unavailable {
        /// The socket's path.
        path: PathBuf,
        /// What failed.
        source: ConnectionError,
    },
    /// No answer within the time allowed.
    #[error("the container engine at {} did not answer within {timeout:?}", path.display())]
    Timeout {
        /// The socket's path.
        path: PathBuf,
        /// The time allowed.
        timeout: Duration,
    },
    /// An HTTP status other than success or "no such container".
    #[error("the container engine answered {status} to GET {request}")]
    Http {
        /// The status.
        status: hyper::StatusCode,
        /// The path asked for.
        request: String,
    },
    /// The answer is not the JSON the API defines.
    #[error("the container engine's answer to GET {request} is not what its API defines")]
    Malformed {
        /// The path asked for.
        request: String,
    },
}

impl CallError {
    /// The kind of failure, as the metrics name it.
    pub(super) fn kind(&self) -> EngineError {
        match self {
            CallError::Absent { .. } => EngineError::Absent,
            CallError::Unavailable { .. } => EngineError::Unavailable,
            CallError::Timeout { .. } => EngineError::Timeout,
            CallError::Http { .. } => EngineError::HttpError,
            CallError::Malformed { .. } => EngineError::Malformed,
        }
    }
}

/// What failed on the way to an answer.
#[derive(Debug, Error)]
pub(super) enum ConnectionError {
    /// Connecting to the socket (refused, or denied: the socket's group is the engine's).
    #[error(transparent)]
    Connect(std::io::Error),
    /// HTTP on the connection (the socket may not be an engine's).
    #[error(transparent)]
    Http(hyper::Error),
}

/// What a `GET` found.
enum Answer {
    /// A successful answer's JSON.
    Json(Value),
    /// 404: the engine knows no such thing.
    NotFound,
}

/// Whether the engine at `socket` answers (`GET /_ping`), within `timeout`.
pub(super) async fn ping(socket: &Path, timeout: Duration) -> Result<(), CallError> {
    bounded(socket, timeout, async {
        call(socket, "/_ping").await.map(|_| ())
    })
    .await
}

/// The name `engine` at `socket` gives container `id` (64 hex digits), `None` when it
/// knows no such container; within `timeout` for every call it takes.
pub(super) async fn name_of(
    engine: Engine,
    socket: &Path,
    id: &str,
    timeout: Duration,
) -> Result<Option<ContainerName>, CallError> {
    bounded(socket, timeout, async {
        match engine {
            Engine::Docker => {
                let request = format!("/containers/{id}/json");
                match json(socket, &request).await? {
                    Answer::NotFound => Ok(None),
                    Answer::Json(value) => docker_name(&value)
                        .map(Some)
                        .ok_or(CallError::Malformed { request }),
                }
            }
            Engine::Podman => {
                let request = format!("/v4.0.0/libpod/containers/{id}/json");
                let value = match json(socket, &request).await? {
                    Answer::NotFound => return Ok(None),
                    Answer::Json(value) => value,
                };
                let mut name = podman_name(&value).ok_or(CallError::Malformed { request })?;
                if let Some(pod) = value["Pod"].as_str().filter(|pod| is_id(pod)) {
                    let request = format!("/v4.0.0/libpod/pods/{pod}/json");
                    if let Answer::Json(value) = json(socket, &request).await? {
                        name.pod = value["Name"].as_str().map(str::to_string);
                    }
                }
                Ok(Some(name))
            }
        }
    })
    .await
}

/// `call`, unless it takes longer than `timeout`.
async fn bounded<T>(
    socket: &Path,
    timeout: Duration,
    call: impl std::future::Future<Output = Result<T, CallError>>,
) -> Result<T, CallError> {
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| {
            Err(CallError::Timeout {
                path: socket.to_path_buf(),
                timeout,
            })
        })
}

/// A `GET` whose answer is JSON.
async fn json(socket: &Path, request: &str) -> Result<Answer, CallError> {
    match call(socket, request).await? {
        None => Ok(Answer::NotFound),
        Some(body) => serde_json::from_slice(&body)
            .map(Answer::Json)
            .map_err(|_| CallError::Malformed {
                request: request.to_string(),
            }),
    }
}

/// `GET request` on the engine at `socket`: the body of a successful answer, `None` for 404.
async fn call(socket: &Path, request: &str) -> Result<Option<Bytes>, CallError> {
    let unavailable = |source| CallError::Unavailable {
        path: socket.to_path_buf(),
        source,
    };
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|error| match error.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory => CallError::Absent {
                path: socket.to_path_buf(),
            },
            _ => unavailable(ConnectionError::Connect(error)),
        })?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|error| unavailable(ConnectionError::Http(error)))?;
    // The connection is driven beside the call and ends with it.
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let answer = async {
        let get = hyper::Request::get(request)
            // A Unix socket names no host; Docker's own client says `docker`.
            .header(hyper::header::HOST, "localhost")
            .body(Empty::<Bytes>::new())
            .map_err(|_| CallError::Malformed {
                request: request.to_string(),
            })?;
        let response = sender
            .send_request(get)
            .await
            .map_err(|error| unavailable(ConnectionError::Http(error)))?;
        let status = response.status();
        if status == hyper::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(CallError::Http {
                status,
                request: request.to_string(),
            });
        }
        let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|_| CallError::Malformed {
                request: request.to_string(),
            })?;
        Ok(Some(body.to_bytes()))
    }
    .await;
    driver.abort();
    answer
}

/// Docker's inspect answer: `Name` (with its leading `/`), `Config.Image`, `Config.Labels`.
fn docker_name(value: &Value) -> Option<ContainerName> {
    let name = value["Name"].as_str()?.trim_start_matches('/');
    Some(ContainerName {
        engine: Engine::Docker,
        name: name.to_string(),
        image: non_empty(&value["Config"]["Image"]),
        compose_project: non_empty(&value["Config"]["Labels"][COMPOSE_PROJECT]),
        pod: None,
    })
}

/// Podman's own inspect answer: `Name`, `ImageName` (empty for a `--rootfs` container),
/// `Config.Labels`; the pod is named by a second call.
fn podman_name(value: &Value) -> Option<ContainerName> {
    let name = value["Name"].as_str()?.trim_start_matches('/');
    Some(ContainerName {
        engine: Engine::Podman,
        name: name.to_string(),
        image: non_empty(&value["ImageName"]).or_else(|| non_empty(&value["Config"]["Image"])),
        compose_project: non_empty(&value["Config"]["Labels"][COMPOSE_PROJECT]),
        pod: None,
    })
}

fn non_empty(value: &Value) -> Option<String> {
    value
        .as_str()
        .filter(|text| !text.is_empty())
        .map(str::to_string)
}

/// An engine's id (hex digits): safe to put in a request's path.
pub(super) fn is_id(text: &str) -> bool {
    !text.is_empty() && text.len() <= 128 && text.bytes().all(|byte| byte.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn docker_names_drop_the_slash_and_read_the_compose_project() {
        let answer = json!({
            "Id": "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d",
            "Name": "/lab-trainer-1",
            "Image": "sha256:7578338baddb",
            "Config": {
                "Image": "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime",
                "Labels": {"com.docker.compose.project": "lab", "other": "x"}
            }
        });
        assert_eq!(
            docker_name(&answer),
            Some(ContainerName {
                engine: Engine::Docker,
                name: "lab-trainer-1".into(),
                image: Some("pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime".into()),
                compose_project: Some("lab".into()),
                pod: None,
            })
        );
        assert_eq!(docker_name(&json!({"Config": {}})), None);
    }

    #[test]
    fn podman_names_read_its_own_keys_and_a_rootfs_has_no_image() {
        // As Podman 4.3 answers: `ImageName` for an image, empty for `--rootfs`.
        let answer = json!({
            "Name": "trainer",
            "ImageName": "localhost/model:1",
            "Pod": "",
            "Config": {"Image": "localhost/model:1", "Labels": {}}
        });
        let name = podman_name(&answer).unwrap();
        assert_eq!(name.image.as_deref(), Some("localhost/model:1"));
        assert_eq!(name.compose_project, None);
        let rootfs = json!({"Name": "probe", "ImageName": "", "Config": {"Image": ""}});
        assert_eq!(podman_name(&rootfs).unwrap().image, None);
    }

    #[test]
    fn only_hex_ids_go_into_a_path() {
        assert!(is_id(
            "dc7308a395a7b366336b7410741baedca30566d0943aef67519edf383e5e7e03"
        ));
        assert!(!is_id("../../containers/json"));
        assert!(!is_id(""));
    }
}
