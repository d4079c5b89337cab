//! [`RecordSink`] for the at-least-once [`KafkaSink`].

use std::future::Future;
use std::sync::Arc;

use super::KafkaSink;
use outbox_relay_core::error::RelayError;
use outbox_relay_core::sink::{
    DeadLetter, Delivered, Deliveries, FatalCause, Record, RecordSink, SendError,
};

impl RecordSink for KafkaSink {
    fn deliveries(&self) -> &Arc<Deliveries> {
        KafkaSink::deliveries(self)
    }
    fn serve(&self) {
        KafkaSink::serve(self);
    }
    fn events(&self) -> impl Future<Output = ()> + Send {
        KafkaSink::events(self)
    }
    fn fatal(&self) -> Option<(FatalCause, String)> {
        KafkaSink::fatal(self)
    }
    fn has_dead_letter(&self) -> bool {
        KafkaSink::has_dead_letter(self)
    }
    fn ensure_topic(&self, topic: &str) -> impl Future<Output = Result<bool, RelayError>> + Send {
        KafkaSink::ensure_topic(self, topic)
    }
    fn recheck_topic(&self, topic: &str) -> impl Future<Output = Result<bool, RelayError>> + Send {
        KafkaSink::recheck_topic(self, topic)
    }
    fn ensure_dead_letter_topic(&self) -> impl Future<Output = Result<(), RelayError>> + Send {
        KafkaSink::ensure_dead_letter_topic(self)
    }
    fn recheck_topic_limit(&self, record: &Record) -> impl Future<Output = bool> + Send {
        KafkaSink::recheck_topic_limit(self, record)
    }
    fn send(&self, record: &mut Record, seq: u64) -> Result<(), SendError> {
        KafkaSink::send(self, record, seq)
    }
    fn send_dead_letter(&self, dl: &DeadLetter, seq: u64) -> Result<(), SendError> {
        KafkaSink::send_dead_letter(self, dl, seq)
    }
    fn send_trial(
        &self,
        record: &Record,
    ) -> impl Future<Output = Result<Delivered, RelayError>> + Send {
        KafkaSink::send_trial(self, record)
    }
}
