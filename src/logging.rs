//! Logging set-up: logfmt (as Prometheus components log) or JSON lines, on standard error.

use crate::dates::rfc3339_millis;
use clap::ValueEnum;
use std::fmt::{self, Write as _};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Log levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Warnings and errors.
    Warn,
    /// Normal operation.
    Info,
    /// Everything.
    Debug,
}

/// Log formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// `key=value` pairs, as Prometheus components log.
    Logfmt,
    /// One JSON object per line.
    Json,
}

/// Install the global subscriber; a second call (tests) is ignored.
pub fn init(level: LogLevel, format: LogFormat) {
    let level = match level {
        LogLevel::Error => Level::ERROR,
        LogLevel::Warn => Level::WARN,
        LogLevel::Info => Level::INFO,
        LogLevel::Debug => Level::DEBUG,
    };
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
        LogFormat::Logfmt => builder.event_format(Logfmt).try_init(),
    };
}

/// `ts=... level=info msg="..." key=value`, one event a line.
struct Logfmt;

impl<S, N> FormatEvent<S, N> for Logfmt
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _context: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let timestamp = rfc3339_millis(std::time::SystemTime::now());
        let level = event.metadata().level().as_str().to_ascii_lowercase();
        let mut fields = LogfmtFields::default();
        event.record(&mut fields);
        write!(writer, "ts={timestamp} level={level}")?;
        if let Some(message) = fields.message {
            write!(writer, " msg={}", quote(&message))?;
        }
        writer.write_str(&fields.rest)?;
        writeln!(writer)
    }
}

#[derive(Default)]
struct LogfmtFields {
    message: Option<String>,
    rest: String,
}

impl Visit for LogfmtFields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let value = format!("{value:?}");
        self.record_str(field, &value);
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = Some(value.to_string());
        } else {
            let _ = write!(self.rest, " {}={}", field.name(), quote(value));
        }
    }
}

/// Quote a logfmt value when it needs it.
fn quote(value: &str) -> String {
    if !value.is_empty()
        && !value
            .chars()
            .any(|c| c.is_whitespace() || c == '"' || c == '=' || c.is_control())
    {
        return value.to_string();
    }
    let mut quoted = String::with_capacity(value.len() + 2);
    quoted.push('"');
    for c in value.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            '\n' => quoted.push_str("\\n"),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_quoted_only_when_needed() {
        assert_eq!(quote("plain"), "plain");
        assert_eq!(quote("two words"), "\"two words\"");
        assert_eq!(quote("a=b"), "\"a=b\"");
        assert_eq!(quote("say \"hi\""), "\"say \\\"hi\\\"\"");
        assert_eq!(quote(""), "\"\"");
    }
}
