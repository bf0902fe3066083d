//! Kubernetes resource quantities (`100Mi`, `1.5G`, `250m`, `1e3`), parsed exactly as
//! apimachinery does: exact decimals, rounded up to 1e-9, and printed canonically.

use std::fmt;

/// How a quantity prints: apimachinery keeps the family of the suffix it was parsed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `Ki`, `Mi`, ... (powers of 1024).
    BinarySi,
    /// `m`, `k`, `M`, ... and no suffix (powers of 1000).
    DecimalSi,
    /// `e3`, `E-2`.
    DecimalExponent,
}

/// An exact quantity in units of 1e-9, which is the finest scale apimachinery keeps.
/// Equality and order are by value, as apimachinery's `Cmp`: `1Ki == 1024`.
#[derive(Clone, Copy, Debug)]
pub struct Quantity {
    nanos: i128,
    format: Format,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantityError {
    #[error("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")]
    Syntax,
    #[error("quantity is too large")]
    TooLarge,
}

const NANO: i128 = 1_000_000_000;
/// Keeps every intermediate product within i128 (about 1.7e38).
const LIMIT: i128 = 10i128.pow(36);

impl Quantity {
    /// A whole number of units (bytes, inodes, PIDs) that prints with binary suffixes,
    /// as the kubelet creates observed and threshold quantities.
    pub fn from_units(units: i64) -> Self {
        Quantity { nanos: units as i128 * NANO, format: Format::BinarySi }
    }

    /// A whole number of units that prints with decimal suffixes.
    pub fn from_units_decimal(units: i64) -> Self {
        Quantity { nanos: units as i128 * NANO, format: Format::DecimalSi }
    }

    /// An exact value in units of 1e-9, printed in `format` (for a sum of quantities, the
    /// first operand's, as apimachinery's `Add` keeps it).
    pub fn from_nanos(nanos: i128, format: Format) -> Self {
        Quantity { nanos, format }
    }

    /// The exact value in units of 1e-9.
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    pub fn is_negative(&self) -> bool {
        self.nanos < 0
    }

    /// The integer value, fractions rounded up (towards +inf), saturating at i64 bounds:
    /// `100m` is 1, `1.2Gi` is 1288490189.
    pub fn value(&self) -> i64 {
        let q = self.nanos.div_euclid(NANO);
        let r = self.nanos.rem_euclid(NANO);
        let v = if r > 0 { q + 1 } else { q };
        v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
    }

    /// The value in thousandths, rounded up, as `MilliValue()`.
    pub fn milli_value(&self) -> i64 {
        let div = NANO / 1000;
        let q = self.nanos.div_euclid(div);
        let r = self.nanos.rem_euclid(div);
        let v = if r > 0 { q + 1 } else { q };
        v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
    }

    pub fn parse(s: &str) -> Result<Self, QuantityError> {
        s.parse()
    }

    /// As `parse`, but a value too large for an i64 of units is that i64's bound rather than
    /// an error, as apimachinery caps a binary quantity at 2^63-1. The API server accepts
    /// `sizeLimit: 1e27` (a decimal it does not cap): read from a pod spec, it is a limit
    /// nothing reaches, never a reason to drop the pod's whole spec.
    /// Capped values also keep a pod's sums (every container's limit, say) far inside i128.
    pub fn parse_capped(s: &str) -> Result<Self, QuantityError> {
        let bound = i128::from(i64::MAX) * NANO;
        match s.parse::<Quantity>() {
            Ok(q) => Ok(Quantity { nanos: q.nanos.clamp(-bound, bound), ..q }),
            Err(QuantityError::TooLarge) => {
                let nanos = if s.starts_with('-') { -bound } else { bound };
                Ok(Quantity { nanos, format: Format::DecimalSi })
            }
            Err(e) => Err(e),
        }
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

/// The multiplier a suffix stands for, as (base, exponent) with base 2 or 10.
fn suffix(s: &str) -> Result<(Format, u32, i32), QuantityError> {
    let r = match s {
        "" => (Format::DecimalSi, 10, 0),
        "n" => (Format::DecimalSi, 10, -9),
        "u" => (Format::DecimalSi, 10, -6),
        "m" => (Format::DecimalSi, 10, -3),
        "k" => (Format::DecimalSi, 10, 3),
        "M" => (Format::DecimalSi, 10, 6),
        "G" => (Format::DecimalSi, 10, 9),
        "T" => (Format::DecimalSi, 10, 12),
        "P" => (Format::DecimalSi, 10, 15),
        "E" => (Format::DecimalSi, 10, 18),
        "Ki" => (Format::BinarySi, 2, 10),
        "Mi" => (Format::BinarySi, 2, 20),
        "Gi" => (Format::BinarySi, 2, 30),
        "Ti" => (Format::BinarySi, 2, 40),
        "Pi" => (Format::BinarySi, 2, 50),
        "Ei" => (Format::BinarySi, 2, 60),
        _ => {
            let rest = s.strip_prefix(['e', 'E']).ok_or(QuantityError::Syntax)?;
            let digits = rest.strip_prefix(['+', '-']).unwrap_or(rest);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(QuantityError::Syntax);
            }
            // An exponent past i32 is a value too large, or one that rounds up to 1e-9:
            // `TooLarge` only ever means the magnitude (`parse_capped`).
            let exp: i32 = match rest.parse() {
                Ok(e) => e,
                Err(_) if rest.starts_with('-') => i32::MIN,
                Err(_) => return Err(QuantityError::TooLarge),
            };
            (Format::DecimalExponent, 10, exp)
        }
    };
    Ok(r)
}

fn checked_mul(a: i128, b: i128) -> Result<i128, QuantityError> {
    a.checked_mul(b).filter(|v| v.abs() < LIMIT).ok_or(QuantityError::TooLarge)
}

/// `n / d`, rounded towards +inf.
fn div_ceil(n: i128, d: i128) -> i128 {
    let q = n.div_euclid(d);
    if n.rem_euclid(d) > 0 { q + 1 } else { q }
}

/// The most significant digits a mantissa keeps: beyond them a value is either too large for
/// any use or differs by less than its rounding up to 1e-9.
const MAX_DIGITS: usize = 36;

/// `digits` as a mantissa of at most `max` digits, rounded up (in magnitude), and how many
/// digits were dropped from its end. A long fraction (`0.000…0001`) is thus a tiny value
/// rounded up, never an error a caller could read as "too large".
fn mantissa(digits: &str, max: usize) -> (i128, usize) {
    let kept = digits.len().min(max);
    let (head, tail) = digits.split_at(kept);
    let mut m = head.bytes().fold(0i128, |m, b| m * 10 + i128::from(b - b'0'));
    if tail.bytes().any(|b| b != b'0') {
        m += 1;
    }
    (m, tail.len())
}

/// `int.frac × 10^exp` in units of 1e-9, rounded up; `None` when too large.
fn decimal_nanos(int_part: &str, frac_part: &str, exp: i32) -> Option<i128> {
    let digits = format!("{int_part}{frac_part}");
    let significant = digits.trim_start_matches('0');
    let trailing_zeros = significant.len() - significant.trim_end_matches('0').len();
    let significant = &significant[..significant.len() - trailing_zeros];
    if significant.is_empty() {
        return Some(0);
    }
    let (m, dropped) = mantissa(significant, MAX_DIGITS);
    // i64: an exponent near i32::MAX must not overflow (`1e2147483647`).
    let pow10 = i64::from(exp) + 9 - frac_part.len() as i64 + (trailing_zeros + dropped) as i64;
    if pow10 >= 0 {
        if pow10 > MAX_DIGITS as i64 {
            return None;
        }
        m.checked_mul(10i128.pow(pow10 as u32)).filter(|v| *v < LIMIT)
    } else if -pow10 > MAX_DIGITS as i64 {
        Some(1)
    } else {
        Some(div_ceil(m, 10i128.pow((-pow10) as u32)))
    }
}

/// `int.frac × 2^exp` (a binary suffix, `exp` ≤ 60) in units of 1e-9, rounded up. The whole
/// part and the fraction are scaled apart, so that a long fraction of an ordinary value
/// (`1.000000000000000001Gi`) is never "too large"; the fraction keeps the digits whose
/// product with 2^exp stays inside i128 (20 at `Ei`, 29 at `Gi`), the rest rounded up into
/// its last: up by less than 0.02 of a unit at `Ei`, and exact to the nano up to `Ti`.
fn binary_nanos(int_part: &str, frac_part: &str, exp: i32) -> Result<i128, QuantityError> {
    let int_part = int_part.trim_start_matches('0');
    let frac_part = frac_part.trim_end_matches('0');
    if int_part.len() > MAX_DIGITS {
        return Err(QuantityError::TooLarge);
    }
    let power = 1i128 << exp;
    let whole = checked_mul(checked_mul(mantissa(int_part, MAX_DIGITS).0, power)?, NANO)?;
    let fits = |digits: u32| 10i128.checked_pow(digits).and_then(|p| p.checked_mul(power)).is_some();
    let keep = (0..=MAX_DIGITS as u32).take_while(|&d| fits(d)).last().unwrap_or(0);
    let (fraction, dropped) = mantissa(frac_part, keep as usize);
    // fraction × 2^exp × 1e9 / 10^scale, with the 1e9 taken out of the division first.
    let scale = (frac_part.len() - dropped) as u32;
    let part = match scale.checked_sub(9) {
        Some(k) => div_ceil(fraction * power, 10i128.pow(k)),
        None => fraction * power * 10i128.pow(9 - scale),
    };
    whole.checked_add(part).filter(|v| *v < LIMIT).ok_or(QuantityError::TooLarge)
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (negative, body) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let num_end = body.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(body.len());
        let (number, sfx) = body.split_at(num_end);
        let (int_part, frac_part) = match number.split_once('.') {
            Some((i, f)) => (i, f),
            None => (number, ""),
        };
        if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
            return Err(QuantityError::Syntax);
        }
        let (format, base, exp) = suffix(sfx)?;
        let nanos = if base == 2 {
            binary_nanos(int_part, frac_part, exp)?
        } else {
            decimal_nanos(int_part, frac_part, exp).ok_or(QuantityError::TooLarge)?
        };
        // Rounding happens on the magnitude: -0.1n rounds to -1n like apimachinery.
        Ok(Quantity { nanos: if negative { -nanos } else { nanos }, format })
    }
}

impl fmt::Display for Quantity {
    /// apimachinery's canonical form: `1536Mi`, `100Mi`, `1500`, `100m`, `1k`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.nanos < 0 { "-" } else { "" };
        let abs = self.nanos.abs();
        if abs == 0 {
            return f.write_str("0");
        }
        let whole = abs % NANO == 0;
        if self.format == Format::BinarySi && whole {
            let units = abs / NANO;
            // Binary form only when it is exact; smaller or odd values print as integers.
            if units >= 1024 && units % 1024 == 0 {
                let mut v = units;
                let mut i = 0;
                const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
                while v % 1024 == 0 && i < SUFFIXES.len() {
                    v /= 1024;
                    i += 1;
                }
                return write!(f, "{sign}{v}{}", SUFFIXES[i - 1]);
            }
            return write!(f, "{sign}{units}");
        }
        // Decimal: the largest exponent (a multiple of 3, from -9) leaving an integer mantissa.
        let mut exp = -9i32;
        let mut mantissa = abs;
        while mantissa % 1000 == 0 && exp < 18 {
            mantissa /= 1000;
            exp += 3;
        }
        let sfx = match exp {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            0 => "",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            _ => "E",
        };
        if self.format == Format::DecimalExponent && exp != 0 {
            return write!(f, "{sign}{mantissa}e{exp}");
        }
        write!(f, "{sign}{mantissa}{sfx}")
    }
}

impl serde::Serialize for Quantity {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Quantity {
    /// Accepts the string form and, as Kubernetes JSON does, bare numbers; capped at the
    /// bounds of an i64 of units (`parse_capped`), for these come from pod specs.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        let s = match v {
            serde_json::Value::String(s) => s,
            serde_json::Value::Number(n) => n.to_string(),
            other => return Err(serde::de::Error::custom(format!("not a quantity: {other}"))),
        };
        Quantity::parse_capped(&s).map_err(|e| serde::de::Error::custom(format!("{s:?}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    /// Exponents at the ends of i32 are errors or round, never overflow.
    #[test]
    fn extreme_exponents_do_not_overflow() {
        assert_eq!("1e2147483647".parse::<Quantity>(), Err(QuantityError::TooLarge));
        assert_eq!(q("0e2147483647").value(), 0);
        assert_eq!(q("1e-2147483648").nanos(), 1, "rounded up to the smallest unit");
        assert_eq!(q("5e-2147483640").nanos(), 1);
    }

    /// What the API server accepts reads as the value it stands for, never as an error:
    /// a long fraction is tiny, rounded up; a huge value in a pod spec is capped.
    #[test]
    fn long_or_huge_quantities_read_as_their_magnitude() {
        let tiny = format!("0.{}1", "0".repeat(40));
        assert_eq!(q(&tiny).nanos(), 1, "a tiny request is tiny, not too large");
        let just_over_one = format!("1.{}1", "0".repeat(40));
        assert_eq!(q(&just_over_one).nanos(), NANO + 1);
        assert_eq!(q(&format!("1{}e-40", "0".repeat(40))).value(), 1);
        assert_eq!(q(&format!("{}e-30", "9".repeat(40))).value(), 10_000_000_000);
        assert_eq!(q(&format!("0.{}1Ki", "0".repeat(40))).nanos(), 1);
        // A long fraction of an ordinary binary value is that value, rounded up.
        assert_eq!(q("1.000000000000000001Gi").value(), 1_073_741_825);
        assert_eq!(q("1.000000001Ei").value(), 1_152_921_505_759_768_481);
        assert_eq!(Quantity::parse_capped("1.000000001Ei").map(|q| q.value()), Ok(1_152_921_505_759_768_481));
        assert_eq!(q(&format!("1.{}5Mi", "0".repeat(30))).value(), (1 << 20) + 1);
        assert_eq!(q("1e-99999999999").nanos(), 1);
        assert_eq!("1e99999999999".parse::<Quantity>(), Err(QuantityError::TooLarge));

        for huge in [
            "1e27",
            "9e26",
            "1e2147483647",
            "99999999999999999999999999999999999999999Ei",
            "9223372036854775808",
        ] {
            assert_eq!(Quantity::parse_capped(huge).map(|q| q.value()), Ok(i64::MAX), "{huge}");
        }
        assert_eq!(Quantity::parse_capped("-1e27").map(|q| q.value()), Ok(-i64::MAX));
        assert_eq!(Quantity::parse_capped("9e26").map(|q| q.nanos()), Ok(i128::from(i64::MAX) * NANO));
        assert_eq!(Quantity::parse_capped(&tiny).map(|q| q.nanos()), Ok(1), "capped only when large");
        assert_eq!(Quantity::parse_capped("1MB"), Err(QuantityError::Syntax));
    }

    #[test]
    fn values_match_apimachinery() {
        let cases: &[(&str, i64)] = &[
            ("100Mi", 100 * 1024 * 1024),
            ("1Gi", 1 << 30),
            ("1.2Gi", 1_288_490_189),
            ("100m", 1),
            ("1500m", 2),
            ("1k", 1000),
            ("1M", 1_000_000),
            ("1e3", 1000),
            ("1E3", 1000),
            ("1.5", 2),
            (".5", 1),
            ("5.", 5),
            ("+7", 7),
            ("0", 0),
            ("0.0", 0),
            ("1n", 1),
            ("1Ei", 1 << 60),
            ("12e-1", 2),
        ];
        for (s, want) in cases {
            assert_eq!(q(s).value(), *want, "{s}");
        }
        assert_eq!(q("-100m").value(), 0);
        assert_eq!(q("-1").value(), -1);
        assert_eq!(q("100m").milli_value(), 100);
        assert_eq!(q("0.1m").milli_value(), 1);
    }

    #[test]
    fn rejects_what_apimachinery_rejects() {
        for s in ["", "MB", "1MB", "1K", " 1", "1 ", "1..0", ".", "Mi", "1Mi1", "1e", "1e+", "abc", "--1"] {
            assert!(s.parse::<Quantity>().is_err(), "{s:?} should be rejected");
        }
        assert_eq!("1e40".parse::<Quantity>(), Err(QuantityError::TooLarge));
    }

    #[test]
    fn canonical_printing() {
        let cases: &[(&str, &str)] = &[
            ("1.5Gi", "1536Mi"),
            ("100Mi", "100Mi"),
            ("1024Ki", "1Mi"),
            ("1000Ki", "1000Ki"),
            ("512", "512"),
            ("1500", "1500"),
            ("1000", "1k"),
            ("100m", "100m"),
            ("0.5Ki", "512"),
            ("1e3", "1e3"),
            ("0", "0"),
        ];
        for (s, want) in cases {
            assert_eq!(q(s).to_string(), *want, "{s}");
        }
        assert_eq!(Quantity::from_units(209_715_203).to_string(), "209715203");
        assert_eq!(Quantity::from_units(1536 << 20).to_string(), "1536Mi");
        assert_eq!(Quantity::from_units(1000).to_string(), "1000");
        assert_eq!(Quantity::from_units_decimal(5000).to_string(), "5k");
    }

    #[test]
    fn ordering_is_exact() {
        assert!(q("1Gi") > q("1G"));
        assert!(q("100m") < q("1"));
        assert_eq!(q("1024"), Quantity::from_units(1024));
    }

    proptest::proptest! {
        #[test]
        fn integers_round_trip(v in 0i64..i64::MAX / 2) {
            let parsed: Quantity = v.to_string().parse().unwrap();
            proptest::prop_assert_eq!(parsed.value(), v);
            let printed = Quantity::from_units(v).to_string();
            proptest::prop_assert_eq!(printed.parse::<Quantity>().unwrap().value(), v);
        }

        #[test]
        fn binary_suffixes_scale(v in 0i64..1_000_000, i in 0usize..4) {
            let sfx = ["Ki", "Mi", "Gi", "Ti"][i];
            let parsed: Quantity = format!("{v}{sfx}").parse().unwrap();
            proptest::prop_assert_eq!(parsed.value() as i128, v as i128 * (1i128 << (10 * (i + 1))));
        }

        #[test]
        fn never_panics(s in "[-+0-9.eEinumkKMGTP]{0,12}") {
            let _ = s.parse::<Quantity>();
        }
    }
}
