//! transformers' `strftime_now(format)` template function: Python's
//! `datetime.now().strftime(format)`, the local date and time in the C locale (English
//! names), as Llama 3.x's and SmolLM3's templates print "Today Date: …".
//!
//! Only the directives templates use are known; any other is a template error naming it,
//! never a guess at what Python would print.

use jiff::civil::DateTime;
use minijinja::{Error, ErrorKind};

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

/// Monday first, as `Weekday::to_monday_zero_offset` counts.
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// The directives [`strftime`] formats, for its error message.
const SUPPORTED: &str = "%d %e %m %Y %y %B %b %A %a %H %I %M %S %p %j %%";

/// The local date and time, as `datetime.now()` gives it: the zone from `TZ` or
/// `/etc/localtime`, UTC when neither names one.
pub(crate) fn local_now() -> Result<DateTime, Error> {
    jiff::ZonedDateTime::try_from(std::time::SystemTime::now())
        .map(|now| now.datetime())
        .map_err(|e| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("strftime_now: the system clock is out of range: {e}"),
            )
        })
}

/// `at.strftime(format)` as Python prints it on Linux (glibc, C locale).
pub(crate) fn strftime(at: DateTime, format: &str) -> Result<String, Error> {
    // A civil DateTime's month is 1..=12 and its weekday offset 0..=6.
    let month_name = MONTHS[usize::from(at.month().unsigned_abs()) - 1];
    let weekday_name = WEEKDAYS[usize::from(at.weekday().to_monday_zero_offset().unsigned_abs())];
    let hour_12 = match at.hour() % 12 {
        0 => 12,
        h => h,
    };
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(directive) = chars.next() else {
            return Err(unsupported("a lone '%' at the end", format));
        };
        match directive {
            'd' => out.push_str(&format!("{:02}", at.day())),
            'e' => out.push_str(&format!("{:>2}", at.day())),
            'm' => out.push_str(&format!("{:02}", at.month())),
            'Y' => out.push_str(&at.year().to_string()),
            'y' => out.push_str(&format!("{:02}", at.year().rem_euclid(100))),
            'B' => out.push_str(month_name),
            'b' => out.push_str(&month_name[..3]),
            'A' => out.push_str(weekday_name),
            'a' => out.push_str(&weekday_name[..3]),
            'H' => out.push_str(&format!("{:02}", at.hour())),
            'I' => out.push_str(&format!("{hour_12:02}")),
            'M' => out.push_str(&format!("{:02}", at.minute())),
            'S' => out.push_str(&format!("{:02}", at.second())),
            'p' => out.push_str(if at.hour() < 12 { "AM" } else { "PM" }),
            'j' => out.push_str(&format!("{:03}", at.day_of_year())),
            '%' => out.push('%'),
            other => return Err(unsupported(&format!("'%{other}'"), format)),
        }
    }
    Ok(out)
}

fn unsupported(what: &str, format: &str) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("strftime_now({format:?}): unsupported directive {what} (supported: {SUPPORTED})"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::civil::date;

    /// Every supported directive, `|`-separated.
    const ALL: &str = "%d|%m|%Y|%y|%B|%b|%A|%a|%H|%M|%S|%j|%p|%I|%e|%%";

    #[test]
    fn every_directive_prints_what_python_prints() {
        // Expected strings from Python 3.11 on Linux (glibc, C locale):
        //   from datetime import datetime
        //   datetime(2024, 2, 29, 13, 5, 9).strftime(ALL)   # and so on for each row
        // The dates cover a leap day, 12 AM and 12 PM, one-digit days (%e pads with a
        // space), the last day of a year (%j = 365) and a two-digit year with a leading 0.
        let cases = [
            (
                date(2024, 2, 29).at(13, 5, 9, 0),
                "29|02|2024|24|February|Feb|Thursday|Thu|13|05|09|060|PM|01|29|%",
            ),
            (
                date(2025, 7, 4).at(0, 7, 0, 0),
                "04|07|2025|25|July|Jul|Friday|Fri|00|07|00|185|AM|12| 4|%",
            ),
            (
                date(2023, 12, 31).at(12, 0, 59, 0),
                "31|12|2023|23|December|Dec|Sunday|Sun|12|00|59|365|PM|12|31|%",
            ),
            (
                date(2005, 1, 9).at(9, 30, 1, 0),
                "09|01|2005|05|January|Jan|Sunday|Sun|09|30|01|009|AM|09| 9|%",
            ),
        ];
        for (at, python) in cases {
            assert_eq!(strftime(at, ALL).unwrap(), python, "{at}");
        }
        // Text around the directives, non-ASCII included, passes through.
        assert_eq!(
            strftime(date(2024, 7, 23).at(0, 0, 0, 0), "Aujourd’hui: %d %b %Y.").unwrap(),
            "Aujourd’hui: 23 Jul 2024."
        );
    }

    #[test]
    fn an_unsupported_directive_is_an_error_naming_it() {
        let at = date(2024, 7, 23).at(0, 0, 0, 0);
        let err = strftime(at, "%d %Q").unwrap_err().to_string();
        assert!(err.contains("'%Q'") && err.contains("\"%d %Q\""), "{err}");
        let err = strftime(at, "%Y %").unwrap_err().to_string();
        assert!(err.contains("lone '%'"), "{err}");
    }

    #[test]
    fn the_local_clock_reads() {
        let now = local_now().unwrap();
        assert!(now.year() >= 2024, "{now}");
    }
}
