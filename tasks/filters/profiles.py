"""The per-source rule profiles (document meta "profile"): which rules a kind of text skips, only
reports, or runs with other numbers, and why. Each departure from a paper says which labelled data chose it
(docs/quality.md).
"""
from __future__ import annotations

from typing import Any




C4_LINE_FILTER = "c4_line_filter"  # skip name of C4's line removal (the modification c4_lines_removed)


def default_profiles() -> dict[str, dict[str, Any]]:
    """Per-source rule sets: field overrides applied to the base config for documents of that profile (docs/quality.md)."""
    # Line-shape rules misfire on prose that is a list (filmographies, parish lists, "see also" sections): on the
    # labelled sample and bench corpus FineWeb's terminal-punctuation and short-line rules catch no junk that
    # another rule misses, yet removed 1.7 % of the clean sample prose; C4's removal of unpunctuated lines then
    # leaves such sections without sentences. FineWeb runs C4 without that line removal, so do we.
    line_shape = {"c4_drop_unpunctuated_lines": False, "skip_rules": ("fineweb_too_few_terminal_punct_lines", "fineweb_too_many_short_lines")}
    return {
        # Web crawls, and every source that names no profile: FineWeb's published chain at its published numbers
        # (Penedo et al. 2024, §3.5-3.6): Gopher quality and repetition as Table A1 of Rae et al.; C4's rules at the
        # C4 paper's numbers but without its removal of unpunctuated lines, which FineWeb dropped (30 % of tokens
        # removed, no gain); FineWeb's three rules at the paper's numbers (the duplicate-line characters at 0.1,
        # not datatrove's code default 0.01). The newline-per-word rule is in datatrove's code, not in the paper:
        # it only reports. No threshold here was chosen on any labelled data (docs/quality.md).
        "web": {"c4_drop_unpunctuated_lines": False, "max_fineweb_duplicate_line_char_fraction": 0.1,
                "report_rules": ("fineweb_too_many_newlines_per_word",)},
        # FineWeb's duplicate-line limit as its paper states it (§3.6: >= 0.1 of characters; datatrove's code default
        # is 0.01). The alphabetic-words rule only reports: in prose its removals were list sections whose entries
        # carry a year or ISBN, and every junk page it caught on both labelled sets fails another rule too.
        "prose": {**line_shape, "max_fineweb_duplicate_line_char_fraction": 0.1, "report_rules": ("gopher_too_few_alphabetic_words",)},
        # Code samples make words without letters and braces normal (seed 001 warns both rules delete them),
        # and C4's line filter would cut every code line and heading (64 % of the characters of the sample's
        # documentation pages). Reference pages are terse, tabular and repetitive by design: parameter lists
        # (one short line each), API names and formulas as "words", table cells and doctest output repeated
        # line after line, type phrases ("array_like of shape") repeated, articles dropped ("Return copy of
        # index."). So: duplicate lines are counted among content lines (C4's line: >= 5 words); the line-count
        # form of Gopher's duplicate-line rule, FineWeb's newline density and the long-mean-word-length rule only
        # report; the top n-gram limits are doubled and one stop word suffices. Words are counted as a word
        # tokenizer counts them (`numpy.linalg.norm(x)` is 4 words), so an API page is as long as its names make
        # it. C4's sentence count only reports: C4 counts sentences on the text its line filter keeps, and that
        # filter is off here. The duplicated 5-10-gram rules only report, at Gopher's numbers: reference pages
        # describe many items in the same words ("Part of the Stable ABI."); repeated lines and the top 2-4-grams
        # (keyword stuffing) still remove. The stop-word rule only reports: Gopher uses it to tell English text
        # from other text, which the langid stage has already decided, and formula, doctest-only and table pages
        # have no stop word by design. Reference pages are short by design (an API stub is a signature and a
        # sentence), so the word floor is 30 names, not 50: fragments of under 30 words are still removed.
        # Measured in docs/quality.md.
        "documentation": {
            "c4_drop_unpunctuated_lines": False,
            "skip_rules": ("gopher_too_few_alphabetic_words", "c4_curly_bracket", C4_LINE_FILTER, "fineweb_duplicate_line_chars") + line_shape["skip_rules"],
            "report_rules": ("gopher_duplicate_lines", "fineweb_too_many_newlines_per_word", "gopher_mean_word_length_too_long",
                             "c4_too_few_sentences", "gopher_duplicate_*gram_coverage", "gopher_too_few_stop_words"),
            "word_split": "identifiers",
            "min_words": 30,
            "duplicate_line_min_words": 5,
            "min_stop_words": 1,
            "max_top_ngram_char_fraction": ((2, 0.40), (3, 0.36), (4, 0.32)),
        },
        # Source code: prose-shape rules (stop words, terminal punctuation, C4 lines) do not apply at all.
        "code": {"skip_rules": ("gopher_too_few_alphabetic_words", "gopher_too_few_stop_words", "gopher_too_many_hash_symbols",
                                "gopher_mean_word_length_*", "gopher_too_many_bullet_lines", "c4_*", "fineweb_*")},
    }
