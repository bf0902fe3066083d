//! Human-readable byte amounts for logs and the trace view.

/// `21.3GiB`, `-4.0MiB`, `512B`.
pub fn bytes(v: i64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    let sign = if v < 0 { "-" } else { "" };
    let mut x = v.unsigned_abs() as f64;
    if x < 1024.0 {
        return format!("{v}B");
    }
    let mut unit = "B";
    for u in UNITS {
        if x < 1024.0 {
            break;
        }
        x /= 1024.0;
        unit = u;
    }
    format!("{sign}{x:.1}{unit}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats() {
        assert_eq!(super::bytes(512), "512B");
        assert_eq!(super::bytes(-512), "-512B");
        assert_eq!(super::bytes(4 << 20), "4.0MiB");
        assert_eq!(super::bytes(-(3 << 29)), "-1.5GiB");
    }
}
