//! The real Prometheus and Alertmanager that the end-to-end, fleet and dashboard tests
//! start on loopback, the webhook receiver Alertmanager notifies, and what those tests
//! need to read them: the rules with shortened `for:` durations, Prometheus durations
//! and RFC 3339 timestamps.

use crate::helpers::free_port;
use crate::helpers::*;
use serde_json::Value;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A bound on a server's start, and on reading its log once it exited before it was ready.
const WAIT: Duration = Duration::from_secs(30);
/// A bound on one API request (a readiness probe gets one second: a port taken by a
/// process that accepts but does not answer must not hold up the retry).
const API_TIMEOUT: Duration = Duration::from_secs(10);

/// The rules text with every `for:` duration divided by `divisor`, and the shipped `for:`
/// of VRAMOrphanedMemory in seconds.
pub(crate) fn shorten_for_durations(rules: &str, divisor: u64) -> (String, f64) {
    let mut out = String::with_capacity(rules.len());
    let mut current_alert = "";
    let mut orphan_for = None;
    for line in rules.lines() {
        let body = line.trim_start();
        if let Some(name) = body.strip_prefix("- alert:") {
            current_alert = name.trim();
        }
        match body.strip_prefix("for:") {
            Some(value) => {
                let milliseconds = duration_ms(value.trim());
                if current_alert == "VRAMOrphanedMemory" {
                    orphan_for = Some(milliseconds as f64 / 1000.0);
                }
                let shortened = milliseconds / divisor;
                let indent = &line[..line.len() - body.len()];
                if shortened % 1000 == 0 {
                    writeln!(out, "{indent}for: {}s", shortened / 1000).unwrap();
                } else {
                    writeln!(out, "{indent}for: {shortened}ms").unwrap();
                }
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    (
        out,
        orphan_for.expect("VRAMOrphanedMemory has a for: duration"),
    )
}

/// A Prometheus duration (`2m`, `1h30m`, `90s`, `500ms`) in milliseconds.
pub(crate) fn duration_ms(text: &str) -> u64 {
    let mut total = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        let number: u64 = rest[..digits]
            .parse()
            .unwrap_or_else(|_| panic!("not a duration: {text:?}"));
        rest = &rest[digits..];
        let unit = rest.chars().take_while(char::is_ascii_alphabetic).count();
        let scale = match &rest[..unit] {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 604_800_000,
            "y" => 31_536_000_000,
            other => panic!("unknown unit {other:?} in duration {text:?}"),
        };
        total += number * scale;
        rest = &rest[unit..];
    }
    total
}

/// The copy differs from the shipped file only in the values of its `for:` lines, and
/// every alert's `for:` is shortened.
pub(crate) fn assert_only_for_lines_differ(shipped: &str, copy: &str) {
    let shipped: Vec<&str> = shipped.lines().collect();
    let copy: Vec<&str> = copy.lines().collect();
    assert_eq!(
        shipped.len(),
        copy.len(),
        "the copy has as many lines as the rules file"
    );
    let mut changed = 0;
    for (number, (original, shortened)) in shipped.iter().zip(&copy).enumerate() {
        if original == shortened {
            continue;
        }
        let is_for = |line: &str| line.trim_start().starts_with("for:");
        let indent = |line: &str| line.len() - line.trim_start().len();
        assert!(
            is_for(original) && is_for(shortened) && indent(original) == indent(shortened),
            "line {} differs in more than its for: duration:\n  {original}\n  {shortened}",
            number + 1
        );
        changed += 1;
    }
    let alerts = shipped
        .iter()
        .filter(|line| line.trim_start().starts_with("- alert:"))
        .count();
    assert_eq!(
        changed, alerts,
        "every alert's for: is shortened, nothing else"
    );
}

/// Now, in seconds since the epoch.
pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// An RFC 3339 timestamp (`2026-12-02T16:25:19.123Z`, `...+01:00`) in seconds since the
/// epoch.
pub(crate) fn unix_seconds(timestamp: &str) -> f64 {
    let bad = || panic!("not an RFC 3339 timestamp: {timestamp:?}");
    let (date, time) = timestamp.split_once('T').unwrap_or_else(bad);
    let date: Vec<i64> = date.split('-').map(|part| part.parse().unwrap()).collect();
    let (clock, offset) = match time.find(['Z', 'z', '+', '-']) {
        Some(at) => time.split_at(at),
        None => bad(),
    };
    let clock: Vec<f64> = clock.split(':').map(|part| part.parse().unwrap()).collect();
    let offset_seconds = match offset {
        "Z" | "z" => 0.0,
        _ => {
            let sign = if offset.starts_with('-') { -1.0 } else { 1.0 };
            let (hours, minutes) = offset[1..].split_once(':').unwrap_or_else(bad);
            sign * (hours.parse::<f64>().unwrap() * 3600.0 + minutes.parse::<f64>().unwrap() * 60.0)
        }
    };
    // Days from the civil date (H. Hinnant's algorithm).
    let (year, month, day) = (date[0] - i64::from(date[1] <= 2), date[1], date[2]);
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    days as f64 * 86_400.0 + clock[0] * 3600.0 + clock[1] * 60.0 + clock[2] - offset_seconds
}

/// A Prometheus or Alertmanager process on loopback, killed when dropped; its log is
/// printed if the test fails. The dashboard's live test starts its Prometheus with it.
pub(crate) struct Server {
    name: &'static str,
    child: Child,
    pub(crate) address: SocketAddr,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Start `command(address)` on a free loopback port and wait for `/-/ready`; a port
    /// taken between choosing and binding it is chosen again.
    pub(crate) fn start(name: &'static str, command: impl Fn(SocketAddr) -> Command) -> Server {
        for _attempt in 0..5 {
            let address = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let mut child = command(address)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|err| panic!("cannot start {name}: {err}"));
            let log = Arc::new(Mutex::new(String::new()));
            collect_lines(child.stdout.take().unwrap(), Arc::clone(&log));
            collect_lines(child.stderr.take().unwrap(), Arc::clone(&log));
            let mut server = Server {
                name,
                child,
                address,
                log,
            };
            let mut exited = None;
            wait_until(&format!("{name} is ready on {address}"), WAIT, || {
                exited = server.child.try_wait().unwrap();
                exited.is_some()
                    || get(address, "/-/ready", Duration::from_secs(1))
                        .is_some_and(|(status, _)| status == 200)
            });
            let Some(status) = exited else {
                return server;
            };
            // The exit may have come before its last lines were drained.
            wait_until(&format!("{name}'s log is read"), WAIT, || {
                Arc::strong_count(&server.log) == 1
            });
            let log = server.log();
            assert!(
                log.contains("address already in use"),
                "{name} exited ({status}) before it was ready; its log:\n{log}"
            );
        }
        panic!("{name}: five free ports were taken before it could bind them");
    }

    /// The process's ID, to read its memory from `/proc`.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// GET `path` from the server's API and parse the JSON.
    pub(crate) fn api(&self, path: &str) -> Value {
        let (status, body) = get(self.address, path, API_TIMEOUT)
            .unwrap_or_else(|| panic!("{} does not answer GET {path}", self.name));
        assert_eq!(status, 200, "{} GET {path}: {body}", self.name);
        serde_json::from_str(&body)
            .unwrap_or_else(|err| panic!("{} GET {path} is not JSON ({err}): {body}", self.name))
    }

    /// An instant query; fails the test unless Prometheus answers `success`.
    pub(crate) fn query(&self, query: &str) -> Vec<Value> {
        let path = format!("/api/v1/query?query={}", percent_encode(query));
        let (status, body) = get(self.address, &path, API_TIMEOUT)
            .unwrap_or_else(|| panic!("{} does not answer the query {query}", self.name));
        let answer: Value = serde_json::from_str(&body)
            .unwrap_or_else(|err| panic!("query {query}: not JSON ({err}): {body}"));
        assert!(
            status == 200 && answer["status"] == "success",
            "Prometheus rejects the query {query}: {body}"
        );
        answer["data"]["result"]
            .as_array()
            .unwrap_or_else(|| panic!("query {query}: no result list: {body}"))
            .clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- {} log ---\n{}", self.name, self.log());
        }
    }
}

/// GET over HTTP/1.0 (so the body is neither chunked nor kept alive): the status and
/// body, or `None` when nothing listens, the answer is cut short or takes longer than
/// `timeout` between two reads.
pub(crate) fn get(address: SocketAddr, path: &str, timeout: Duration) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&address, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// Percent-encode everything but RFC 3986's unreserved characters.
pub(crate) fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(byte as char);
        } else {
            write!(out, "%{byte:02X}").unwrap();
        }
    }
    out
}

/// Alertmanager's webhook receiver: an HTTP listener that keeps every notification with
/// the moment it arrived.
pub(crate) struct Webhook {
    pub(crate) address: SocketAddr,
    notifications: Arc<Mutex<Vec<(Instant, Value)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Webhook {
    pub(crate) fn start() -> Webhook {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the webhook");
        let address = listener.local_addr().unwrap();
        let notifications = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let notifications = Arc::clone(&notifications);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    if let Some(body) = receive(stream) {
                        let notification = serde_json::from_str(&body).unwrap_or_else(
                            |err| serde_json::json!({ "unparsable": body, "error": err.to_string() }),
                        );
                        notifications
                            .lock()
                            .unwrap()
                            .push((Instant::now(), notification));
                    }
                }
            })
        };
        Webhook {
            address,
            notifications,
            stop,
            thread: Some(thread),
        }
    }

    /// The arrival and the alert of the first notified alert that `matches`.
    pub(crate) fn first(&self, matches: impl Fn(&Value) -> bool) -> Option<(Instant, Value)> {
        let notifications = self.notifications.lock().unwrap();
        notifications.iter().find_map(|(at, notification)| {
            let alerts = notification["alerts"].as_array()?;
            let alert = alerts.iter().find(|alert| matches(alert))?;
            Some((*at, alert.clone()))
        })
    }

    /// Every notification so far (one per POST: a group's alerts), with its arrival.
    pub(crate) fn notifications(&self) -> Vec<(Instant, Value)> {
        self.notifications.lock().unwrap().clone()
    }

    /// Every alert name notified so far, with its status and instance, in order.
    pub(crate) fn alert_names(&self) -> Vec<String> {
        let notifications = self.notifications.lock().unwrap();
        let mut names: Vec<String> = notifications
            .iter()
            .flat_map(|(_, notification)| notification["alerts"].as_array().cloned())
            .flatten()
            .map(|alert| {
                format!(
                    "{} {} ({})",
                    alert["labels"]["alertname"].as_str().unwrap_or("?"),
                    alert["status"].as_str().unwrap_or("?"),
                    alert["labels"]["instance"].as_str().unwrap_or("-"),
                )
            })
            .collect();
        names.dedup();
        names
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept call so the thread sees the flag.
        let _ = TcpStream::connect(self.address);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Read one POST with a Content-Length body, answer 200 and close; the body.
fn receive(mut stream: TcpStream) -> Option<String> {
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut length = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.trim().eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    stream
        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .ok()?;
    Some(String::from_utf8_lossy(&body).into_owned())
}
