//! The exporter binary running: as a server on a free port (with a small HTTP client), or
//! as a one-shot command whose output is collected.

use crate::output::Metrics;
use crate::wait_until;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a finished command said.
#[derive(Debug)]
pub struct Outcome {
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl From<std::process::Output> for Outcome {
    fn from(output: std::process::Output) -> Outcome {
        Outcome {
            status: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl Outcome {
    /// Standard output parsed as JSON (`check --json`, `snapshot`).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|error| {
            panic!(
                "standard output is not JSON ({error}):\n{}\nstandard error:\n{}",
                self.stdout, self.stderr
            )
        })
    }
}

/// A running exporter, killed when dropped.
pub struct Exporter {
    pub child: Child,
    pub address: SocketAddr,
    log: Arc<Mutex<String>>,
}

/// Start an exporter `command` (which listens on port 0) and wait for its address.
pub fn start(command: Command) -> Exporter {
    Exporter::start(command)
}

impl Exporter {
    fn start(mut command: Command) -> Exporter {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start exporter");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (address_sender, address_receiver) = std::sync::mpsc::channel();
        let sink = Arc::clone(&log);
        // Keep draining stderr for the exporter's whole life so it never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("msg=listening") {
                    if let Some(address) = line
                        .split_whitespace()
                        .find_map(|field| field.strip_prefix("address="))
                    {
                        let _ = address_sender.send(address.parse::<SocketAddr>().unwrap());
                    }
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let address = match address_receiver.recv_timeout(Duration::from_secs(20)) {
            Ok(address) => address,
            Err(_) => {
                let _ = child.kill();
                let status = child.wait();
                panic!(
                    "exporter did not start ({status:?}); its log:\n{}",
                    log.lock().unwrap()
                );
            }
        };
        Exporter {
            child,
            address,
            log,
        }
    }

    /// Everything the exporter logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// GET `path` and parse the metrics.
    pub fn scrape(&self) -> Metrics {
        let response = self.get("/metrics");
        assert_eq!(response.status, 200, "scrape failed: {}", response.body);
        Metrics::parse(&response.body)
    }

    /// One request with `method`, `path` and extra header lines.
    pub fn request(&self, method: &str, path: &str, headers: &[&str]) -> Response {
        http(self.address, method, path, headers)
    }

    /// A GET request.
    pub fn get(&self, path: &str) -> Response {
        self.request("GET", path, &[])
    }

    /// Wait for the exit status of an exporter already told to stop (15 s at most).
    pub fn wait_for_exit(mut self) -> std::process::ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "exporter ignored SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// A minimal HTTP/1.1 client: one request per connection.
pub fn http(address: SocketAddr, method: &str, path: &str, headers: &[&str]) -> Response {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let request = request_head(method, path, &address.to_string(), headers);
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read response");
    parse_response(&raw).expect("an HTTP response with a status line")
}

/// An HTTP/1.1 request without a body for `host`, with `headers` (whole header lines),
/// asking the server to close the connection after answering.
pub fn request_head(method: &str, path: &str, host: &str, headers: &[&str]) -> String {
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for header in headers {
        request.push_str(header);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    request
}

/// `raw` as an HTTP response, or `None` when it is none (cut short, no status line).
pub fn parse_response(raw: &[u8]) -> Option<Response> {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(key, value)| (key.trim().to_string(), value.trim().to_string()))
        .collect();
    Some(Response {
        status,
        headers,
        body: body.to_string(),
    })
}

/// A one-shot command still running, whose output is collected line by line, so a test
/// can wait for what it has printed so far.
pub struct Running {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Running {
    pub fn spawn(command: &mut Command) -> Running {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the exporter");
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let readers = vec![
            collect_lines(child.stdout.take().unwrap(), Arc::clone(&stdout)),
            collect_lines(child.stderr.take().unwrap(), Arc::clone(&stderr)),
        ];
        Running {
            child,
            stdout,
            stderr,
            readers,
        }
    }

    /// Standard output so far.
    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// Standard error so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Wait for the exit (failing after `timeout`) and return everything it printed.
    pub fn finish(mut self, timeout: Duration) -> Outcome {
        let mut status = None;
        wait_until("the command exits", timeout, || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        for reader in self.readers.drain(..) {
            reader.join().unwrap();
        }
        Outcome {
            status: status.unwrap().code(),
            stdout: self.stdout(),
            stderr: self.stderr(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Append every line of `stream` to `sink` until it closes.
pub fn collect_lines(
    stream: impl Read + Send + 'static,
    sink: Arc<Mutex<String>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            let mut text = sink.lock().unwrap();
            text.push_str(&line);
            text.push('\n');
        }
    })
}
