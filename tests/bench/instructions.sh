#!/usr/bin/env bash
# `make bench-instructions`: the instructions the relay executes per row draining a backlog, by
# thread, counted by callgrind (valgrind) in a drain of BENCH_ROWS rows (default 100000) per
# server of BENCH_SERVERS (default mariadb10,mysql8). With BENCH_REF_BIN=<another outbox-relay
# binary>, that build is counted right after, on the same rows' workload, for a side-by-side.
#
# Why: on the shared bench machine a drain's rows/s and CPU seconds vary by a third from one run
# to the next (docs/src/benchmark.md), so a change of a few percent in the relay's cost per row
# cannot be seen in them. An instruction count is the same from run to run within about 1 %.
# It is not a rate: callgrind runs one thread at a time and does not count cache misses,
# atomics' cost or waiting, so the drain rates of `make bench` stay the measure of the targets.
#
# Prints, per server and build, instructions per row of the pipeline thread (route, produce,
# acknowledge, checkpoint), the binlog reader thread (read, decode), librdkafka's threads and
# the rest, and leaves callgrind's files in target/bench-instructions/<server>-<build>/ for
# callgrind_annotate. Takes about a minute per server and build.
source "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
apt_install valgrind
tests/services/kafka.sh up
rows="${BENCH_ROWS:-100000}"
out_root="$REPO_ROOT/target/bench-instructions"
builds=("relay=$REPO_ROOT/target/release/outbox-relay")
if [ -n "${BENCH_REF_BIN:-}" ]; then
  [ -x "$BENCH_REF_BIN" ] || die "BENCH_REF_BIN=$BENCH_REF_BIN: not an executable outbox-relay binary"
  builds+=("ref=$BENCH_REF_BIN")
fi

# summarise DIR: the relay's drain run is its last process (the harness starts it once before
# to fix its position); its per-thread files are DIR/cg.<pid>-<thread>. A thread is told by the
# function it runs (callgrind_annotate's inclusive list).
summarise() {
  local dir="$1" pid f ir top group
  pid="$(ls -t "$dir" | sed -n 's/^cg\.\([0-9]*\)-[0-9]*$/\1/p' | head -1)"
  [ -n "$pid" ] || die "no callgrind output in $dir (see $dir/bench.log)"
  for f in "$dir"/cg."$pid"-*; do
    ir="$(awk '/^summary:/ {print $2; exit}' "$f")"
    top="$(callgrind_annotate --inclusive=yes "$f" 2>/dev/null | sed -n '1,80p')"
    if grep -q 'KafkaSink::send' <<<"$top"; then group=pipeline
    elif grep -q 'read_ahead::read' <<<"$top"; then group=reader
    elif grep -q 'rd_kafka_broker_thread_main\|rd_kafka_thread_main' <<<"$top"; then group=librdkafka
    else group=other
    fi
    echo "$group ${ir:-0}"
  done | awk -v rows="$rows" '
    { ir[$1] += $2; total += $2 }
    END {
      split("pipeline reader librdkafka other", order, " ")
      for (i = 1; i <= 4; i++) printf "  %-11s %8.0f instructions per row\n", order[i], ir[order[i]] / rows
      printf "  %-11s %8.0f instructions per row\n", "total", total / rows
    }'
}

status=0
for server in "${servers[@]}"; do
  tests/services/server.sh "$server" up
  for build in "${builds[@]}"; do
    label="${build%%=*}" bin="${build#*=}"
    dir="$out_root/$server-$label"
    rm -rf "$dir" && mkdir -p "$dir"
    # glibc copies and clears blocks above ~2 KiB with `rep movsb` / `rep stosb`, which callgrind
    # counts as one instruction per byte: a 7 KiB memset counted 7,316 where its vector loop
    # counts 420, and the reader's packet buffers made a tenth of its count. Raising both
    # thresholds keeps glibc on its vector loops, which callgrind counts as the work they are.
    printf '#!/bin/sh\nGLIBC_TUNABLES=glibc.cpu.x86_rep_stosb_threshold=1073741824:glibc.cpu.x86_rep_movsb_threshold=1073741824 exec valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file=%s/cg.%%p %s "$@"\n' \
      "$dir" "$bin" >"$dir/relay.sh"
    chmod +x "$dir/relay.sh"
    log "$server, $label ($bin): a drain of $rows rows under callgrind"
    if BENCH_RELAY_BIN="$dir/relay.sh" OUTBOX_TEST_SERVER="$server" BENCH_PHASES=drain \
      BENCH_SYSTEMS=relay BENCH_DRAIN_REPEAT=1 BENCH_ROWS="$rows" \
      target/release/outbox-relay-bench measure "$dir/out.json" >"$dir/bench.log" 2>&1; then
      echo "$server, $label:"
      summarise "$dir"
    else
      echo "$server, $label: the drain failed (see ${dir#"$REPO_ROOT"/}/bench.log)" >&2
      status=1
    fi
    # A drain writes ~60 MB of binlog per 100k rows: keep only the current file.
    mariadb --protocol=TCP -h127.0.0.1 -P"$(tests/services/server.sh "$server" port)" -uroot \
      -e "PURGE BINARY LOGS BEFORE NOW()" || true
  done
done
exit $status
