#!/usr/bin/env python3
"""Checks a benchmark question set against the pages it was written from.

Usage: python3 scripts/check-answers.py [QUESTIONS_JSON] [REFERENCE_DIR]
(defaults: crates/bench/answers/rust-reference.json and
`$(rustc --print sysroot)/share/doc/rust/html/reference`)

For each question: the id is unique, the answer regex compiles, and it
matches (case-insensitively) the <main> text of every gold page. A question
whose regex also matches more than 60% of all content pages gets a warning: its
answer is too generic to tell a right reply from a wrong one.
Exits non-zero on any failure (warnings alone do not fail).
"""
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser

MIN_QUESTIONS = 60
GENERIC_SHARE = 0.60
SKIP_PAGES = {"print.html", "toc.html", "404.html"}  # not content pages


class MainText(HTMLParser):
    """Collects the text inside <main> (the page body of an mdBook page)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth = 0  # >0 while inside <main>
        self.parts = []

    def handle_starttag(self, tag, attrs):
        if tag == "main":
            self.depth += 1

    def handle_endtag(self, tag):
        if tag == "main" and self.depth:
            self.depth -= 1

    def handle_data(self, data):
        if self.depth:
            self.parts.append(data)


def page_text(path):
    """The <main> text of an HTML file, whitespace collapsed ('' if none)."""
    parser = MainText()
    with open(path, encoding="utf-8") as f:
        parser.feed(f.read())
    return " ".join("".join(parser.parts).split())


def default_reference_dir():
    try:
        sysroot = subprocess.run(["rustc", "--print", "sysroot"], capture_output=True,
                                 text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        sys.exit("check-answers: rustc not found; pass REFERENCE_DIR")
    return os.path.join(sysroot, "share/doc/rust/html/reference")


def load_pages(root):
    """Relative path -> text for every content page (redirect stubs have no <main>)."""
    pages = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name.endswith(".html") and name not in SKIP_PAGES:
                full = os.path.join(dirpath, name)
                text = page_text(full)
                if text:
                    pages[os.path.relpath(full, root).replace(os.sep, "/")] = text
    return pages


def main():
    qpath = sys.argv[1] if len(sys.argv) > 1 else "crates/bench/answers/rust-reference.json"
    root = sys.argv[2] if len(sys.argv) > 2 else default_reference_dir()
    with open(qpath, encoding="utf-8") as f:
        questions = json.load(f)["questions"]
    pages = load_pages(root)
    if not pages:
        sys.exit(f"check-answers: no content pages under {root}")
    failures, generic, others, seen, gold_pages = [], [], [], set(), set()

    for q in questions:
        qid, gold = q.get("id", "?"), q.get("gold") or []
        if qid in seen:
            failures.append(f"{qid}: duplicate id")
        seen.add(qid)
        try:
            rx = re.compile(q["answer"], re.IGNORECASE)
        except (re.error, KeyError) as e:
            failures.append(f"{qid}: bad answer regex: {e}")
            continue
        if not gold:
            failures.append(f"{qid}: no gold page")
        for page in gold:
            gold_pages.add(page)
            if page not in pages:
                failures.append(f"{qid}: gold page {page} not found")
            elif not rx.search(pages[page]):
                failures.append(f"{qid}: /{q['answer']}/ not in gold page {page}")
        # An answer found on most pages would also be found in most wrong replies.
        matching = {p for p, text in pages.items() if rx.search(text)}
        others.append(f"{qid}={len(matching - set(gold))}")
        if len(matching) > GENERIC_SHARE * len(pages):
            generic.append(f"{qid}: /{q['answer']}/ matches {len(matching)}/{len(pages)} pages (too generic)")

    if len(questions) < MIN_QUESTIONS:
        failures.append(f"only {len(questions)} questions (need {MIN_QUESTIONS})")

    print(f"{len(questions)} questions, {len(gold_pages)} distinct gold pages, "
          f"{len(pages)} content pages; {len(failures)} failures, {len(generic)} generic-answer warnings")
    print("non-gold pages matching each answer: " + ", ".join(others))
    for line in failures:
        print("FAIL " + line)
    for line in generic:
        print("WARN " + line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
