//! The HTTP side: a landing page, health endpoints and `/metrics`, with concurrent
//! scrapes sharing one collection.

use crate::cli::ServeConfig;
use crate::exporter::{encode, Exporter, Format};
use anyhow::Context;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// How long a client may take to send its request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections may take to finish after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// One collection in flight, shared by every scrape that arrives while it runs.
type InFlight = watch::Receiver<Option<Bytes>>;

struct Shared {
    registry: Registry,
    telemetry_path: String,
    in_flight: Mutex<HashMap<Format, InFlight>>,
}

/// Bind the listener; a busy port or a bad address is an error for the caller to print.
pub async fn bind(config: &ServeConfig) -> anyhow::Result<TcpListener> {
    TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))
}

/// Serve until SIGTERM or Ctrl-C, then let open requests finish.
pub async fn serve(
    listener: TcpListener,
    config: ServeConfig,
    exporter: Arc<Exporter>,
) -> anyhow::Result<()> {
    let shared = Arc::new(Shared {
        registry: exporter.registry(),
        telemetry_path: config.telemetry_path,
        in_flight: Mutex::new(HashMap::new()),
    });
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown_signal());
    tracing::info!(address = %listener.local_addr()?, "listening");
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _peer)) => stream,
                    Err(error) => {
                        // Out of descriptors, usually: back off instead of spinning.
                        tracing::warn!(error = %error, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let shared = Arc::clone(&shared);
                let connection = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .serve_connection(
                        TokioIo::new(stream),
                        service_fn(move |request| handle(Arc::clone(&shared), request)),
                    );
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    if let Err(error) = connection.await {
                        tracing::debug!(error = %error, "connection ended with an error");
                    }
                });
            }
            signal = &mut shutdown => {
                tracing::info!(signal, "shutting down");
                break;
            }
        }
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(SHUTDOWN_GRACE) => {
            tracing::warn!("connections still open after the grace period; closing them");
        }
    }
    Ok(())
}

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

async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let head_only = request.method() == Method::HEAD;
    if !(request.method() == Method::GET || head_only) {
        let mut response = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "Method not allowed; use GET or HEAD.\n",
        );
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Ok(response);
    }
    let path = request.uri().path();
    let mut response = if path == shared.telemetry_path {
        let format = negotiate(&request);
        match metrics(&shared, format).await {
            Some(body) => {
                let mut response = Response::new(Full::new(body));
                response.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static(format.content_type()),
                );
                response
            }
            None => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "The collection failed; see the exporter's log.\n",
            ),
        }
    } else {
        match path {
            "/" => {
                let mut response =
                    Response::new(Full::new(Bytes::from(landing_page(&shared.telemetry_path))));
                response.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("text/html; charset=utf-8"),
                );
                response
            }
            "/-/healthy" => text(StatusCode::OK, "Healthy\n"),
            "/-/ready" => text(StatusCode::OK, "Ready\n"),
            _ => text(StatusCode::NOT_FOUND, "Not found.\n"),
        }
    };
    if head_only {
        *response.body_mut() = Full::new(Bytes::new());
    }
    Ok(response)
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// OpenMetrics when the scraper asks for it, the classic text format otherwise.
fn negotiate(request: &Request<Incoming>) -> Format {
    let accepts_openmetrics = request
        .headers()
        .get_all(hyper::header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|value| value.contains("application/openmetrics-text"));
    if accepts_openmetrics {
        Format::OpenMetrics
    } else {
        Format::PrometheusText
    }
}

/// The metrics body, from a collection already in flight when there is one: scrapes
/// that arrive together share it instead of queueing NVML calls behind each other.
/// `None` when the collection died.
async fn metrics(shared: &Arc<Shared>, format: Format) -> Option<Bytes> {
    let mut receiver = {
        let mut in_flight = lock(&shared.in_flight);
        match in_flight.get(&format) {
            Some(receiver) => receiver.clone(),
            None => {
                let (sender, receiver) = watch::channel(None);
                in_flight.insert(format, receiver.clone());
                let shared = Arc::clone(shared);
                // NVML calls block: collect on the blocking pool, never on the async threads.
                tokio::task::spawn_blocking(move || {
                    let _done = InFlightGuard {
                        shared: &shared,
                        format,
                    };
                    let body = Bytes::from(encode(&shared.registry, format));
                    let _ = sender.send(Some(body));
                });
                receiver
            }
        }
    };
    let body = receiver.wait_for(Option::is_some).await.ok()?;
    body.clone()
}

/// Ends a collection's turn, also when it panics, so the next scrape starts a new one.
struct InFlightGuard<'a> {
    shared: &'a Shared,
    format: Format,
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        lock(&self.shared.in_flight).remove(&self.format);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn landing_page(telemetry_path: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html>\n<head><meta charset=\"utf-8\"><title>vram-exporter</title></head>\n<body>\n\
         <h1>vram-exporter {version}</h1>\n\
         <p>Which GPU memory a live process owns, and which is orphaned.</p>\n\
         <ul>\n<li><a href=\"{telemetry_path}\">Metrics</a></li>\n\
         <li><a href=\"/-/healthy\">Health</a></li>\n<li><a href=\"/-/ready\">Readiness</a></li>\n</ul>\n\
         <p>On the host, <code>vram-exporter check</code> names the process still holding orphaned memory.</p>\n\
         </body>\n</html>\n",
        version = env!("CARGO_PKG_VERSION"),
    )
}
