//! The kubelet's pod-resources API, `v1.PodResourcesLister/List`, asked over its Unix
//! socket: which container of which pod each device (a GPU, a MIG device) is assigned to.
//!
//! gRPC through tonic's client over one HTTP/2 connection per call (hyper), so a kubelet
//! that restarts and makes a new socket is simply found there on the next call. The
//! message bytes are decoded here with prost rather than inside tonic, so an answer that
//! is not a `ListPodResourcesResponse` is told apart from a failed call.

use super::reading::{DeviceAssignment, SourceError};
use prost::bytes::{Buf, BufMut};
use prost::Message;
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use thiserror::Error;

/// The method the kubelet serves (package `v1`, service `PodResourcesLister`).
const LIST_PATH: &str = "/v1.PodResourcesLister/List";

/// The kubelet's own cap on pod-resources messages (16 MiB); a node's answer is a few KiB.
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// The messages of `k8s.io/kubelet/pkg/apis/podresources/v1/api.proto` that `List` uses,
/// written by hand. Fields this exporter does not read (CPU ids, memory, dynamic
/// resources) are left out: protobuf skips fields a reader does not know.
pub(super) mod v1 {
    /// `ListPodResourcesRequest`: no fields.
    #[derive(Clone, PartialEq, Eq, ::prost::Message)]
    pub struct ListPodResourcesRequest {}

    /// `ListPodResourcesResponse`: every pod on the node with the resources assigned to it.
    #[derive(Clone, PartialEq, Eq, ::prost::Message)]
    pub struct ListPodResourcesResponse {
        /// `repeated PodResources pod_resources = 1`
        #[prost(message, repeated, tag = "1")]
        pub pod_resources: Vec<PodResources>,
    }

    /// `PodResources`: one pod.
    #[derive(Clone, PartialEq, Eq, ::prost::Message)]
    pub struct PodResources {
        /// `string name = 1`
        #[prost(string, tag = "1")]
        pub name: String,
        /// `string namespace = 2`
        #[prost(string, tag = "2")]
        pub namespace: String,
        /// `repeated ContainerResources containers = 3`
        #[prost(message, repeated, tag = "3")]
        pub containers: Vec<ContainerResources>,
    }

    /// `ContainerResources`: one container of a pod.
    #[derive(Clone, PartialEq, Eq, ::prost::Message)]
    pub struct ContainerResources {
        /// `string name = 1`
        #[prost(string, tag = "1")]
        pub name: String,
        /// `repeated ContainerDevices devices = 2`
        #[prost(message, repeated, tag = "2")]
        pub devices: Vec<ContainerDevices>,
    }

    /// `ContainerDevices`: the devices of one extended resource assigned to a container.
    #[derive(Clone, PartialEq, Eq, ::prost::Message)]
    pub struct ContainerDevices {
        /// `string resource_name = 1`, e.g. `nvidia.com/gpu`, `nvidia.com/mig-1g.18gb`.
        #[prost(string, tag = "1")]
        pub resource_name: String,
        /// `repeated string device_ids = 2`: what the device plugin calls each device
        /// (NVIDIA's: the GPU's `GPU-...` UUID, or a MIG device's `MIG-...` UUID).
        #[prost(string, repeated, tag = "2")]
        pub device_ids: Vec<String>,
        /// `TopologyInfo topology = 3`
        #[prost(message, optional, tag = "3")]
        pub topology: Option<TopologyInfo>,
    }

    /// `TopologyInfo`: the NUMA nodes a device is attached to.
    #[derive(Clone, PartialEq, Eq, ::prost::Message)]
    pub struct TopologyInfo {
        /// `repeated NUMANode nodes = 1`
        #[prost(message, repeated, tag = "1")]
        pub nodes: Vec<NumaNode>,
    }

    /// `NUMANode`.
    #[derive(Clone, PartialEq, Eq, ::prost::Message)]
    pub struct NumaNode {
        /// `int64 ID = 1`
        #[prost(int64, tag = "1")]
        pub id: i64,
    }
}

/// Why the kubelet could not be asked, or what it answered instead.
#[derive(Debug, Error)]
pub(super) enum KubeletError {
    /// Nothing at the socket's path: no kubelet on this host, the directory is not
    /// mounted, or the kubelet is between two runs.
    #[error("no kubelet pod-resources socket at {}", path.display())]
    Absent {
        /// The socket's path.
        path: PathBuf,
    },
    /// The socket exists but the connection failed (refused, reset, not HTTP/2).
    #[error("cannot talk to the kubelet at {}", path.display())]
    Unavailable {
        /// The socket's path.
        path: PathBuf,
        /// What failed.
        source: ConnectionError,
    },
    /// No answer within the time allowed.
    #[error("the kubelet at {} did not answer within {timeout:?}", path.display())]
    Timeout {
        /// The socket's path.
        path: PathBuf,
        /// The time allowed.
        timeout: Duration,
    },
    /// The kubelet answered with a gRPC error.
    #[error("the kubelet answered {code:?}: {message}")]
    Rpc {
        /// The gRPC status code.
        code: tonic::Code,
        /// The kubelet's words.
        message: String,
    },
    /// The answer is not a `ListPodResourcesResponse`.
    #[error("the kubelet's answer is not a ListPodResourcesResponse")]
    Malformed(#[source] prost::DecodeError),
}

impl KubeletError {
    /// The kind of failure, as the metrics name it.
    pub(super) fn kind(&self) -> SourceError {
        match self {
            KubeletError::Absent { .. } => SourceError::Absent,
            KubeletError::Unavailable { .. } => SourceError::Unavailable,
            KubeletError::Timeout { .. } => SourceError::Timeout,
            KubeletError::Rpc { .. } => SourceError::RpcError,
            KubeletError::Malformed(_) => SourceError::Malformed,
        }
    }
}

/// What failed on the way to the kubelet's answer.
#[derive(Debug, Error)]
pub(super) enum ConnectionError {
    /// Connecting to the socket.
    #[error(transparent)]
    Connect(std::io::Error),
    /// The HTTP/2 handshake (the socket may not be the kubelet's).
    #[error("HTTP/2 handshake failed")]
    Handshake(#[source] hyper::Error),
    /// The connection, before the call could be sent.
    #[error(transparent)]
    Connection(hyper::Error),
    /// The call, as tonic reports a connection that failed under it.
    #[error(transparent)]
    Call(FailedCall),
}

/// A call tonic gave up on: its words, and the connection's error as the cause.
#[derive(Debug)]
pub(super) struct FailedCall(tonic::Status);

impl fmt::Display for FailedCall {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.0.message())
    }
}

impl std::error::Error for FailedCall {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.0)
    }
}

/// Calls `List` on the kubelet listening at `socket`, within `timeout`.
pub(super) async fn list(
    socket: &Path,
    timeout: Duration,
) -> Result<v1::ListPodResourcesResponse, KubeletError> {
    match tokio::time::timeout(timeout, list_unbounded(socket)).await {
        Ok(answer) => answer,
        Err(_) => Err(KubeletError::Timeout {
            path: socket.to_path_buf(),
            timeout,
        }),
    }
}

async fn list_unbounded(socket: &Path) -> Result<v1::ListPodResourcesResponse, KubeletError> {
    let unavailable = |source: ConnectionError| KubeletError::Unavailable {
        path: socket.to_path_buf(),
        source,
    };
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|error| match error.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory => {
                KubeletError::Absent {
                    path: socket.to_path_buf(),
                }
            }
            _ => unavailable(ConnectionError::Connect(error)),
        })?;
    let (sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .map_err(|error| unavailable(ConnectionError::Handshake(error)))?;
    // The connection is driven beside the call and ends with it (its sender is dropped).
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    // gRPC over a Unix socket names no host; Go's clients say `localhost` too.
    let mut client = tonic::client::Grpc::with_origin(
        Http2Channel(sender),
        hyper::Uri::from_static("http://localhost"),
    )
    .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let answer = async {
        client
            .ready()
            .await
            .map_err(|error| unavailable(ConnectionError::Connection(error)))?;
        client
            .unary(
                tonic::Request::new(v1::ListPodResourcesRequest {}.encode_to_vec()),
                hyper::http::uri::PathAndQuery::from_static(LIST_PATH),
                BytesCodec,
            )
            .await
            .map_err(|status| call_error(socket, status))
    }
    .await;
    driver.abort();
    let bytes = answer?.into_inner();
    v1::ListPodResourcesResponse::decode(bytes.as_slice()).map_err(KubeletError::Malformed)
}

/// A status made by tonic from a failed connection carries that error as its source; one
/// the server sent (in trailers, or as a non-gRPC HTTP status) carries none.
fn call_error(socket: &Path, status: tonic::Status) -> KubeletError {
    if std::error::Error::source(&status).is_some() {
        return KubeletError::Unavailable {
            path: socket.to_path_buf(),
            source: ConnectionError::Call(FailedCall(status)),
        };
    }
    KubeletError::Rpc {
        code: status.code(),
        message: status.message().to_string(),
    }
}

/// The NVIDIA devices of an answer, sorted.
pub(super) fn nvidia_devices(answer: &v1::ListPodResourcesResponse) -> Vec<DeviceAssignment> {
    let mut devices = Vec::new();
    for pod in &answer.pod_resources {
        for container in &pod.containers {
            for group in &container.devices {
                if !group.resource_name.starts_with("nvidia.com/") {
                    continue;
                }
                for id in &group.device_ids {
                    devices.push(DeviceAssignment {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: container.name.clone(),
                        resource: group.resource_name.clone(),
                        device_id: id.clone(),
                    });
                }
            }
        }
    }
    devices.sort();
    devices
}

/// One HTTP/2 connection as the service tonic's client sends requests through.
struct Http2Channel(hyper::client::conn::http2::SendRequest<tonic::body::Body>);

type ResponseFuture = Pin<
    Box<dyn Future<Output = Result<hyper::Response<hyper::body::Incoming>, hyper::Error>> + Send>,
>;

impl tower_service::Service<hyper::Request<tonic::body::Body>> for Http2Channel {
    type Response = hyper::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(context)
    }

    fn call(&mut self, request: hyper::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(request))
    }
}

/// Messages as bytes: prost encodes the request and decodes the answer outside tonic.
#[derive(Debug, Clone, Copy, Default)]
struct BytesCodec;

impl tonic::codec::Codec for BytesCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = BytesCodec;
    type Decoder = BytesCodec;

    fn encoder(&mut self) -> Self::Encoder {
        BytesCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        BytesCodec
    }
}

impl tonic::codec::Encoder for BytesCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        destination: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        destination.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for BytesCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        source: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        let mut bytes = vec![0; source.remaining()];
        source.copy_to_slice(&mut bytes);
        Ok(Some(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::v1::*;
    use super::*;
    use crate::observe::kubernetes::reading::examples::assigned;

    #[test]
    fn messages_have_the_api_field_numbers() {
        // Bytes as the kubelet's Go code writes them, spelled out tag by tag.
        let response = ListPodResourcesResponse {
            pod_resources: vec![PodResources {
                name: "p".into(),
                namespace: "n".into(),
                containers: vec![ContainerResources {
                    name: "c".into(),
                    devices: vec![ContainerDevices {
                        resource_name: "r".into(),
                        device_ids: vec!["d".into()],
                        topology: Some(TopologyInfo {
                            nodes: vec![NumaNode { id: 1 }],
                        }),
                    }],
                }],
            }],
        };
        let numa = [0x08, 0x01];
        let topology = [&[0x0a, 0x02][..], &numa].concat();
        let devices = [
            &[0x0a, 0x01, b'r', 0x12, 0x01, b'd', 0x1a, 0x04][..],
            &topology,
        ]
        .concat();
        let container = [&[0x0a, 0x01, b'c', 0x12, devices.len() as u8][..], &devices].concat();
        let pod = [
            &[
                0x0a,
                0x01,
                b'p',
                0x12,
                0x01,
                b'n',
                0x1a,
                container.len() as u8,
            ][..],
            &container,
        ]
        .concat();
        let wire = [&[0x0a, pod.len() as u8][..], &pod].concat();
        assert_eq!(response.encode_to_vec(), wire);
        assert_eq!(
            ListPodResourcesResponse::decode(&wire[..]).unwrap(),
            response
        );
    }

    #[test]
    fn unknown_fields_of_newer_kubelets_are_skipped() {
        // ContainerResources with cpu_ids (3) and memory (4), which this reader leaves out.
        let container = [0x0a, 0x01, b'c', 0x18, 0x05, 0x22, 0x00];
        let pod = [&[0x1a, container.len() as u8][..], &container].concat();
        let wire = [&[0x0a, pod.len() as u8][..], &pod].concat();
        let decoded = ListPodResourcesResponse::decode(&wire[..]).unwrap();
        assert_eq!(decoded.pod_resources[0].containers[0].name, "c");
    }

    #[test]
    fn another_message_is_not_taken_for_the_answer() {
        // A NUMANode (field 1 a varint) where a list of pods (field 1 a message) belongs.
        assert!(ListPodResourcesResponse::decode(&[0x08, 0x07][..]).is_err());
        // A name that is not UTF-8.
        let pod = [0x0a, 0x01, 0xff];
        let wire = [&[0x0a, pod.len() as u8][..], &pod].concat();
        assert!(ListPodResourcesResponse::decode(&wire[..]).is_err());
    }

    #[test]
    fn only_nvidia_devices_are_kept_from_an_answer() {
        let answer = ListPodResourcesResponse {
            pod_resources: vec![
                PodResources {
                    name: "train".into(),
                    namespace: "ml".into(),
                    containers: vec![
                        ContainerResources {
                            name: "trainer".into(),
                            devices: vec![
                                ContainerDevices {
                                    resource_name: "nvidia.com/gpu".into(),
                                    device_ids: vec!["GPU-1".into(), "GPU-0".into()],
                                    topology: None,
                                },
                                ContainerDevices {
                                    resource_name: "example.com/fpga".into(),
                                    device_ids: vec!["f0".into()],
                                    topology: None,
                                },
                            ],
                        },
                        ContainerResources {
                            name: "sidecar".into(),
                            devices: Vec::new(),
                        },
                    ],
                },
                PodResources {
                    name: "web".into(),
                    namespace: "default".into(),
                    containers: Vec::new(),
                },
            ],
        };
        let devices = nvidia_devices(&answer);
        assert_eq!(
            devices,
            [
                assigned("train", "trainer", "nvidia.com/gpu", "GPU-0"),
                assigned("train", "trainer", "nvidia.com/gpu", "GPU-1"),
            ]
        );
    }

    #[test]
    fn a_missing_socket_is_absent_not_a_failure() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let socket = dir.path().join("kubelet.sock");
        let error = runtime
            .block_on(list(&socket, Duration::from_secs(5)))
            .unwrap_err();
        assert_eq!(error.kind(), SourceError::Absent, "{error}");
        // A file that is no socket: something is there, but it is not a kubelet.
        std::fs::write(&socket, b"").unwrap();
        let error = runtime
            .block_on(list(&socket, Duration::from_secs(5)))
            .unwrap_err();
        assert_eq!(error.kind(), SourceError::Unavailable, "{error}");
    }
}
