//! Wall-clock time as RFC 3339 UTC text, without a date library: the civil
//! (proleptic Gregorian) date of a day count, by Howard Hinnant's
//! `civil_from_days` ("chrono-Compatible Low-Level Date Algorithms"), for
//! the store's rows (`state/store.rs`, seconds) and the Ollama API's dates
//! (milliseconds).

use std::time::{SystemTime, UNIX_EPOCH};

/// The civil date `(year, month 1..=12, day 1..=31)` of `days` since
/// 1970-01-01 (negative before it).
pub(crate) fn civil_from_days(days: i64) -> (i64, u32, u32) {
    // Shift the epoch to 0000-03-01, so a leap day ends its year, and count
    // in 400-year eras of 146 097 days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097; // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March first
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// `t` as `2024-05-01T12:00:00Z` (whole seconds, truncated).
pub(crate) fn rfc3339(t: SystemTime) -> String {
    format(millis_since_epoch(t), false)
}

/// `t` as `2024-05-01T12:00:00.250Z` (milliseconds, truncated), the form
/// of the Ollama API's dates (`modified_at`, `created_at`, `expires_at`).
pub(crate) fn rfc3339_millis(t: SystemTime) -> String {
    format(millis_since_epoch(t), true)
}

/// Milliseconds since the epoch, negative before it, floored.
fn millis_since_epoch(t: SystemTime) -> i128 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i128,
        Err(before) => {
            let d = before.duration();
            // Floor: 0.0005 s before the epoch is in its last millisecond.
            let up = u128::from(d.subsec_nanos() % 1_000_000 != 0);
            -((d.as_millis() + up) as i128)
        }
    }
}

fn format(ms: i128, millis: bool) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // A SystemTime's day count fits an i64 by far (i64 seconds / 86 400).
    let (y, m, d) = civil_from_days(days as i64);
    let (hh, mm, ss) = (rem / 3600, rem / 60 % 60, rem % 60);
    if millis {
        format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}.{:03}Z", ms.rem_euclid(1000))
    } else {
        format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const DAY: i64 = 86_400;

    /// `secs` seconds from the epoch (before it when negative), plus `ms`.
    fn at(secs: i64, ms: u64) -> SystemTime {
        let whole = Duration::from_secs(secs.unsigned_abs());
        let t = if secs < 0 { UNIX_EPOCH - whole } else { UNIX_EPOCH + whole };
        t + Duration::from_millis(ms)
    }

    #[test]
    fn known_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_millis(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        // 2024-02-29, a leap day (19 782 days after the epoch).
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(rfc3339(at(19_782 * DAY + 3661, 0)), "2024-02-29T01:01:01Z");
        assert_eq!(civil_from_days(19_783), (2024, 3, 1));
        // 2100 is no leap year: February ends on the 28th.
        assert_eq!(civil_from_days(47_540), (2100, 2, 28));
        assert_eq!(civil_from_days(47_541), (2100, 3, 1));
        // 2000 is one (divisible by 400).
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(rfc3339_millis(at(1_714_564_800, 250)), "2024-05-01T12:00:00.250Z");
        assert_eq!(rfc3339(at(1_714_564_800, 999)), "2024-05-01T12:00:00Z");
    }

    #[test]
    fn before_the_epoch() {
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(rfc3339(at(-1, 0)), "1969-12-31T23:59:59Z");
        assert_eq!(rfc3339_millis(at(-1, 750)), "1969-12-31T23:59:59.750Z");
        assert_eq!(
            rfc3339_millis(UNIX_EPOCH - Duration::from_micros(500)),
            "1969-12-31T23:59:59.999Z"
        );
        assert_eq!(civil_from_days(-719_468), (0, 3, 1));
        assert_eq!(civil_from_days(-719_469), (0, 2, 29));
    }

    /// Day after day across ±2000 years, each date follows the one before.
    #[test]
    fn every_day_follows_the_last() {
        let leap = |y: i64| y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
        let length = |y: i64, m: u32| match m {
            2 if leap(y) => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        let mut last = civil_from_days(-730_000);
        for days in -729_999..730_000 {
            let (y, m, d) = last;
            let next = if d < length(y, m) {
                (y, m, d + 1)
            } else if m < 12 {
                (y, m + 1, 1)
            } else {
                (y + 1, 1, 1)
            };
            let got = civil_from_days(days);
            assert_eq!(got, next, "day {days}");
            last = got;
        }
    }
}
