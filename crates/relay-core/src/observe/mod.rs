//! What operators see of a running relay: the metrics registry and health state
//! ([`metrics`], a leaf the stages feed with plain values; the metric names are the constants of
//! [`names`]), the sources a process serves ([`hub`]) and the HTTP endpoints that serve them ([`http`]: `/metrics`, `/healthz`,
//! `/readyz`), and the OpenTelemetry spans of relayed rows ([`spans`], `[tracing]`), and the
//! acknowledgement audit ([`audit`], `[audit]`).

pub mod audit;
pub mod http;
pub mod hub;
pub mod metrics;
pub mod names;
pub mod spans;
