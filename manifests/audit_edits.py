"""The evidence of a modification: which characters of a document a rule changed, kept small.

Every `modified` audit row carries `detail.edits`: `[start, end, label]` character offsets into the
text the rule read (the stage's input; docs/corpus.md, "Evidence" names the one exception), sorted by
start, with the label saying why (`too_few_words`, `citation`, `email`, ...). A row keeps at most
`EDITS_CAP` of them; when a rule made more, `detail.edits_total` gives the full count, so the bytes a
row adds stay bounded whatever the document's length.
"""
from __future__ import annotations

import difflib
import os
from typing import Any, Iterable

EDITS_CAP = 64  # entries a row keeps; a page shows the first ones, the count says how many there were
LABEL_CHARS = 24  # a label longer than this (an odd codec name) is cut: the bound below holds for any label
# The most JSON `edits` + `edits_total` add to one row: 64 entries of two 10-digit offsets and a 24-character label.
ROW_BYTES_BOUND = EDITS_CAP * len('[1234567890,1234567890,"%s"],' % ("x" * LABEL_CHARS)) + len(',"edits":[],"edits_total":1234567890')
MODIFYING_ROWS_PER_DOCUMENT = 8  # ingest 2 (encoding guessed, controls), extract 2 (main text, mojibake), quality 1, pii 3

Edit = tuple[int, int, str]
DIFF_CHARS = 4000  # a changed line longer than this is one span (a character diff is quadratic in it)


def edits_detail(edits: Iterable[Edit]) -> dict[str, Any]:
    """`{"edits": [...]}` sorted by offset, capped at EDITS_CAP, with `edits_total` only when capped."""
    ordered = sorted(edits)
    found: dict[str, Any] = {"edits": [[start, end, label[:LABEL_CHARS]] for start, end, label in ordered[:EDITS_CAP]]}
    if len(ordered) > EDITS_CAP:
        found["edits_total"] = len(ordered)
    return found


def line_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each line of `text` as `str.splitlines()` cuts it, without the line break."""
    spans, start = [], 0
    for line in text.splitlines(keepends=True):
        body = line.splitlines()[0] if line else line
        spans.append((start, start + len(body)))
        start += len(line)
    return spans


def changed_spans(before: str, after: str, label: str) -> list[Edit]:
    """Where `after` differs from `before`, in `before`'s offsets: line by line when both have the same lines (a
    repair that keeps the layout), character runs within a line of up to DIFF_CHARS, else the one span between the
    common prefix and the common suffix (an insertion is an empty span where it goes)."""
    old_lines, new_lines = before.splitlines(), after.splitlines()
    if len(old_lines) == len(new_lines) and len(old_lines) > 1:
        spans = []
        for (start, _), old, new in zip(line_spans(before), old_lines, new_lines):
            if old != new:
                spans += [(start + s, start + e, label) for s, e, _ in changed_spans(old, new, label)]
        return spans
    if before == after:
        return []
    if len(before) + len(after) <= DIFF_CHARS:
        matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
        return [(i1, i2, label) for tag, i1, i2, _, _ in matcher.get_opcodes() if tag != "equal"]
    prefix = len(os.path.commonprefix([before, after]))
    suffix = len(os.path.commonprefix([before[prefix:][::-1], after[prefix:][::-1]]))
    return [(prefix, len(before) - suffix, label)]
