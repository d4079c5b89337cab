//! The source server, as far as MariaDB and MySQL differ: [`Flavor`] (module [`flavor`]) is
//! the one place that decides per flavor. A leaf: it depends only on [`outbox_relay_core::position`].

pub mod flavor;

pub use flavor::Flavor;
