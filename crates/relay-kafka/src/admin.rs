//! The cluster as `check` sees it: an admin client on the relay's brokers ([`Admin`]) that
//! reads the metadata (brokers, topics) and the configurations of a broker or of topics
//! (DescribeConfigs), as plain values.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, ConfigResource, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;

use outbox_relay_core::config::KafkaConfig;

/// A resource's configuration entries, in the broker's order (`None`: a value not given, a
/// sensitive one).
#[derive(Debug, Clone, Default)]
pub struct Configs(Vec<(String, Option<String>)>);

impl Configs {
    /// The value of the first entry `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| v.as_deref())
    }

    fn of(r: &ConfigResource) -> Self {
        Self(
            r.entries
                .iter()
                .map(|e| (e.name.clone(), e.value.clone()))
                .collect(),
        )
    }
}

/// The cluster's metadata: its brokers' ids and its topics' names.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    /// The brokers' ids.
    pub brokers: Vec<i32>,
    /// The topics' names.
    pub topics: Vec<String>,
}

/// Why the metadata was not read.
#[derive(Debug, Clone)]
pub enum MetadataError {
    /// The brokers did not answer (the client's text).
    Kafka(String),
    /// The blocking task reading it failed (its text).
    Task(String),
}

/// An admin client with `[kafka.properties]` (security settings included) and
/// `bootstrap.servers`.
pub struct Admin(Arc<AdminClient<DefaultClientContext>>);

impl Admin {
    /// The client.
    ///
    /// # Errors
    /// Why the properties do not make a client, as text.
    pub fn new(kafka: &KafkaConfig) -> Result<Self, String> {
        let client = crate::sink::admin_client_config(kafka);
        client
            .create::<AdminClient<DefaultClientContext>>()
            .map(|a| Self(Arc::new(a)))
            .map_err(|e| e.to_string())
    }

    /// The brokers and topics, read on a blocking thread.
    ///
    /// # Errors
    /// [`MetadataError`].
    pub async fn cluster(&self, timeout: Duration) -> Result<Cluster, MetadataError> {
        let admin = Arc::clone(&self.0);
        let metadata = tokio::task::spawn_blocking(move || {
            admin
                .inner()
                .fetch_metadata(None, timeout)
                .map(|m| Cluster {
                    brokers: m.brokers().iter().map(|b| b.id()).collect::<Vec<_>>(),
                    topics: m
                        .topics()
                        .iter()
                        .map(|t| t.name().to_owned())
                        .collect::<Vec<_>>(),
                })
        })
        .await;
        match metadata {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(MetadataError::Kafka(e.to_string())),
            Err(e) => Err(MetadataError::Task(e.to_string())),
        }
    }

    /// The configuration of broker `id` (`None`: not readable).
    pub async fn broker_configs(&self, id: i32, timeout: Duration) -> Option<Configs> {
        let spec = ResourceSpecifier::Broker(id);
        let opts = AdminOptions::new().request_timeout(Some(timeout));
        match self.0.describe_configs([&spec], &opts).await {
            Ok(results) => results
                .into_iter()
                .find_map(Result::ok)
                .map(|r| Configs::of(&r)),
            Err(_) => None,
        }
    }

    /// The configurations of `topics`, one per topic in order (`None`: that one is not
    /// readable).
    ///
    /// `None` when the request got no answer at all.
    pub async fn topic_configs(
        &self,
        topics: &[&str],
        timeout: Duration,
    ) -> Option<Vec<Option<Configs>>> {
        let specs: Vec<ResourceSpecifier<'_>> =
            topics.iter().map(|t| ResourceSpecifier::Topic(t)).collect();
        let opts = AdminOptions::new().request_timeout(Some(timeout));
        match self.0.describe_configs(specs.iter(), &opts).await {
            Ok(results) => Some(
                results
                    .into_iter()
                    .map(|r| r.ok().map(|r| Configs::of(&r)))
                    .collect(),
            ),
            Err(_) => None,
        }
    }
}
