"""The evidence of a modification (`detail.edits`): sorted, capped, and bounded in bytes whatever the document."""
from __future__ import annotations

from manifests.audit_edits import EDITS_CAP, ROW_BYTES_BOUND, changed_spans, edits_detail, line_spans
from manifests.schema import dumps_json


def test_edits_are_sorted_and_capped_with_the_full_count():
    detail = edits_detail([(9, 12, "b"), (0, 3, "a")])
    assert detail == {"edits": [[0, 3, "a"], [9, 12, "b"]]}
    many = edits_detail((i * 10, i * 10 + 5, "too_few_words") for i in range(1000))
    assert len(many["edits"]) == EDITS_CAP and many["edits_total"] == 1000 and many["edits"][0] == [0, 5, "too_few_words"]


def test_a_rows_edits_stay_under_the_stated_bound_for_any_offsets_and_labels():
    worst = edits_detail((10**10 - 2 - i, 10**10 - 1, "a-very-long-codec-name-" * 10) for i in range(10**4))
    assert len(dumps_json(worst)) <= ROW_BYTES_BOUND


def test_line_spans_follow_splitlines_and_changed_spans_find_each_run():
    text = "one\r\ntwo\n\nthree\u2028four"
    assert [text[s:e] for s, e in line_spans(text)] == text.splitlines()
    before, after = "a Ã© b\nsame\nc Ã¨", "a é b\nsame\nc è"
    assert [before[s:e] for s, e, _ in changed_spans(before, after, "mojibake")] == ["Ã©", "Ã¨"]
    assert changed_spans("x" * 5000 + "ab" + "y" * 5000, "x" * 5000 + "c" + "y" * 5000, "m") == [(5000, 5002, "m")]
