"""Gopher repetition rules (Rae et al. 2021, Table A1): duplicated lines and paragraphs, top and
duplicated n-grams."""
from __future__ import annotations

from typing import Callable


from tasks.filters.quality_config import QualityConfig, Verdict, verdict_above
from tasks.filters.text_view import TextView


def gopher_duplicate_lines(view: TextView, config: QualityConfig) -> Verdict:
    duplicates, _ = view.line_duplicates(config.duplicate_line_min_words)
    return verdict_above("gopher_duplicate_lines", duplicates / max(1, len(view.content_lines(config.duplicate_line_min_words))),
                         config.max_duplicate_line_fraction)


def gopher_duplicate_paragraphs(view: TextView, config: QualityConfig) -> Verdict:
    duplicates, _ = view.paragraph_duplicates
    return verdict_above("gopher_duplicate_paragraphs", duplicates / max(1, len(view.paragraphs)), config.max_duplicate_paragraph_fraction)


def gopher_duplicate_line_chars(view: TextView, config: QualityConfig) -> Verdict:
    _, chars = view.line_duplicates(config.duplicate_line_min_words)
    return verdict_above("gopher_duplicate_line_chars", chars / max(1, len(view.text)), config.max_duplicate_line_char_fraction)


def gopher_duplicate_paragraph_chars(view: TextView, config: QualityConfig) -> Verdict:
    _, chars = view.paragraph_duplicates
    return verdict_above("gopher_duplicate_paragraph_chars", chars / max(1, len(view.text)), config.max_duplicate_paragraph_char_fraction)


def duplicate_coverage_verdict(rule: str, view: TextView, kind: str, n: int, threshold: float) -> Verdict:
    """The duplicate n-gram (or n-char) rule. A document whose coverage at a shorter n is already under this
    threshold is kept without measuring n (coverage never grows with n); its verdict's value is then that bound."""
    bound = view.duplicate_bound(kind, n)
    if bound is not None and bound <= threshold:
        return verdict_above(rule, bound, threshold)
    measured = view.word_ngrams(n) if kind == "_word_ngrams" else view.char_ngrams(n)
    return verdict_above(rule, measured.duplicate_fraction, threshold)


def gopher_top_ngram_rule(n: int, threshold: float) -> Callable[[TextView, QualityConfig], Verdict]:
    def rule(view: TextView, config: QualityConfig) -> Verdict:
        return verdict_above(f"gopher_top_{n}gram_coverage", view.word_ngrams(n).top_fraction, threshold)

    rule.__name__ = f"gopher_top_{n}gram_coverage"
    return rule


def gopher_duplicate_ngram_rule(n: int, threshold: float) -> Callable[[TextView, QualityConfig], Verdict]:
    def rule(view: TextView, config: QualityConfig) -> Verdict:
        return duplicate_coverage_verdict(f"gopher_duplicate_{n}gram_coverage", view, "_word_ngrams", n, threshold)

    rule.__name__ = f"gopher_duplicate_{n}gram_coverage"
    return rule
