//! The one parser of sizes (`16MiB`) and the one parser of durations (`500ms`, `1m30s`)
//! of the whole program: flags and the web configuration file read them here.

use std::time::Duration;
use thiserror::Error;

/// Why a text is not a byte size.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SizeError {
    /// No number where the size should start.
    #[error("'{0}' is not a size such as 16MiB or 9MB")]
    NotASize(String),
    /// A number without its unit (only a bare `0` needs none): `16` is as likely meant
    /// as 16 MiB as 16 bytes.
    #[error("'{0}' needs a unit: {units}", units = named(&SIZE_UNITS, "or"))]
    NoUnit(String),
    /// A unit that is not one of ours.
    #[error("unknown size unit '{unit}' in '{text}' (use {units})", units = named(&SIZE_UNITS, "or"))]
    UnknownUnit {
        /// The unit as written.
        unit: String,
        /// The whole size as written.
        text: String,
    },
    /// More bytes than a `u64` holds.
    #[error("'{0}' is too large")]
    TooLarge(String),
}

/// Why a text is not a duration.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DurationError {
    /// No number where a part of the duration should start.
    #[error("'{0}' is not a duration such as 500ms, 30s or 1m30s")]
    NotADuration(String),
    /// A number without its unit (only a bare `0` needs none).
    #[error("'{0}' needs a unit: {units}", units = named(&DURATION_UNITS, "or"))]
    NoUnit(String),
    /// A unit that is not one of ours.
    #[error("unknown duration unit '{unit}' in '{text}' (use {units})", units = named(&DURATION_UNITS, "or"))]
    UnknownUnit {
        /// The unit as written.
        unit: String,
        /// The whole duration as written.
        text: String,
    },
    /// Longer than a [`Duration`] holds.
    #[error("'{0}' is out of range")]
    OutOfRange(String),
}

/// Seconds in Prometheus's day: 24 hours, leap seconds and clock changes aside.
const DAY: f64 = 86_400.0;

/// A unit: the names it is written with (the first is the one messages name) and what
/// one of it is worth. The parsers read these tables, and their messages name them, so
/// a message never lists a unit the parser refuses or leaves out one it takes.
type Unit<T> = (&'static [&'static str], T);

/// Byte sizes, binary then decimal.
const SIZE_UNITS: [Unit<u64>; 9] = [
    (&["B"], 1),
    (&["KiB"], 1 << 10),
    (&["MiB"], 1 << 20),
    (&["GiB"], 1 << 30),
    (&["TiB"], 1 << 40),
    (&["kB", "KB"], 1_000),
    (&["MB"], 1_000_000),
    (&["GB"], 1_000_000_000),
    (&["TB"], 1_000_000_000_000),
];

/// Durations in seconds: Go's units, then Prometheus's longer ones as it counts them.
const DURATION_UNITS: [Unit<f64>; 9] = [
    (&["ns"], 1e-9),
    (&["us", "µs", "μs"], 1e-6),
    (&["ms"], 1e-3),
    (&["s"], 1.0),
    (&["m"], 60.0),
    (&["h"], 3600.0),
    (&["d"], DAY),
    (&["w"], 7.0 * DAY),
    (&["y"], 365.0 * DAY),
];

/// The units of `table` as a message names them: `ns, us, ms, ... or y`.
fn named<T>(table: &[Unit<T>], last: &str) -> String {
    let names: Vec<&str> = table.iter().map(|(names, _)| names[0]).collect();
    match names.split_last() {
        Some((final_name, [])) => final_name.to_string(),
        Some((final_name, rest)) => format!("{} {last} {final_name}", rest.join(", ")),
        None => String::new(),
    }
}

/// What one `unit` is worth, as `table` says.
fn worth<T: Copy>(table: &[Unit<T>], unit: &str) -> Option<T> {
    table
        .iter()
        .find(|(names, _)| names.contains(&unit))
        .map(|(_, value)| *value)
}

/// Split `16MiB` into its leading number and the unit that follows.
fn split_number(text: &str) -> Option<(f64, &str)> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    Some((number.parse().ok()?, unit))
}

/// Parse a byte size: a number and its unit (B, KiB, MiB, GiB, TiB, kB, MB, GB, TB); a
/// bare `0` is zero. A number alone is refused, as a duration's is: the default of
/// `--orphan.context-overhead` is 16MiB, and `16` meaning 16 bytes would surprise.
pub fn parse_bytes(text: &str) -> Result<u64, SizeError> {
    let text = text.trim();
    if text == "0" {
        return Ok(0);
    }
    let (value, unit) = split_number(text).ok_or_else(|| SizeError::NotASize(text.into()))?;
    let scale = match unit.trim() {
        "" => return Err(SizeError::NoUnit(text.into())),
        unit => worth(&SIZE_UNITS, unit).ok_or_else(|| SizeError::UnknownUnit {
            unit: unit.into(),
            text: text.into(),
        })?,
    };
    let bytes = value * scale as f64;
    if !bytes.is_finite() || bytes > u64::MAX as f64 {
        return Err(SizeError::TooLarge(text.into()));
    }
    Ok(bytes.round() as u64)
}

/// Parse a duration as Go and Prometheus write them: one or more numbers, each with a
/// unit, such as `500ms`, `30s`, `1.5h`, `1m30s` or `1d`; a bare `0` is zero. The units
/// are Go's (`ns`, `us` or `µs`, `ms`, `s`, `m`, `h`) and Prometheus's longer ones, as
/// Prometheus counts them: `d` is 24 hours, `w` 7 days and `y` 365 days. Flags and the
/// web configuration file both read this.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let not_a_duration = || DurationError::NotADuration(text.into());
    if text.is_empty() {
        return Err(not_a_duration());
    }
    let mut seconds = 0.0;
    let mut rest = text;
    while !rest.is_empty() {
        let (value, after) = split_number(rest).ok_or_else(not_a_duration)?;
        let unit_length = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let scale = match &after[..unit_length] {
            "" => return Err(DurationError::NoUnit(text.into())),
            unit => worth(&DURATION_UNITS, unit).ok_or_else(|| DurationError::UnknownUnit {
                unit: unit.into(),
                text: text.into(),
            })?,
        };
        seconds += value * scale;
        rest = &after[unit_length..];
    }
    Duration::try_from_secs_f64(seconds).map_err(|_| DurationError::OutOfRange(text.into()))
}

/// Format bytes for people, in binary units with one decimal (`74.3 GiB`).
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What went wrong, in words.
    fn message<T: std::fmt::Debug>(result: Result<T, impl std::error::Error>) -> String {
        result.unwrap_err().to_string()
    }

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        assert_eq!(parse_bytes("16MiB"), Ok(16 * 1024 * 1024));
        assert_eq!(parse_bytes("1048576B"), Ok(1_048_576));
        assert_eq!(parse_bytes("1.5GiB"), Ok(1_610_612_736));
        assert_eq!(parse_bytes("9 MB"), Ok(9_000_000));
        assert_eq!(parse_bytes("0"), Ok(0));
    }

    #[test]
    fn bad_sizes_say_what_is_wrong() {
        assert!(message(parse_bytes("lots")).contains("not a size"));
        assert!(message(parse_bytes("5 parsecs")).contains("unknown size unit"));
        assert!(parse_bytes("").is_err());
        // A number alone is refused in the words a bare duration gets; 0 alone is 0.
        assert_eq!(
            message(parse_bytes("16")),
            "'16' needs a unit: B, KiB, MiB, GiB, TiB, kB, MB, GB or TB"
        );
        for bare in ["1048576", "1.5", "0.0", "00"] {
            assert!(
                message(parse_bytes(bare)).contains("needs a unit"),
                "{bare}"
            );
        }
        assert_eq!(parse_bytes(" 0 "), Ok(0));
    }

    #[test]
    fn sizes_take_every_listed_unit() {
        let units = [
            ("B", 1),
            ("KiB", 1 << 10),
            ("MiB", 1 << 20),
            ("GiB", 1 << 30),
            ("TiB", 1 << 40),
            ("kB", 1_000),
            ("MB", 1_000_000),
            ("GB", 1_000_000_000),
            ("TB", 1_000_000_000_000),
        ];
        for (unit, scale) in units {
            assert_eq!(parse_bytes(&format!("2{unit}")), Ok(2 * scale), "{unit}");
        }
        assert_eq!(parse_bytes("1.5TiB"), Ok(1_649_267_441_664));
        assert!(message(parse_bytes("99999999TB")).contains("too large"));
    }

    #[test]
    fn durations_parse_like_prometheus_and_go() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(
            parse_duration("1h0m0.5s"),
            Ok(Duration::from_millis(3_600_500))
        );
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0.5s"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("250µs"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("7ns"), Ok(Duration::from_nanos(7)));
    }

    #[test]
    fn durations_take_prometheus_days_weeks_and_years() {
        const DAY: u64 = 24 * 3600;
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(DAY)));
        assert_eq!(parse_duration("2w"), Ok(Duration::from_secs(14 * DAY)));
        assert_eq!(parse_duration("1y"), Ok(Duration::from_secs(365 * DAY)));
        assert_eq!(
            parse_duration("1y2w3d4h5m6s"),
            Ok(Duration::from_secs(
                365 * DAY + 14 * DAY + 3 * DAY + 4 * 3600 + 5 * 60 + 6
            ))
        );
        assert_eq!(parse_duration("1.5d"), Ok(Duration::from_secs(36 * 3600)));
    }

    #[test]
    fn bad_durations_say_what_is_wrong() {
        assert!(message(parse_duration("30")).contains("needs a unit"));
        assert!(message(parse_duration("1m30")).contains("needs a unit"));
        assert!(parse_duration("3 weeks").is_err());
        assert_eq!(
            message(parse_duration("30")),
            "'30' needs a unit: ns, us, ms, s, m, h, d, w or y"
        );
        assert_eq!(
            message(parse_duration("1mo")),
            "unknown duration unit 'mo' in '1mo' (use ns, us, ms, s, m, h, d, w or y)"
        );
        assert!(message(parse_duration("s")).contains("not a duration"));
        for bad in ["", "-1s", "1x", "1s-", "..s", "1e9999h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bytes_format_for_people() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(76_107 * 1024 * 1024), "74.3 GiB");
        assert_eq!(format_bytes(9_229_565_952), "8.6 GiB");
    }

    /// The units a message names, parsed out of it: `ns, us, ms, s, m, h, d, w or y`.
    fn units_named(message: &str) -> Vec<String> {
        let list = message.rsplit(": ").next().unwrap();
        list.split([',', ' '])
            .filter(|word| !word.is_empty() && *word != "or")
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn every_unit_a_message_names_parses_and_every_unit_that_parses_is_named() {
        // Durations: each named unit parses; each unit the parser takes is named, but
        // for the other spellings of one (µs for us).
        let named = units_named(&message(parse_duration("30")));
        for unit in &named {
            assert!(parse_duration(&format!("3{unit}")).is_ok(), "{unit}");
        }
        let canonical: Vec<&str> = DURATION_UNITS.iter().map(|(names, _)| names[0]).collect();
        assert_eq!(named, canonical);
        for (names, _) in DURATION_UNITS {
            for name in names {
                assert!(parse_duration(&format!("3{name}")).is_ok(), "{name}");
            }
        }
        // Sizes, likewise.
        let named = units_named(&message(parse_bytes("16")));
        for unit in &named {
            assert!(parse_bytes(&format!("3{unit}")).is_ok(), "{unit}");
        }
        let canonical: Vec<&str> = SIZE_UNITS.iter().map(|(names, _)| names[0]).collect();
        assert_eq!(named, canonical);
        assert_eq!(parse_bytes("2KB"), parse_bytes("2kB"));
    }
}
