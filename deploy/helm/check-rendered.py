#!/usr/bin/env python3
"""Checks the relay.toml of every ConfigMap in `helm template` output (stdin): it parses as TOML
(tomllib), the HTTP endpoints listen on 0.0.0.0, [[source]] names are non-empty and unique, and
no MySQL URL carries a literal password (only ${env:…} / ${file:…} references). Standard library
only: the ConfigMap's `relay.toml: |` block scalar is cut out by its indentation, as the chart's
templates/configmap.yaml writes it.

Usage: helm template … | deploy/helm/check-rendered.py LABEL
"""

import re
import sys
import tomllib


def relay_tomls(stream):
    """The relay.toml texts of the ConfigMap documents of a multi-document YAML stream."""
    for doc in re.split(r"(?m)^---\s*$", stream):
        if not re.search(r"(?m)^kind:\s*ConfigMap\s*$", doc):
            continue
        lines = doc.splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"^(\s+)relay\.toml:\s*\|[-+]?\s*$", line)
            if not m:
                continue
            key_indent = len(m.group(1))
            block, indent = [], None
            for body in lines[i + 1 :]:
                if body.strip() == "":
                    block.append("")
                    continue
                this = len(body) - len(body.lstrip(" "))
                if this <= key_indent:
                    break
                indent = this if indent is None else indent
                block.append(body[indent:])
            yield "\n".join(block) + "\n"


def check(label, text):
    errors = []
    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return [f"not valid TOML: {e}"]
    listen = config.get("http", {}).get("listen")
    if listen != "0.0.0.0:9719":
        errors.append(f"http.listen is {listen!r}, expected '0.0.0.0:9719'")
    sources = config.get("source", [])
    names = [s.get("name") for s in sources]
    if any(not n for n in names):
        errors.append("a [[source]] without a name")
    if len(set(names)) != len(names):
        errors.append(f"duplicate [[source]] names: {names}")
    urls = [config.get("mysql", {}).get("url")] + [s.get("mysql", {}).get("url") for s in sources]
    for url in filter(None, urls):
        m = re.match(r"^mysql://[^:@/]+:([^@]*)@", url)
        if m and not re.fullmatch(r"\$\{(env|file):[^}]+\}", m.group(1)):
            errors.append(f"a literal password in mysql.url {url.split('@')[-1]!r}")
    return errors


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else "stdin"
    texts = list(relay_tomls(sys.stdin.read()))
    if not texts:
        print(f"{label}: no ConfigMap with relay.toml rendered", file=sys.stderr)
        return 1
    failed = False
    for text in texts:
        errors = check(label, text)
        for e in errors:
            print(f"{label}: relay.toml: {e}", file=sys.stderr)
        failed |= bool(errors)
        if not errors:
            config = tomllib.loads(text)
            print(
                f"{label}: relay.toml OK ({len(config.get('source', []))} [[source]], "
                f"fleet {'on' if config.get('fleet', {}).get('enabled') else 'off'})"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
