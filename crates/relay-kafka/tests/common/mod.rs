//! What the live-broker tests of this crate share.

/// The test broker: `127.0.0.1:KAFKA_PORT` (default 9092).
pub fn bootstrap() -> String {
    let port = std::env::var("KAFKA_PORT")
        .ok()
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap_or(9092);
    format!("127.0.0.1:{port}")
}

/// A topic name no other run used: `prefix-pid-nanos`.
pub fn unique_topic(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{prefix}-{}-{nanos}", std::process::id())
}
