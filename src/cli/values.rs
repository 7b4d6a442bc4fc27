//! Single flag values that clap's parsers leave unchecked: an address to listen on, a
//! path to serve, a duration that must be longer than 0, a socket path that may be empty.

use super::errors::InvalidFlag;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

/// A GPU as `--gpu` names it, before `--gpu.numbering` says what a number is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuArg {
    /// An index or a device minor.
    Number(u32),
    /// A GPU's UUID, `GPU-...`.
    Uuid(String),
}

/// One GPU of `--gpu`: a number, or a GPU UUID. A MIG instance's UUID is refused: `check`
/// looks at whole GPUs.
pub(super) fn parse_gpu(value: &str) -> Result<GpuArg, String> {
    let value = value.trim();
    if value.is_empty() {
        return Err("an empty GPU: give indices or UUIDs, separated by commas".into());
    }
    if let Ok(number) = value.parse::<u32>() {
        return Ok(GpuArg::Number(number));
    }
    let prefix = |text: &str, prefix: &str| {
        text.get(..prefix.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(prefix))
    };
    if prefix(value, "MIG-") {
        return Err(format!(
            "{value} is a MIG instance; --gpu takes whole GPUs: the index or GPU-... UUID of its GPU"
        ));
    }
    if prefix(value, "GPU-") && value.len() > 4 {
        return Ok(GpuArg::Uuid(value.to_string()));
    }
    Err(format!(
        "'{value}' is neither a GPU index nor a GPU UUID (GPU-...)"
    ))
}

/// A socket's path; empty (which clap's path parser refuses) turns its engine off.
pub(super) fn socket_path(value: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(value))
}

/// `duration`, unless it is zero: a wait, budget or interval of 0 cannot work.
pub(super) fn longer_than_zero(
    duration: Duration,
    flag: &'static str,
) -> Result<Duration, InvalidFlag> {
    if duration.is_zero() {
        Err(InvalidFlag::NoTime { flag })
    } else {
        Ok(duration)
    }
}

/// `:9077` means every interface, IPv6 and IPv4, as in other Prometheus exporters: the
/// unspecified IPv6 address, which the server listens on with both families.
pub(super) fn parse_listen_address(text: &str) -> Result<SocketAddr, InvalidFlag> {
    let spelled = if text.starts_with(':') {
        format!("[::]{text}")
    } else {
        text.to_string()
    };
    spelled
        .to_socket_addrs()
        .ok()
        .and_then(|mut addresses| addresses.next())
        .ok_or_else(|| InvalidFlag::ListenAddress(text.to_string()))
}

pub(super) fn parse_telemetry_path(path: String) -> Result<String, InvalidFlag> {
    if !path.starts_with('/') || path.len() < 2 {
        return Err(InvalidFlag::TelemetryPath(path));
    }
    if path == "/-/healthy" || path == "/-/ready" {
        return Err(InvalidFlag::ReservedPath(path));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use crate::cli::config::Mode;
    use crate::cli::testing::parse;

    #[test]
    fn listen_address_forms() {
        for (flag, port) in [("127.0.0.1:1234", 1234), ("[::1]:99", 99), (":8080", 8080)] {
            let config = parse(&["--web.listen-address", flag]).unwrap();
            let Mode::Serve(serve) = config.mode else {
                panic!()
            };
            assert_eq!(serve.listen.port(), port);
        }
        let error = parse(&["--web.listen-address", "nonsense"]).unwrap_err();
        assert!(error.contains("is not HOST:PORT"), "{error}");
        // `:PORT` is every interface of both families: the server listens on `[::]`
        // with IPv4 too.
        for every in [":9077", "[::]:9077"] {
            let Mode::Serve(serve) = parse(&["--web.listen-address", every]).unwrap().mode else {
                panic!()
            };
            assert_eq!(serve.listen, "[::]:9077".parse().unwrap(), "{every}");
        }
    }

    #[test]
    fn telemetry_path_must_be_a_path() {
        assert!(parse(&["--web.telemetry-path", "metrics"]).is_err());
        assert!(parse(&["--web.telemetry-path", "/"]).is_err());
        assert!(parse(&["--web.telemetry-path", "/-/ready"]).is_err());
        assert!(parse(&["--web.telemetry-path", "/vram"]).is_ok());
    }
}
