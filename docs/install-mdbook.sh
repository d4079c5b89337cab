#!/usr/bin/env bash
# Installs the pinned mdBook from crates.io, if it is missing or not the pinned version;
# idempotent. Prints the path of the mdbook binary. Installed once per machine (user), not per
# clone: into $OUTBOX_TOOLS_CACHE/mdbook-<version> (default ~/.cache/outbox-relay/tools), so a
# fresh clone (CI's) does not spend minutes building it again.
# The first run builds mdBook with `cargo install --locked` (a few minutes on 2 cores); later runs
# only check the version. MDBOOK_VERSION overrides the pin (then `make docs` builds with that).
set -euo pipefail
MDBOOK_VERSION="${MDBOOK_VERSION:-0.5.4}"
root="${OUTBOX_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/tools}/mdbook-$MDBOOK_VERSION"
tool="$root/bin/mdbook"
# `mdbook --version` prints "mdbook v0.5.4".
installed_version() { "$tool" --version 2>/dev/null | sed -n 's/^mdbook v//p' || true; }
if [ -x "$tool" ] && [ "$(installed_version)" = "$MDBOOK_VERSION" ]; then
  echo "$tool"
  exit 0
fi
command -v cargo >/dev/null 2>&1 || { echo "install-mdbook: cargo not found (mdBook is built with cargo install)" >&2; exit 1; }
echo "install-mdbook: cargo install --locked mdbook@$MDBOOK_VERSION --root $root" >&2
# Its own target directory, so that a CARGO_TARGET_DIR of the workspace is not filled with it.
mkdir -p "$root"
CARGO_TARGET_DIR="$root/build" cargo install --locked --quiet --force "mdbook@$MDBOOK_VERSION" --root "$root" >&2
rm -rf "$root/build"
got="$(installed_version)"
if [ "$got" != "$MDBOOK_VERSION" ]; then
  echo "install-mdbook: installed mdbook reports version '$got', expected $MDBOOK_VERSION" >&2
  exit 1
fi
echo "$tool"
