"""FineWeb's rules (Penedo et al. 2024, §3.6): terminal punctuation, short lines, duplicated line
characters, newlines per word."""
from __future__ import annotations

from itertools import repeat

from tasks.filters.quality_config import QualityConfig, Verdict, verdict_above, verdict_below
from tasks.filters.text_view import TextView


def fineweb_too_few_terminal_punct_lines(view: TextView, config: QualityConfig) -> Verdict:
    ending = sum(map(str.endswith, view.lines, repeat(config.fineweb_end_marks)))  # map: no generator frame a line
    return verdict_below("fineweb_too_few_terminal_punct_lines", ending / max(1, len(view.lines)), config.min_terminal_punct_line_fraction)


def fineweb_too_many_short_lines(view: TextView, config: QualityConfig) -> Verdict:
    short = sum(map(config.short_line_max_chars.__ge__, map(len, view.lines)))
    return verdict_above("fineweb_too_many_short_lines", short / max(1, len(view.lines)), config.max_short_line_fraction)


def fineweb_duplicate_line_chars(view: TextView, config: QualityConfig) -> Verdict:
    _, chars = view.line_duplicates(1)
    text_chars = len(view.text) - view.newlines
    return verdict_above("fineweb_duplicate_line_chars", chars / max(1, text_chars), config.max_fineweb_duplicate_line_char_fraction)


def fineweb_too_many_newlines_per_word(view: TextView, config: QualityConfig) -> Verdict:
    return verdict_above("fineweb_too_many_newlines_per_word", view.newlines / max(1, view.n_words), config.max_newlines_per_word)
