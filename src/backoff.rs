//! Backoff after a failed work item (shared/CONTRACTS.md §2).
//!
//! The first failure waits `initial`; each failure after a failure multiplies
//! the previous interval (persisted in `work_backoff.last_interval_seconds`)
//! by `exponent`, capped at `maximum`. Intervals are whole seconds, rounded
//! up, at least one. An exponent of 1 is a constant backoff. Optional jitter
//! lengthens the wait (never the persisted interval) by up to that fraction.

use std::time::Duration;

use rand::Rng;

/// No backoff is longer than this, whatever the configuration: ten years.
pub const BACKOFF_CEILING_SECONDS: i64 = 10 * 365 * 24 * 3600;

#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    pub initial: Duration,
    pub maximum: Option<Duration>,
    pub exponent: f64,
    /// Fraction in [0, 1]: the wait is interval × (1 + jitter × U[0, 1)).
    pub jitter: f64,
}

/// Backoff parameters that make no sense: each names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackoffError {
    #[error("exponent must be at least 1, not {0}")]
    Exponent(f64),
    #[error("jitter must be within 0 and 1, not {0}")]
    Jitter(f64),
    #[error("maximum must not be shorter than initial")]
    MaximumBelowInitial,
}

impl Backoff {
    /// Always waits `interval`.
    pub fn constant(interval: Duration) -> Self {
        Backoff {
            initial: interval,
            maximum: None,
            exponent: 1.0,
            jitter: 0.0,
        }
    }

    pub fn exponential(initial: Duration, maximum: Duration, exponent: f64) -> Self {
        Backoff {
            initial,
            maximum: Some(maximum),
            exponent,
            jitter: 0.0,
        }
    }

    pub fn with_jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// Whether the parameters make sense; the error names the field.
    pub fn validate(&self) -> Result<(), BackoffError> {
        if !self.exponent.is_finite() || self.exponent < 1.0 {
            return Err(BackoffError::Exponent(self.exponent));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(BackoffError::Jitter(self.jitter));
        }
        if let Some(max) = self.maximum
            && max < self.initial
        {
            return Err(BackoffError::MaximumBelowInitial);
        }
        Ok(())
    }

    fn cap_seconds(&self) -> i64 {
        match self.maximum {
            Some(m) => ceil_seconds(m.as_secs_f64()).clamp(1, BACKOFF_CEILING_SECONDS),
            None => BACKOFF_CEILING_SECONDS,
        }
    }

    /// The interval to persist after a failure, given the previously
    /// persisted one (None: the previous attempt did not fail).
    pub fn next_interval_seconds(&self, last: Option<i64>) -> i64 {
        let cap = self.cap_seconds();
        let initial = ceil_seconds(self.initial.as_secs_f64()).clamp(1, cap);
        let Some(last) = last else {
            return initial;
        };
        if self.exponent.is_nan() || self.exponent <= 1.0 {
            return initial;
        }
        let next = last.max(1) as f64 * self.exponent;
        if !next.is_finite() || next >= cap as f64 {
            return cap;
        }
        ceil_seconds(next).clamp(1, cap)
    }

    /// How long to wait for an interval: the interval plus jitter.
    pub fn wait_for(&self, interval_seconds: i64) -> Duration {
        let base = interval_seconds as f64;
        let extra = if self.jitter > 0.0 {
            base * self.jitter * rand::rng().random::<f64>()
        } else {
            0.0
        };
        Duration::from_secs_f64(base + extra)
    }
}

/// Whole seconds rounded up, after rounding to microseconds so that float
/// noise (10 × 1.1 = 11.000000000000002) does not add a second.
fn ceil_seconds(s: f64) -> i64 {
    if !s.is_finite() || s >= i64::MAX as f64 {
        return i64::MAX;
    }
    let micros = (s * 1e6).round();
    (micros / 1e6).ceil() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sequence(b: &Backoff, n: usize) -> Vec<i64> {
        let mut out = Vec::new();
        let mut last = None;
        for _ in 0..n {
            let next = b.next_interval_seconds(last);
            out.push(next);
            last = Some(next);
        }
        out
    }

    #[test]
    fn contract_sequence() {
        let b = Backoff {
            initial: Duration::from_secs(1),
            maximum: None,
            exponent: 1.1,
            jitter: 0.0,
        };
        assert_eq!(
            sequence(&b, 14),
            vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17]
        );
    }

    #[test]
    fn maximum_caps() {
        let b = Backoff::exponential(Duration::from_secs(1), Duration::from_secs(10), 2.0);
        assert_eq!(sequence(&b, 7), vec![1, 2, 4, 8, 10, 10, 10]);
    }

    #[test]
    fn constant_and_rounding() {
        let b = Backoff::constant(Duration::from_millis(1500));
        assert_eq!(sequence(&b, 3), vec![2, 2, 2]);
        let b = Backoff::constant(Duration::from_millis(10));
        assert_eq!(sequence(&b, 2), vec![1, 1]);
    }

    #[test]
    fn huge_exponent_does_not_overflow() {
        let b = Backoff {
            initial: Duration::from_secs(1),
            maximum: None,
            exponent: 1e300,
            jitter: 0.0,
        };
        assert_eq!(
            sequence(&b, 4),
            vec![
                1,
                BACKOFF_CEILING_SECONDS,
                BACKOFF_CEILING_SECONDS,
                BACKOFF_CEILING_SECONDS
            ]
        );
        assert_eq!(
            b.next_interval_seconds(Some(i64::MAX)),
            BACKOFF_CEILING_SECONDS
        );
        let b = Backoff::exponential(Duration::from_secs(60), Duration::from_secs(3600), f64::MAX);
        assert_eq!(sequence(&b, 3), vec![60, 3600, 3600]);
    }

    #[test]
    fn jitter_only_lengthens() {
        let b = Backoff::constant(Duration::from_secs(10)).with_jitter(0.5);
        for _ in 0..100 {
            let w = b.wait_for(10);
            assert!(
                w >= Duration::from_secs(10) && w < Duration::from_secs(15),
                "{w:?}"
            );
        }
    }
}
