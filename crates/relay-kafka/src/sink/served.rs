//! The one place the relay calls librdkafka's C API directly (rdkafka exposes no safe
//! wrapper for either):
//! - a producer whose main queue wakes a [`Notify`] when it becomes non-empty
//!   (`rd_kafka_queue_cb_event_enable`, librdkafka `rdkafka.h`), so the pipeline can serve the
//!   queue on its own thread (see the parent module, "Who serves librdkafka's queue");
//! - [`ServedProducer::produce`], which hands a record's value to librdkafka without a copy and
//!   names its topic by a handle kept for the producer's life (`rd_kafka_producev` with
//!   `RD_KAFKA_MSG_F_FREE` and `RD_KAFKA_VTYPE_RKT`). rdkafka's `BaseProducer::send` copies
//!   every value (`RD_KAFKA_MSG_F_COPY`) and makes a C string of the topic for every record,
//!   which librdkafka then looks up under its handle's write lock: together about a seventh of
//!   the pipeline thread's CPU draining a backlog (issue 30's profile).
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CString};
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::bindings::rd_kafka_vtype_t::{
    RD_KAFKA_VTYPE_END, RD_KAFKA_VTYPE_HEADERS, RD_KAFKA_VTYPE_KEY, RD_KAFKA_VTYPE_MSGFLAGS,
    RD_KAFKA_VTYPE_OPAQUE, RD_KAFKA_VTYPE_PARTITION, RD_KAFKA_VTYPE_RKT, RD_KAFKA_VTYPE_TIMESTAMP,
    RD_KAFKA_VTYPE_VALUE,
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::util::IntoOpaque;
use tokio::sync::Notify;

use super::RelayKafkaContext;
use outbox_relay_core::error::RelayError;

/// A producer whose main queue wakes a [`Notify`] when it becomes non-empty.
pub(super) struct ServedProducer {
    pub(super) producer: BaseProducer<RelayKafkaContext>,
    /// librdkafka's main queue of `producer` (our own reference, released in `drop`).
    queue: NonNull<rdsys::rd_kafka_queue_t>,
    /// Woken by librdkafka; registered as the callback's opaque (`Arc::into_raw`), reclaimed in
    /// `drop` after the callback is disabled.
    wake: NonNull<Notify>,
    /// librdkafka's topic handles of the topics produced to, ours until `drop`.
    topics: Mutex<TopicHandles>,
}

/// The topic handles a [`ServedProducer`] made (`rd_kafka_topic_new`), by topic name.
#[derive(Default)]
struct TopicHandles {
    /// The topic of the last record and its handle: most records go where the one before
    /// went, and a pointer comparison finds them without hashing the name.
    last: Option<(Arc<str>, NonNull<rdsys::rd_kafka_topic_t>)>,
    all: HashMap<Arc<str>, NonNull<rdsys::rd_kafka_topic_t>>,
}

/// A record for [`ServedProducer::produce`], all borrowed but its value.
pub(super) struct Produce<'a> {
    /// Destination topic.
    pub topic: &'a Arc<str>,
    /// Explicit partition; `None` lets the partitioner hash the key.
    pub partition: Option<i32>,
    /// Record key.
    pub key: &'a [u8],
    /// Record timestamp (`CreateTime`), ms since the Unix epoch.
    pub timestamp_ms: i64,
    /// Headers in order (a `None` value is a header with a null value).
    pub headers: &'a [(Arc<str>, Option<Vec<u8>>)],
    /// One more header after `headers` (the timestamp fallback).
    pub extra_header: Option<(&'a str, &'a [u8])>,
    /// The delivery report's opaque (the sequence number).
    pub opaque: usize,
}

// SAFETY: the queue handle is only used through librdkafka calls, which lock the queue; the
// Notify is Sync. The producer itself is Send + Sync.
unsafe impl Send for ServedProducer {}
unsafe impl Sync for ServedProducer {}

/// librdkafka's queue event callback: the main queue just became non-empty. Runs on a
/// librdkafka thread with the queue locked: it only wakes the waiter.
unsafe extern "C" fn queue_nonempty(_rk: *mut rdsys::rd_kafka_t, opaque: *mut c_void) {
    // SAFETY: `opaque` is the `Notify` registered in `ServedProducer::new`, alive until the
    // callback is disabled in `drop`.
    if let Some(wake) = unsafe { opaque.cast::<Notify>().as_ref() } {
        wake.notify_one();
    }
}

impl ServedProducer {
    /// Takes `producer` and registers the wake-up on its main queue.
    ///
    /// # Errors
    /// [`RelayError::Kafka`] when librdkafka has no main queue (cannot happen for a producer).
    pub(super) fn new(producer: BaseProducer<RelayKafkaContext>) -> Result<Self, RelayError> {
        // SAFETY: a valid client handle; the returned queue reference is ours to destroy.
        let queue = unsafe { rdsys::rd_kafka_queue_get_main(producer.client().native_ptr()) };
        let queue =
            NonNull::new(queue).ok_or_else(|| RelayError::kafka("librdkafka has no main queue"))?;
        // A raw Arc pointer, so the callback reaches it without a lock (never null).
        let wake = NonNull::new(Arc::into_raw(Arc::new(Notify::new())).cast_mut())
            .ok_or_else(|| RelayError::kafka("allocation failed"))?;
        // SAFETY: `wake` stays valid until `drop` disables the callback.
        unsafe {
            rdsys::rd_kafka_queue_cb_event_enable(
                queue.as_ptr(),
                Some(queue_nonempty),
                wake.as_ptr().cast::<c_void>(),
            );
        }
        Ok(Self {
            producer,
            queue,
            wake,
            topics: Mutex::default(),
        })
    }

    /// Enqueues `record` with the value in `value`, which librdkafka then owns: on success
    /// `value` is `None`, and librdkafka frees the buffer with `free(3)` once the record's
    /// delivery report was served (`RD_KAFKA_MSG_F_FREE`, librdkafka `rdkafka.h`,
    /// `rd_kafka_produce`). On an error nothing was enqueued and `value` is as it was.
    ///
    /// Why `free(3)` may free a Rust buffer: the relay's binaries use either the system
    /// allocator, whose Rust allocations of bytes are `malloc(3)`'s, or mimalloc built with
    /// `override` (the workspace's Cargo.toml), whose `free(3)` is mimalloc's (the CLI's test
    /// `librdkafka_frees_what_the_global_allocator_allocated` proves it). An empty value is
    /// copied: an empty `Vec` owns no allocation.
    ///
    /// # Errors
    /// librdkafka's error for the record ([`KafkaError::MessageProduction`]: a full queue, a
    /// record too large, a partition the topic does not have, a fatal producer error), or
    /// [`KafkaError::Nul`] for a topic name librdkafka cannot take (a NUL byte).
    pub(super) fn produce(
        &self,
        record: &Produce<'_>,
        value: &mut Option<Vec<u8>>,
    ) -> Result<(), KafkaError> {
        let rkt = self.topic_handle(record.topic)?;
        let headers = raw_headers(record.headers, record.extra_header);
        // The value's buffer, lent to librdkafka: reclaimed below if it refuses the record.
        let lent = value.take_if(|v| v.capacity() > 0).map(ManuallyDrop::new);
        let (payload, len, flags) = match (&lent, value.as_ref()) {
            (Some(v), _) => (v.as_ptr(), v.len(), rdsys::RD_KAFKA_MSG_F_FREE),
            (None, Some(empty)) => (empty.as_ptr(), 0, rdsys::RD_KAFKA_MSG_F_COPY),
            (None, None) => (std::ptr::null(), 0, rdsys::RD_KAFKA_MSG_F_COPY),
        };
        // SAFETY: every pointer is valid for the call; librdkafka copies the key and the
        // headers' contents, takes the headers list and (F_FREE) the value's buffer only on
        // success, and keeps its own reference to the topic handle. Arguments are passed with
        // the C types `rd_kafka_producev` reads (`rdkafka_msg.c`), as rdkafka's own call does.
        let err = unsafe {
            rdsys::rd_kafka_producev(
                self.producer.client().native_ptr(),
                RD_KAFKA_VTYPE_RKT,
                rkt.as_ptr(),
                RD_KAFKA_VTYPE_PARTITION,
                record.partition.unwrap_or(-1),
                RD_KAFKA_VTYPE_MSGFLAGS,
                flags,
                RD_KAFKA_VTYPE_VALUE,
                payload.cast_mut().cast::<c_void>(),
                len,
                RD_KAFKA_VTYPE_KEY,
                record.key.as_ptr().cast_mut().cast::<c_void>(),
                record.key.len(),
                RD_KAFKA_VTYPE_OPAQUE,
                record.opaque.into_ptr(),
                RD_KAFKA_VTYPE_TIMESTAMP,
                record.timestamp_ms,
                RD_KAFKA_VTYPE_HEADERS,
                headers,
                RD_KAFKA_VTYPE_END,
            )
        };
        if err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Ok(());
        }
        // Refused: the headers and the value are still ours.
        if !headers.is_null() {
            // SAFETY: made by `raw_headers`, not taken by librdkafka.
            unsafe { rdsys::rd_kafka_headers_destroy(headers) };
        }
        if let Some(v) = lent {
            *value = Some(ManuallyDrop::into_inner(v));
        }
        Err(KafkaError::MessageProduction(RDKafkaErrorCode::from(err)))
    }

    /// The handle of `topic`, made at its first record.
    fn topic_handle(
        &self,
        topic: &Arc<str>,
    ) -> Result<NonNull<rdsys::rd_kafka_topic_t>, KafkaError> {
        let mut handles = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((last, rkt)) = &handles.last {
            if Arc::ptr_eq(last, topic) {
                return Ok(*rkt);
            }
        }
        let rkt = match handles.all.get(topic) {
            Some(rkt) => *rkt,
            None => {
                let name = CString::new(topic.as_bytes())?;
                // SAFETY: a valid client handle and C string; the handle is ours to destroy
                // (in `drop`). Without a topic configuration librdkafka uses the producer's,
                // as it does for a record named by its topic.
                let rkt = unsafe {
                    rdsys::rd_kafka_topic_new(
                        self.producer.client().native_ptr(),
                        name.as_ptr(),
                        std::ptr::null_mut(),
                    )
                };
                let rkt = NonNull::new(rkt).ok_or_else(|| {
                    // SAFETY: reads librdkafka's thread-local last error.
                    KafkaError::MessageProduction(RDKafkaErrorCode::from(unsafe {
                        rdsys::rd_kafka_last_error()
                    }))
                })?;
                handles.all.insert(Arc::clone(topic), rkt);
                rkt
            }
        };
        handles.last = Some((Arc::clone(topic), rkt));
        Ok(rkt)
    }

    /// The Notify librdkafka wakes.
    pub(super) fn wake(&self) -> &Notify {
        // SAFETY: reclaimed only in `drop`.
        unsafe { self.wake.as_ref() }
    }

    /// Serves the main queue until it is empty (at most `limit` events); returns the events
    /// served.
    pub(super) fn serve(&self, limit: usize) -> usize {
        let mut served = 0;
        // SAFETY: our queue reference is valid until `drop`.
        while served < limit && unsafe { rdsys::rd_kafka_queue_length(self.queue.as_ptr()) } > 0 {
            // One event per call with a zero timeout (a delivery report event carries a batch).
            self.producer.poll(Duration::ZERO);
            served += 1;
        }
        served
    }
}

/// librdkafka's headers list of `headers` then `extra`, or null when there are none (the
/// caller's until librdkafka takes it). Values are copied; a `None` value is a null header.
fn raw_headers(
    headers: &[(Arc<str>, Option<Vec<u8>>)],
    extra: Option<(&str, &[u8])>,
) -> *mut rdsys::rd_kafka_headers_t {
    let count = headers.len() + usize::from(extra.is_some());
    if count == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: a new list of our own.
    let list = unsafe { rdsys::rd_kafka_headers_new(count) };
    let all = headers
        .iter()
        .map(|(name, value)| (&**name, value.as_deref()))
        .chain(extra.map(|(name, value)| (name, Some(value))));
    for (name, value) in all {
        let (value, len) = value.map_or((std::ptr::null(), 0), |v| (v.as_ptr(), v.len()));
        // SAFETY: `list` is ours and writable; name and value are copied. Lengths of Rust
        // slices fit an isize. It fails only for a read-only list, which this is not (as
        // rdkafka's `OwnedHeaders::insert` assumes).
        unsafe {
            rdsys::rd_kafka_header_add(
                list,
                name.as_ptr().cast::<c_char>(),
                name.len() as isize,
                value.cast::<c_void>(),
                len as isize,
            );
        }
    }
    list
}

impl Drop for ServedProducer {
    fn drop(&mut self) {
        let handles = std::mem::take(self.topics.get_mut().unwrap_or_else(|p| p.into_inner()));
        for rkt in handles.all.into_values() {
            // SAFETY: made by `topic_handle`, released once; librdkafka keeps the topic for
            // records still queued (they hold their own reference).
            unsafe { rdsys::rd_kafka_topic_destroy(rkt.as_ptr()) };
        }
        // SAFETY: disable the callback before its opaque is freed (librdkafka calls it with the
        // queue locked, and this call takes the same lock); then release our queue reference
        // and the Notify. The producer itself is dropped after this (purge, flush).
        unsafe {
            rdsys::rd_kafka_queue_cb_event_enable(self.queue.as_ptr(), None, std::ptr::null_mut());
            rdsys::rd_kafka_queue_destroy(self.queue.as_ptr());
            drop(Arc::from_raw(self.wake.as_ptr().cast_const()));
        }
    }
}
