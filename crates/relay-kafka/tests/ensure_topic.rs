//! `KafkaSink::ensure_topic` against the test broker (`KAFKA_PORT`, default 9092): a topic
//! whose partitions have leaders is ready, and stays ready for the sink (the pipeline skips the
//! call for the records that follow on the strength of that answer).

use std::sync::Arc;
use std::time::Duration;

use outbox_relay_core::config::KafkaConfig;
use outbox_relay_core::observe::metrics::Metrics;
use outbox_relay_kafka::sink::KafkaSink;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

mod common;
use common::{bootstrap, unique_topic};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_with_leaders_is_ready_and_stays_ready() {
    let topic = unique_topic("ensure-topic");
    // The topic exists with a leader once a record is acknowledged in it.
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("producer");
    producer
        .send(
            FutureRecord::to(&topic).key("k").payload("v"),
            Duration::from_secs(60),
        )
        .await
        .expect("the test broker takes the record");

    let kafka = KafkaConfig {
        bootstrap_servers: bootstrap(),
        ..KafkaConfig::default()
    };
    let sink = KafkaSink::new(&kafka, None, Arc::new(Metrics::new())).expect("sink");
    assert_eq!(sink.ensure_topic(&topic).await.ok(), Some(true), "ready");
    assert_eq!(
        sink.ensure_topic(&topic).await.ok(),
        Some(true),
        "still ready: the sink remembers it"
    );
    assert_eq!(
        sink.recheck_topic(&topic).await.ok(),
        Some(true),
        "a recheck of a ready topic says ready too"
    );
}
