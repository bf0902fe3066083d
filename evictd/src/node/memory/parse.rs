//! The text of memory.stat and /proc/meminfo, apart from reading the files.
//!
//! Self-contained (std alone, no `crate::` or `super::`): the fuzz targets compile this file
//! on its own, so fuzzing the parsers does not build the daemon and its dependencies.

/// What is wrong with a file's text.
#[derive(Debug, PartialEq, Eq)]
pub enum FieldError {
    Missing,
    NotANumber(String),
    /// A number above `i64::MAX`.
    TooLarge(String),
}

/// A count of bytes or pages. One above `i64::MAX` (8 EiB) is no machine's: garbage, an
/// error of its own, so that no signal is computed from it (the signals are signed).
pub fn number(s: &str) -> Result<u64, FieldError> {
    let n = s.parse::<u64>().map_err(|_| FieldError::NotANumber(s.to_owned()))?;
    i64::try_from(n).map(|_| n).map_err(|_| FieldError::TooLarge(s.to_owned()))
}

/// The value of the `key value` line of memory.stat.
pub fn stat_value(text: &str, key: &str) -> Result<u64, FieldError> {
    let value = text
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|rest| rest.strip_prefix(' ')))
        .ok_or(FieldError::Missing)?;
    number(value.trim())
}

/// The `Key:   N kB` line of /proc/meminfo, in bytes; a value whose bytes pass `i64::MAX` is
/// too large, as in `number`.
pub fn meminfo_bytes(text: &str, key: &str) -> Result<u64, FieldError> {
    let value = text
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|rest| rest.strip_prefix(':')))
        .ok_or(FieldError::Missing)?;
    let kb = value.trim().trim_end_matches("kB").trim();
    number(kb)?
        .checked_mul(1024)
        .filter(|&n| i64::try_from(n).is_ok())
        .ok_or_else(|| FieldError::TooLarge(format!("{kb} kB")))
}
