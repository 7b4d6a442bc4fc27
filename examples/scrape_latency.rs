//! Scrape latency as a compiled client sees it: `COUNT` scrapes of `http://ADDRESS/metrics`
//! over one kept-alive connection, each timed from the request's first byte to the
//! body's last, after `WARM_UP` untimed ones; prints one JSON line of percentiles.
//!
//! The GPU suite runs it beside its Python client, whose own 0.1 ms a request would
//! otherwise be counted as the exporter's:
//!
//! ```sh
//! cargo build --release --example scrape_latency
//! target/release/examples/scrape_latency 127.0.0.1:9835 1000 100
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let (address, count, warm_up) = match arguments.as_slice() {
        [address, count, warm_up] => match (count.parse::<usize>(), warm_up.parse::<usize>()) {
            (Ok(count), Ok(warm_up)) if count > 0 => (address.clone(), count, warm_up),
            _ => return usage(),
        },
        _ => return usage(),
    };
    match measure(&address, count, warm_up) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("scrape_latency: {address}: {error}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> ExitCode {
    eprintln!("usage: scrape_latency ADDRESS COUNT WARM_UP (e.g. 127.0.0.1:9835 1000 100)");
    ExitCode::from(2)
}

fn measure(address: &str, count: usize, warm_up: usize) -> Result<String, String> {
    let stream = TcpStream::connect(address).map_err(|error| error.to_string())?;
    stream
        .set_nodelay(true)
        .map_err(|error| error.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|error| error.to_string())?;
    let mut writer = stream.try_clone().map_err(|error| error.to_string())?;
    let mut reader = BufReader::with_capacity(256 * 1024, stream);
    let request = format!(
        "GET /metrics HTTP/1.1\r\nHost: {address}\r\nUser-Agent: scrape_latency\r\n\
         Accept: text/plain;version=0.0.4\r\n\r\n"
    );
    let mut body = Vec::new();
    let mut times = Vec::with_capacity(count);
    for scrape in 0..warm_up + count {
        let started = Instant::now();
        writer
            .write_all(request.as_bytes())
            .map_err(|error| error.to_string())?;
        read_response(&mut reader, &mut body)?;
        if scrape >= warm_up {
            times.push(started.elapsed());
        }
    }
    times.sort();
    let at = |fraction: f64| {
        let index = ((times.len() as f64 * fraction) as usize).min(times.len() - 1);
        times[index].as_secs_f64() * 1e6
    };
    Ok(format!(
        "{{\"scrapes\": {count}, \"body_bytes\": {}, \"p50_us\": {:.1}, \"p90_us\": {:.1}, \"p99_us\": {:.1}, \"max_us\": {:.1}}}",
        body.len(),
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0),
    ))
}

/// One response: its head, then exactly `Content-Length` bytes of body; anything but 200
/// is an error that quotes the body.
fn read_response(reader: &mut BufReader<TcpStream>, body: &mut Vec<u8>) -> Result<(), String> {
    let mut line = String::new();
    let mut status = None;
    let mut length = None;
    loop {
        line.clear();
        let read = reader
            .read_line(&mut line)
            .map_err(|error| error.to_string())?;
        if read == 0 {
            return Err("connection closed".to_string());
        }
        if line == "\r\n" {
            break;
        }
        if status.is_none() {
            status = line.split_whitespace().nth(1).map(str::to_string);
        } else if let Some((key, value)) = line.split_once(':') {
            if key.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse::<usize>().ok();
            }
        }
    }
    let length = length.ok_or("a response without Content-Length")?;
    body.resize(length, 0);
    reader.read_exact(body).map_err(|error| error.to_string())?;
    match status.as_deref() {
        Some("200") => Ok(()),
        other => Err(format!(
            "status {other:?}: {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        )),
    }
}
