//! Seconds flags (`--duration`, `--stats-period`, ...) of both binaries.

/// Seconds from 0 to `MAX_SECONDS`. NaN, negative and absurdly large
/// values are refused here: turned into a `Duration` or added to an
/// `Instant` later, they would panic.
pub fn parse(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number of seconds"))?;
    if (0.0..=MAX_SECONDS).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "'{s}': expected seconds from 0 to {MAX_SECONDS} (a year)"
        ))
    }
}

/// The longest time any seconds flag takes: a year, beyond any run and
/// well within what a `Duration` or an `Instant` can hold.
pub const MAX_SECONDS: f64 = 365.0 * 24.0 * 3600.0;
