//! How long a test waits, scaled to the machine it runs on. A limit that is generous on
//! this project's hosts is too short under the VM matrix's QEMU emulation (TCG runs the same
//! code 10–30 times slower), and a limit generous enough there would make a real hang on
//! the host take minutes to show. So the harness measures the machine once: a fixed piece
//! of work, timed against what it takes on a reference host, gives the factor every wait
//! is multiplied by (never below 1). `EVICTD_TEST_PATIENCE` sets the factor by hand.

use std::{
    sync::OnceLock,
    time::{Duration, Instant},
};

use sha2::Digest as _;

/// The work: hashing 1 MiB, five times; the median is kept. Debug build (the tests'
/// profile), so the reference is a debug build's time too.
fn calibration_work() -> Duration {
    let data = vec![0x5au8; 1 << 20];
    let mut times: Vec<Duration> = (0..5)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(sha2::Sha256::digest(std::hint::black_box(&data)));
            t.elapsed()
        })
        .collect();
    times.sort();
    times[2]
}

/// What `calibration_work` takes on the reference host (2 cores of this project's CI
/// kind, debug build, measured while another build ran): a machine as fast gets factor 1.
const REFERENCE: Duration = Duration::from_millis(REFERENCE_MS);
const REFERENCE_MS: u64 = 40;

/// The factor every test wait is multiplied by on this machine.
pub fn factor() -> f64 {
    static FACTOR: OnceLock<f64> = OnceLock::new();
    *FACTOR.get_or_init(|| {
        let set = std::env::var("EVICTD_TEST_PATIENCE").ok().and_then(|v| v.parse::<f64>().ok());
        if let Some(f) = set.filter(|f| f.is_finite()) {
            return f.clamp(1.0, 1000.0);
        }
        let measured = calibration_work();
        let f = (measured.as_secs_f64() / REFERENCE.as_secs_f64()).max(1.0);
        if f > 1.5 {
            eprintln!("evictd-tests: this machine is {f:.1}x slower than the reference: waits scaled");
        }
        f
    })
}

/// `within`, scaled to this machine.
pub fn patience(within: Duration) -> Duration {
    within.mul_f64(factor())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_factor_is_never_below_one_and_scales_waits() {
        assert!(factor() >= 1.0);
        assert!(patience(Duration::from_secs(2)) >= Duration::from_secs(2));
        eprintln!("calibration work here: {:?}, factor {:.2}", calibration_work(), factor());
    }
}
