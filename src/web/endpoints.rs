//! What the server answers: a landing page, the health endpoints and the metrics, to GET
//! and HEAD only, behind the web config's rate limit and basic authentication. A scrape
//! waits for its collection at most `--web.collection-timeout`, or less when Prometheus
//! says it gives up sooner, and then gets 503.

use super::auth::Authenticator;
use super::collections::{Collected, Collections};
use super::reload::WebConfig;
use super::settings::WebSettings;
use crate::exporter::{Exporter, Format};
use http_body_util::Full;
use hyper::body::{Body as _, Bytes, Incoming};
use hyper::header::{
    HeaderValue, ALLOW, AUTHORIZATION, CONNECTION, CONTENT_TYPE, WWW_AUTHENTICATE,
};
use hyper::{Method, Request, Response, StatusCode};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

/// Prometheus says how long it will wait for a scrape; answering 503 this much before
/// that deadline (or halfway to it, when it is closer) lets it record why the scrape
/// failed.
const SCRAPE_DEADLINE_MARGIN: Duration = Duration::from_millis(500);
/// Where the served exporter's verdict is, as `check --json` prints it: the face of the
/// verdict that a script beside the exporter, or in the cluster, reads.
pub(super) const VERDICT_PATH: &str = "/verdict";
/// The shortest wait for a collection, whatever a scraper asks for.
const SHORTEST_WAIT: Duration = Duration::from_millis(1);

/// Everything a request is answered from.
pub(super) struct Endpoints {
    telemetry_path: String,
    collection_timeout: Duration,
    collections: Arc<Collections>,
    /// The web configuration in force, also read for each new connection's TLS.
    pub(super) web: WebConfig,
    auth: Authenticator,
}

impl Endpoints {
    /// Metrics at `telemetry_path` from `exporter`, each scrape waiting at most
    /// `collection_timeout`, behind `web`.
    pub(super) fn new(
        telemetry_path: String,
        collection_timeout: Duration,
        exporter: Arc<Exporter>,
        web: WebConfig,
    ) -> Endpoints {
        Endpoints {
            telemetry_path,
            collection_timeout,
            collections: Arc::new(Collections::new(exporter)),
            web,
            auth: Authenticator::default(),
        }
    }

    /// The response to `request`, with the extra headers of the web config in force.
    pub(super) async fn handle(
        &self,
        request: Request<Incoming>,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        let settings = self.web.current();
        let mut response = self.respond(&settings, request).await;
        for (name, value) in &settings.headers {
            response.headers_mut().insert(name.clone(), value.clone());
        }
        Ok(response)
    }

    /// The rate limit and authentication first, then the method, then the endpoint.
    async fn respond(
        &self,
        settings: &WebSettings,
        request: Request<Incoming>,
    ) -> Response<Full<Bytes>> {
        if let Some(limiter) = &settings.rate_limit {
            if !limiter.allow() {
                return text(StatusCode::TOO_MANY_REQUESTS, "Too many requests.\n");
            }
        }
        if let Some(users) = &settings.users {
            if !self
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
        let mut response = if path == self.telemetry_path || path == VERDICT_PATH {
            let format = if path == VERDICT_PATH {
                Format::Verdict
            } else {
                negotiate(&request)
            };
            let timeout = collection_timeout(&request, self.collection_timeout);
            match self.collections.metrics(format, timeout).await {
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
                        "The collection has been running for {:.1}s, longer than this scrape waits ({:.1}s), although it gives up on NVML and /proc in time: the exporter may be starved of CPU. It goes on; later scrapes wait for it rather than start another. See the exporter's log.\n",
                        running.as_secs_f64(),
                        timeout.as_secs_f64(),
                    ),
                ),
            }
        } else {
            match path {
                "/" => {
                    let mut response =
                        Response::new(Full::new(Bytes::from(landing_page(&self.telemetry_path))));
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
pub(super) fn close_after(mut response: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
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

fn landing_page(telemetry_path: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html>\n<head><meta charset=\"utf-8\"><title>vram-exporter</title></head>\n<body>\n\
         <h1>vram-exporter {version}</h1>\n\
         <p>Which GPU memory a live process owns, and which is orphaned.</p>\n\
         <ul>\n<li><a href=\"{telemetry_path}\">Metrics</a></li>\n\
         <li><a href=\"/verdict\">Verdict</a>, as <code>vram-exporter check --json</code> prints it</li>\n\
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
