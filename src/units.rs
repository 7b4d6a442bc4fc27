//! Parsing of the human sizes and durations that flags accept (`16MiB`, `500ms`, `2m`).

use std::time::Duration;

/// Split `16MiB` into its leading number and the unit that follows.
fn split_number(text: &str) -> Option<(f64, &str)> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    Some((number.parse().ok()?, unit))
}

/// Parse a byte size: a number with an optional unit (B, KiB, MiB, GiB, TiB, kB, MB, GB, TB).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (value, unit) = split_number(text)
        .ok_or_else(|| format!("'{text}' is not a size such as 16MiB or 1048576"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        other => {
            return Err(format!(
            "unknown size unit '{other}' in '{text}' (use B, KiB, MiB, GiB, TiB, kB, MB, GB, TB)"
        ))
        }
    };
    let bytes = value * scale as f64;
    if !bytes.is_finite() || bytes > u64::MAX as f64 {
        return Err(format!("'{text}' is too large"));
    }
    Ok(bytes.round() as u64)
}

/// Parse a duration: a number with a unit (ms, s, m, h), as Prometheus writes them.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (value, unit) = split_number(text)
        .ok_or_else(|| format!("'{text}' is not a duration such as 500ms, 30s or 2m"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        "" => return Err(format!("'{text}' needs a unit: ms, s, m or h")),
        other => {
            return Err(format!(
                "unknown duration unit '{other}' in '{text}' (use ms, s, m or h)"
            ))
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("'{text}' is out of range"))
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

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        assert_eq!(parse_bytes("16MiB"), Ok(16 * 1024 * 1024));
        assert_eq!(parse_bytes("1048576"), Ok(1_048_576));
        assert_eq!(parse_bytes("1.5GiB"), Ok(1_610_612_736));
        assert_eq!(parse_bytes("9 MB"), Ok(9_000_000));
        assert_eq!(parse_bytes("0"), Ok(0));
    }

    #[test]
    fn bad_sizes_say_what_is_wrong() {
        assert!(parse_bytes("lots").unwrap_err().contains("not a size"));
        assert!(parse_bytes("5 parsecs")
            .unwrap_err()
            .contains("unknown size unit"));
        assert!(parse_bytes("").is_err());
    }

    #[test]
    fn durations_parse_like_prometheus() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
    }

    #[test]
    fn bad_durations_say_what_is_wrong() {
        assert!(parse_duration("30").unwrap_err().contains("needs a unit"));
        assert!(parse_duration("3 weeks").is_err());
        assert!(parse_duration("s").unwrap_err().contains("not a duration"));
    }

    #[test]
    fn bytes_format_for_people() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(76_107 * 1024 * 1024), "74.3 GiB");
        assert_eq!(format_bytes(9_229_565_952), "8.6 GiB");
    }
}
