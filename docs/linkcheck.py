#!/usr/bin/env python3
"""Checks the internal links of the built book (docs/book) and of README.md; exits 1 on any
broken one, naming the page, the link and what is missing.

mdBook checks no links, and mdbook-linkcheck 0.7.7 (its last release) cannot read mdBook 0.5's
render context and checks no #anchors, so this reads the built HTML instead:

- every relative href/src of every page: the file exists in the book, and a #fragment names an
  id (or <a name>) of the target page (a fragment alone: of the page itself);
- every link to this repository on GitHub (https://github.com/outbox-relay/outbox-relay/blob|tree|raw/main/PATH):
  PATH exists in the work tree, and a #fragment of a Markdown file names one of its headings as
  GitHub makes their anchors (for docs/src pages: an id of the built page);
- every link of README.md: a relative target exists in the work tree; a #fragment names a
  heading of that file (GitHub's anchors) or, for docs/src/X.md, an id of the built X.html;
- every link to this repository in the operations kit (deploy/: the alert rules' runbook URLs,
  the dashboard), checked as the book's.

Other external links (http, https, mailto) are not fetched: the lint runs without a network.

    docs/linkcheck.py [BOOK_DIR]   (default: docs/book, after `mdbook build docs`)
"""

import html.parser
import os
import re
import sys
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_URL = re.compile(r"^https://github\.com/outbox-relay/outbox-relay/(?:blob|tree|raw)/main/([^#?]*)(?:#(.*))?$")
# mdBook's own pages and assets, not chapters: print.html repeats every chapter with its links
# rewritten for one page; 404.html and toc.html are generated.
SKIP_PAGES = {"print.html", "404.html", "toc.html"}


class Page(html.parser.HTMLParser):
    """The ids and the links (href/src) of one HTML page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids = set()
        self.links = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if value is None:
                continue
            if name == "id" or (tag == "a" and name == "name"):
                self.ids.add(value)
            elif name in ("href", "src"):
                self.links.append(value)


_pages = {}


def parse_html(path):
    if path not in _pages:
        page = Page()
        with open(path, encoding="utf-8") as f:
            page.feed(f.read())
        _pages[path] = page
    return _pages[path]


def github_anchors(md_path):
    """The anchors GitHub gives the headings of a Markdown file (lower case, punctuation other
    than '-' and '_' dropped, spaces to '-', repeats numbered -1, -2, ...)."""
    anchors, seen, fence = set(), {}, False
    with open(md_path, encoding="utf-8") as f:
        for line in f:
            if line.lstrip().startswith("```"):
                fence = not fence
                continue
            m = None if fence else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))  # link text only
            slug = re.sub(r"[^\w\- ]", "", text.lower().replace("`", "")).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def built_page_of(md_rel, book):
    """docs/src/X.md -> <book>/X.html."""
    inside = os.path.relpath(os.path.join(ROOT, md_rel), os.path.join(ROOT, "docs", "src"))
    return os.path.join(book, os.path.splitext(inside)[0] + ".html")


def check_repo_target(path, frag, book, where, errors):
    """A path in the work tree (relative to the repository root) and its fragment."""
    full = os.path.join(ROOT, path)
    if not os.path.exists(full):
        errors.append(f"{where}: {path} does not exist in the repository")
        return
    if not frag:
        return
    if path.startswith("docs/src/") and path.endswith(".md"):
        target = built_page_of(path, book)
        if os.path.exists(target) and frag not in parse_html(target).ids:
            errors.append(f"{where}: #{frag} is no heading or id of {path} (built as {os.path.relpath(target, ROOT)})")
    elif path.endswith(".md") and frag not in github_anchors(full):
        errors.append(f"{where}: #{frag} is no heading of {path}")


def checked_as_repo_url(link, book, where, errors):
    """A link to a file of this repository on GitHub: checks it and says True; else False."""
    repo = REPO_URL.match(link)
    if repo:
        check_repo_target(urllib.parse.unquote(repo.group(1)).rstrip("/"), repo.group(2), book, where, errors)
    return bool(repo)


def check_book(book, errors):
    count = 0
    for dirpath, _, files in os.walk(book):
        for name in files:
            if not name.endswith(".html") or name in SKIP_PAGES:
                continue
            page_path = os.path.join(dirpath, name)
            page = parse_html(page_path)
            where_page = os.path.relpath(page_path, book)
            for link in page.links:
                count += 1
                where = f"{where_page}: link {link}"
                if checked_as_repo_url(link, book, where, errors):
                    continue
                parsed = urllib.parse.urlsplit(link)
                if parsed.scheme or link.startswith("//"):
                    continue  # external: not fetched
                target = page_path
                if parsed.path:
                    target = os.path.normpath(os.path.join(dirpath, urllib.parse.unquote(parsed.path)))
                    if os.path.isdir(target):
                        target = os.path.join(target, "index.html")
                    if not os.path.exists(target):
                        errors.append(f"{where}: {os.path.relpath(target, book)} does not exist in the book")
                        continue
                if parsed.fragment and target.endswith(".html"):
                    if urllib.parse.unquote(parsed.fragment) not in parse_html(target).ids:
                        errors.append(f"{where}: no id #{parsed.fragment} in {os.path.relpath(target, book)}")
    return count


def check_readme(book, errors):
    readme = os.path.join(ROOT, "README.md")
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # links in code blocks are not links
    links = re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text) + re.findall(r"<img[^>]*\bsrc=\"([^\"]+)\"", text)
    for link in links:
        where = f"README.md: link {link}"
        if checked_as_repo_url(link, book, where, errors):
            continue
        parsed = urllib.parse.urlsplit(link)
        if parsed.scheme:
            continue
        path = urllib.parse.unquote(parsed.path) or "README.md"
        check_repo_target(os.path.normpath(path), parsed.fragment, book, where, errors)
    return len(links)


def check_kit(book, errors):
    """Links to this repository in deploy/ (runbook_url of the alert rules, the dashboard)."""
    count = 0
    for dirpath, _, files in os.walk(os.path.join(ROOT, "deploy")):
        for name in files:
            if not name.endswith((".yaml", ".yml", ".json", ".md")):
                continue
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for link in re.findall(r"https://github\.com/outbox-relay/outbox-relay/[^\s\"')>]+", text):
                count += 1
                where = f"{os.path.relpath(path, ROOT)}: link {link}"
                if not checked_as_repo_url(link, book, where, errors):
                    errors.append(f"{where}: not a link to a file of the main branch")
    return count


def main():
    book = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "docs", "book"))
    if not os.path.exists(os.path.join(book, "index.html")):
        print(f"linkcheck: {book} holds no built book; run `make docs` first", file=sys.stderr)
        return 2
    errors = []
    n_book = check_book(book, errors)
    n_readme = check_readme(book, errors)
    n_kit = check_kit(book, errors)
    for e in errors:
        print(f"broken link: {e}", file=sys.stderr)
    status = f"{n_book} links in the book, {n_readme} in README.md, {n_kit} in deploy/"
    if errors:
        print(f"linkcheck: {len(errors)} broken ({status})", file=sys.stderr)
        return 1
    print(f"linkcheck: OK ({status})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
