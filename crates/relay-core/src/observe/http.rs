//! The HTTP endpoints of a running relay (`[http]`), served on the relay's tokio runtime:
//!
//! * `GET /metrics`: every metric of [`crate::observe::metrics`] in the Prometheus text format 0.0.4.
//! * `GET /healthz`: `200 ok` while the process runs (liveness).
//! * `GET /readyz`: `200 ready: streaming` while the binlog stream is connected and an event or
//!   heartbeat was read within `http.ready_stall_ms` and a Kafka broker answered the relay's
//!   metadata probe within `http.ready_kafka_ms` (also while no rows flow); otherwise `503 not
//!   ready: <reason>` (starting, waiting for the lease, connecting, retrying after an error,
//!   stalled, Kafka unreachable, stopping). A process of many sources answers for all of them,
//!   one line `<source>: ready: …` / `<source>: not ready: …` each, by the rule of
//!   [`crate::observe::hub`]; `GET /readyz?source=<name>` for one (404 for an unknown name).
//!   A fleet's process starts the body with its membership (`fleet: joined group …` or
//!   `fleet: not joined (…)`) and is not ready until it has joined.
//!
//! The listener is bound before the relay connects anywhere, so a port already in use is a
//! configuration error at start-up, and `/healthz` answers while MySQL is unreachable. The
//! server stops with the relay ([`HttpServer::stop`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::HttpConfig;
use crate::error::RelayError;
use crate::observe::hub::Hub;

/// Content type of the Prometheus text exposition format.
const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

/// How long [`HttpServer::stop`] lets open requests finish.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// What the handlers read.
#[derive(Clone)]
struct Endpoints {
    hub: Arc<Hub>,
}

/// A running HTTP server.
#[derive(Debug)]
pub struct HttpServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

/// Binds `config.listen` and serves the endpoints of `hub`'s sources until
/// [`HttpServer::stop`]; `Ok(None)` when `http.enabled = false`.
///
/// # Errors
/// [`RelayError::Config`] when `http.listen` is not an `IP:port` address or cannot be bound
/// (already in use, not an address of this host, a privileged port), naming the key and the
/// fix.
pub async fn start(config: &HttpConfig, hub: Arc<Hub>) -> Result<Option<HttpServer>, RelayError> {
    if !config.enabled {
        return Ok(None);
    }
    let addr: SocketAddr = config.listen.parse().map_err(|e| {
        RelayError::Config(format!(
            "http.listen {:?} is not an IP:port address ({e}); e.g. \"127.0.0.1:9719\" or \
             \"[::1]:9719\"",
            config.listen
        ))
    })?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| bind_error(&config.listen, &e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| bind_error(&config.listen, &e))?;
    let state = Endpoints { hub };
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the HTTP server (/metrics, /healthz, /readyz) failed");
        }
    });
    tracing::info!(address = %addr, "serving /metrics, /healthz and /readyz over HTTP");
    Ok(Some(HttpServer {
        addr,
        stop: Some(stop),
        task,
    }))
}

/// The configuration error for a listener that cannot be bound.
fn bind_error(listen: &str, e: &std::io::Error) -> RelayError {
    let why = match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            "the address is already in use (another outbox-relay, or another exporter, listens \
             there)"
        }
        std::io::ErrorKind::AddrNotAvailable => "this host has no such address",
        std::io::ErrorKind::PermissionDenied => "not permitted (ports below 1024 need privileges)",
        _ => "it cannot be bound",
    };
    RelayError::Config(format!(
        "http.listen {listen:?}: {why}: {e}. Fix: set http.listen (or \
         OUTBOX_RELAY__HTTP__LISTEN) to a free IP:port, or set http.enabled = false to serve no \
         HTTP endpoints"
    ))
}

impl HttpServer {
    /// The address the server listens on (with the actual port when `http.listen` asked for
    /// port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting connections, lets open requests finish for up to a second, then ends
    /// the server.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(STOP_GRACE, &mut self.task)
            .await
            .is_err()
        {
            // Idle keep-alive connections would hold a graceful shutdown open.
            self.task.abort();
        }
    }
}

async fn metrics_handler(State(s): State<Endpoints>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
        s.hub.render(),
    )
}

async fn healthz() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, TEXT)], "ok\n")
}

async fn readyz(
    State(s): State<Endpoints>,
    Query(query): Query<HashMap<String, String>>,
) -> impl IntoResponse {
    let line = |r: &Result<String, String>| match r {
        Ok(what) => format!("ready: {what}"),
        Err(why) => format!("not ready: {why}"),
    };
    if let Some(name) = query.get("source") {
        return match s.hub.source_readiness(name) {
            Some(r) => (
                status(r.is_ok()),
                [(header::CONTENT_TYPE, TEXT)],
                format!("{}\n", line(&r)),
            ),
            None => (
                StatusCode::NOT_FOUND,
                [(header::CONTENT_TYPE, TEXT)],
                format!("this process runs no source named {name:?}\n"),
            ),
        };
    }
    let all = s.hub.readiness();
    let fleet = s.hub.fleet();
    // A fleet's process is ready only once it has joined (then as its assigned sources are).
    let ready = all.iter().all(|(_, r)| r.is_ok()) && fleet.as_ref().is_none_or(|f| f.is_joined());
    let mut body = fleet.map(|f| format!("{}\n", f.line())).unwrap_or_default();
    if !s.hub.is_multi() && all.len() == 1 {
        body.push_str(&format!("{}\n", line(&all[0].1)));
    } else if all.is_empty() {
        if ready {
            body.push_str("ready: this process runs no source\n");
        }
    } else {
        body.extend(all.iter().map(|(name, r)| format!("{name}: {}\n", line(r))));
    }
    (status(ready), [(header::CONTENT_TYPE, TEXT)], body)
}

fn status(ready: bool) -> StatusCode {
    if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::hub::ReadyLimits;
    use crate::observe::metrics::State as RelayState;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A minimal HTTP/1.0 GET: (status code, body).
    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
        conn.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .expect("write");
        let mut response = String::new();
        conn.read_to_string(&mut response).await.expect("read");
        let (head, body) = response.split_once("\r\n\r\n").expect("a head");
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("a status line");
        (status, body.to_owned())
    }

    fn config(listen: &str) -> HttpConfig {
        HttpConfig {
            enabled: true,
            listen: listen.into(),
            ready_stall_ms: 30_000,
            ready_kafka_ms: 30_000,
        }
    }

    #[tokio::test]
    async fn serves_metrics_health_and_readiness_then_stops() {
        let hub = Hub::new(false);
        let metrics = hub.add(
            "shop",
            ReadyLimits {
                stall: Duration::from_secs(30),
                kafka: Duration::from_secs(30),
            },
        );
        let server = start(&config("127.0.0.1:0"), hub)
            .await
            .expect("binds")
            .expect("enabled");
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0);

        assert_eq!(get(addr, "/healthz").await, (200, "ok\n".into()));
        assert_eq!(
            get(addr, "/readyz").await,
            (503, "not ready: starting\n".into())
        );
        metrics.set_state(RelayState::Streaming);
        assert_eq!(
            get(addr, "/readyz").await,
            (200, "ready: streaming\n".into())
        );
        metrics.row_read("db.outbox");
        let (status, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert!(
            body.contains(
                "outbox_relay_outbox_rows_read_total{table=\"db.outbox\",source=\"shop\"} 1\n"
            ),
            "{body}"
        );
        assert_eq!(get(addr, "/nope").await.0, 404);
        assert_eq!(
            get(addr, "/readyz?source=shop").await,
            (200, "ready: streaming\n".into())
        );
        assert_eq!(get(addr, "/readyz?source=other").await.0, 404);

        server.stop().await;
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "still listening after stop"
        );
    }

    #[tokio::test]
    async fn a_fleet_process_is_ready_only_once_joined() {
        let hub = Hub::new(true);
        hub.set_fleet(crate::observe::hub::FleetState::NotJoined {
            reason: "joining group g".into(),
        });
        let server = start(&config("127.0.0.1:0"), Arc::clone(&hub))
            .await
            .expect("binds")
            .expect("enabled");
        let addr = server.local_addr();
        assert_eq!(
            get(addr, "/readyz").await,
            (503, "fleet: not joined (joining group g)\n".into())
        );
        hub.set_fleet(crate::observe::hub::FleetState::Joined {
            group: "g".into(),
            generation: 3,
            assigned: 0,
            partitions: 4,
        });
        assert_eq!(
            get(addr, "/readyz").await,
            (
                200,
                "fleet: joined group g (generation 3, 0 of 4 partitions)\nready: this process \
                 runs no source\n"
                    .into()
            )
        );
        let a = hub.add(
            "a",
            ReadyLimits {
                stall: Duration::from_secs(30),
                kafka: Duration::from_secs(30),
            },
        );
        let (status, body) = get(addr, "/readyz").await;
        assert_eq!(status, 503, "{body}");
        assert!(body.ends_with("\na: not ready: starting\n"), "{body}");
        a.set_state(RelayState::Streaming);
        assert_eq!(get(addr, "/readyz").await.0, 200);
        hub.set_fleet(crate::observe::hub::FleetState::NotJoined {
            reason: "the membership was lost".into(),
        });
        assert_eq!(get(addr, "/readyz").await.0, 503);
        server.stop().await;
    }

    #[tokio::test]
    async fn a_port_in_use_is_a_configuration_error() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let listen = taken.local_addr().expect("addr").to_string();
        let err = start(&config(&listen), Hub::new(false))
            .await
            .expect_err("in use");
        assert_eq!(err.exit_code(), 2);
        let text = err.to_string();
        assert!(
            text.starts_with(&format!(
                "configuration error: http.listen {listen:?}: the address is already in use"
            )),
            "{text}"
        );
        assert!(text.contains("http.enabled = false"), "{text}");
    }

    #[tokio::test]
    async fn disabled_serves_nothing_and_bad_addresses_are_refused() {
        let hub = Hub::new(false);
        let off = HttpConfig {
            enabled: false,
            ..config("127.0.0.1:0")
        };
        assert!(start(&off, hub.clone()).await.expect("ok").is_none());
        let err = start(&config("localhost"), hub)
            .await
            .expect_err("no port")
            .to_string();
        assert!(
            err.contains("http.listen \"localhost\" is not an IP:port"),
            "{err}"
        );
    }
}
