//! Durations as Go's `time.ParseDuration` reads them ("5m0s", "1.5h", "300ms", "-2s"): the
//! kubelet's flags and KubeletConfiguration use this syntax, so evictd accepts exactly it.

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid duration {0:?} (examples: 30s, 5m0s, 1.5h, 300ms)")]
pub struct DurationError(pub String);

/// Nanoseconds, signed (Go durations may be negative; callers decide whether that is valid).
pub fn parse(s: &str) -> Result<i64, DurationError> {
    let err = || DurationError(s.to_owned());
    let (neg, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(err());
    }
    let mut total: i128 = 0;
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(err)?;
        let (num, tail) = rest.split_at(num_end);
        let unit_end = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let scale: i128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(err()),
        };
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
            return Err(err());
        }
        let int: i128 = if int.is_empty() { 0 } else { int.parse().map_err(|_| err())? };
        let mut part = int.checked_mul(scale).ok_or_else(err)?;
        // Fractions truncate towards zero, as Go does.
        let mut div: i128 = 1;
        for d in frac.bytes().take(18) {
            div *= 10;
            part += i128::from(d - b'0') * scale / div;
        }
        total = total.checked_add(part).ok_or_else(err)?;
        rest = tail;
    }
    let total = if neg { -total } else { total };
    i64::try_from(total).map_err(|_| err())
}

/// Go's `Duration.String()` form: "5m0s", "1h30m0s", "300ms", "0s".
pub fn format(ns: i64) -> String {
    if ns == 0 {
        return "0s".into();
    }
    let sign = if ns < 0 { "-" } else { "" };
    let u = ns.unsigned_abs();
    if u < 1_000_000_000 {
        let (v, unit) = if u < 1_000 {
            return format!("{sign}{u}ns");
        } else if u < 1_000_000 {
            (u as f64 / 1e3, "µs")
        } else {
            (u as f64 / 1e6, "ms")
        };
        return format!("{sign}{v}{unit}");
    }
    let h = u / 3_600_000_000_000;
    let m = (u / 60_000_000_000) % 60;
    let s_ns = u % 60_000_000_000;
    let secs = if s_ns.is_multiple_of(1_000_000_000) {
        format!("{}", s_ns / 1_000_000_000)
    } else {
        let f = format!("{:.9}", s_ns as f64 / 1e9);
        f.trim_end_matches('0').to_owned()
    };
    match (h, m) {
        (0, 0) => format!("{sign}{secs}s"),
        (0, m) => format!("{sign}{m}m{secs}s"),
        (h, m) => format!("{sign}{h}h{m}m{secs}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_syntax() {
        let s = 1_000_000_000i64;
        for (text, want) in [
            ("0", 0),
            ("30s", 30 * s),
            ("5m0s", 300 * s),
            ("1h30m", 5400 * s),
            ("1.5h", 5400 * s),
            ("300ms", 300_000_000),
            ("-2s", -2 * s),
            ("+2s", 2 * s),
            ("1us", 1_000),
            ("1µs", 1_000),
            ("2ns", 2),
            (".5s", s / 2),
            ("1.s", s),
        ] {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
        for bad in ["", "5", "s", "1x", "1.2.3s", "-", "1h-5m", " 1s", "1 s", "99999999999h"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn formats_like_go() {
        let s = 1_000_000_000i64;
        assert_eq!(format(0), "0s");
        assert_eq!(format(300 * s), "5m0s");
        assert_eq!(format(5400 * s), "1h30m0s");
        assert_eq!(format(90 * s), "1m30s");
        assert_eq!(format(1_500_000_000), "1.5s");
        assert_eq!(format(300_000_000), "300ms");
        assert_eq!(format(-2 * s), "-2s");
    }
}
