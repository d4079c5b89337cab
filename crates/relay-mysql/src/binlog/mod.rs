//! The binlog, as a replica reads it: the dump stream from the server ([`source`]), MySQL's
//! compressed transaction payloads ([`compressed`]) and binlog files read directly
//! ([`replay`]: the `replay` command's reader and event source).

pub mod compressed;
#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod gtid_fixtures;
pub mod replay;
pub mod source;

use std::future::Future;

/// The table map event of [`EventSource::table_map`] (mysql_async's), for implementations
/// outside this crate.
pub use mysql_async::binlog::events::TableMapEvent;

use outbox_relay_core::error::RelayError;
use source::{BinlogSource, SourceEvent};

/// Where a run's binlog events come from.
pub trait EventSource {
    /// The next event. `Ok(None)`: the source has no more events (the end of the last binlog
    /// file); the run then waits for every acknowledgement and returns `Ok`. A live dump never
    /// ends this way.
    ///
    /// Must be cancel-safe: the run's select loop drops the future whenever another branch
    /// (an acknowledgement, a tick, a stop request) is ready first, and an event may only be
    /// consumed by a future that returns it.
    ///
    /// # Errors
    /// As the source's own reading method ([`BinlogSource::next`],
    /// [`crate::binlog::replay::ReplaySource::next_event`]).
    fn next_event(
        &mut self,
    ) -> impl Future<Output = Result<Option<SourceEvent>, RelayError>> + Send;

    /// The table map event for `table_id`, as last seen in this source.
    fn table_map(&self, table_id: u64) -> Option<&TableMapEvent<'static>>;
}

impl EventSource for BinlogSource {
    async fn next_event(&mut self) -> Result<Option<SourceEvent>, RelayError> {
        self.next().await.map(Some)
    }

    fn table_map(&self, table_id: u64) -> Option<&TableMapEvent<'static>> {
        BinlogSource::table_map(self, table_id)
    }
}
