//! Dates as S3 gives them, read into Unix time: the HTTP date of its headers (`Date`,
//! `Last-Modified`) and the ISO 8601 time of its listings (`LastModified`), through one rule
//! for a civil date and its fields.

/// Seconds since 1970 of the UTC date and time given, each field checked (a month of 1 to
/// 12, a day within its month, 23:59:60 at most); `None` otherwise.
fn unix_seconds(year: i64, month: i64, day: i64, h: i64, m: i64, s: i64) -> Option<i64> {
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    if !(1..=days_in_month).contains(&day) || h > 23 || m > 59 || s > 60 {
        return None;
    }
    // Days from 1970-01-01 to the date (Howard Hinnant's days_from_civil).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + m * 60 + s)
}

/// `s` as a number of exactly `digits` ASCII digits (no sign, no space).
fn number(s: &str, digits: usize) -> Option<i64> {
    (s.len() == digits && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// `HH:MM:SS` as its three numbers.
fn clock(time: &str) -> Option<(i64, i64, i64)> {
    let mut parts = time.split(':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    Some((number(h, 2)?, number(m, 2)?, number(s, 2)?))
}

/// Seconds since 1970 of an HTTP date in its one current form (IMF-fixdate, RFC 9110:
/// `Fri, 27 Nov 2026 10:24:31 GMT`); `None` for any other text.
pub(crate) fn http_date(text: &str) -> Option<i64> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (_, rest) = text.trim().split_once(", ")?;
    let parts: Vec<&str> = rest.split(' ').collect();
    let [day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    let month = MONTHS.iter().position(|m| m == month)? as i64 + 1;
    let (h, m, s) = clock(time)?;
    unix_seconds(number(year, 4)?, month, number(day, 2)?, h, m, s)
}

/// Unix milliseconds of an ISO 8601 UTC time as S3 lists it (`2026-11-27T08:16:22.000Z`; the
/// fraction, of any number of digits, and the `Z` may be left out); `None` for any other text.
pub(crate) fn iso_ms(text: &str) -> Option<u64> {
    let text = text.strip_suffix('Z').unwrap_or(text);
    let (date, time) = text.split_once('T')?;
    let mut d = date.split('-');
    let (y, mo, day) = (d.next()?, d.next()?, d.next()?);
    if d.next().is_some() {
        return None;
    }
    let (hms, fraction) = time.split_once('.').unwrap_or((time, ""));
    if !fraction.bytes().all(|b| b.is_ascii_digit()) || (time.contains('.') && fraction.is_empty())
    {
        return None;
    }
    // Milliseconds: the first three digits of the fraction, padded (.5 is 500 ms).
    let ms = fraction
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(3)
        .fold(0u64, |acc, b| acc * 10 + u64::from(b - b'0'));
    let (h, m, s) = clock(hms)?;
    let secs = unix_seconds(number(y, 4)?, number(mo, 2)?, number(day, 2)?, h, m, s)?;
    u64::try_from(secs).ok()?.checked_mul(1000)?.checked_add(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates_are_read_and_anything_else_is_not() {
        assert_eq!(http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(
            http_date("Fri, 27 Nov 2026 10:24:31 GMT"),
            Some(1_795_775_071)
        );
        assert_eq!(
            http_date("Tue, 29 Feb 2000 23:59:59 GMT"),
            Some(951_868_799)
        );
        for bad in [
            "",
            "yesterday",
            "Fri, 27 Nov 2026 10:24:31 UTC",
            "Fri, 27 Foo 2026 10:24:31 GMT",
            "Fri, 7 Nov 2026 10:24:31 GMT",
            "Fri, 27 Nov 2026 24:00:00 GMT",
            "Friday, 27-Nov-26 10:24:31 GMT",
            "Fri, 27 Nov 2026 10:24 GMT",
            "Fri, 27 Nov 2026 10:24:31:00 GMT",
            "Sat, 31 Feb 2026 10:24:31 GMT",
            "Thu, 29 Feb 2100 00:00:00 GMT",
        ] {
            assert_eq!(http_date(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn listing_times_read_as_unix_milliseconds() {
        assert_eq!(iso_ms("1970-01-01T00:00:00.000Z"), Some(0));
        assert_eq!(iso_ms("2000-03-01T00:00:01.250Z"), Some(951_868_801_250));
        assert_eq!(iso_ms("2026-11-27T08:16:22Z"), Some(1_795_767_382_000));
        // A fraction of other lengths is still milliseconds (.5 is 500, not 5).
        assert_eq!(iso_ms("1970-01-01T00:00:00.5Z"), Some(500));
        assert_eq!(iso_ms("1970-01-01T00:00:00.123456Z"), Some(123));
        for bad in [
            "",
            "2026-13-01T00:00:00Z",
            "yesterday",
            "2026-11-27",
            "2026-02-30T00:00:00Z",
            "+2026-11-27T00:00:00Z",
            "2026-11-27T08:16:22.Z",
            "2026-11-27T08:16:22.-5Z",
            "2026-11-27T8:16:22Z",
            "1969-12-31T23:59:59Z",
        ] {
            assert_eq!(iso_ms(bad), None, "{bad:?}");
        }
    }

    /// Both forms of one instant read alike.
    #[test]
    fn the_two_forms_agree() {
        let http = http_date("Tue, 29 Feb 2000 23:59:59 GMT").expect("date");
        let iso = iso_ms("2000-02-29T23:59:59.000Z").expect("time");
        assert_eq!(iso, http as u64 * 1000);
    }
}
