//! What the command line's tests share: a parse from words to a `Config` or the line a
//! mistake says, and the `--help` of a mode.

use super::command::Cli;
use super::config::Config;
use super::errors::CliError;

/// The `Config` that the words `args` (after the program's name) resolve to, or the one
/// line their mistake says.
pub(super) fn parse(args: &[&str]) -> Result<Config, String> {
    let mut argv = vec!["vram-exporter"];
    argv.extend_from_slice(args);
    match Cli::from_command_line(argv).and_then(|cli| Ok(cli.into_config()?)) {
        Ok(config) => Ok(config),
        Err(CliError::Info(info)) => panic!("help instead of a parse: {info}"),
        Err(mistake) => Err(mistake.to_string()),
    }
}

/// The text of `--help` for `args` (a subcommand, or nothing for the server).
pub(super) fn help(args: &[&str]) -> String {
    let mut argv = vec!["vram-exporter"];
    argv.extend_from_slice(args);
    argv.push("--help");
    match Cli::from_command_line(argv) {
        Err(CliError::Info(info)) => info.render().to_string(),
        other => panic!("--help did not give help: {other:?}"),
    }
}

/// The long flags a mode's `--help` lists.
pub(super) fn listed_flags(args: &[&str]) -> Vec<String> {
    let mut flags: Vec<String> = help(args)
        .lines()
        .filter_map(|line| {
            let line = line.trim_start();
            // `-h, --help` and `-o, --output <OUTPUT>` have a short form first.
            let line = line.split_once(", ").map_or(line, |(_, long)| long);
            line.strip_prefix("--")
        })
        .map(|rest| rest.split([' ', '=']).next().unwrap().to_string())
        .collect();
    flags.sort();
    flags
}
