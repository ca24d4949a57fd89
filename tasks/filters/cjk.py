"""Rules for space-less scripts (Chinese, Japanese, Thai, ...; seed 001: whitespace rules do not apply):
character counts, Han share, duplicated character n-grams, Chinese function words."""
from __future__ import annotations

import re
from typing import Callable


from tasks.filters.quality_config import compiled_pattern
from tasks.filters.quality_config import QualityConfig, Verdict, verdict_above, verdict_below
from tasks.filters.gopher_repetition import duplicate_coverage_verdict
from tasks.filters.text_view import HAN, LETTER, TextView


def cjk_too_few_chars(view: TextView, config: QualityConfig) -> Verdict:
    return verdict_below("cjk_too_few_chars", len(view.dense_text), config.cjk_min_chars)


def cjk_too_many_chars(view: TextView, config: QualityConfig) -> Verdict:
    return verdict_above("cjk_too_many_chars", len(view.dense_text), config.cjk_max_chars)


def zh_too_few_han_chars(view: TextView, config: QualityConfig) -> Verdict:
    letters = len(LETTER.findall(view.text))
    fraction = len(HAN.findall(view.text)) / letters if letters else 0.0
    return verdict_below("zh_too_few_han_chars", fraction, config.min_han_fraction)


def cjk_duplicate_char_ngram_rule(n: int, threshold: float) -> Callable[[TextView, QualityConfig], Verdict]:
    def rule(view: TextView, config: QualityConfig) -> Verdict:
        return duplicate_coverage_verdict(f"cjk_duplicate_{n}char_coverage", view, "_char_ngrams", n, threshold)

    rule.__name__ = f"cjk_duplicate_{n}char_coverage"
    return rule


def zh_too_few_function_words(view: TextView, config: QualityConfig) -> Verdict:
    present = set(compiled_pattern("|".join(map(re.escape, config.zh_function_words))).findall(view.text))
    return verdict_below("zh_too_few_function_words", len(present), config.min_zh_function_words)
