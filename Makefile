# outbox-relay: `make demo` runs the relay end to end; `make test` runs every test.
# Both start the local servers and Kafka they need (tests/services/*.sh), installing them if missing.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: all build release demo demo-inbox test lint docs docs-lint docs-capture helm-lint prometheus-lint fmt services-up services-down clean bench fuzz inbox config-reference

all: build

build:
	$(CARGO) build --workspace

## The release binary (target/release/outbox-relay), built exactly as docker/Dockerfile builds it.
release:
	$(CARGO) build --release --locked -p outbox-relay

## The main job end to end: services, schema, relay, an order flow, the Kafka records, clean stop.
demo:
	tests/demo/demo.sh

## The consumer half end to end: the relay produces order events, a fulfilment consumer on the
## Rust inbox helper grants coupons, crashes after a database commit, restarts, meets a duplicate
## delivery; every order has one coupon (docs/src/consumers/inbox.md).
demo-inbox:
	tests/demo/inbox-demo.sh

## Every test: the unit tests, then every end-to-end suite against each server in
## OUTBOX_TEST_SERVERS (default mariadb10,mariadb11,mysql8) and the real Kafka, the README's
## quick start as written (tests/quickstart.sh), the inbox helpers' suites (tests/run.sh;
## cargo --no-fail-fast, a summary at the end). One server: OUTBOX_TEST_SERVERS=mysql8 make test.
test: services-up inbox
	$(CARGO) build --workspace --all-targets
	tests/run.sh

## Formatting and lints, as CI runs them: Rust (rustfmt, clippy), the consumer helpers in
## inbox/ (Go: gofmt, go vet, staticcheck; Python: ruff format, ruff check; Java: Spotless
## with google-java-format, javac -Xlint -Werror), the Helm chart (helm-lint), the Prometheus
## alert rules (prometheus-lint), the configuration reference (config-reference) and the book
## (docs-lint).
lint: inbox helm-lint prometheus-lint docs-lint
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) test -q -p outbox-relay-core --test config_reference
	cd inbox/go && test -z "$$(gofmt -l .)" && go vet ./... && go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	cd inbox/python && .venv/bin/ruff format --check . && .venv/bin/ruff check .
	cd inbox/java && mvn -q -B spotless:check

## The configuration reference, docs/src/reference/configuration.md, generated from the
## configuration types (their doc comments, types, defaults, values and ranges) by the hidden
## `outbox-relay config-reference`. `make lint` (crates/relay-core/tests/config_reference.rs)
## fails when the committed file differs, a key lacks a doc comment, or an example in the README
## or docs/src uses a key the reference does not list.
config-reference:
	$(CARGO) run -q -p outbox-relay -- config-reference > docs/src/reference/configuration.md

## The documentation book (docs/, mdBook) into docs/book/ (git-ignored; open docs/book/index.html).
## mdBook is pinned and built once per machine from crates.io into ~/.cache/outbox-relay/tools by docs/install-mdbook.sh (a few
## minutes the first time).
docs:
	@set -euo pipefail; mdbook="$$(docs/install-mdbook.sh)"; "$$mdbook" build docs

## The book built, then every internal link checked (docs/linkcheck.py over the built HTML: pages,
## #anchors, links to this repository's files, and README.md's links into docs/).
docs-lint: docs
	docs/linkcheck.py docs/book

## Every command output the book shows, captured again from a run against the test servers
## (docs/capture.sh: MariaDB 10.11 and Kafka, started if needed) and written into the pages'
## <!-- capture:NAME --> blocks; what varies run to run is normalized as docs/capture.sh says.
docs-capture:
	docs/capture.sh

## The Prometheus alert rules in deploy/prometheus: promtool (pinned; built once from the Go module
## proxy into .tools/bin by deploy/prometheus/install-promtool.sh, several minutes) `check rules`
## on every rule file and `test rules` on every unit test in deploy/prometheus/tests.
prometheus-lint:
	@set -euo pipefail; promtool="$$(deploy/prometheus/install-promtool.sh)"; \
	"$$promtool" check rules deploy/prometheus/*-alerts.yaml; \
	"$$promtool" test rules deploy/prometheus/tests/*.test.yaml

## The Helm chart deploy/helm/outbox-relay, without a cluster: helm (pinned; built once from the
## Go module proxy into .tools/bin by deploy/helm/install-helm.sh, a few minutes), `helm lint
## --strict` with the default values and each deploy/helm/examples/*-values.yaml, `helm template`
## of each with every rendered relay.toml parsed as TOML (deploy/helm/check-rendered.py), and
## values the chart must refuse (duplicate or empty source names, [http] in a source, fleet
## without sources, http.enabled = false, mysql.server_id in a fleet).
HELM_CHART := deploy/helm/outbox-relay
HELM_EXAMPLES := $(sort $(wildcard deploy/helm/examples/*-values.yaml))
helm-lint:
	@set -euo pipefail; helm="$$(deploy/helm/install-helm.sh)"; \
	"$$helm" lint --strict --quiet $(HELM_CHART); \
	for f in $(HELM_EXAMPLES); do "$$helm" lint --strict --quiet $(HELM_CHART) -f "$$f"; done; \
	"$$helm" template outbox-relay $(HELM_CHART) | deploy/helm/check-rendered.py "default values"; \
	for f in $(HELM_EXAMPLES); do "$$helm" template outbox-relay $(HELM_CHART) -f "$$f" | deploy/helm/check-rendered.py "$$f"; done; \
	for bad in 'sources=[{"name":"a"},{"name":"a"}]' 'sources=[{"name":""}]' 'sources=[{"mysql":{}}]' \
	    'sources=[{"name":"a","http":{}}]' 'sources=[{"name":"a","connector_name":"b"}]' 'fleet={"enabled":true}' 'config.shared.http={"enabled":false}'; do \
	  if "$$helm" template outbox-relay $(HELM_CHART) --set-json "$$bad" >/dev/null 2>&1; then \
	    echo "helm-lint: the chart accepted $$bad" >&2; exit 1; fi; \
	done; \
	if "$$helm" template outbox-relay $(HELM_CHART) --set fleet.enabled=true \
	    --set-json 'sources=[{"name":"a","mysql":{"server_id":5}}]' >/dev/null 2>&1; then \
	  echo "helm-lint: the chart accepted a server_id in a fleet's source" >&2; exit 1; fi; \
	echo "helm-lint: OK (helm $$("$$helm" version --template '{{.Version}}'))"

## The consumer helpers (inbox/CONTRACT.md) and their scenario consumers, as the tests run them:
## Python in a venv (inbox/python/.venv), Go (inbox/go/bin/scenario-consumer), Java (mvn package
## and the classpath inbox/java/run-scenario-consumer reads), Rust (crates/inbox's example).
inbox:
	[ -x inbox/python/.venv/bin/python ] || python3 -m venv inbox/python/.venv
	inbox/python/.venv/bin/pip install -q -e 'inbox/python[dev]'
	cd inbox/go && go build -o bin/scenario-consumer ./cmd/scenario-consumer
	cd inbox/java && mvn -q -B package -DskipTests
	$(CARGO) build -p outbox-inbox --examples

fmt:
	$(CARGO) fmt --all

## Start the servers in OUTBOX_TEST_SERVERS (MariaDB 10.11 on 127.0.0.1:$${MARIADB_PORT:-3306},
## MariaDB 11.4 on $${MARIADB11_PORT:-3316}, MySQL 8.0 on $${MYSQL8_PORT:-3326}), Kafka
## (127.0.0.1:$${KAFKA_PORT:-9092}) and Jaeger (OTLP/HTTP $${JAEGER_OTLP_HTTP_PORT:-4318}, query API
## $${JAEGER_QUERY_PORT:-16686}; built with Go on first use); idempotent. Logs: .services/<server>/*.log.
services-up:
	tests/services/up.sh

## Stop every server and broker the scripts and tests started (tests/services/down.sh), also the
## private ones a killed test run may have left running (.services/private/).
services-down:
	tests/services/down.sh

clean: services-down
	rm -rf .services
	$(CARGO) clean

## Fault matrix: the relay under a concurrent workload while kill -9, broker restarts, database
## server restarts and connection cuts are injected (crates/testkit/src/faults), against the server
## OUTBOX_TEST_SERVER names (mariadb10 by default, mariadb11, mysql8). It RESTARTS that server (on
## MARIADB_PORT / MARIADB11_PORT / MYSQL8_PORT) and Kafka (KAFKA_PORT) through tests/services/*.sh:
## run it when no other test uses them (or point it at private ports that no test uses either:
## MYSQL8_PORT=3446 KAFKA_PORT=9642 KAFKA_CONTROLLER_PORT=9643
## OUTBOX_SERVICES_DIR=$$PWD/.services/faults OUTBOX_TEST_SERVER=mysql8
## OUTBOX_TEST_SERVERS=mysql8 make faults). Prints a table ending with `missing: N duplicates: M`;
## fails when anything committed is missing or out of order.
## `faults`: 8 kills, 3 cuts, 2 broker and 2 server restarts (~3 min); `faults-full`: 100 kills, 20 broker
## restarts, 10 server restarts, 10 cuts (~15-20 min). Extra options: FAULTS_ARGS="--seed 42";
## FAULTS_ARGS=--exactly-once runs the relay with kafka.delivery = "exactly_once", reads the topics
## read_committed and fails on any duplicate too.
## Optional conformance checks (not part of `make test`): the relay's binlog reading against real
## binlog files of servers this machine cannot run (MySQL 8.4/9.x tagged GTIDs, ...), in the folder
## OUTBOX_CONFORMANCE_BINLOGS names (the layout of mysql_common's test-data/binlogs). Fails, saying
## so, when the variable is unset or the folder or a file is missing.
.PHONY: conformance
conformance:
	$(CARGO) run -q -p outbox-relay-testkit --bin conformance

## Soak (not part of `make test`): the fault matrix's harness for SOAK_MINUTES (default 60) of
## continuous writes, with rounds of kill -9, broker and server restarts, connection cuts,
## half-open connections and CPU starvation, a new auto-created topic after every fault, and the
## acknowledgement audit on (every acknowledged offset read back at the end). Same environment
## as `faults` (run it on private ports: it restarts the servers); FAULTS_ARGS=--exactly-once too.
.PHONY: soak
soak: export OUTBOX_JAEGER = off
soak: services-up
	$(CARGO) build -p outbox-relay --bin outbox-relay
	$(CARGO) run -p outbox-relay-testkit --bin faults -- --profile soak $(FAULTS_ARGS)

.PHONY: faults faults-full
# No Jaeger for the fault matrix (passed on to services-up).
faults faults-full: export OUTBOX_JAEGER = off
faults: services-up
	$(CARGO) build -p outbox-relay --bin outbox-relay
	$(CARGO) run -p outbox-relay-testkit --bin faults -- --profile short $(FAULTS_ARGS)

faults-full: services-up
	$(CARGO) build -p outbox-relay --bin outbox-relay
	$(CARGO) run -p outbox-relay-testkit --bin faults -- --profile full $(FAULTS_ARGS)

## Fleet fault profile (not part of `make test`; ~20-30 min): three relay processes sharing 12
## sources (4 on each of MariaDB 10.11, MariaDB 11.4 and MySQL 8.0) through a Kafka group
## (`[fleet]`), under writes on every source, with seeded kill -9 and SIGSTOP (past the lease TTL
## plus the session timeout) of processes, broker restarts and a restart of each server; then
## every source's outbox table compared with Kafka (crates/testkit/src/faults/fleet.rs). Runs
## twice: at-least-once (0 missing), then exactly-once (0 missing, 0 duplicates read_committed).
## Its servers and broker are private (ports 3406/3416/3426 and 9652-9653, data in
## .services/private/fleet-faults, stopped at the end), so it never restarts the suite's
## services. Extra options: FAULTS_ARGS="--seed 42" (passed to both runs).
FLEET_FAULTS_ENV = MARIADB_PORT=3406 MARIADB11_PORT=3416 MYSQL8_PORT=3426 KAFKA_PORT=9652 \
	KAFKA_CONTROLLER_PORT=9653 OUTBOX_SERVICES_DIR=$(CURDIR)/.services/private/fleet-faults \
	KAFKA_LIBS_DIR=$(CURDIR)/.services/kafka-libs-$${KAFKA_VERSION:-4.1.1} OUTBOX_JAEGER=off
.PHONY: faults-fleet
faults-fleet:
	$(CARGO) build -p outbox-relay --bin outbox-relay
	$(CARGO) build -p outbox-relay-testkit --bin fleet_faults
	@status=0; \
	$(FLEET_FAULTS_ENV) $(CARGO) run -q -p outbox-relay-testkit --bin fleet_faults -- $(FAULTS_ARGS) || status=1; \
	$(FLEET_FAULTS_ENV) $(CARGO) run -q -p outbox-relay-testkit --bin fleet_faults -- --exactly-once $(FAULTS_ARGS) || status=1; \
	$(FLEET_FAULTS_ENV) tests/services/down.sh >/dev/null 2>&1 || true; \
	exit $$status

## Benchmark (not part of `make test`): backlog drain and steady-state latency of the relay, side
## by side with the machine's limit, a polling relay and Debezium (tests/bench/bench.sh,
## crates/bench), once per server in BENCH_SERVERS (default mariadb10,mysql8: MariaDB 10.11 and
## MySQL 8.0; also mariadb11), each started if needed (and Kafka). Writes
## tests/bench/results/{latest.json,latest.md,latency-<server>.png} (figures per server) and the
## bench section of docs/src/benchmark.md. Defaults: 1,000,000 rows, 60 s per rate; smaller: BENCH_ROWS=100000
## BENCH_STEADY_SECS=15 make bench; one server: BENCH_SERVERS=mysql8 make bench. Takes ~25 min
## per server at the defaults; run it on a quiet machine.
bench: inbox
	tests/bench/bench.sh
	tests/bench/inbox-bench.sh

## Many idle sources in one process (also a step of `make bench`): start time and resident
## memory of BENCH_SOURCES (100) sources against one, on OUTBOX_TEST_SERVER's server
## (crates/bench/src/sources.rs; docs/src/benchmark.md, "Many sources in one process").
.PHONY: bench-sources
bench-sources: services-up
	$(CARGO) build --release -p outbox-relay -p outbox-relay-bench
	target/release/outbox-relay-bench sources

## Every shared inbox scenario in batch mode (tests/inbox_e2e.rs, batch_mode_*), four languages, on
## MariaDB 10.11 and MySQL 8.0; `make test` runs six of the ten (the rebalance, gap-expiry and
## retry-tier ones only here, for CI time). About 6 minutes.
.PHONY: test-inbox-batch
test-inbox-batch: services-up inbox
	for server in mariadb10 mysql8; do \
	  OUTBOX_TEST_SERVER=$$server $(CARGO) test -p outbox-relay-e2e --test inbox_e2e -- batch_mode_ || exit 1; \
	done

## The latency budget per stage (not part of `make bench`, about 20 minutes): steady runs of the
## relay in both delivery modes with a bare replica and a bare producer on the same rows, on a
## fresh private broker, per server of BENCH_SERVERS (mariadb10,mysql8); BENCH_REF_COMMIT=<commit>
## adds that build side by side (tests/bench/budget.sh; docs/src/benchmark.md, "Latency budget").
.PHONY: bench-budget
bench-budget: services-up
	tests/bench/budget.sh

## Instructions per row by thread (not part of `make bench`, about a minute per server): a
## BENCH_ROWS (100000) row drain under callgrind, per server of BENCH_SERVERS; BENCH_REF_BIN=<an
## older outbox-relay binary> counts that build too. Run-to-run noise is under 1 %, where a drain's
## rows/s vary by a third (tests/bench/instructions.sh; docs/src/benchmark.md, "Instructions per
## row").
.PHONY: bench-instructions
bench-instructions: services-up
	tests/bench/instructions.sh

## The inbox's cost alone (also the last step of `make bench`): each helper's scenario consumer
## with and without the inbox on the same BENCH_INBOX_RECORDS (20000) records of one partition
## (tests/bench/inbox-bench.sh; docs/src/benchmark.md, "The inbox's cost").
.PHONY: bench-inbox
bench-inbox: inbox
	tests/bench/inbox-bench.sh

## Fuzzing (not part of `make test`; needs a nightly toolchain, installs cargo-fuzz): every
## cargo-fuzz target of fuzz/ for FUZZ_SECONDS each (default 600), one after another on one
## core, then a table of executions and crashes per target; fails when one crashed.
## A subset: FUZZ_TARGETS="rows_event ddl_parse" FUZZ_SECONDS=60 make fuzz.
fuzz:
	fuzz/run.sh
