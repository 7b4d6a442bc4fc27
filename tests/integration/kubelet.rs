//! A stand-in kubelet: the pod-resources API (`v1.PodResourcesLister/List`) on a Unix
//! socket in a temporary directory, served by tonic's server over hyper's HTTP/2, as the
//! real kubelet serves it (gRPC, no TLS, on `pod-resources/kubelet.sock`). What it
//! answers is set by the test, like the fake NVML's scenario, and read on every call.
//!
//! Its messages are its own prost definitions, written from the API's field numbers, not
//! the exporter's message types, so a wrong field number on either side shows. tonic's
//! prost codec carries them.

use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType};
use prost::{DecodeError, Message};
use std::convert::Infallible;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tonic::codec::ProstCodec;

/// A pod and its containers, as the test describes the node.
#[derive(Debug, Clone)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub containers: Vec<Container>,
}

/// A container and its devices: `(resource name, device ids)` per resource.
#[derive(Debug, Clone)]
pub struct Container {
    pub name: String,
    pub devices: Vec<(String, Vec<String>)>,
}

impl Pod {
    pub fn new(namespace: &str, name: &str) -> Pod {
        Pod {
            namespace: namespace.into(),
            name: name.into(),
            containers: Vec::new(),
        }
    }

    /// Adds a container with `devices` of `(resource, ids)`.
    pub fn container(mut self, name: &str, devices: &[(&str, &[&str])]) -> Pod {
        self.containers.push(Container {
            name: name.into(),
            devices: devices
                .iter()
                .map(|(resource, ids)| {
                    (
                        resource.to_string(),
                        ids.iter().map(|id| id.to_string()).collect(),
                    )
                })
                .collect(),
        });
        self
    }
}

/// What the stand-in does when `List` is called.
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// Answers these pods.
    Answer(Vec<Pod>),
    /// Answers these bytes as the message, in a well-formed gRPC frame.
    Bytes(Vec<u8>),
    /// Answers this gRPC error status.
    Status(tonic::Code),
    /// Takes the call and never answers.
    Hang,
    /// Writes bytes that are not HTTP/2 on each new connection and closes it.
    NotHttp2,
}

/// The stand-in kubelet; stops and removes its socket when dropped.
pub struct StandInKubelet {
    /// The pod-resources directory (the exporter is given the socket in it).
    pub dir: tempfile::TempDir,
    behaviour: Arc<Mutex<Behaviour>>,
    calls: Arc<AtomicUsize>,
    server: Option<Server>,
}

struct Server {
    shutdown: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl StandInKubelet {
    /// Serves `behaviour`; the socket exists when this returns.
    pub fn start(behaviour: Behaviour) -> StandInKubelet {
        let mut kubelet = StandInKubelet {
            dir: tempfile::tempdir().expect("temporary folder"),
            behaviour: Arc::new(Mutex::new(behaviour)),
            calls: Arc::new(AtomicUsize::new(0)),
            server: None,
        };
        kubelet.restart();
        kubelet
    }

    /// The socket, where the kubelet makes it: `kubelet.sock` in its directory.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("kubelet.sock")
    }

    /// The socket as a flag value.
    pub fn socket_arg(&self) -> String {
        self.socket().display().to_string()
    }

    /// Changes what the next calls get.
    pub fn set(&self, behaviour: Behaviour) {
        *self.behaviour.lock().unwrap() = behaviour;
    }

    /// Calls of `List` (and connections refused as not HTTP/2) so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Stops serving and removes the socket, as a kubelet that stops does.
    pub fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            let _ = server.shutdown.send(());
            server.thread.join().expect("the stand-in kubelet's thread");
        }
        let _ = std::fs::remove_file(self.socket());
    }

    /// Serves again on a new socket at the same path, as a restarted kubelet does.
    pub fn restart(&mut self) {
        self.stop();
        let listener = UnixListener::bind(self.socket()).expect("bind the kubelet socket");
        listener.set_nonblocking(true).unwrap();
        let (shutdown, stopped) = tokio::sync::oneshot::channel();
        let behaviour = Arc::clone(&self.behaviour);
        let calls = Arc::clone(&self.calls);
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(serve(listener, behaviour, calls, stopped));
        });
        self.server = Some(Server { shutdown, thread });
    }
}

impl Drop for StandInKubelet {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn serve(
    listener: UnixListener,
    behaviour: Arc<Mutex<Behaviour>>,
    calls: Arc<AtomicUsize>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::UnixListener::from_std(listener).unwrap();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
            _ = &mut stopped => return,
        };
        let current = behaviour.lock().unwrap().clone();
        if let Behaviour::NotHttp2 = current {
            calls.fetch_add(1, Ordering::SeqCst);
            let mut stream = stream;
            let _ = stream
                .write_all(b"HTTP/1.1 400 Bad Request\r\n\r\nthis is not HTTP/2\n")
                .await;
            continue;
        }
        let behaviour = Arc::clone(&behaviour);
        let calls = Arc::clone(&calls);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let behaviour = behaviour.lock().unwrap().clone();
                calls.fetch_add(1, Ordering::SeqCst);
                answer(request, behaviour)
            });
            let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer(
    request: hyper::Request<hyper::body::Incoming>,
    behaviour: Behaviour,
) -> Result<hyper::Response<tonic::body::Body>, Infallible> {
    if request.uri().path() != "/v1.PodResourcesLister/List" {
        return Ok(
            tonic::Status::unimplemented("the stand-in kubelet serves only List").into_http(),
        );
    }
    let reply = match behaviour {
        Behaviour::Answer(pods) => Ok(Answer::Message(response(&pods))),
        Behaviour::Bytes(bytes) => Ok(Answer::Verbatim(bytes)),
        Behaviour::Status(code) => Err(tonic::Status::new(code, "the stand-in kubelet says no")),
        Behaviour::Hang => std::future::pending().await,
        Behaviour::NotHttp2 => unreachable!("refused at accept"),
    };
    let mut grpc =
        tonic::server::Grpc::new(ProstCodec::<Answer, v1::ListPodResourcesRequest>::default());
    Ok(grpc.unary(Reply(reply), request).await)
}

/// The unary handler: checks the request is the empty `ListPodResourcesRequest`.
struct Reply(Result<Answer, tonic::Status>);

impl tower_service::Service<tonic::Request<v1::ListPodResourcesRequest>> for Reply {
    type Response = tonic::Response<Answer>;
    type Error = tonic::Status;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<v1::ListPodResourcesRequest>) -> Self::Future {
        if request.get_ref().fields > 0 {
            return std::future::ready(Err(tonic::Status::invalid_argument(
                "ListPodResourcesRequest has no fields",
            )));
        }
        std::future::ready(self.0.clone().map(tonic::Response::new))
    }
}

/// The answer to `List` for `pods`. Each container also has `cpu_ids`, as a kubelet with
/// a static CPU policy sends: the exporter must skip what it does not read.
fn response(pods: &[Pod]) -> v1::ListPodResourcesResponse {
    v1::ListPodResourcesResponse {
        pod_resources: pods
            .iter()
            .map(|pod| v1::PodResources {
                name: pod.name.clone(),
                namespace: pod.namespace.clone(),
                containers: pod
                    .containers
                    .iter()
                    .map(|container| v1::ContainerResources {
                        name: container.name.clone(),
                        devices: container
                            .devices
                            .iter()
                            .map(|(resource, ids)| v1::ContainerDevices {
                                resource_name: resource.clone(),
                                device_ids: ids.clone(),
                            })
                            .collect(),
                        cpu_ids: vec![2, 3],
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// What the stand-in answers `List` with: the API's message, or bytes as they are, for
/// answers that no encoder writes (bytes that are no protobuf, a pod name that is not
/// UTF-8).
#[derive(Debug, Clone)]
enum Answer {
    Message(v1::ListPodResourcesResponse),
    Verbatim(Vec<u8>),
}

impl Message for Answer {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        match self {
            Answer::Message(message) => message.encode_raw(buf),
            Answer::Verbatim(bytes) => buf.put_slice(bytes),
        }
    }

    fn merge_field(
        &mut self,
        _: u32,
        _: WireType,
        _: &mut impl Buf,
        _: DecodeContext,
    ) -> Result<(), DecodeError> {
        unreachable!("the stand-in sends answers and never decodes one")
    }

    fn encoded_len(&self) -> usize {
        match self {
            Answer::Message(message) => message.encoded_len(),
            Answer::Verbatim(bytes) => bytes.len(),
        }
    }

    fn clear(&mut self) {
        *self = Answer::Verbatim(Vec::new());
    }
}

/// The pod-resources v1 messages the stand-in reads and writes, from the API's proto
/// (`k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`); fields the exporter does not
/// read are left out, except `cpu_ids`.
mod v1 {
    use prost::bytes::Buf;
    use prost::encoding::{DecodeContext, WireType};
    use prost::{DecodeError, Message};

    /// `ListPodResourcesRequest {}`. The API gives it no fields, so the stand-in counts
    /// any a client sends (prost's derive would drop them unseen) and refuses the call.
    #[derive(Debug, Default)]
    pub struct ListPodResourcesRequest {
        pub fields: usize,
    }

    impl Message for ListPodResourcesRequest {
        fn encode_raw(&self, _: &mut impl prost::bytes::BufMut) {}

        fn merge_field(
            &mut self,
            tag: u32,
            wire_type: WireType,
            buf: &mut impl Buf,
            ctx: DecodeContext,
        ) -> Result<(), DecodeError> {
            self.fields += 1;
            prost::encoding::skip_field(wire_type, tag, buf, ctx)
        }

        fn encoded_len(&self) -> usize {
            0
        }

        fn clear(&mut self) {
            self.fields = 0;
        }
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct ListPodResourcesResponse {
        #[prost(message, repeated, tag = "1")]
        pub pod_resources: Vec<PodResources>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct PodResources {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub namespace: String,
        #[prost(message, repeated, tag = "3")]
        pub containers: Vec<ContainerResources>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct ContainerResources {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, repeated, tag = "2")]
        pub devices: Vec<ContainerDevices>,
        #[prost(int64, repeated, tag = "3")]
        pub cpu_ids: Vec<i64>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct ContainerDevices {
        #[prost(string, tag = "1")]
        pub resource_name: String,
        #[prost(string, repeated, tag = "2")]
        pub device_ids: Vec<String>,
    }
}
