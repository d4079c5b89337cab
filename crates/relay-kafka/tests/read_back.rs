//! `kafka::sink::ReadBack` against the test broker (`KAFKA_PORT`, default 9092): a record
//! produced and acknowledged is proven at its offset; an offset the log does not hold (past
//! the partition's end, as for an acknowledgement the broker did not keep) is reported not
//! stored; a partition counts as new once per process until a failed read-back forgets it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_relay_core::config::KafkaConfig;
use outbox_relay_kafka::sink::{ReadBack, ReadBackRequest, ReadBackResult};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

mod common;
use common::{bootstrap, unique_topic};

/// Waits for the result of `seq`.
async fn result_of(read_back: &ReadBack, seq: u64) -> ReadBackResult {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut got = Vec::new();
    loop {
        read_back.take(&mut got);
        if let Some(i) = got.iter().position(|(r, _)| r.seq == seq) {
            return got.swap_remove(i);
        }
        assert!(Instant::now() < deadline, "no read-back result for {seq}");
        let _ = tokio::time::timeout(Duration::from_millis(500), read_back.ready()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_record_is_proven_and_a_missing_offset_is_not() {
    let topic: Arc<str> = Arc::from(unique_topic("readback").as_str());
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    let mut offsets = Vec::new();
    for i in 0..3 {
        let delivery = producer
            .send(
                FutureRecord::to(&topic).key("k").payload(&format!("v{i}")),
                Duration::from_secs(60),
            )
            .await
            .expect("the test broker takes the record");
        offsets.push((delivery.partition, delivery.offset));
    }
    let (partition, last) = offsets[2];

    let kafka = KafkaConfig {
        bootstrap_servers: bootstrap(),
        ..KafkaConfig::default()
    };
    let metrics = Arc::new(outbox_relay_core::observe::metrics::Metrics::new());
    let read_back = ReadBack::start(&kafka, Arc::clone(&metrics));
    assert!(read_back.needs_proof(&topic, partition), "a new partition");
    assert!(
        !read_back.needs_proof(&topic, partition),
        "proven once per process"
    );

    read_back.request(ReadBackRequest {
        seq: 1,
        topic: Arc::clone(&topic),
        partition,
        offset: offsets[1].1,
    });
    let (_, verdict) = result_of(&read_back, 1).await;
    assert_eq!(verdict, Ok(()), "an acknowledged record is in the log");

    // An acknowledgement the log does not bear out: the offset after the last record.
    read_back.request(ReadBackRequest {
        seq: 2,
        topic: Arc::clone(&topic),
        partition,
        offset: last + 1,
    });
    let (_, verdict) = result_of(&read_back, 2).await;
    let why = verdict.expect_err("an offset past the end is not stored");
    assert!(why.contains("ends before that offset"), "{why}");

    read_back.forget(&topic, partition);
    assert!(
        read_back.needs_proof(&topic, partition),
        "after a failed read-back the partition is proven again"
    );
    let text = metrics.render();
    for line in [
        "outbox_relay_read_backs_total{result=\"stored\"} 1\n",
        "outbox_relay_read_backs_total{result=\"missing\"} 1\n",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}
