//! The one calendar of the program: moments as people and log readers write them, in UTC,
//! without a date crate.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Now, as the time since the Unix epoch; `None` on a clock set before it. The one
/// reading of the wall clock for a date: the `now_unix_*` below are this in their unit.
pub fn since_epoch_now() -> Option<Duration> {
    SystemTime::now().duration_since(UNIX_EPOCH).ok()
}

/// Now, in milliseconds since the Unix epoch (0 on a clock set before it).
pub fn now_unix_millis() -> u64 {
    since_epoch_now().map_or(0, |since| since.as_millis() as u64)
}

/// Now, in whole seconds since the Unix epoch (0 on a clock set before it).
pub fn now_unix_seconds() -> u64 {
    since_epoch_now().map_or(0, |since| since.as_secs())
}

/// Now, in seconds since the Unix epoch with their fraction (0 on a clock set before it).
pub fn now_unix_seconds_f64() -> f64 {
    since_epoch_now().map_or(0.0, |since| since.as_secs_f64())
}

/// A moment in seconds since the Unix epoch as `2026-12-03 09:31:02 UTC`.
pub fn utc_words(seconds: u64) -> String {
    let (year, month, day, hour, minute, second) = civil(seconds);
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}:{second:02} UTC")
}

/// A moment as RFC 3339 in UTC with milliseconds, `2026-12-03T09:31:02.123Z`, as
/// Prometheus components log it.
pub fn rfc3339_millis(time: SystemTime) -> String {
    let since_epoch = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (year, month, day, hour, minute, second) = civil(since_epoch.as_secs());
    let millis = since_epoch.subsec_millis();
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{millis:03}Z")
}

/// Seconds since the epoch as year, month, day, hour, minute and second.
fn civil(seconds: u64) -> (u64, u64, u64, u64, u64, u64) {
    let (year, month, day) = civil_from_days(seconds / 86_400);
    let rest = seconds % 86_400;
    (year, month, day, rest / 3600, rest % 3600 / 60, rest % 60)
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm,
/// for dates after 1970).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn dates_are_civil() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_789), (2026, 12, 2));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn dates_in_utc() {
        assert_eq!(utc_words(0), "1970-01-01 00:00:00 UTC");
        // 2026-12-03 09:31:02 UTC, worked out by `date -u -d @1796290262`.
        assert_eq!(utc_words(1_796_290_262), "2026-12-03 09:31:02 UTC");
        // A leap day.
        assert_eq!(utc_words(951_782_400), "2000-02-29 00:00:00 UTC");
    }

    #[test]
    fn log_timestamps_carry_milliseconds() {
        let time = UNIX_EPOCH + Duration::from_millis(1_796_290_262_123);
        assert_eq!(rfc3339_millis(time), "2026-12-03T09:31:02.123Z");
    }
}
