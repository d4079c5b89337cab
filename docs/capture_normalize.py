#!/usr/bin/env python3
"""Normalizes the outputs docs/capture.sh captured and writes them into the book's capture blocks.

    docs/capture_normalize.py UID CAPTURES_DIR SRC_DIR

UID is the run's unique name (shown as `shop`); CAPTURES_DIR holds NAME.txt per capture; every
`<!-- capture:NAME -->` ... `<!-- capture:end -->` block under SRC_DIR is rewritten with the
normalized NAME.txt in a ```text fence. What is normalized, and why, is listed in
docs/capture.sh. A block without a capture, or a capture without a block, is an error and
nothing is written.
"""

import glob
import os
import re
import sys

BLOCK = re.compile(r"(?m)^([ \t]*)<!-- capture:([a-z0-9-]+) -->\n.*?<!-- capture:end -->", re.S)


class Renumber:
    """Each distinct value of one kind becomes the i-th canonical value of that kind, in the order
    of first appearance."""

    def __init__(self, canonical):
        self.canonical = canonical
        self.seen = {}

    def __call__(self, value):
        if value not in self.seen:
            self.seen[value] = self.canonical(len(self.seen))
        return self.seen[value]


class Ranks:
    """Each distinct value of one kind becomes the canonical value of its rank among the values of
    that kind in the block (smallest first), so that order stays: an older time stays older, a
    later position later."""

    def __init__(self, pattern, group, key, canonical):
        self.pattern, self.group, self.key, self.canonical = pattern, group, key, canonical

    def apply(self, text):
        values = sorted({m.group(self.group) for m in re.finditer(self.pattern, text)}, key=self.key)
        rank = {v: i for i, v in enumerate(values)}

        def sub(m):
            a, b = m.span(self.group)
            s = m.start()
            whole = m.group(0)
            return whole[: a - s] + self.canonical(rank[m.group(self.group)], m.group(self.group)) + whole[b - s :]

        return re.sub(self.pattern, sub, text)


def canonical_time(i, value):
    # value: "YYYY-MM-DD?HH:MM:SS[.fff][Z]"; keep its separators, fraction length and zone.
    sep = value[10]
    frac = re.search(r"\.(\d+)", value)
    frac = "." + "0" * len(frac.group(1)) if frac else ""
    zone = "Z" if value.endswith("Z") else ""
    return f"2026-12-01{sep}10:{i // 60:02}:{i % 60:02}{frac}{zone}"


def normalize(text, uid):
    text = text.replace(uid, "shop")
    # Log lines: the leading timestamp goes.
    text = re.sub(r"(?m)^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d+Z\s+", "", text)
    # The build's git commit (--version).
    text = re.sub(r"\(commit [0-9a-f]{7,40}\)", "(commit 1a2b3c4d5e6f)", text)
    # MariaDB GTIDs (domain-server-sequence): the sequence number, by rank. Before the dates,
    # which look alike.
    text = Ranks(r"(?<![\d-])\d{1,3}-\d{1,10}-(\d+)(?![\d-])", 1, int, lambda i, v: str(100 + 3 * i)).apply(text)
    text = Ranks(r"(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:\.\d+)?Z?)", 1, lambda v: v.replace("T", " ").rstrip("Z"),
                 canonical_time).apply(text)
    text = Ranks(r"\b(?:mariadb|mysql)-bin\.(\d{6})\b", 1, int, lambda i, v: f"{i + 1:06}").apply(text)
    # Binlog positions past a file's header (4 stays 4: every file's first event starts there).
    keep = lambda i, v: v if int(v) < 1000 else str(4711 + 1000 * i)
    text = Ranks(r"-bin\.\d{6}:(\d+)", 1, int, keep).apply(text)
    text = Ranks(r'"binlog_pos":(\d+)', 1, int, keep).apply(text)

    seconds = Renumber(lambda i: str(2 + i))
    def secs(v):
        return v if float(v) == 0 else seconds(v)
    # Ages and durations; a lag of 0 s stays 0 (it means "caught up").
    text = re.sub(r"\b(\d+(?:\.\d+)?)( s ago| s\))", lambda m: seconds(m.group(1)) + m.group(2), text)
    text = re.sub(r"\b(\d+(?:\.\d+)?)( s \(seconds since)", lambda m: secs(m.group(1)) + m.group(2), text)
    text = re.sub(r"\b(\d+) min (\d+) s before", lambda m: f"0 min {seconds(str(int(m.group(1)) * 60 + int(m.group(2))))} s before", text)
    text = re.sub(r'("age_seconds":)([\d.]+)', lambda m: m.group(1) + seconds(m.group(2)), text)
    text = re.sub(r'("seconds":)([\d.]+)', lambda m: m.group(1) + secs(m.group(2)), text)
    lag = Renumber(lambda i: str(1250 + 250 * i))
    def lag_bytes(v):
        return v if v == "0" else lag(v)
    text = re.sub(r"\b(\d+)( bytes behind)", lambda m: lag_bytes(m.group(1)) + m.group(2), text)
    text = re.sub(r"(lag\s+)(\d+)( bytes)", lambda m: m.group(1) + lag_bytes(m.group(2)) + m.group(3), text)
    text = re.sub(r'("bytes":)(\d+)', lambda m: m.group(1) + lag_bytes(m.group(2)), text)
    owners = Renumber(lambda i: f"relay-host:{4242 + i}")
    host = re.escape(os.uname().nodename)
    text = re.sub(rf"\b{host}:(\d+)\b", lambda m: owners(m.group(0)), text)
    conns = Renumber(lambda i: str(42 + i))
    text = re.sub(r'("holder_connection_id":)(\d+)', lambda m: m.group(1) + conns(m.group(2)), text)
    text = re.sub(r"(connection )(\d+)", lambda m: m.group(1) + conns(m.group(2)), text)
    ports = Renumber(lambda i: str(9719 + i))
    text = re.sub(r"(address=127\.0\.0\.1:)(\d+)", lambda m: m.group(1) + ports(m.group(2)), text)
    fleet_partitions = Renumber(lambda i: str(17 + 21 * i))
    text = re.sub(r"(?m)^(\S+  partition )(\d+)", lambda m: m.group(1) + fleet_partitions(m.group(2)), text)
    text = re.sub(r"\((\d+) files\)", "(3 files)", text)
    text = re.sub(r"\((\d+) brokers?, (\d+) topics\)", lambda m: f"({m.group(1)} brokers, 12 topics)", text)
    return text


def main():
    uid, captures, src = sys.argv[1], sys.argv[2], sys.argv[3]
    texts = {}
    for path in glob.glob(os.path.join(captures, "*.txt")):
        with open(path, encoding="utf-8") as f:
            texts[os.path.basename(path)[:-4]] = normalize(f.read(), uid).rstrip("\n")
    pages, used, errors = {}, set(), []
    for page in sorted(glob.glob(os.path.join(src, "**", "*.md"), recursive=True)):
        with open(page, encoding="utf-8") as f:
            text = f.read()

        def fill(m, page=page):
            indent, name = m.group(1), m.group(2)
            if name not in texts:
                errors.append(f"{page}: block capture:{name}, which docs/capture.sh does not capture")
                return m.group(0)
            used.add(name)
            block = f"<!-- capture:{name} -->\n```text\n{texts[name]}\n```\n<!-- capture:end -->"
            return "\n".join(indent + line if line else line for line in block.split("\n"))

        new = BLOCK.sub(fill, text)
        if new != text:
            pages[page] = new
    errors += [f"capture {n} has no <!-- capture:{n} --> block in {src}" for n in sorted(set(texts) - used)]
    if errors:
        for e in errors:
            print(f"capture: {e}", file=sys.stderr)
        sys.exit(1)
    for page, text in pages.items():
        with open(page, "w", encoding="utf-8") as f:
            f.write(text)
    print(f"capture: {len(used)} blocks in {len(pages)} pages")


if __name__ == "__main__":
    main()
