"""The quality stage's numbers (`QualityConfig`: every threshold, published value by default) and a rule's
answer (`Verdict`)."""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple


from tasks.filters.profiles import default_profiles


WORD_SPLITS = ("whitespace", "identifiers")  # QualityConfig.word_split; IDENTIFIER_JOIN defines the second


@dataclass(frozen=True)
class QualityConfig:
    # Gopher quality (Rae et al. 2021, Table A1; seed 001 list). Words = whitespace-separated tokens.
    min_words: int = 50
    # How the word-count rules (min/max words) count words: "whitespace" (Gopher) or "identifiers", where a
    # code identifier counts as the names it is made of (`numpy.linalg.norm(x)` is 4 words), as a word
    # tokenizer would count it (datatrove's Gopher filter counts tokenizer words). See WORD_SPLITS.
    word_split: str = "whitespace"
    max_words: int = 100_000
    min_mean_word_length: float = 3.0
    max_mean_word_length: float = 10.0
    max_hash_per_word: float = 0.1
    max_ellipsis_per_word: float = 0.1
    max_bullet_line_fraction: float = 0.9
    max_ellipsis_line_fraction: float = 0.3
    min_alphabetic_word_fraction: float = 0.8
    min_stop_words: int = 2  # distinct stop words present
    stop_words: tuple[str, ...] = ("the", "be", "to", "of", "and", "that", "have", "with")
    stop_word_langs: tuple[str, ...] = ("en",)  # the list is English; other languages skip this rule
    bullet_prefixes: tuple[str, ...] = ("•", "-", "*", "‣", "◦")
    # Gopher repetition (Table A1).
    max_duplicate_line_fraction: float = 0.3
    max_duplicate_paragraph_fraction: float = 0.3
    max_duplicate_line_char_fraction: float = 0.2
    max_duplicate_paragraph_char_fraction: float = 0.2
    duplicate_line_min_words: int = 1  # lines shorter than this are not counted by the duplicate-line rules (Gopher: every line)
    max_top_ngram_char_fraction: tuple[tuple[int, float], ...] = ((2, 0.20), (3, 0.18), (4, 0.16))
    max_duplicate_ngram_char_fraction: tuple[tuple[int, float], ...] = ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))
    # C4 (TFDS c4_utils.clean_page: 5 words per line, 3 sentences; datatrove swaps the two numbers).
    c4_min_words_per_line: int = 5
    c4_min_sentences: int = 3
    c4_max_word_length: int = 1000
    c4_end_marks: tuple[str, ...] = (".", "?", "!", '"')
    c4_policy_substrings: tuple[str, ...] = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
    c4_drop_unpunctuated_lines: bool = True  # TFDS C4; FineWeb turns it off (datatrove filter_no_terminal_punct=False)
    # FineWeb (Penedo et al. 2024).
    min_terminal_punct_line_fraction: float = 0.12
    fineweb_end_marks: tuple[str, ...] = (".", "'", '"', "!", "?")
    max_short_line_fraction: float = 0.67
    short_line_max_chars: int = 30
    max_fineweb_duplicate_line_char_fraction: float = 0.01
    max_newlines_per_word: float = 0.3
    # Space-less scripts (seed 001: whitespace rules do not apply to Chinese). Bounds are the Gopher
    # word bounds at ~1.5 characters per Chinese word; shares and n-gram sizes are ours, see docs/quality.md.
    spaceless_langs: tuple[str, ...] = ("zh", "ja", "th", "lo", "km", "my", "bo", "wuu", "yue")
    han_langs: tuple[str, ...] = ("zh", "wuu", "yue")
    cjk_min_chars: int = 75
    cjk_max_chars: int = 150_000
    min_han_fraction: float = 0.2  # Han characters among all letters (mixed zh-en technical text passes)
    max_duplicate_char_ngram_fraction: tuple[tuple[int, float], ...] = ((10, 0.15), (20, 0.10))
    zh_function_words: tuple[str, ...] = ("的", "是", "了", "在", "和", "有", "不", "这", "也", "就", "都", "与", "为", "而", "着")
    min_zh_function_words: int = 2  # distinct function words present
    # Rule sets per source profile (document meta "profile"); each entry overrides fields above.
    profiles: dict[str, dict[str, Any]] = field(default_factory=default_profiles)
    default_profile: str = "web"  # documents whose source names no profile: web crawls get web rules
    skip_rules: tuple[str, ...] = ()  # rule names or fnmatch patterns (e.g. "c4_*") not applied
    # Report-only rules: evaluated on every document, never remove it; a kept document they fail carries
    # them in meta.quality_flags as [rule, value, threshold] (C4's page rules cannot be report-only).
    report_rules: tuple[str, ...] = ()
    all_rules: bool = False  # evaluate every rule and list every failure in the audit detail (analysis)

    def __post_init__(self) -> None:
        if self.word_split not in WORD_SPLITS:
            raise ValueError(f"quality.word_split = {self.word_split!r}; expected one of {list(WORD_SPLITS)}")
        problem = range_problem({f: getattr(self, f) for f in self.__dataclass_fields__ if f != "profiles"}, "quality")
        for profile, overrides in self.profiles.items():
            problem = problem or range_problem({**{f: getattr(self, f) for f in self.__dataclass_fields__}, **overrides},
                                               f"quality.profiles.{profile}")
        if problem:
            raise ValueError(problem)


def range_problem(values: dict[str, Any], where: str) -> str | None:
    """Counts, lengths and thresholds are >= 0, fractions at most 1, and each min_X at most its max_X (-5 words or a
    floor above the ceiling would remove every document, or none, without a word)."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if value < 0:
            return f"{where}.{name} = {value}: must be >= 0"
        if "fraction" in name and value > 1:
            return f"{where}.{name} = {value}: a fraction, must be at most 1"
    for low, high in (("min_words", "max_words"), ("min_mean_word_length", "max_mean_word_length"), ("cjk_min_chars", "cjk_max_chars")):
        if values.get(low) is not None and values.get(high) is not None and values[low] > values[high]:
            return f"{where}.{low} = {values[low]} is above {high} = {values[high]}"
    return None


class Verdict(NamedTuple):
    """One rule's answer: `rule` names the failure it detects; `keep` is False when it fired.

    A named tuple, not a frozen dataclass: every document gets one per rule it reaches, and a frozen
    dataclass's field-by-field set-up cost as much as some of the rules."""

    keep: bool
    rule: str
    value: float
    threshold: float


def verdict_above(rule: str, value: float, threshold: float) -> Verdict:
    return Verdict(not value > threshold, rule, float(value), float(threshold))


def verdict_below(rule: str, value: float, threshold: float) -> Verdict:
    return Verdict(not value < threshold, rule, float(value), float(threshold))


_PATTERNS: dict[str, re.Pattern[str]] = {}


def compiled_pattern(pattern: str) -> re.Pattern[str]:
    if pattern not in _PATTERNS:
        _PATTERNS[pattern] = re.compile(pattern)
    return _PATTERNS[pattern]


def rule_skipped(name: str, skip_rules: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in skip_rules)


# The QualityConfig field each rule compares against: what a "what if" on the report page moves, and the key of
# the `--set quality.KEY=VALUE` that applies it. An n-gram rule's threshold is one entry of a (n, threshold) list.
RULE_THRESHOLD_FIELDS: dict[str, str] = {
    "gopher_too_few_words": "min_words", "gopher_too_many_words": "max_words",
    "gopher_mean_word_length_too_short": "min_mean_word_length", "gopher_mean_word_length_too_long": "max_mean_word_length",
    "gopher_too_many_hash_symbols": "max_hash_per_word", "gopher_too_many_ellipses": "max_ellipsis_per_word",
    "gopher_too_many_bullet_lines": "max_bullet_line_fraction", "gopher_too_many_ellipsis_lines": "max_ellipsis_line_fraction",
    "gopher_too_few_alphabetic_words": "min_alphabetic_word_fraction", "gopher_too_few_stop_words": "min_stop_words",
    "gopher_duplicate_lines": "max_duplicate_line_fraction", "gopher_duplicate_paragraphs": "max_duplicate_paragraph_fraction",
    "gopher_duplicate_line_chars": "max_duplicate_line_char_fraction", "gopher_duplicate_paragraph_chars": "max_duplicate_paragraph_char_fraction",
    "c4_too_few_sentences": "c4_min_sentences",
    "fineweb_too_few_terminal_punct_lines": "min_terminal_punct_line_fraction", "fineweb_too_many_short_lines": "max_short_line_fraction",
    "fineweb_duplicate_line_chars": "max_fineweb_duplicate_line_char_fraction", "fineweb_too_many_newlines_per_word": "max_newlines_per_word",
    "cjk_too_few_chars": "cjk_min_chars", "cjk_too_many_chars": "cjk_max_chars",
    "zh_too_few_han_chars": "min_han_fraction", "zh_too_few_function_words": "min_zh_function_words",
}
NGRAM_THRESHOLD_FIELDS = ((re.compile(r"gopher_top_(\d+)gram_coverage"), "max_top_ngram_char_fraction"),
                          (re.compile(r"gopher_duplicate_(\d+)gram_coverage"), "max_duplicate_ngram_char_fraction"),
                          (re.compile(r"cjk_duplicate_(\d+)char_coverage"), "max_duplicate_char_ngram_fraction"))
FIXED_RULES = ("quality_empty_text", "c4_lorem_ipsum", "c4_curly_bracket")  # yes/no rules: no threshold to move


def threshold_field(rule: str) -> tuple[str, int | None] | None:
    """(QualityConfig field, n for an n-gram list's entry or None) of a rule's threshold; None for a yes/no rule."""
    if rule in RULE_THRESHOLD_FIELDS:
        return RULE_THRESHOLD_FIELDS[rule], None
    for pattern, name in NGRAM_THRESHOLD_FIELDS:
        match = pattern.fullmatch(rule)
        if match:
            return name, int(match.group(1))
    return None


def with_threshold(current: Any, n: int | None, value: float) -> Any:
    """A field's new value with one rule's threshold changed: the number itself, or the n-gram list with entry n replaced."""
    if n is None:
        return type(current)(value) if isinstance(current, (int, float)) and not isinstance(current, bool) else value
    return [[size, value if size == n else limit] for size, limit in current]
