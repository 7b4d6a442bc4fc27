//! The listener: binding the address, admitting connections within
//! `--web.max-connections` (see [`super::connections`]), TLS when the web config in force
//! says so, HTTP/1.1, and a graceful stop on SIGTERM or Ctrl-C.
//!
//! Limits: a connection must send its request headers (and finish its TLS handshake)
//! within [`HEADER_READ_TIMEOUT`], also between keep-alive requests; request heads are
//! capped at [`MAX_REQUEST_HEAD`]; and what a request may ask is up to
//! [`super::endpoints`].

use super::connections::{Slot, Slots, Tracked};
use super::endpoints::{close_after, Endpoints};
use super::reload::WebConfig;
use crate::exporter::Exporter;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

/// How long a client may take to finish its TLS handshake, and to send its request
/// headers (also the idle time allowed between two requests on a kept-alive connection).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections may take to finish after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How long a collection may hold up the exit after that (it ends by its scrape's deadline;
/// a reader thread stuck in a hung NVML call or `/proc` read is never waited for).
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(1);
/// Largest request line and headers accepted (431 beyond); a scrape sends well under 1 KiB.
const MAX_REQUEST_HEAD: usize = 16 * 1024;
/// Most header fields accepted in one request.
const MAX_HEADERS: usize = 64;
/// How often, at most, hitting the connection cap is logged.
const LIMIT_LOG_INTERVAL: Duration = Duration::from_secs(60);
/// Connections the kernel queues before they are accepted (tokio's own bind uses 1024).
const LISTEN_BACKLOG: i32 = 1024;

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Socket address to bind.
    pub listen: SocketAddr,
    /// Path of the metrics endpoint.
    pub telemetry_path: String,
    /// The exporter-toolkit web configuration file, if any.
    pub web_config_file: Option<PathBuf>,
    /// Cap on open connections.
    pub max_connections: usize,
    /// Longest wait of a scrape for its collection.
    pub collection_timeout: Duration,
}

/// Why the server could not start.
#[derive(Debug, Error)]
pub enum ServeError {
    /// The threads that serve could not be started.
    #[error("cannot start the server's threads")]
    Runtime(#[source] std::io::Error),
    /// The address is in use, or not one of this host's.
    #[error("cannot listen on {address}")]
    Listen {
        /// The address asked for.
        address: SocketAddr,
        /// Why it cannot be had.
        source: std::io::Error,
    },
}

/// Serve `exporter`'s metrics as `config` and `web` say until SIGTERM or Ctrl-C, then
/// let open requests finish.
pub fn run(config: ServeConfig, exporter: Arc<Exporter>, web: WebConfig) -> Result<(), ServeError> {
    // One async thread: it only speaks HTTP and TLS (collections run on the blocking
    // pool), and with two, a scrape woke both (the second to steal the woken task), which
    // at one scrape a second cost a cold wake of a thread with nothing to do.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(4)
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    let served = runtime.block_on(async {
        let listen = |source| ServeError::Listen {
            address: config.listen,
            source,
        };
        let listener = match bind(config.listen, bind_dual_stack).map_err(listen)? {
            Bound::AsAsked(listener) => listener,
            Bound::Ipv4Only { listener, ipv6 } => {
                tracing::warn!(error = %ipv6, "this host has no IPv6: listening on every IPv4 interface only");
                listener
            }
        };
        let listener = TcpListener::from_std(listener).map_err(listen)?;
        let address = listener.local_addr().map_err(listen)?;
        serve(listener, address, config, exporter, web).await;
        Ok(())
    });
    // A collection still running must not keep the process alive, nor may a reader thread
    // stuck in a hung NVML call (those end with the process).
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
    served
}

/// A listening socket, as asked for or in its stead.
#[derive(Debug)]
enum Bound {
    /// On the address asked for; for every interface (`[::]`), IPv6 and IPv4.
    AsAsked(std::net::TcpListener),
    /// On every IPv4 interface, since the host has no IPv6 for `[::]`.
    Ipv4Only {
        listener: std::net::TcpListener,
        /// What IPv6 answered.
        ipv6: std::io::Error,
    },
}

/// Listen on `address`. The unspecified IPv6 address (what `:PORT` means) listens on
/// every interface of both families through one socket, as node_exporter's `:9100`
/// does; `dual_stack` makes that socket, and where the host has no IPv6 every IPv4
/// interface is listened on instead.
fn bind(
    address: SocketAddr,
    dual_stack: impl FnOnce(SocketAddr) -> std::io::Result<std::net::TcpListener>,
) -> std::io::Result<Bound> {
    if address.ip() != Ipv6Addr::UNSPECIFIED {
        return listen_socket(address, None).map(Bound::AsAsked);
    }
    match dual_stack(address) {
        Ok(listener) => Ok(Bound::AsAsked(listener)),
        Err(ipv6) if lacks_ipv6(&ipv6) => {
            let ipv4 = SocketAddr::from((Ipv4Addr::UNSPECIFIED, address.port()));
            let listener = listen_socket(ipv4, None)?;
            Ok(Bound::Ipv4Only { listener, ipv6 })
        }
        Err(error) => Err(error),
    }
}

/// One socket on `[::]:PORT` that also takes IPv4 connections (as IPv4-mapped IPv6
/// addresses), whatever the host's `net.ipv6.bindv6only` says.
fn bind_dual_stack(address: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    listen_socket(address, Some(false))
}

/// A non-blocking listening socket on `address`, set up as tokio's own bind sets one up
/// (address reuse, so a restart does not wait for old connections to time out), with
/// `IPV6_V6ONLY` set to `only_v6` when given.
fn listen_socket(
    address: SocketAddr,
    only_v6: Option<bool>,
) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(address),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    if let Some(only_v6) = only_v6 {
        socket.set_only_v6(only_v6)?;
    }
    socket.set_reuse_address(true)?;
    socket.bind(&address.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Whether `error`, from making or binding an IPv6 socket, says the host has no IPv6 (a
/// kernel without it, or booted with `ipv6.disable=1`), rather than that the port is
/// taken or forbidden.
fn lacks_ipv6(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EAFNOSUPPORT | libc::EPROTONOSUPPORT | libc::EADDRNOTAVAIL)
    )
}

/// Accept connections on `listener` (bound to `address`) until a shutdown signal, then
/// give open ones [`SHUTDOWN_GRACE`] to finish.
async fn serve(
    listener: TcpListener,
    address: SocketAddr,
    config: ServeConfig,
    exporter: Arc<Exporter>,
    web: WebConfig,
) {
    let settings = web.current();
    tracing::info!(
        address = %address,
        tls = settings.tls.is_some(),
        basic_auth_users = settings.users.as_ref().map_or(0, |users| users.len()),
        max_connections = config.max_connections,
        "listening"
    );
    drop(settings);
    let endpoints = Arc::new(Endpoints::new(
        config.telemetry_path,
        config.collection_timeout,
        exporter,
        web,
    ));
    let slots = Slots::new(config.max_connections);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown_signal());
    let mut limit_logged: Option<Instant> = None;
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(error) => {
                    // Out of descriptors, usually: back off instead of spinning.
                    tracing::warn!(error = %error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            signal = &mut shutdown => {
                tracing::info!(signal, "shutting down");
                break;
            }
        };
        // At the cap, the connection waits here (and later ones in the kernel's
        // backlog) until a connection makes way: it is never closed unanswered.
        let admitted = tokio::select! {
            admitted = slots.admit() => admitted,
            signal = &mut shutdown => {
                tracing::info!(signal, "shutting down");
                break;
            }
        };
        if (admitted.evicted || admitted.waited)
            && limit_logged.is_none_or(|at| at.elapsed() >= LIMIT_LOG_INTERVAL)
        {
            limit_logged = Some(Instant::now());
            tracing::warn!(
                max_connections = config.max_connections,
                "connection limit reached: making room by closing a connection idle for a second, or the oldest one after its next response (logged once a minute at most)"
            );
        }
        tokio::spawn(connection(
            stream,
            admitted.slot,
            Arc::clone(&endpoints),
            graceful.watcher(),
        ));
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(SHUTDOWN_GRACE) => {
            tracing::warn!("connections still open after the grace period; closing them");
        }
    }
}

/// One connection: TLS when the web config in force says so, then HTTP/1.1, until the
/// client leaves, a limit closes it, or its slot is taken by a newer connection.
async fn connection(stream: TcpStream, slot: Slot, endpoints: Arc<Endpoints>, watcher: Watcher) {
    let slot = Arc::new(slot);
    let tls = endpoints.web.current().tls.clone();
    match tls {
        Some(acceptor) => {
            let handshake = tokio::time::timeout(HEADER_READ_TIMEOUT, acceptor.accept(stream));
            let stream = tokio::select! {
                result = handshake => match result {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(error)) => {
                        tracing::debug!(error = %error, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!("TLS handshake timed out");
                        return;
                    }
                },
                _ = slot.evicted() => return,
            };
            serve_http(stream, slot, endpoints, watcher).await;
        }
        None => serve_http(stream, slot, endpoints, watcher).await,
    }
}

/// HTTP/1.1 on `io`, within the limits, until the client leaves or the slot is taken.
async fn serve_http<I>(io: I, slot: Arc<Slot>, endpoints: Arc<Endpoints>, watcher: Watcher)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service_slot = Arc::clone(&slot);
    let io = Tracked::new(io, Arc::clone(&slot));
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        // A client may close its sending side after the request (`nc -N`, say) and
        // still get the response.
        .half_close(true)
        .max_header_size(MAX_REQUEST_HEAD)
        .max_buf_size(4 * MAX_REQUEST_HEAD)
        .max_headers(MAX_HEADERS)
        .serve_connection(
            TokioIo::new(io),
            service_fn(move |request| {
                let serving = service_slot.serving();
                let endpoints = Arc::clone(&endpoints);
                let slot = Arc::clone(&service_slot);
                async move {
                    let mut response = endpoints.handle(request).await;
                    // A newer connection waits for this one's slot: this response is the
                    // last, and the client knows it before it sends another request.
                    if slot.asked_to_close() {
                        response = response.map(close_after);
                    }
                    drop(serving);
                    response
                }
            }),
        );
    let connection = watcher.watch(connection);
    tokio::select! {
        result = connection => {
            if let Err(error) = result {
                tracing::debug!(error = %error, "connection ended with an error");
            }
        }
        _ = slot.evicted() => {
            tracing::debug!("closed an idle connection to make room for a new one");
        }
    }
}

/// Which signal asked the server to stop.
async fn shutdown_signal() -> &'static str {
    let mut terminate = match tokio::signal::unix::signal(
        tokio::signal::unix::SignalKind::terminate(),
    ) {
        Ok(signal) => signal,
        Err(error) => {
            tracing::warn!(error = %error, "cannot listen for SIGTERM; only Ctrl-C stops the server");
            let _ = tokio::signal::ctrl_c().await;
            return "SIGINT";
        }
    };
    tokio::select! {
        _ = terminate.recv() => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(errno: i32) -> impl FnOnce(SocketAddr) -> std::io::Result<std::net::TcpListener> {
        move |_| Err(std::io::Error::from_raw_os_error(errno))
    }

    #[test]
    fn every_interface_is_one_socket_for_ipv6_and_ipv4() {
        let every = SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0));
        let listener = match bind(every, bind_dual_stack).unwrap() {
            Bound::AsAsked(listener) => listener,
            Bound::Ipv4Only { ipv6, .. } => {
                panic!(
                    "this host has no IPv6 ({ipv6}): the dual-stack socket cannot be tested here"
                )
            }
        };
        let port = listener.local_addr().unwrap().port();
        let socket = socket2::SockRef::from(&listener);
        assert!(!socket.only_v6().unwrap());
        // The kernel hands an IPv4 connection to the IPv6 socket.
        std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap();
        let (_, peer) = listener.accept().unwrap();
        assert_eq!(
            peer.ip(),
            std::net::IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped())
        );
    }

    #[test]
    fn without_ipv6_every_interface_is_every_ipv4_interface() {
        let every = SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0));
        for no_ipv6 in [
            libc::EAFNOSUPPORT,
            libc::EPROTONOSUPPORT,
            libc::EADDRNOTAVAIL,
        ] {
            let Bound::Ipv4Only { listener, ipv6 } = bind(every, refused(no_ipv6)).unwrap() else {
                panic!("errno {no_ipv6}: not the IPv4 fallback")
            };
            assert_eq!(ipv6.raw_os_error(), Some(no_ipv6));
            let address = listener.local_addr().unwrap();
            assert_eq!(address.ip(), Ipv4Addr::UNSPECIFIED);
        }
        // A port in use or forbidden is an error, not a reason to listen elsewhere.
        for taken in [libc::EADDRINUSE, libc::EACCES] {
            let error = bind(every, refused(taken)).unwrap_err();
            assert_eq!(error.raw_os_error(), Some(taken));
        }
    }

    #[test]
    fn other_addresses_are_listened_on_as_given() {
        let dual_stack_unused =
            |_| -> std::io::Result<std::net::TcpListener> { panic!("only [::] is dual-stack") };
        let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let Bound::AsAsked(listener) = bind(loopback, dual_stack_unused).unwrap() else {
            panic!("not as asked")
        };
        assert_eq!(listener.local_addr().unwrap().ip(), Ipv4Addr::LOCALHOST);
    }
}
