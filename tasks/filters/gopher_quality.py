"""Gopher quality rules (Rae et al. 2021, Table A1): word counts and lengths, symbols, bullets, ellipses,
alphabetic words and stop words."""
from __future__ import annotations

import functools
import re
from itertools import repeat


from tasks.filters.quality_config import compiled_pattern
from tasks.filters.quality_config import QualityConfig, Verdict, verdict_above, verdict_below
from tasks.filters.text_view import LETTER, NON_ALPHABETIC_WORD, TextView


def gopher_too_few_words(view: TextView, config: QualityConfig) -> Verdict:
    return verdict_below("gopher_too_few_words", view.word_count(config.word_split), config.min_words)


def gopher_too_many_words(view: TextView, config: QualityConfig) -> Verdict:
    return verdict_above("gopher_too_many_words", view.word_count(config.word_split), config.max_words)


def gopher_mean_word_length_too_short(view: TextView, config: QualityConfig) -> Verdict:
    return verdict_below("gopher_mean_word_length_too_short", view.mean_word_length, config.min_mean_word_length)


def gopher_mean_word_length_too_long(view: TextView, config: QualityConfig) -> Verdict:
    return verdict_above("gopher_mean_word_length_too_long", view.mean_word_length, config.max_mean_word_length)


def gopher_too_many_hash_symbols(view: TextView, config: QualityConfig) -> Verdict:
    return verdict_above("gopher_too_many_hash_symbols", view.text.count("#") / max(1, view.n_words), config.max_hash_per_word)


def gopher_too_many_ellipses(view: TextView, config: QualityConfig) -> Verdict:
    ellipses = view.text.count("...") + view.text.count("…")
    return verdict_above("gopher_too_many_ellipses", ellipses / max(1, view.n_words), config.max_ellipsis_per_word)


def gopher_too_many_bullet_lines(view: TextView, config: QualityConfig) -> Verdict:
    bullets = sum(map(str.startswith, view.lines, repeat(config.bullet_prefixes)))  # map: no generator frame a line
    return verdict_above("gopher_too_many_bullet_lines", bullets / max(1, len(view.lines)), config.max_bullet_line_fraction)


def gopher_too_many_ellipsis_lines(view: TextView, config: QualityConfig) -> Verdict:
    endings = sum(map(str.endswith, view.lines, repeat(("...", "…"))))
    return verdict_above("gopher_too_many_ellipsis_lines", endings / max(1, len(view.lines)), config.max_ellipsis_line_fraction)


# ASCII text with every character but letters and whitespace deleted: its words are the words that had a letter.
KEEP_ASCII_LETTERS_AND_SPACE = {code: None for code in range(128) if not (chr(code).isalpha() or chr(code).isspace())}


def words_without_letter(view: TextView) -> int:
    """Whitespace words with no letter (NON_ALPHABETIC_WORD's matches): the batch's count when the view has one;
    else for ASCII text by one translate and split."""
    if view.batch is not None:
        return int(view.batch.without_letter[view.index])
    if view.text.isascii():
        return view.n_words - len(view.text.translate(KEEP_ASCII_LETTERS_AND_SPACE).split())
    return len(NON_ALPHABETIC_WORD.findall(view.text))


def gopher_too_few_alphabetic_words(view: TextView, config: QualityConfig) -> Verdict:
    without_letter = words_without_letter(view)
    fraction = 1.0 - without_letter / view.n_words if view.n_words else 0.0
    return verdict_below("gopher_too_few_alphabetic_words", fraction, config.min_alphabetic_word_fraction)


def stop_word_pattern(stop_words: tuple[str, ...]) -> re.Pattern[str]:
    return compiled_pattern(r"(?<![^\W\d_])(?:" + "|".join(map(re.escape, stop_words)) + r")(?![^\W\d_])")


@functools.lru_cache(maxsize=64)
def findable_stop_words(stop_words: tuple[str, ...]) -> tuple[str, ...] | None:
    """The distinct stop words when all are made of letters (str.find can look them up), else None; once per list."""
    if "" in stop_words or not all(LETTER.fullmatch(ch) for word in stop_words for ch in word):
        return None
    return tuple(dict.fromkeys(stop_words))


def distinct_stop_words(lower: str, stop_words: tuple[str, ...]) -> int:
    """How many of `stop_words` occur in `lower` as a whole word between non-letters: each looked up with str.find
    (C speed, and the first bounded hit ends the search), ten times faster than one alternation regex over the text.
    Words that are not all letters go through the regex, whose matches can then overlap differently."""
    words = findable_stop_words(tuple(stop_words))
    if words is None:
        return len(set(stop_word_pattern(stop_words).findall(lower)))
    found, size = 0, len(lower)
    for word in words:
        at = lower.find(word)
        while at != -1:
            end = at + len(word)
            if (at == 0 or not LETTER.match(lower, at - 1)) and (end == size or not LETTER.match(lower, end)):
                found += 1
                break
            at = lower.find(word, at + 1)
    return found


def gopher_too_few_stop_words(view: TextView, config: QualityConfig) -> Verdict:
    """Distinct stop words present, case-folded, letters-only word boundaries (seed 001 Lab 1)."""
    return verdict_below("gopher_too_few_stop_words", distinct_stop_words(view.lower, config.stop_words), config.min_stop_words)
