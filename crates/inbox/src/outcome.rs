//! How a record was settled ([`Outcome`], [`Settled`]): what [`crate::Inbox::process`] returns,
//! the hooks and the runner are told, and the spans record. A leaf: it depends on no other
//! module of the crate, so `process` and `otel` both use it without depending on each other's
//! types.

/// How a record was settled. Every outcome lets its offset be committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The handler ran and its transaction (with the inbox row) committed.
    Processed,
    /// The inbox row existed: processed before; the handler did not run.
    Duplicate,
    /// Its version was not newer than the stored one; recorded, the handler did not run.
    Stale,
    /// A version gap with [`GapPolicy::Park`](crate::GapPolicy::Park): stored in the parked
    /// table, applied by itself later ([`Outcome::Resumed`]); the handler did not run.
    Parked,
    /// A parked record applied by itself once the version before it was: the handler ran and
    /// its transaction (inbox row, version, removal of the parked row) committed.
    Resumed,
    /// Failed `max_attempts` times and copied to the next retry tier's topic
    /// ([`InboxConfig::retry_tiers`](crate::InboxConfig::retry_tiers)); the copy is processed
    /// at its `retry_at`.
    Retried,
    /// Failed `max_attempts` times (or could never be processed): dead-lettered.
    DeadLettered,
    /// A parked record whose gap deadline passed, handed to
    /// [`Hooks::on_gap_expired`](crate::Hooks::on_gap_expired) (the compensation) instead of the
    /// dead-letter topic; its parked row was removed.
    Compensated,
}

impl Outcome {
    /// The contract's name: `processed`, `duplicate`, `stale`, `parked`, `resumed`,
    /// `retried`, `dead_lettered`, `compensated`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Processed => "processed",
            Outcome::Duplicate => "duplicate",
            Outcome::Stale => "stale",
            Outcome::Parked => "parked",
            Outcome::Resumed => "resumed",
            Outcome::Retried => "retried",
            Outcome::DeadLettered => "dead_lettered",
            Outcome::Compensated => "compensated",
        }
    }
}

/// The result of [`Inbox::process`](crate::Inbox::process).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// What happened.
    pub outcome: Outcome,
    /// Attempts counted: database transactions that reached a result or failed for the record
    /// or the handler (0 when the record was dead-lettered before any); those ended by an
    /// infrastructure error are not counted.
    pub attempts: u32,
    /// Why it was dead-lettered, parked or retried (the dead letter's `dlq_reason`, the copy's
    /// `retry_error`).
    pub reason: Option<String>,
}
