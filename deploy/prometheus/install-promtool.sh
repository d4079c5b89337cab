#!/usr/bin/env bash
# Installs the pinned promtool (Prometheus's rule checker) into <repo>/.tools/bin (git-ignored)
# from the Go module proxy, if it is missing or not the pinned version; idempotent. Prints the
# path of the promtool binary. The first run builds it with `go install` (several minutes: it
# compiles much of Prometheus); later runs only check the version.
set -euo pipefail
source "$(dirname "$0")/../go-tool.sh"
PROMTOOL_MODULE="${PROMTOOL_MODULE:-github.com/prometheus/prometheus}"
# Prometheus 3.x is published to the Go module proxy as v0.3MM.P (3.16.0 is v0.316.0).
PROMTOOL_VERSION="${PROMTOOL_VERSION:-v0.316.0}"

# "promtool, version v0.316.0 (branch: …)": the version set by -ldflags below.
installed_version() { "$tool" --version 2>/dev/null | awk 'NR==1{print $3}' || true; }

go_tool_install promtool "$PROMTOOL_MODULE/cmd/promtool" "$PROMTOOL_VERSION" \
  "-X github.com/prometheus/common/version.Version=$PROMTOOL_VERSION"
