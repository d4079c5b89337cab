#!/usr/bin/env bash
# Installs the pinned helm into <repo>/.tools/bin (git-ignored) from the Go module proxy, if it is
# missing or not the pinned version; idempotent. Prints the path of the helm binary.
# The first run builds helm with `go install` (a few minutes); later runs only check the version.
set -euo pipefail
source "$(dirname "$0")/../go-tool.sh"
HELM_MODULE="${HELM_MODULE:-helm.sh/helm/v4}"
HELM_VERSION="${HELM_VERSION:-v4.3.2}"

# `helm version --template` prints the version helm was built with (set by -ldflags; without it
# `helm version` says the module's default, as helm's own Makefile sets it).
installed_version() { "$tool" version --template '{{.Version}}' 2>/dev/null || true; }

go_tool_install helm "$HELM_MODULE/cmd/helm" "$HELM_VERSION" \
  "-X $HELM_MODULE/internal/version.version=$HELM_VERSION"
