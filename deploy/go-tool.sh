#!/usr/bin/env bash
# Sourced by deploy/helm/install-helm.sh and deploy/prometheus/install-promtool.sh: the tools the
# lints need come pinned from the Go module proxy (no other download site), built once into
# <repo>/.tools/bin (git-ignored).
#   go_tool_install NAME PACKAGE VERSION LDFLAGS
# Prints the binary's path. Idempotent: when .tools/bin/NAME already reports VERSION (through the
# caller's `installed_version` function, which reads "$tool"), nothing is built. LDFLAGS stamp
# VERSION into the binary (each tool reads its version from its own variable), so that check can
# recognise the pinned build.
go_tool_install() {
  local name="$1" package="$2" version="$3" ldflags="$4"
  local bin
  bin="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.tools/bin"
  tool="$bin/$name"
  if [ -x "$tool" ] && [ "$(installed_version)" = "$version" ]; then
    echo "$tool"
    return 0
  fi
  command -v go >/dev/null 2>&1 || { echo "install-$name: go not found ($name is built with go install)" >&2; return 1; }
  mkdir -p "$bin"
  # go install refuses to replace a file that is not a Go binary (a wrapper script, a broken file).
  rm -f "$tool"
  echo "install-$name: go install $package@$version into $bin" >&2
  GOBIN="$bin" CGO_ENABLED=0 go install -ldflags "$ldflags" "$package@$version" >&2
  local got
  got="$(installed_version)"
  if [ "$got" != "$version" ]; then
    echo "install-$name: installed $name reports version '$got', expected $version" >&2
    return 1
  fi
  echo "$tool"
}
