//! The calendar of `strftime_now`: civil dates and times (proleptic Gregorian, leap years),
//! the local time through the C library's time zone rules, and formatting as C's `strftime`
//! does in the C locale with glibc's flags (what Python's `datetime.strftime`, which the chat
//! templates' `strftime_now` calls, asks glibc for).

/// A civil date and time, as `strftime_now` formats it (local time, no time zone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DateTime {
    year: i32,
    month: u8,
    day: u8,
    hour: u8,
    minute: u8,
    second: u8,
}

impl DateTime {
    /// The date and time, or `None` if it does not exist (month 1-12, a day of that month,
    /// hour < 24, minute < 60, second < 61).
    pub fn new(
        year: i32,
        month: u8,
        day: u8,
        hour: u8,
        minute: u8,
        second: u8,
    ) -> Option<DateTime> {
        let ok = (1..=12).contains(&month)
            && day >= 1
            && day <= days_in_month(year, month)
            && hour < 24
            && minute < 60
            && second < 61;
        ok.then_some(DateTime {
            year,
            month,
            day,
            hour,
            minute,
            second,
        })
    }

    /// The current local time (UTC where the system cannot say).
    pub fn now_local() -> DateTime {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        local_time(secs).unwrap_or_else(|| DateTime::from_unix_utc(secs))
    }

    /// The UTC date and time of `secs` seconds after 1970-01-01T00:00:00Z.
    pub fn from_unix_utc(secs: i64) -> DateTime {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        DateTime {
            year,
            month,
            day,
            hour: (rem / 3600) as u8,
            minute: (rem / 60 % 60) as u8,
            second: (rem % 60) as u8,
        }
    }

    /// Formats as C's `strftime` does in the C locale (what Python's `datetime.strftime` asks
    /// glibc for), including glibc's `-` (no padding), `_` (spaces), `0` and `^` (upper case)
    /// flags. `%z` and `%Z` are empty (a naive time, as Python's `datetime.now()`); an unknown
    /// conversion is copied as it is.
    pub fn strftime(&self, fmt: &str) -> String {
        let mut out = String::with_capacity(fmt.len() + 16);
        let mut chars = fmt.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let mut flag = None;
            if let Some(&f @ ('-' | '_' | '0' | '^' | '#')) = chars.peek() {
                flag = Some(f);
                chars.next();
            }
            let Some(conv) = chars.next() else {
                out.push('%');
                if let Some(f) = flag {
                    out.push(f);
                }
                break;
            };
            let piece = self.conversion(conv, flag);
            match piece {
                Some(p) => out.push_str(&p),
                None => {
                    out.push('%');
                    if let Some(f) = flag {
                        out.push(f);
                    }
                    out.push(conv);
                }
            }
        }
        out
    }

    fn weekday(&self) -> u32 {
        // 1970-01-01 was a Thursday (day 4 counting from Sunday).
        (days_from_civil(self.year, self.month, self.day) + 4).rem_euclid(7) as u32
    }

    fn yday(&self) -> u32 {
        (days_from_civil(self.year, self.month, self.day) - days_from_civil(self.year, 1, 1) + 1)
            as u32
    }

    /// One conversion: `None` for an unknown one.
    fn conversion(&self, conv: char, flag: Option<char>) -> Option<String> {
        const DAYS: [&str; 7] = [
            "Sunday",
            "Monday",
            "Tuesday",
            "Wednesday",
            "Thursday",
            "Friday",
            "Saturday",
        ];
        const MONTHS: [&str; 12] = [
            "January",
            "February",
            "March",
            "April",
            "May",
            "June",
            "July",
            "August",
            "September",
            "October",
            "November",
            "December",
        ];
        let wday = self.weekday();
        let hour12 = match self.hour % 12 {
            0 => 12,
            h => h,
        };
        // A number with its default padding, which the flag may change.
        let num = |v: i64, width: usize, pad: char| -> String {
            let pad = match flag {
                Some('-') => return v.to_string(),
                Some('_') => ' ',
                Some('0') => '0',
                _ => pad,
            };
            let digits = v.unsigned_abs().to_string();
            let mut s = String::new();
            if v < 0 {
                s.push('-');
            }
            for _ in digits.len() + s.len()..width {
                s.push(pad);
            }
            s.push_str(&digits);
            s
        };
        let text = |s: &str| -> String {
            if flag == Some('^') {
                s.to_uppercase()
            } else {
                s.to_string()
            }
        };
        let month_name = MONTHS[usize::from(self.month - 1)];
        let s = match conv {
            'a' => text(&DAYS[wday as usize][..3]),
            'A' => text(DAYS[wday as usize]),
            'b' | 'h' => text(&month_name[..3]),
            'B' => text(month_name),
            'c' => text(&self.strftime("%a %b %e %H:%M:%S %Y")),
            'C' => num(i64::from(self.year).div_euclid(100), 2, '0'),
            'd' => num(i64::from(self.day), 2, '0'),
            'D' | 'x' => self.strftime("%m/%d/%y"),
            'e' => num(i64::from(self.day), 2, ' '),
            'F' => self.strftime("%Y-%m-%d"),
            'H' => num(i64::from(self.hour), 2, '0'),
            'I' => num(i64::from(hour12), 2, '0'),
            'j' => num(i64::from(self.yday()), 3, '0'),
            'k' => num(i64::from(self.hour), 2, ' '),
            'l' => num(i64::from(hour12), 2, ' '),
            'm' => num(i64::from(self.month), 2, '0'),
            'M' => num(i64::from(self.minute), 2, '0'),
            'n' => "\n".into(),
            'p' => (if self.hour < 12 { "AM" } else { "PM" }).into(),
            'P' => (if self.hour < 12 { "am" } else { "pm" }).into(),
            'r' => self.strftime("%I:%M:%S %p"),
            'R' => self.strftime("%H:%M"),
            'S' => num(i64::from(self.second), 2, '0'),
            't' => "\t".into(),
            'T' | 'X' => self.strftime("%H:%M:%S"),
            'u' => num(i64::from(if wday == 0 { 7 } else { wday }), 1, '0'),
            'U' => num(i64::from((self.yday() + 6 - wday) / 7), 2, '0'),
            'w' => num(i64::from(wday), 1, '0'),
            'W' => num(i64::from((self.yday() + 6 - (wday + 6) % 7) / 7), 2, '0'),
            'y' => num(i64::from(self.year).rem_euclid(100), 2, '0'),
            'Y' => num(i64::from(self.year), 1, '0'),
            'z' | 'Z' => String::new(),
            '%' => "%".into(),
            _ => return None,
        };
        Some(s)
    }
}

fn is_leap(year: i32) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i32, month: u8) -> u8 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a civil date (proleptic Gregorian).
fn days_from_civil(y: i32, m: u8, d: u8) -> i64 {
    let y = i64::from(y) - i64::from(m <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day number of [`days_from_civil`].
fn civil_from_days(z: i64) -> (i32, u8, u8) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32,
        m,
        d,
    )
}

/// The local time of `secs` through the C library's time zone rules.
#[cfg(unix)]
fn local_time(secs: i64) -> Option<DateTime> {
    let t = libc::time_t::try_from(secs).ok()?;
    // SAFETY: `tm` is plain old data, for which all zeroes is a valid value.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call; localtime_r is the reentrant variant,
    // writing only to `tm`, and returns null on failure.
    let r = unsafe { libc::localtime_r(&t, &mut tm) };
    if r.is_null() {
        return None;
    }
    DateTime::new(
        tm.tm_year.checked_add(1900)?,
        u8::try_from(tm.tm_mon + 1).ok()?,
        u8::try_from(tm.tm_mday).ok()?,
        u8::try_from(tm.tm_hour).ok()?,
        u8::try_from(tm.tm_min).ok()?,
        u8::try_from(tm.tm_sec).ok()?,
    )
}

#[cfg(not(unix))]
fn local_time(_secs: i64) -> Option<DateTime> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_round_trip() {
        for d in (-800_000..800_000).step_by(97) {
            let (y, m, day) = civil_from_days(d);
            assert!(DateTime::new(y, m, day, 0, 0, 0).is_some(), "{d}");
            assert_eq!(days_from_civil(y, m, day), d);
        }
        let epoch = DateTime::from_unix_utc(0);
        assert_eq!(epoch, DateTime::new(1970, 1, 1, 0, 0, 0).unwrap());
        assert_eq!(epoch.weekday(), 4, "a Thursday");
        let t = DateTime::from_unix_utc(951_825_599); // 2000-02-29T11:59:59Z
        assert_eq!(t, DateTime::new(2000, 2, 29, 11, 59, 59).unwrap());
        assert_eq!(t.yday(), 60);
        assert!(DateTime::new(1900, 2, 29, 0, 0, 0).is_none());
        assert!(DateTime::new(2024, 13, 1, 0, 0, 0).is_none());
        assert!(DateTime::new(2024, 4, 31, 0, 0, 0).is_none());
        assert!(DateTime::new(2024, 1, 1, 24, 0, 0).is_none());
        let now = DateTime::now_local();
        assert!(now.year >= 2024, "{now:?}");
    }

    #[test]
    fn strftime_follows_glibc() {
        let t = DateTime::new(2024, 7, 5, 9, 3, 7).unwrap();
        assert_eq!(
            t.strftime("%-d|%e|%_m|%-H|%^a|%k|%l%P"),
            "5| 5| 7|9|FRI| 9| 9am"
        );
        assert_eq!(
            t.strftime("%F %T %D %R %u %w %C %y"),
            "2024-07-05 09:03:07 07/05/24 09:03 5 5 20 24"
        );
        // ISO weeks and the time zone are not known here: copied, or empty as for Python's
        // naive datetime.
        assert_eq!(t.strftime("%V%z%Z|%Q|%"), "%V|%Q|%");
        // Weeks of the year, Sunday- and Monday-based.
        let jan1 = DateTime::new(2023, 1, 1, 0, 0, 0).unwrap(); // a Sunday
        assert_eq!(jan1.strftime("%U %W %j"), "01 00 001");
    }
}
