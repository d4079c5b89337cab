//! The one place the relay calls librdkafka's C API directly: a producer whose main queue
//! wakes a [`Notify`] when it becomes non-empty (`rd_kafka_queue_cb_event_enable`, librdkafka
//! `rdkafka.h`), so the pipeline can serve the queue on its own thread (see the parent module,
//! "Who serves librdkafka's queue"). rdkafka exposes no safe wrapper for it.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::producer::{BaseProducer, Producer};
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
        })
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

impl Drop for ServedProducer {
    fn drop(&mut self) {
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
