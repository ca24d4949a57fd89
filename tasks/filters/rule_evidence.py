"""Which parts of a text a quality rule's statistic counted: character spans `[start, end, label]`, the same
shape as an audit row's `edits`, so the report page highlights both the same way.

Only for showing a document: the rules themselves count without building spans (they run on every
document; this runs on the few examples a report shows). A rule with no span to show (word counts,
mean word length, n-gram coverage) gets none.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Callable

from manifests.audit_edits import line_spans
from tasks.filters.quality_config import QualityConfig
from tasks.filters.text_view import LETTER, PARAGRAPH_BREAK

Span = list  # [start, end, label]


def stripped_lines(text: str) -> list[tuple[int, int, str]]:
    """(start, end, stripped line) of every non-empty line, in the text's offsets (TextView.lines, located)."""
    found = []
    for start, end in line_spans(text):
        line = text[start:end]
        stripped = line.strip()
        if stripped:
            at = start + line.index(stripped)
            found.append((at, at + len(stripped), stripped))
    return found


def lines_where(text: str, keep: Callable[[str], bool], label: str) -> list[Span]:
    return [[start, end, label] for start, end, line in stripped_lines(text) if keep(line)]


def duplicated_lines(text: str, min_words: int) -> list[Span]:
    lines = [(s, e, line) for s, e, line in stripped_lines(text) if min_words <= 1 or len(line.split()) >= min_words]
    counts = Counter(line for _, _, line in lines)
    return [[s, e, "duplicate line"] for s, e, line in lines if counts[line] > 1]


def duplicated_paragraphs(text: str) -> list[Span]:
    pieces, at = [], 0
    for brk in [*PARAGRAPH_BREAK.finditer(text), None]:
        body = text[at:brk.start() if brk else len(text)]
        stripped = body.strip()
        if stripped:
            start = at + body.index(stripped)
            pieces.append((start, start + len(stripped), stripped))
        if brk:
            at = brk.end()
    counts = Counter(p for _, _, p in pieces)
    return [[s, e, "duplicate paragraph"] for s, e, p in pieces if counts[p] > 1]


def matches(text: str, pattern: str, label: str) -> list[Span]:
    return [[m.start(), m.end(), label] for m in re.finditer(pattern, text)]


def stop_words(text: str, config: QualityConfig) -> list[Span]:
    lower = text.lower()
    spans = []
    for word in config.stop_words:
        for m in re.finditer(re.escape(word), lower):
            before = m.start() == 0 or not LETTER.match(lower, m.start() - 1)
            after = m.end() == len(lower) or not LETTER.match(lower, m.end())
            if before and after:
                spans.append([m.start(), m.end(), "stop word"])
    return sorted(spans)


def triggering_spans(rule: str, text: str, config: QualityConfig) -> list[Span]:
    """The spans `rule` counted in `text` (sorted by start); [] when the statistic is not made of spans."""
    if rule == "gopher_too_many_bullet_lines":
        spans = lines_where(text, lambda line: line.startswith(config.bullet_prefixes), "bullet line")
    elif rule == "gopher_too_many_ellipsis_lines":
        spans = lines_where(text, lambda line: line.endswith(("...", "…")), "ellipsis line")
    elif rule == "gopher_too_many_ellipses":
        spans = matches(text, r"\.\.\.|…", "ellipsis")
    elif rule == "gopher_too_many_hash_symbols":
        spans = matches(text, "#", "#")
    elif rule == "gopher_too_few_alphabetic_words":
        spans = [[m.start(), m.end(), "no letter"] for m in re.finditer(r"\S+", text) if not LETTER.search(m.group())]
    elif rule == "gopher_too_few_stop_words":
        spans = stop_words(text, config)
    elif rule in ("gopher_duplicate_lines", "gopher_duplicate_line_chars"):
        spans = duplicated_lines(text, config.duplicate_line_min_words)
    elif rule == "fineweb_duplicate_line_chars":
        spans = duplicated_lines(text, 1)
    elif rule in ("gopher_duplicate_paragraphs", "gopher_duplicate_paragraph_chars"):
        spans = duplicated_paragraphs(text)
    elif rule == "fineweb_too_few_terminal_punct_lines":
        spans = lines_where(text, lambda line: not line.endswith(config.fineweb_end_marks), "no terminal punctuation")
    elif rule == "fineweb_too_many_short_lines":
        spans = lines_where(text, lambda line: len(line) <= config.short_line_max_chars, "short line")
    elif rule == "fineweb_too_many_newlines_per_word":
        spans = matches(text, "\n", "newline")
    elif rule == "c4_too_few_sentences":
        spans = matches(text, r"[.?!]", "sentence end")
    else:
        spans = []
    return sorted(spans)
