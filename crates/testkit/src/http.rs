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

/// The value of one series (`name{labels}` as exposed, labels in the order exposed) in a
/// Prometheus text page, the `source` label (each source's series carry one) left out of the
/// comparison: for a relay of one source.
pub fn metric(page: &str, series: &str) -> Option<f64> {
    page.lines().find_map(|l| {
        let (name, _, value) = split_source(l)?;
        (name == series).then(|| value.parse().ok())?
    })
}

/// The value of `series` (as in [`metric`], without the `source` label) of source `source`.
pub fn source_metric(page: &str, source: &str, series: &str) -> Option<f64> {
    page.lines().find_map(|l| {
        let (name, of, value) = split_source(l)?;
        (name == series && of.as_deref() == Some(source)).then(|| value.parse().ok())?
    })
}

/// A sample line as (series without its `source` label, that label's value, value text).
fn split_source(line: &str) -> Option<(String, Option<String>, &str)> {
    if line.starts_with('#') {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let Some((name, labels)) = series.split_once('{') else {
        return Some((series.to_owned(), None, value.trim()));
    };
    let labels = labels.strip_suffix('}')?;
    let mut source = None;
    let mut kept = Vec::new();
    // Label values here never hold `",` (topic, table and source names).
    for label in labels.split("\",").filter(|l| !l.is_empty()) {
        let label = label.strip_suffix('"').unwrap_or(label);
        match label.strip_prefix("source=\"") {
            Some(v) => source = Some(v.to_owned()),
            None => kept.push(format!("{label}\"")),
        }
    }
    let series = if kept.is_empty() {
        name.to_owned()
    } else {
        format!("{name}{{{}}}", kept.join(","))
    };
    Some((series, source, value.trim()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_match_without_their_source_label() {
        let page = "# TYPE x counter\n\
            outbox_relay_in_flight{source=\"a\"} 3\n\
            outbox_relay_rows_total{table=\"db.t\",source=\"a\"} 5\n\
            outbox_relay_rows_total{table=\"db.t\",source=\"b\"} 7\n\
            outbox_relay_build_info{version=\"1\"} 1\n";
        assert_eq!(metric(page, "outbox_relay_in_flight"), Some(3.0));
        assert_eq!(
            metric(page, "outbox_relay_rows_total{table=\"db.t\"}"),
            Some(5.0)
        );
        assert_eq!(
            source_metric(page, "b", "outbox_relay_rows_total{table=\"db.t\"}"),
            Some(7.0)
        );
        assert_eq!(source_metric(page, "c", "outbox_relay_in_flight"), None);
        assert_eq!(
            metric(page, "outbox_relay_build_info{version=\"1\"}"),
            Some(1.0)
        );
        assert_eq!(metric(page, "outbox_relay_rows"), None);
    }
}
