//! Polling for observable state with a deadline.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};

/// Calls `check` every `poll_interval` until it returns `Ok(Some(value))`, and returns that
/// value. `Ok(None)` means "not yet"; an `Err` ends the wait at once with that error (use it for
/// conditions that can no longer come true, such as the relay process having exited).
///
/// # Errors
/// The error `check` returned, or a timeout error naming `what` once `timeout` has passed
/// (`check` is always called at least once, and once more at the deadline).
///
/// ```no_run
/// # async fn f(pool: &outbox_relay_testkit::mysql_async::Pool) -> anyhow::Result<()> {
/// use std::time::Duration;
/// use outbox_relay_testkit::{mysql_async::prelude::*, wait_until};
/// let n: u64 = wait_until("10 outbox rows", Duration::from_secs(30), Duration::from_millis(100), async || {
///     let n: Option<u64> = pool.get_conn().await?.query_first("SELECT COUNT(*) FROM outbox").await?;
///     Ok(n.filter(|n| *n >= 10))
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub async fn wait_until<T>(
    what: &str,
    timeout: Duration,
    poll_interval: Duration,
    mut check: impl AsyncFnMut() -> Result<Option<T>>,
) -> Result<T> {
    let start = Instant::now();
    let deadline = start + timeout;
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        let now = Instant::now();
        if now >= deadline {
            bail!(
                "timed out after {:.1} s waiting for {what}",
                start.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(poll_interval.min(deadline - now)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_value_once_ready() -> Result<()> {
        let mut calls = 0;
        let v = wait_until(
            "third call",
            Duration::from_secs(5),
            Duration::from_millis(1),
            async || {
                calls += 1;
                Ok((calls >= 3).then_some(calls))
            },
        )
        .await?;
        assert_eq!(v, 3);
        Ok(())
    }

    #[tokio::test]
    async fn times_out_naming_what_it_waited_for() {
        let err = wait_until(
            "never",
            Duration::from_millis(50),
            Duration::from_millis(10),
            async || Ok(None::<()>),
        )
        .await
        .expect_err("must time out");
        assert!(err.to_string().contains("never"), "{err}");
    }

    #[tokio::test]
    async fn an_error_ends_the_wait() {
        let err = wait_until(
            "x",
            Duration::from_secs(60),
            Duration::from_millis(10),
            async || -> Result<Option<()>> { bail!("relay exited") },
        )
        .await
        .expect_err("must fail");
        assert!(err.to_string().contains("relay exited"), "{err}");
    }
}
