//! The HTTP side: a landing page, health endpoints and `/metrics`, with concurrent
//! scrapes sharing one collection, behind the `--web.config.file` protections (TLS,
//! client certificates, basic authentication) and limits against bad clients.
//!
//! Limits: a connection must send its request headers (and finish its TLS handshake)
//! within [`HEADER_READ_TIMEOUT`], also between keep-alive requests; request heads are
//! capped at [`MAX_REQUEST_HEAD`]; GET and HEAD carry no body, so a request with one is
//! refused unread (413); open connections are capped (`--web.max-connections`, see
//! [`crate::web::connections`]); and a scrape waits for its collection at most
//! `--web.collection-timeout` before it gets 503.

use crate::cli::ServeConfig;
use crate::exporter::{encode, Exporter, Format};
use crate::sync::lock;
use crate::web::auth::Authenticator;
use crate::web::connections::{Slot, Slots, Tracked};
use crate::web::{WebConfig, WebSettings};
use anyhow::Context;
use http_body_util::Full;
use hyper::body::{Body as _, Bytes, Incoming};
use hyper::header::{
    HeaderValue, ALLOW, AUTHORIZATION, CONNECTION, CONTENT_TYPE, WWW_AUTHENTICATE,
};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How long a client may take to finish its TLS handshake, and to send its request
/// headers (also the idle time allowed between two requests on a kept-alive connection).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections may take to finish after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Largest request line and headers accepted (431 beyond); a scrape sends well under 1 KiB.
const MAX_REQUEST_HEAD: usize = 16 * 1024;
/// Most header fields accepted in one request.
const MAX_HEADERS: usize = 64;
/// How often, at most, hitting the connection cap is logged.
const LIMIT_LOG_INTERVAL: Duration = Duration::from_secs(60);
/// Prometheus says how long it will wait for a scrape; answering 503 this much before
/// that deadline (or halfway to it, when it is closer) lets it record why the scrape
/// failed.
const SCRAPE_DEADLINE_MARGIN: Duration = Duration::from_millis(500);
/// The shortest wait for a collection, whatever a scraper asks for.
const SHORTEST_WAIT: Duration = Duration::from_millis(1);
/// How much of a scrape's wait a holder scan may take at most.
const SCAN_SHARE_OF_WAIT: f64 = 0.9;

/// One collection in flight, shared by every scrape that arrives while it runs.
#[derive(Clone)]
struct InFlight {
    body: watch::Receiver<Option<Bytes>>,
    started: Instant,
    /// Whether a scrape already gave up on this collection (and logged it).
    overran: Arc<AtomicBool>,
}

struct Shared {
    exporter: Arc<Exporter>,
    telemetry_path: String,
    collection_timeout: Duration,
    in_flight: Mutex<HashMap<Format, InFlight>>,
    web: WebConfig,
    auth: Authenticator,
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
    web: WebConfig,
) -> anyhow::Result<()> {
    let settings = web.current();
    let shared = Arc::new(Shared {
        exporter,
        telemetry_path: config.telemetry_path,
        collection_timeout: config.collection_timeout,
        in_flight: Mutex::new(HashMap::new()),
        web,
        auth: Authenticator::default(),
    });
    let slots = Slots::new(config.max_connections);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown_signal());
    tracing::info!(
        address = %listener.local_addr()?,
        tls = settings.tls.is_some(),
        basic_auth_users = settings.users.as_ref().map_or(0, |users| users.len()),
        max_connections = config.max_connections,
        "listening"
    );
    drop(settings);
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
            Arc::clone(&shared),
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
    Ok(())
}

/// One connection: TLS when the web config in force says so, then HTTP/1.1, until the
/// client leaves, a limit closes it, or its slot is taken by a newer connection.
async fn connection(stream: TcpStream, slot: Slot, shared: Arc<Shared>, watcher: Watcher) {
    let slot = Arc::new(slot);
    let tls = shared.web.current().tls.clone();
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
            serve_http(stream, slot, shared, watcher).await;
        }
        None => serve_http(stream, slot, shared, watcher).await,
    }
}

async fn serve_http<I>(io: I, slot: Arc<Slot>, shared: Arc<Shared>, watcher: Watcher)
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
                let shared = Arc::clone(&shared);
                let slot = Arc::clone(&service_slot);
                async move {
                    let mut response = handle(shared, request).await;
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
    let settings = shared.web.current();
    let mut response = respond(&shared, &settings, request).await;
    for (name, value) in &settings.headers {
        response.headers_mut().insert(name.clone(), value.clone());
    }
    Ok(response)
}

async fn respond(
    shared: &Arc<Shared>,
    settings: &WebSettings,
    request: Request<Incoming>,
) -> Response<Full<Bytes>> {
    if let Some(limiter) = &settings.rate_limit {
        if !limiter.allow() {
            return text(StatusCode::TOO_MANY_REQUESTS, "Too many requests.\n");
        }
    }
    if let Some(users) = &settings.users {
        if !shared
            .auth
            .check(users, request.headers().get(AUTHORIZATION))
            .await
        {
            let mut response = text(StatusCode::UNAUTHORIZED, "Unauthorized.\n");
            response.headers_mut().insert(
                WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"vram-exporter\", charset=\"UTF-8\""),
            );
            return response;
        }
    }
    let head_only = request.method() == Method::HEAD;
    if !(request.method() == Method::GET || head_only) {
        let mut response = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "Method not allowed; use GET or HEAD.\n",
        );
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return close_after(response);
    }
    if !request.body().is_end_stream() {
        // GET and HEAD carry no body: refuse one without reading it.
        return close_after(text(
            StatusCode::PAYLOAD_TOO_LARGE,
            "GET and HEAD requests take no body.\n",
        ));
    }
    let path = request.uri().path();
    let mut response = if path == shared.telemetry_path {
        let format = negotiate(&request);
        let timeout = collection_timeout(&request, shared.collection_timeout);
        match metrics(shared, format, timeout).await {
            Collected::Body(body) => {
                let mut response = Response::new(Full::new(body));
                response.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static(format.content_type()),
                );
                response
            }
            Collected::Failed => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "The collection failed; see the exporter's log.\n",
            ),
            Collected::Overran(running) => owned_text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "The collection has been running for {:.1}s, longer than this scrape waits ({:.1}s): an NVML call or the /proc scan hangs. It goes on; later scrapes wait for it rather than start another. See the exporter's log.\n",
                    running.as_secs_f64(),
                    timeout.as_secs_f64(),
                ),
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
    response
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    owned_text(status, body.to_string())
}

fn owned_text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Close the connection after this response rather than read what the client sent on.
fn close_after(mut response: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
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

/// `--web.collection-timeout`, or less when Prometheus says it gives up sooner
/// (`X-Prometheus-Scrape-Timeout-Seconds`), so that it sees the 503 and its reason.
fn collection_timeout(request: &Request<Incoming>, configured: Duration) -> Duration {
    let header = request
        .headers()
        .get("x-prometheus-scrape-timeout-seconds")
        .map(|value| value.to_str().unwrap_or("(not text)"));
    scrape_wait(header, configured)
}

/// How long a scrape waits for its collection: `configured`, or up to half a second
/// before the deadline Prometheus announces, or halfway to that deadline when it is
/// under a second away. A value that is not a positive number of seconds is ignored
/// (and logged at debug level).
fn scrape_wait(header: Option<&str>, configured: Duration) -> Duration {
    let Some(header) = header else {
        return configured;
    };
    let Some(seconds) = header
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|seconds| *seconds > 0.0)
        .and_then(|seconds| Duration::try_from_secs_f64(seconds).ok())
    else {
        tracing::debug!(
            value = header,
            "ignoring an X-Prometheus-Scrape-Timeout-Seconds that is not a positive number of seconds"
        );
        return configured;
    };
    let before_deadline = seconds
        .saturating_sub(SCRAPE_DEADLINE_MARGIN)
        .max(seconds / 2);
    configured.min(before_deadline).max(SHORTEST_WAIT)
}

/// What a scrape got from the collection it waited for.
enum Collected {
    Body(Bytes),
    /// The collection panicked.
    Failed,
    /// The collection has run this long, longer than the scrape would wait.
    Overran(Duration),
}

/// The metrics body, from a collection already in flight when there is one: scrapes
/// that arrive together share it instead of queueing NVML calls behind each other.
/// A scrape waits at most `timeout`; a collection that takes longer (a hung NVML call)
/// stays the one in flight, so later scrapes wait for it too instead of starting more
/// collections that would hang on the same call.
async fn metrics(shared: &Arc<Shared>, format: Format, timeout: Duration) -> Collected {
    let in_flight = {
        let mut in_flight = lock(&shared.in_flight);
        match in_flight.get(&format) {
            Some(running) => running.clone(),
            None => {
                let (sender, receiver) = watch::channel(None);
                let running = InFlight {
                    body: receiver,
                    started: Instant::now(),
                    overran: Arc::new(AtomicBool::new(false)),
                };
                in_flight.insert(format, running.clone());
                let shared = Arc::clone(shared);
                let overran = Arc::clone(&running.overran);
                let started = running.started;
                // Scrapes that join later may wait longer; the holder scan still has to
                // end before the scrape that started the collection gives up on it, with
                // a tenth of the wait left to judge and encode what it found.
                let registry = shared
                    .exporter
                    .registry_until(started + timeout.mul_f64(SCAN_SHARE_OF_WAIT));
                // NVML calls block: collect on the blocking pool, never on the async threads.
                tokio::task::spawn_blocking(move || {
                    let done = InFlightGuard {
                        shared: &shared,
                        format,
                    };
                    let body = Bytes::from(encode(&registry, format));
                    if overran.load(Ordering::SeqCst) {
                        tracing::info!(
                            seconds = started.elapsed().as_secs_f64(),
                            "the collection that overran --web.collection-timeout has finished"
                        );
                    }
                    // Out of the table before the body goes out: a scrape that arrives
                    // from now on starts a fresh collection instead of getting this one.
                    drop(done);
                    let _ = sender.send(Some(body));
                });
                running
            }
        }
    };
    let mut receiver = in_flight.body.clone();
    let waited = tokio::time::timeout(timeout, async {
        receiver
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|body| body.clone())
    })
    .await;
    match waited {
        Ok(Some(body)) => Collected::Body(body),
        Ok(None) => Collected::Failed,
        Err(_) => {
            let running = in_flight.started.elapsed();
            if !in_flight.overran.swap(true, Ordering::SeqCst) {
                tracing::warn!(
                    seconds = running.as_secs_f64(),
                    timeout_seconds = timeout.as_secs_f64(),
                    "a collection is taking longer than scrapes wait (a hung NVML call?); scrapes get 503 and join it until it ends (logged once per collection)"
                );
            }
            Collected::Overran(running)
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_scrape_timeout_shortens_the_wait() {
        let ten = Duration::from_secs(10);
        let millis = Duration::from_millis;
        assert_eq!(scrape_wait(None, ten), ten);
        // Longer than the configured wait: the configured one.
        assert_eq!(scrape_wait(Some("60"), ten), ten);
        assert_eq!(scrape_wait(Some("10.5"), ten), ten);
        // Half a second before Prometheus gives up.
        assert_eq!(scrape_wait(Some("10"), ten), millis(9_500));
        assert_eq!(scrape_wait(Some(" 2 "), ten), millis(1_500));
        assert_eq!(scrape_wait(Some("1e0"), ten), millis(500));
    }

    #[test]
    fn a_scrape_timeout_under_a_second_waits_half_of_it() {
        let ten = Duration::from_secs(10);
        let millis = Duration::from_millis;
        assert_eq!(scrape_wait(Some("1"), ten), millis(500));
        assert_eq!(scrape_wait(Some("0.8"), ten), millis(400));
        assert_eq!(scrape_wait(Some("0.5"), ten), millis(250));
        assert_eq!(scrape_wait(Some("0.4"), ten), millis(200));
        assert_eq!(scrape_wait(Some("0.001"), ten), SHORTEST_WAIT);
        assert_eq!(scrape_wait(Some("0.0001"), ten), SHORTEST_WAIT);
        // The wait never shrinks as the timeout grows.
        let mut previous = Duration::ZERO;
        for thousandths in 1..3_000u64 {
            let header = format!("{}", thousandths as f64 / 1000.0);
            let wait = scrape_wait(Some(&header), ten);
            assert!(wait >= previous, "{header} s: {wait:?} < {previous:?}");
            assert!(
                wait <= Duration::from_millis(thousandths).max(SHORTEST_WAIT),
                "{header} s: waits {wait:?}, past the deadline"
            );
            previous = wait;
        }
    }

    #[test]
    fn a_malformed_scrape_timeout_is_ignored() {
        let ten = Duration::from_secs(10);
        for header in [
            "",
            " ",
            "garbage",
            "10s",
            "-3",
            "-0.5",
            "0",
            "0.0",
            "-0",
            "NaN",
            "inf",
            "-inf",
            "1e400",
            "(not text)",
            "0x10",
            "1,5",
        ] {
            assert_eq!(scrape_wait(Some(header), ten), ten, "{header:?}");
        }
    }
}
