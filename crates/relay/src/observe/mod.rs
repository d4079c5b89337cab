//! What operators see of a running relay: the metrics registry and health state
//! ([`metrics`], a leaf the stages feed with plain values) and the HTTP endpoints that serve
//! them ([`http`]: `/metrics`, `/healthz`, `/readyz`), and the OpenTelemetry spans of relayed
//! rows ([`spans`], `[tracing]`).

pub mod http;
pub mod metrics;
pub mod spans;
