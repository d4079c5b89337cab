# outbox-relay: `make demo` runs the relay end to end; `make test` runs every test.
# Both start the local MariaDB and Kafka they need (tests/services/*.sh), installing them if missing.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: all build demo test lint fmt services-up services-down clean

all: build

build:
	$(CARGO) build --workspace

## The main job end to end: services, schema, relay, an order flow, the Kafka records, clean stop.
demo:
	tests/demo/demo.sh

## Every test (unit, and end-to-end against the real MariaDB and Kafka).
test: services-up
	$(CARGO) test --workspace --all-targets -- --nocapture --test-threads=4

## Formatting and lints, as CI runs them.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## Start MariaDB (127.0.0.1:$${MARIADB_PORT:-3306}) and Kafka (127.0.0.1:$${KAFKA_PORT:-9092}); idempotent.
services-up:
	tests/services/mariadb.sh up
	tests/services/kafka.sh up

services-down:
	tests/services/kafka.sh down
	tests/services/mariadb.sh down

clean: services-down
	rm -rf .services
	$(CARGO) clean
