//! The relay's HTTP endpoints as tests read them: `GET` a path, one series of a Prometheus
//! page, waiting for a status.

use std::io::{Read, Write};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};

use crate::relay::RelayProcess;
use crate::wait::wait_until;

/// `GET path` on `127.0.0.1:port` (HTTP/1.0, so the server closes the connection): the status
/// code and the body.
pub async fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || -> Result<(u16, String)> {
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", port))
            .with_context(|| format!("connecting to 127.0.0.1:{port}"))?;
        conn.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(conn, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
        let mut response = String::new();
        conn.read_to_string(&mut response)?;
        let (head, body) = response
            .split_once("\r\n\r\n")
            .ok_or_else(|| anyhow!("no HTTP head in {response:?}"))?;
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow!("no status in {head:?}"))?;
        Ok((status, body.to_owned()))
    })
    .await?
}

/// The value of one series (`name{labels}` exactly as exposed) in a Prometheus text page.
pub fn metric(page: &str, series: &str) -> Option<f64> {
    page.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Waits until `GET path` answers `status`; returns the body. Fails at once if the relay exits.
pub async fn wait_for_status(
    relay: &RelayProcess,
    port: u16,
    path: &str,
    status: u16,
    timeout: Duration,
) -> Result<String> {
    let mut last = None;
    wait_until(
        &format!("{path} to answer {status}"),
        timeout,
        Duration::from_millis(100),
        async || {
            relay.ensure_running()?;
            match http_get(port, path).await {
                Ok((s, body)) if s == status => Ok(Some(body)),
                other => {
                    last = Some(format!("{other:?}"));
                    Ok(None)
                }
            }
        },
    )
    .await
    .map_err(|e| {
        anyhow!(
            "{e:#}; last answer {last:?}\n--- relay stderr ---\n{}",
            relay.stderr_tail()
        )
    })
}
