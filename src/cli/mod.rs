//! Command-line flags (node_exporter's naming), resolved into a plain [`Config`].
//!
//! - `command`: the command line as clap derives it ([`Cli`]), whose doc comments are the
//!   `--help` text;
//! - `flags`: the flag groups, each defined once and shared by the modes that use it;
//! - `parse`: reading the words, flags given before the subcommand included;
//! - `config`: the flags resolved into a plain [`Config`];
//! - `values`: the checks of single values that clap's parsers do not make;
//! - `errors`: what a mistake says, in one line.

mod command;
mod config;
mod errors;
mod flags;
mod parse;
#[cfg(test)]
mod testing;
mod values;

pub use command::Cli;
pub use config::{CheckConfig, Config, Mode};
pub use errors::CliError;
