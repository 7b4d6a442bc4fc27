//! Why a command line leads to no run, each said in one line: clap's mistakes rebuilt from
//! their kind and context, without its usage block, and the flags that parse but cannot
//! work.

use clap::error::{ContextKind, ContextValue, ErrorKind};
use thiserror::Error;

/// Why the command line does not lead to a run.
#[derive(Debug, Error)]
pub enum CliError {
    /// `--help`, `--version` or `help`: not a mistake. Print it on standard output and
    /// exit 0.
    #[error("{0}")]
    Info(clap::Error),
    /// A mistake clap found: said in one line from its kind and context, with the
    /// `--help` of the mode it was made in.
    #[error("{}; see {help}", one_line(.error))]
    Parse {
        /// What clap found.
        error: clap::Error,
        /// Where to read more: `vram-exporter check --help`, say.
        help: String,
    },
    /// A flag given before the subcommand that does nothing for it.
    #[error("--{flag} does nothing for `{subcommand}`; see vram-exporter {subcommand} --help")]
    NothingFor {
        /// The flag, without its dashes.
        flag: String,
        /// The subcommand.
        subcommand: String,
    },
    /// Words before the subcommand that cannot be told apart from it.
    #[error("cannot tell where `{subcommand}` begins; give its flags after it; see vram-exporter {subcommand} --help")]
    Unplaced {
        /// The subcommand.
        subcommand: String,
    },
    /// A flag whose value parses but cannot work.
    #[error(transparent)]
    Invalid(#[from] InvalidFlag),
}

/// A flag whose value parses but cannot work.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InvalidFlag {
    /// A count that has to be at least 1 is 0.
    #[error("--{flag} must be at least 1")]
    Zero {
        /// The flag, without its dashes.
        flag: &'static str,
    },
    /// A duration that has to be longer than 0 is 0.
    #[error("--{flag} must be longer than 0")]
    NoTime {
        /// The flag, without its dashes.
        flag: &'static str,
    },
    /// `--web.listen-address` names no socket address.
    #[error("--web.listen-address '{0}' is not HOST:PORT, [IPv6]:PORT or :PORT")]
    ListenAddress(String),
    /// `--web.telemetry-path` is not an absolute path below `/`.
    #[error("--web.telemetry-path '{0}' must start with / and name a path other than /")]
    TelemetryPath(String),
    /// A flag that does something only beside another.
    #[error("--{flag} needs {needs}")]
    Needs {
        /// The flag, without its dashes.
        flag: &'static str,
        /// What it needs, as the command line says it.
        needs: &'static str,
    },
    /// `--web.telemetry-path` is one of the health endpoints.
    #[error("--web.telemetry-path '{0}' is reserved")]
    ReservedPath(String),
}

/// A clap error in one line, built from its kind and context: the mistake, then any tip
/// (the values there are, a similar flag), without the usage block.
fn one_line(error: &clap::Error) -> String {
    let joined = |kind, separator| items(error.get(kind)).join(separator);
    let (arg, value) = (
        joined(ContextKind::InvalidArg, ", "),
        joined(ContextKind::InvalidValue, ""),
    );
    let mut parts = vec![match error.kind() {
        ErrorKind::UnknownArgument => format!("unexpected argument '{arg}' found"),
        ErrorKind::InvalidSubcommand => format!(
            "unrecognized subcommand '{}'",
            joined(ContextKind::InvalidSubcommand, "")
        ),
        ErrorKind::InvalidValue if value.is_empty() => {
            format!("a value is required for '{arg}' but none was supplied")
        }
        ErrorKind::InvalidValue => format!("invalid value '{value}' for '{arg}'"),
        // Our value parsers' errors (`crate::units`) say what is wrong with the value.
        ErrorKind::ValueValidation => match std::error::Error::source(error) {
            Some(reason) => format!(
                "invalid value '{value}' for '{arg}': {}",
                crate::observe::one_line(reason)
            ),
            None => format!("invalid value '{value}' for '{arg}'"),
        },
        ErrorKind::TooManyValues => {
            format!("unexpected value '{value}' for '{arg}' found; no more were expected")
        }
        ErrorKind::MissingRequiredArgument => {
            format!("the following required arguments were not provided: {arg}")
        }
        ErrorKind::ArgumentConflict
            if error.get(ContextKind::PriorArg) == error.get(ContextKind::InvalidArg) =>
        {
            format!("the argument '{arg}' cannot be used multiple times")
        }
        ErrorKind::ArgumentConflict => format!(
            "the argument '{arg}' cannot be used with '{}'",
            joined(ContextKind::PriorArg, "', '")
        ),
        kind => kind.to_string(),
    }];
    let values = joined(ContextKind::ValidValue, ", ");
    if !values.is_empty() {
        parts.push(format!("[possible values: {values}]"));
    }
    for (kind, what) in [
        (ContextKind::SuggestedSubcommand, "subcommand"),
        (ContextKind::SuggestedArg, "argument"),
        (ContextKind::SuggestedValue, "value"),
    ] {
        match items(error.get(kind)).as_slice() {
            [] => {}
            [similar] => parts.push(format!("tip: a similar {what} exists: '{similar}'")),
            similar => parts.push(format!(
                "tip: some similar {what}s exist: '{}'",
                similar.join("', '")
            )),
        }
    }
    let tips = items(error.get(ContextKind::Suggested));
    parts.extend(tips.iter().map(|tip| format!("tip: {tip}")));
    parts.join("; ")
}

/// The words of a piece of clap's context: one, a list, or none.
fn items(value: Option<&ContextValue>) -> Vec<String> {
    match value {
        Some(ContextValue::String(item)) => vec![item.clone()],
        Some(ContextValue::Strings(items)) => items.clone(),
        Some(ContextValue::StyledStrs(items)) => items.iter().map(ToString::to_string).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use crate::cli::testing::parse;

    #[test]
    fn other_mistakes_are_one_line_with_their_tips() {
        assert_eq!(
            parse(&["--log.format", "jsn"]).unwrap_err(),
            "invalid value 'jsn' for '--log.format <LOG_FORMAT>'; [possible values: logfmt, json]; tip: a similar value exists: 'json'; see vram-exporter --help"
        );
        assert_eq!(
            parse(&["--json", "check"]).unwrap_err(),
            "unexpected argument '--json' found; tip: 'check --json' exists; see vram-exporter check --help"
        );
        assert_eq!(
            parse(&["check", "--replay", "a", "--replay", "b"]).unwrap_err(),
            "the argument '--replay <FILE>' cannot be used multiple times; see vram-exporter check --help"
        );
        assert_eq!(
            parse(&["--log.level"]).unwrap_err(),
            "a value is required for '--log.level <LOG_LEVEL>' but none was supplied; [possible values: error, warn, info, debug]; see vram-exporter --help"
        );
    }

    #[test]
    fn mistakes_are_one_line_that_names_the_flag() {
        assert_eq!(
            parse(&["--bogus"]).unwrap_err(),
            "unexpected argument '--bogus' found; see vram-exporter --help"
        );
        assert_eq!(
            parse(&["check", "--wait", "30"]).unwrap_err(),
            "invalid value '30' for '--wait <DURATION>': '30' needs a unit: ns, us, ms, s, m, h, d, w or y; see vram-exporter check --help"
        );
        assert_eq!(
            parse(&["check", "--jsn"]).unwrap_err(),
            "unexpected argument '--jsn' found; tip: a similar argument exists: '--json'; see vram-exporter check --help"
        );
        assert_eq!(
            parse(&["textfile"]).unwrap_err(),
            "the following required arguments were not provided: --output <OUTPUT>; see vram-exporter textfile --help"
        );
        assert_eq!(
            parse(&["chek"]).unwrap_err(),
            "unrecognized subcommand 'chek'; tip: a similar subcommand exists: 'check'; see vram-exporter --help"
        );
        for args in [&["--bogus"][..], &["check", "--gpu", "x"], &["textfile"]] {
            let line = parse(args).unwrap_err();
            assert!(!line.contains('\n'), "{args:?}: {line}");
        }
    }
}
