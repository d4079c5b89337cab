//! The `[retry]` policy, written once for every loop that retries a failure (a relay run, the
//! TLS negotiation with MySQL): capped exponential backoff with jitter (backon), consecutive
//! attempts counted against `retry.max_attempts`, and a wait that a stop cuts short.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::watch;

use outbox_relay_core::config::RetryConfig;

/// Consecutive failures and the delay before the next attempt.
pub(crate) struct Retry {
    config: RetryConfig,
    backoff: Box<dyn Iterator<Item = Duration> + Send>,
    attempts: usize,
}

impl Retry {
    /// A policy from `[retry]`, with no failure counted yet.
    pub(crate) fn new(config: &RetryConfig) -> Self {
        Self {
            config: config.clone(),
            backoff: Self::backoff(config),
            attempts: 0,
        }
    }

    fn backoff(config: &RetryConfig) -> Box<dyn Iterator<Item = Duration> + Send> {
        Box::new(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(config.initial_backoff_ms))
                .with_max_delay(Duration::from_millis(config.max_backoff_ms))
                .with_jitter()
                .without_max_times()
                .build(),
        )
    }

    /// Progress was made: the count and the backoff start over.
    pub(crate) fn reset(&mut self) {
        self.backoff = Self::backoff(&self.config);
        self.attempts = 0;
    }

    /// Consecutive failures counted so far.
    pub(crate) fn attempts(&self) -> usize {
        self.attempts
    }

    /// Counts one more consecutive failure. `None` when that was the last one
    /// `retry.max_attempts` allows (0 allows any number); otherwise the delay before the next
    /// attempt, at most `retry.max_backoff_ms` (jitter may add to the exponential delay: the cap
    /// holds after it).
    pub(crate) fn failed(&mut self) -> Option<Duration> {
        self.attempts += 1;
        if self.config.max_attempts > 0 && self.attempts >= self.config.max_attempts {
            return None;
        }
        let max_delay = Duration::from_millis(self.config.max_backoff_ms);
        Some(self.backoff.next().unwrap_or(max_delay).min(max_delay))
    }
}

/// Sleeps `delay`, or less when a stop is requested. Returns `true` when a stop was requested.
pub(crate) async fn wait_or_stop(delay: Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = shutdown.changed() => {}
    }
    *shutdown.borrow()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max_attempts: usize) -> RetryConfig {
        RetryConfig {
            initial_backoff_ms: 100,
            max_backoff_ms: 1_000,
            max_attempts,
            ..RetryConfig::default()
        }
    }

    #[test]
    fn gives_up_after_max_attempts_and_starts_over_after_a_reset() {
        let mut r = Retry::new(&config(3));
        assert!(r.failed().is_some());
        assert!(r.failed().is_some());
        assert_eq!(
            r.failed(),
            None,
            "the third consecutive failure is the last"
        );
        assert_eq!(r.attempts(), 3);
        r.reset();
        assert_eq!(r.attempts(), 0);
        assert!(r.failed().is_some());
    }

    #[test]
    fn zero_max_attempts_retries_forever_within_the_cap() {
        let mut r = Retry::new(&config(0));
        for _ in 0..50 {
            let d = r.failed().expect("never gives up");
            assert!(d <= Duration::from_millis(1_000), "{d:?} above the cap");
        }
    }

    #[tokio::test]
    async fn a_stop_cuts_the_wait_short() {
        let (tx, mut rx) = watch::channel(false);
        tx.send(true).expect("the receiver is alive");
        let started = std::time::Instant::now();
        assert!(wait_or_stop(Duration::from_secs(60), &mut rx).await);
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
