//! Exponential backoff with full jitter and a bounded number of attempts for AppendRows.
//! What is retryable is decided once, in `BigQueryError::is_retryable`.

use std::time::Duration;

#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts per request, the first included.
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { max_attempts: 8, initial_backoff: Duration::from_millis(200), max_backoff: Duration::from_secs(10) }
    }
}

impl RetryPolicy {
    /// Delay before retry number `attempt` (1-based): uniform in [ceiling/2, ceiling], where the
    /// ceiling doubles from `initial_backoff` up to `max_backoff`.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(20);
        let ceiling = self.initial_backoff.saturating_mul(1 << exponent).min(self.max_backoff);
        let half = ceiling / 2;
        half + half.mul_f64(rand::random::<f64>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_and_is_capped() {
        let policy = RetryPolicy::default();
        for attempt in 1..=12 {
            let ceiling = (Duration::from_millis(200) * 2u32.pow(attempt.min(20) - 1)).min(Duration::from_secs(10));
            let delay = policy.backoff(attempt);
            assert!(delay >= ceiling / 2 && delay <= ceiling, "attempt {attempt}: {delay:?}");
        }
    }
}
