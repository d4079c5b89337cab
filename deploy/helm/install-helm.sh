#!/usr/bin/env bash
# Installs the pinned helm into <repo>/.tools/bin (git-ignored) from the Go module proxy, if it is
# missing or not the pinned version; idempotent. Prints the path of the helm binary.
# The first run builds helm with `go install` (a few minutes); later runs only check the version.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
HELM_MODULE="${HELM_MODULE:-helm.sh/helm/v4}"
HELM_VERSION="${HELM_VERSION:-v4.3.2}"
bin="$repo/.tools/bin"
helm="$bin/helm"

installed_version() {
  # `helm version --template` prints the version helm was built with (set by -ldflags below).
  "$helm" version --template '{{.Version}}' 2>/dev/null || true
}

if [ -x "$helm" ] && [ "$(installed_version)" = "$HELM_VERSION" ]; then
  echo "$helm"
  exit 0
fi

command -v go >/dev/null 2>&1 || { echo "install-helm.sh: go not found (helm is built with go install)" >&2; exit 1; }
mkdir -p "$bin"
# go install refuses to replace a file that is not a Go binary (a wrapper script, a broken file).
rm -f "$helm"
echo "install-helm.sh: go install $HELM_MODULE/cmd/helm@$HELM_VERSION into $bin" >&2
# helm's version is an -ldflags variable (its Makefile sets it); without it `helm version` says
# the module's default. Set it so the check above can recognise the pinned build.
GOBIN="$bin" CGO_ENABLED=0 go install \
  -ldflags "-X $HELM_MODULE/internal/version.version=$HELM_VERSION" \
  "$HELM_MODULE/cmd/helm@$HELM_VERSION" >&2
got="$(installed_version)"
if [ "$got" != "$HELM_VERSION" ]; then
  echo "install-helm.sh: installed helm reports version '$got', expected $HELM_VERSION" >&2
  exit 1
fi
echo "$helm"
