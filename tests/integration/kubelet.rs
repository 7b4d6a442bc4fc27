//! A stand-in kubelet: the pod-resources API (`v1.PodResourcesLister/List`) on a Unix
//! socket in a temporary directory, served by tonic's server over hyper's HTTP/2, as the
//! real kubelet serves it (gRPC, no TLS, on `pod-resources/kubelet.sock`). What it
//! answers is set by the test, like the fake NVML's scenario, and read on every call.
//!
//! Its answers are protobuf bytes encoded here by hand from the API's field numbers, not
//! with the exporter's message types, so a wrong field number on either side shows.

use std::convert::Infallible;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

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
        Behaviour::Answer(pods) => Ok(encode_response(&pods)),
        Behaviour::Bytes(bytes) => Ok(bytes),
        Behaviour::Status(code) => Err(tonic::Status::new(code, "the stand-in kubelet says no")),
        Behaviour::Hang => std::future::pending().await,
        Behaviour::NotHttp2 => unreachable!("refused at accept"),
    };
    let mut grpc = tonic::server::Grpc::new(RawCodec);
    Ok(grpc.unary(Reply(reply), request).await)
}

/// The unary handler: checks the request is the empty `ListPodResourcesRequest`.
struct Reply(Result<Vec<u8>, tonic::Status>);

impl tower_service::Service<tonic::Request<Vec<u8>>> for Reply {
    type Response = tonic::Response<Vec<u8>>;
    type Error = tonic::Status;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<Vec<u8>>) -> Self::Future {
        if !request.get_ref().is_empty() {
            return std::future::ready(Err(tonic::Status::invalid_argument(
                "ListPodResourcesRequest has no fields",
            )));
        }
        std::future::ready(self.0.clone().map(tonic::Response::new))
    }
}

/// Message bytes in and out unchanged: the stand-in encodes its answers itself.
#[derive(Clone, Copy)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        destination: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        prost::bytes::BufMut::put_slice(destination, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        source: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use prost::bytes::Buf;
        let mut bytes = vec![0; source.remaining()];
        source.copy_to_slice(&mut bytes);
        Ok(Some(bytes))
    }
}

// Protobuf by hand: a length-delimited field is its key ((number << 3) | 2) and its
// length as varints, then its bytes. Every field of these messages is one.

fn varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn field(number: u64, bytes: &[u8], out: &mut Vec<u8>) {
    varint((number << 3) | 2, out);
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// `ListPodResourcesResponse { repeated PodResources pod_resources = 1 }`, with
/// `PodResources { name = 1, namespace = 2, repeated ContainerResources containers = 3 }`,
/// `ContainerResources { name = 1, repeated ContainerDevices devices = 2 }` and
/// `ContainerDevices { resource_name = 1, repeated string device_ids = 2 }`.
pub fn encode_response(pods: &[Pod]) -> Vec<u8> {
    let mut response = Vec::new();
    for pod in pods {
        let mut message = Vec::new();
        field(1, pod.name.as_bytes(), &mut message);
        field(2, pod.namespace.as_bytes(), &mut message);
        for container in &pod.containers {
            let mut resources = Vec::new();
            field(1, container.name.as_bytes(), &mut resources);
            for (resource, ids) in &container.devices {
                let mut devices = Vec::new();
                field(1, resource.as_bytes(), &mut devices);
                for id in ids {
                    field(2, id.as_bytes(), &mut devices);
                }
                field(2, &devices, &mut resources);
            }
            // cpu_ids = 3 (packed int64), as a kubelet with a static CPU policy sends:
            // the exporter must skip what it does not read.
            field(3, &[2, 3], &mut resources);
            field(3, &resources, &mut message);
        }
        field(1, &message, &mut response);
    }
    response
}
