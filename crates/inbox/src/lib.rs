//! The consumer half of the outbox pattern: an **inbox**.
//!
//! The relay delivers every committed outbox row at least once. A consumer built on this crate
//! records "consumer C processed `event_key` K" in the same database transaction as its business
//! change, before the change; a second delivery of K finds the record and is acknowledged
//! without running the handler. The contract (the same in the Rust, Java, Go and Python helpers)
//! is `inbox/CONTRACT.md`; the tables are `migrations/0004_inbox.sql`.
//!
//! ```no_run
//! use outbox_inbox::{Handler, HandlerError, Inbox, InboxConfig, InboxConsumer, InboxRecord};
//! use mysql_async::prelude::Queryable;
//!
//! struct GrantCoupon;
//! impl Handler for GrantCoupon {
//!     async fn handle(
//!         &self,
//!         tx: &mut mysql_async::Transaction<'_>,
//!         record: &InboxRecord,
//!     ) -> Result<(), HandlerError> {
//!         let order = record.key_str().unwrap_or_default().to_owned();
//!         tx.exec_drop("INSERT INTO coupons (order_id) VALUES (?)", (order,)).await?;
//!         Ok(())
//!     }
//! }
//!
//! # async fn run() -> Result<(), outbox_inbox::InboxError> {
//! let pool = mysql_async::Pool::new("mysql://app@127.0.0.1:3306/fulfilment");
//! let config = InboxConfig::new("fulfilment", "fulfilment.dead_letter");
//! let inbox = Inbox::new(pool, config, "127.0.0.1:9092")?;
//! let consumer = InboxConsumer::new("127.0.0.1:9092", &["outbox.event.order"], inbox, GrantCoupon)?;
//! consumer.run(async { tokio::signal::ctrl_c().await.ok(); }).await
//! # }
//! ```

mod config;
mod consumer;
mod dead_letter;
mod error;
pub mod otel;
mod process;
mod record;

pub use config::{GapPolicy, InboxConfig};
pub use consumer::InboxConsumer;
pub use error::{HandlerError, InboxError};
pub use process::{Handler, Hooks, Inbox, NoHooks, Outcome, Settled};
pub use record::InboxRecord;
