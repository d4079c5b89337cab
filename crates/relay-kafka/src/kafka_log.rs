//! librdkafka's logs and client errors in the relay's `tracing` log, and whether the cluster
//! answers, as one line per change.
//!
//! With its brokers down, librdkafka reports the same failure again and again: a log line per
//! connection attempt, an error event per attempt and "all brokers are down", from every client
//! (the producer of each run, the read-back consumer, …), and each retry of a run makes new
//! clients. Here they go to DEBUG; the operator gets one WARN line when the cluster becomes
//! unreachable (the brokers tried, the class of error, what to check) and one INFO line when
//! it answers again. Other librdkafka lines keep their level (its LOG_ERR lines as WARN: the
//! failures that matter reach the relay as errors of its own; a fresh broker's "Coordinator
//! load in progress" while the producer gets its id, retried by librdkafka, as INFO), and a
//! line already logged in the last [`LOG_REPEAT`] goes to DEBUG.
//!
//! State and repeat memory are per cluster (`kafka.bootstrap_servers`) and per process, so the
//! clients of successive runs share them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// Least time between two identical librdkafka lines at their own level; a repeat within it
/// goes to DEBUG.
pub const LOG_REPEAT: Duration = Duration::from_secs(600);

/// What to check when no broker answers: the same advice in the state line and in the error
/// of a run that gives up.
pub const UNREACHABLE_CHECKS: &str = "check kafka.bootstrap_servers (host and port), that the \
    brokers run, that the listeners the brokers advertise (advertised.listeners) resolve and \
    can be reached from this host, and that security.protocol, ssl.* and sasl.* in \
    [kafka.properties] match the listener";

/// Whether one cluster answers, and the lines already logged for it.
#[derive(Debug)]
pub struct KafkaLog {
    /// `kafka.bootstrap_servers`.
    bootstrap: String,
    /// Set while the cluster is known to be unreachable (read on every delivery report).
    unreachable: AtomicBool,
    state: Mutex<State>,
    /// When each line (its text without counters) was last logged at its own level.
    last_logged: Mutex<HashMap<String, Instant>>,
}

#[derive(Debug, Default)]
struct State {
    /// Since when no broker answers (`None`: reachable, or not known yet).
    since: Option<Instant>,
    /// The last connection failure librdkafka reported, for the state line.
    last_failure: Option<String>,
}

impl KafkaLog {
    /// The log of the cluster at `bootstrap`, shared by every client of this process.
    pub fn of(bootstrap: &str) -> Arc<Self> {
        static ALL: OnceLock<Mutex<HashMap<String, Arc<KafkaLog>>>> = OnceLock::new();
        let all = ALL.get_or_init(Default::default);
        let Ok(mut all) = all.lock() else {
            return Arc::new(Self::new(bootstrap));
        };
        Arc::clone(
            all.entry(bootstrap.to_owned())
                .or_insert_with(|| Arc::new(Self::new(bootstrap))),
        )
    }

    fn new(bootstrap: &str) -> Self {
        Self {
            bootstrap: bootstrap.to_owned(),
            unreachable: AtomicBool::new(false),
            state: Mutex::new(State::default()),
            last_logged: Mutex::new(HashMap::new()),
        }
    }

    /// `true` while the cluster is known to be unreachable (its line was logged).
    pub fn is_unreachable(&self) -> bool {
        self.unreachable.load(Ordering::Relaxed)
    }

    /// No broker answered (`detail`: the client's own words). Logs the state line when the
    /// cluster was reachable or not known yet; nothing when it was already unreachable.
    pub fn unreachable(&self, detail: &str) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        if state.since.is_some() {
            return;
        }
        state.since = Some(Instant::now());
        self.unreachable.store(true, Ordering::Relaxed);
        let failure = state
            .last_failure
            .clone()
            .unwrap_or_else(|| detail.to_owned());
        let class = error_class(&failure);
        tracing::warn!(
            target: "outbox_relay_kafka",
            brokers = %self.bootstrap,
            error_class = class.name,
            error = %failure,
            "Kafka unreachable: no broker of {} answers ({}). Fix: {UNREACHABLE_CHECKS}. The \
             relay retries by [retry] (max_attempts = 0, the default: until Kafka answers) and \
             logs again when it does",
            self.bootstrap,
            class.text
        );
    }

    /// A broker answered (a metadata answer, an acknowledged record). Logs the state line when
    /// the cluster was unreachable.
    pub fn reachable(&self) {
        if !self.is_unreachable() {
            return;
        }
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        let Some(since) = state.since.take() else {
            return;
        };
        state.last_failure = None;
        self.unreachable.store(false, Ordering::Relaxed);
        tracing::info!(
            target: "outbox_relay_kafka",
            brokers = %self.bootstrap,
            unreachable_s = since.elapsed().as_secs(),
            "Kafka reachable again: {} answered after {} s unreachable",
            self.bootstrap,
            since.elapsed().as_secs()
        );
    }

    /// The class and words of the last connection failure, for an error that ends a run:
    /// "connection refused: nothing listens at that address …".
    pub fn failure_text(&self) -> Option<String> {
        let state = self.state.lock().ok()?;
        let failure = state.last_failure.as_deref()?;
        Some(format!("{}; {failure}", error_class(failure).text))
    }

    /// A librdkafka log line (`ClientContext::log`).
    pub fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        use RDKafkaLogLevel as L;
        // librdkafka flags the property as experimental at every start; the relay sets it on
        // purpose (see KafkaSink::new), so this is not worth an operator's attention.
        let routine = message.contains("enable.gapless.guarantee is experimental")
            || self.connection_failure(message);
        if routine || !self.first_in_a_while(message) {
            tracing::debug!(target: "librdkafka", facility, "{message}");
            return;
        }
        match shown_level(level, message) {
            L::Emerg | L::Alert | L::Critical => {
                tracing::error!(target: "librdkafka", facility, "{message}")
            }
            L::Error | L::Warning => tracing::warn!(target: "librdkafka", facility, "{message}"),
            L::Notice | L::Info => tracing::info!(target: "librdkafka", facility, "{message}"),
            L::Debug => tracing::debug!(target: "librdkafka", facility, "{message}"),
        }
    }

    /// A client error event (`ClientContext::error`): broker transport failures and "all
    /// brokers are down" go to DEBUG (a transport failure's text is kept for the state line);
    /// others are logged as WARN, repeats as DEBUG. Events never change the state: a client
    /// whose queue is served late (the read-back consumer, a run's producer at its close)
    /// hands over events from before Kafka answered again. The state follows the relay's own
    /// requests: a run's first metadata request, the readiness probe, acknowledgements.
    pub fn error(&self, error: &KafkaError, reason: &str) {
        match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::AllBrokersDown) => {
                tracing::debug!(target: "librdkafka", error = %error, "{reason}");
            }
            Some(
                RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::Resolve
                | RDKafkaErrorCode::SSL,
            ) => {
                tracing::debug!(target: "librdkafka", error = %error, "{reason}");
                self.note_failure(reason);
            }
            _ if self.first_in_a_while(&error.to_string()) => {
                tracing::warn!(target: "librdkafka", error = %error, "{reason}")
            }
            _ => tracing::debug!(target: "librdkafka", error = %error, "{reason}"),
        }
    }

    /// Whether `message` is a failed connection to a broker (kept for the state line).
    fn connection_failure(&self, message: &str) -> bool {
        let failed = [
            "Connect to ",
            "Failed to resolve",
            "SSL handshake failed",
            "brokers are down",
            "Disconnected while requesting",
            "Connection setup timed out",
        ]
        .iter()
        .any(|n| message.contains(n));
        if failed {
            self.note_failure(message);
        }
        failed
    }

    fn note_failure(&self, message: &str) {
        if message.contains("brokers are down") {
            return;
        }
        if let Ok(mut state) = self.state.lock() {
            state.last_failure = Some(message.to_owned());
        }
    }

    /// `true` the first time `message` (its counters left out) is seen in [`LOG_REPEAT`].
    fn first_in_a_while(&self, message: &str) -> bool {
        let key = without_counters(message);
        let Ok(mut last) = self.last_logged.lock() else {
            return true;
        };
        let now = Instant::now();
        match last.get(&key) {
            Some(t) if now.duration_since(*t) < LOG_REPEAT => false,
            _ => {
                if last.len() > 1000 {
                    last.clear(); // bounded: messages embed broker names
                }
                last.insert(key, now);
                true
            }
        }
    }
}

/// The level a librdkafka line is logged at: its own, except a producer's "Failed to acquire
/// idempotence PID from broker …: Coordinator load in progress: retrying" (or the coordinator
/// not available or moved), a WARN that a fresh broker gives while it loads its transaction
/// state topic at start-up: librdkafka retries on its own and the producer goes on once the
/// coordinator answers, so it is INFO (a coordinator that never answers shows as the relay's own
/// delivery timeout).
fn shown_level(level: RDKafkaLogLevel, message: &str) -> RDKafkaLogLevel {
    let coordinator_busy = [
        "Coordinator load in progress",
        "Coordinator not available",
        "Not coordinator",
    ];
    let transient = message.contains(" PID from broker ")
        && message.ends_with(": retrying")
        && coordinator_busy.iter().any(|c| message.contains(c));
    if transient && matches!(level, RDKafkaLogLevel::Warning) {
        RDKafkaLogLevel::Info
    } else {
        level
    }
}

/// `message` without the parts librdkafka changes from one repeat to the next: "(after 0ms in
/// state CONNECT, 3 identical error(s) suppressed)" and the numbers in it.
fn without_counters(message: &str) -> String {
    let cut = message.find(" (after ").unwrap_or(message.len());
    message[..cut]
        .chars()
        .map(|c| if c.is_ascii_digit() { '#' } else { c })
        .collect()
}

/// A connection failure's class, for the operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorClass {
    /// A short name (a log field): `connection_refused`, `name_resolution`, `timeout`, `tls`,
    /// `sasl`, `disconnected`, `other`.
    pub name: &'static str,
    /// What it means and where to look.
    pub text: &'static str,
}

/// The class of a librdkafka connection failure's text.
pub fn error_class(failure: &str) -> ErrorClass {
    let f = failure.to_ascii_lowercase();
    let class = |name, text| ErrorClass { name, text };
    if f.contains("connection refused") {
        class(
            "connection_refused",
            "connection refused: nothing listens at that address (a wrong host or port, or the \
             brokers are down)",
        )
    } else if f.contains("resolve") || f.contains("name or service not known") {
        class(
            "name_resolution",
            "the host name does not resolve (a typo, or a name only the brokers' network \
             knows)",
        )
    } else if f.contains("ssl") || f.contains("certificate") || f.contains("tls") {
        class(
            "tls",
            "the TLS handshake failed: ssl.ca.location, the broker's certificate and \
             security.protocol must match the listener",
        )
    } else if f.contains("sasl") || f.contains("authentication") {
        class(
            "sasl",
            "SASL authentication failed: sasl.mechanism, sasl.username and sasl.password",
        )
    } else if f.contains("timed out") || f.contains("timeout") {
        class(
            "timeout",
            "no answer in time: a firewall, a route, or a host that is down",
        )
    } else if f.contains("disconnected") || f.contains("receive failed") {
        class(
            "disconnected",
            "the broker closed the connection at once: a TLS or SASL listener spoken to in \
             plain text (or the reverse), or a port that is not Kafka's",
        )
    } else {
        class("other", "no broker answered")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_differ_only_in_counters() {
        let a = "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused \
                 (after 0ms in state CONNECT)";
        let b = "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused \
                 (after 1ms in state CONNECT, 1 identical error(s) suppressed)";
        assert_eq!(without_counters(a), without_counters(b));
        assert_ne!(
            without_counters("1/1 brokers are down"),
            without_counters("a broker is down")
        );
    }

    #[test]
    fn a_coordinator_loading_at_start_up_is_info() {
        use RDKafkaLogLevel as L;
        // As librdkafka 2.12's rdkafka_idempotence.c writes it on a fresh broker.
        let loading = "Failed to acquire idempotence PID from broker 127.0.0.1:9092/1: Broker: \
                       Coordinator load in progress: retrying";
        assert!(matches!(shown_level(L::Warning, loading), L::Info));
        let moved = "Failed to acquire transactional PID from broker kafka-0:9092/0: Broker: \
                     Not coordinator: retrying";
        assert!(matches!(shown_level(L::Warning, moved), L::Info));
        // Other failures to get a PID (a refused ACL, a timeout) keep their level.
        let denied = "Failed to acquire idempotence PID from broker 127.0.0.1:9092/1: Broker: \
                      Cluster authorization failed: retrying";
        assert!(matches!(shown_level(L::Warning, denied), L::Warning));
        let timeout = "Failed to acquire idempotence PID from broker 127.0.0.1:9092/1: Local: \
                       Timed out: retrying";
        assert!(matches!(shown_level(L::Warning, timeout), L::Warning));
        assert!(matches!(shown_level(L::Error, loading), L::Error));
    }

    #[test]
    fn failures_are_classed() {
        let name = |f: &str| error_class(f).name;
        assert_eq!(
            name("Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms)"),
            "connection_refused"
        );
        assert_eq!(
            name("Failed to resolve 'kafka-0.internal:9092': Name or service not known"),
            "name_resolution"
        );
        assert_eq!(
            name("SSL handshake failed: error:0A000086:SSL routines::certificate verify failed"),
            "tls"
        );
        assert_eq!(
            name("SASL authentication error: Authentication failed"),
            "sasl"
        );
        assert_eq!(
            name("Connection setup timed out in state CONNECT"),
            "timeout"
        );
        assert_eq!(
            name("Disconnected while requesting ApiVersion: might be caused by incorrect security.protocol"),
            "disconnected"
        );
        assert_eq!(name("something else"), "other");
    }

    #[test]
    fn one_line_per_change_of_state() {
        let log = KafkaLog::new("kafka:9092");
        assert!(!log.is_unreachable());
        log.reachable(); // nothing to say
        log.log(
            RDKafkaLogLevel::Error,
            "FAIL",
            "kafka:9092/bootstrap: Connect to ipv4#10.0.0.1:9092 failed: Connection refused",
        );
        log.unreachable("no broker answered");
        assert!(log.is_unreachable());
        assert!(log
            .failure_text()
            .is_some_and(|t| t.starts_with("connection refused: nothing listens")));
        log.unreachable("again"); // already said
        assert!(log.is_unreachable());
        log.reachable();
        assert!(!log.is_unreachable());
        assert_eq!(log.failure_text(), None);
        assert!(Arc::ptr_eq(&KafkaLog::of("a:1"), &KafkaLog::of("a:1")));
        assert!(!Arc::ptr_eq(&KafkaLog::of("a:1"), &KafkaLog::of("b:1")));
    }
}
