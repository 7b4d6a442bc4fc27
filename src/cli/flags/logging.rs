//! Logging.

use crate::logging::{LogFormat, LogLevel};
use clap::Args;

/// Logging.
#[derive(Debug, Default, Args)]
#[command(next_help_heading = "Logging")]
pub struct LogArgs {
    /// Only log messages at or above this level [default: info].
    #[arg(long = "log.level", value_enum)]
    pub log_level: Option<LogLevel>,

    /// Log line format, on standard error [default: logfmt].
    #[arg(long = "log.format", value_enum)]
    pub log_format: Option<LogFormat>,
}
