#!/usr/bin/env bash
# `make fuzz`: runs each cargo-fuzz target of fuzz/ for FUZZ_SECONDS (default 600) one after
# another on ONE core (libFuzzer fork mode with a single worker, so a crash is recorded and the
# run goes on), then prints executions and crashes per target. Exits non-zero when a target
# found a crash (or could not run). FUZZ_TARGETS="a b" runs a subset.
#
# Needs a nightly toolchain (cargo-fuzz builds with -Zsanitizer=address) and installs
# cargo-fuzz when it is missing. Crash inputs land in fuzz/artifacts/<target>/; reproduce one
# with `cargo +nightly fuzz run <target> <file>` in fuzz/.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(cd .. && pwd)

FUZZ_SECONDS=${FUZZ_SECONDS:-600}
ALL_TARGETS="json_render rows_event ddl_parse gtid_sets binlog_file config_load"
FUZZ_TARGETS=${FUZZ_TARGETS:-$ALL_TARGETS}
TOOLCHAIN=${FUZZ_TOOLCHAIN:-nightly}

if ! rustup run "$TOOLCHAIN" rustc --version >/dev/null 2>&1; then
    echo "fuzz: the Rust toolchain '$TOOLCHAIN' is missing; cargo-fuzz needs nightly:" >&2
    echo "      rustup toolchain install nightly" >&2
    exit 2
fi
if ! cargo "+$TOOLCHAIN" fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz"
    cargo install --locked cargo-fuzz
fi

# Seeds generated from the project's own files (the committed ones are in corpus/<target>/).
mkdir -p corpus/binlog_file corpus/config_load
for f in "$ROOT"/tests/fixtures/binlogs/*.000001; do
    name=$(basename "$f")
    # First byte: 0 = planned replay, 1 = the file reader alone, 2 = planned, CRC32s rewritten.
    for mode in 0 1 2; do
        seed="corpus/binlog_file/fixture-$mode-$name"
        [ -e "$seed" ] || { printf "\\x0$mode"; cat "$f"; } > "$seed"
    done
done
for f in "$ROOT"/docker/relay.toml "$ROOT"/tests/demo/relay.toml; do
    seed="corpus/config_load/fixture-$(basename "$(dirname "$f")")-$(basename "$f")"
    [ -e "$seed" ] || cp "$f" "$seed"
done

# rdkafka-sys links a test program against zstd-sys, which cc builds with the sanitizer the
# Rust flags name: the link needs the sanitizer runtime too.
export LDFLAGS="${LDFLAGS:+$LDFLAGS }-fsanitize=address"
# -a: debug assertions and overflow checks, as in tests.
for t in $FUZZ_TARGETS; do
    cargo "+$TOOLCHAIN" fuzz build -a "$t"
done

declare -A EXECS CRASHES STATUS
for t in $FUZZ_TARGETS; do
    mkdir -p "corpus/$t" "artifacts/$t"
    log="artifacts/$t/last-run.log"
    before=$(find "artifacts/$t" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'oom-*' -o -name 'timeout-*' -o -name 'leak-*' \) | wc -l)
    echo "fuzz: $t for ${FUZZ_SECONDS}s (log: fuzz/$log)"
    # Fork mode with one worker: one core, and a crash does not end the target's time.
    # -rss_limit_mb/-malloc_limit_mb: an allocation a length field asks for is a crash.
    set +e
    cargo "+$TOOLCHAIN" fuzz run -a "$t" "corpus/$t" -- \
        -fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 \
        -max_total_time="$FUZZ_SECONDS" -timeout=30 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
        -max_len=65536 -print_final_stats=1 \
        -artifact_prefix="artifacts/$t/" > "$log" 2>&1
    rc=$?
    set -e
    after=$(find "artifacts/$t" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'oom-*' -o -name 'timeout-*' -o -name 'leak-*' \) | wc -l)
    # Fork mode: each job's executions are in its "#N" status lines; the last is the total.
    EXECS[$t]=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
    EXECS[$t]=${EXECS[$t]:-0}
    CRASHES[$t]=$((after - before))
    STATUS[$t]=ok
    [ $rc -eq 0 ] || STATUS[$t]="exit $rc"
done

failed=0
printf '\n%-14s %14s %8s  %s\n' target executions crashes status
for t in $FUZZ_TARGETS; do
    printf '%-14s %14s %8s  %s\n' "$t" "${EXECS[$t]}" "${CRASHES[$t]}" "${STATUS[$t]}"
    if [ "${CRASHES[$t]}" -gt 0 ] || [ "${STATUS[$t]}" != ok ]; then
        failed=1
    fi
done
if [ $failed -ne 0 ]; then
    echo "fuzz: crashes (or a failed run) above; inputs in fuzz/artifacts/<target>/" >&2
    exit 1
fi
