//! What operators see of a running relay: the metrics registry and health state
//! ([`metrics`], a leaf the stages feed with plain values) and the HTTP endpoints that serve
//! them ([`http`]: `/metrics`, `/healthz`, `/readyz`).

pub mod http;
pub mod metrics;
