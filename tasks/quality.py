"""Heuristic quality filters: Gopher quality + repetition, C4 lines, FineWeb, and Chinese-aware rules.

Seed 001, "启发式质量过滤器" (and "按成本排序，并保留日志"): cheap statistics after
whitespace tokenisation decide most junk; each rule targets one kind of junk.
Thresholds below are the published numbers (Gopher: Rae et al. 2021 Table A1;
C4: the TFDS `c4_utils.clean_page` reference; FineWeb: Penedo et al. 2024) and
live only in `QualityConfig`.

Every rule is a pure function `(TextView, QualityConfig) -> Verdict`: keep or
drop, the name of the failure (`gopher_too_few_stop_words`), the measured value
and the threshold. The rule set follows the document's language (space-less
scripts get character rules) and its source profile (prose / documentation /
code skip rules by name, recorded in the audit detail). Definitions that
differ from datatrove's are listed in docs/quality.md.
"""
from __future__ import annotations

import fnmatch
import json
import re
from collections import Counter
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
from prefect import task

from manifests.schema import docs_table, dumps_json
from manifests.stage_manifest import StageManifest
from tasks.stage_runner import ShardOutcome, StageDef, run_stage

STAGE = "quality"
VERSION = "1"


def _default_profiles() -> dict[str, dict[str, Any]]:
    """Per-source rule sets: field overrides applied to the base config for documents of that profile (docs/quality.md)."""
    # Line-shape rules misfire on prose that is a list (filmographies, parish lists, "see also" sections): on the
    # labelled sample and bench corpus FineWeb's terminal-punctuation and short-line rules catch no junk that
    # another rule misses, yet removed 1.7 % of the clean sample prose; C4's removal of unpunctuated lines then
    # leaves such sections without sentences. FineWeb runs C4 without that line removal, so do we.
    line_shape = {"c4_drop_unpunctuated_lines": False, "skip_rules": ("fineweb_too_few_terminal_punct_lines", "fineweb_too_many_short_lines")}
    return {
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
    profiles: dict[str, dict[str, Any]] = field(default_factory=_default_profiles)
    default_profile: str = "prose"
    skip_rules: tuple[str, ...] = ()  # rule names or fnmatch patterns (e.g. "c4_*") not applied
    # Report-only rules: evaluated on every document, never remove it; a kept document they fail carries
    # them in meta.quality_flags as [rule, value, threshold] (C4's page rules cannot be report-only).
    report_rules: tuple[str, ...] = ()
    all_rules: bool = False  # evaluate every rule and list every failure in the audit detail (analysis)

    def __post_init__(self) -> None:
        if self.word_split not in WORD_SPLITS:
            raise ValueError(f"quality.word_split = {self.word_split!r}; expected one of {list(WORD_SPLITS)}")


@dataclass(frozen=True)
class Verdict:
    """One rule's answer: `rule` names the failure it detects; `keep` is False when it fired."""

    keep: bool
    rule: str
    value: float
    threshold: float


def _verdict_above(rule: str, value: float, threshold: float) -> Verdict:
    return Verdict(not value > threshold, rule, float(value), float(threshold))


def _verdict_below(rule: str, value: float, threshold: float) -> Verdict:
    return Verdict(not value < threshold, rule, float(value), float(threshold))


NON_ALPHABETIC_WORD = re.compile(r"(?<!\S)(?:[\d_]|[^\w\s])+(?!\S)")  # a token with no letter at all
LETTER = re.compile(r"[^\W\d_]")
HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f]")
SPACELESS_SCRIPT = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\U00020000-\U0002fa1f]")
PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n\s*")
WHITESPACE = re.compile(r"\s+")
CITATION = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]")
SCRIPT_SAMPLE_CHARS = 20_000  # enough text to tell scripts apart without scanning a 5 MB page
C4_LINE_FILTER = "c4_line_filter"  # skip name of C4's line removal (the modification c4_lines_removed)
SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*(?=\s|$)")
# A join inside a code identifier: between two name parts (letters/digits) stands a connector that programming
# languages use to build one name from several: snake_case's `_`, member/module access `.`, `::`, `->`, and a call
# or subscript `(` / `[` followed by its first argument. After `.`, `::`, `->`, `(`, `[` the next part must start
# with a letter, so numbers (3.14, 1.2.3, a[0]) stay one word; hyphens, slashes and apostrophes are not joins.
# Each branch starts with its connector and looks back at the name part before it, so the regex engine jumps from
# connector to connector (~0.15 ms per 6 KB page, like str.split; a leading look-behind made it 9x slower).
_NEXT_NAME, _NEXT_PART = r"(?=[^\W\d_])", r"(?=[^\W_])"
IDENTIFIER_JOIN = re.compile("|".join([
    r"\.(?<=[^\W_]\.)" + _NEXT_NAME, r"::(?<=[^\W_]::)" + _NEXT_NAME, r"->(?<=[^\W_]->)" + _NEXT_NAME,
    r"[(\[](?<=[^\W_][(\[])" + _NEXT_NAME, r"_(?<=[^\W_]_)_*" + _NEXT_PART,
]))
HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
MIX_MULTIPLIER = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64 finaliser constant


def duplicate_counts(items: list[str]) -> tuple[int, int]:
    """(occurrences after the first, their characters) — Gopher's duplicate line/paragraph measure."""
    counts = Counter(items)
    duplicates = len(items) - len(counts)
    duplicate_chars = sum(len(item) * (n - 1) for item, n in counts.items() if n > 1)
    return duplicates, duplicate_chars


@dataclass
class NgramRepetition:
    """For one n: coverage of the most frequent n-gram and of all repeated occurrences, in token characters."""

    top_fraction: float
    duplicate_fraction: float


def window_hashes(token_ids: np.ndarray, previous: np.ndarray | None, n: int) -> np.ndarray:
    """Hashes of every n-token window, built from the (n-1)-token window hashes in one vector step."""
    windows = len(token_ids) - n + 1
    if n == 1 or previous is None:
        hashes = token_ids[:windows].copy()
        for offset in range(1, n):
            hashes = hashes * HASH_MULTIPLIER + token_ids[offset: offset + windows]
        return hashes
    return previous[:windows] * HASH_MULTIPLIER + token_ids[n - 1:]


def ngram_repetition(hashes: np.ndarray, token_lengths: np.ndarray, n: int, total_chars: int, separator_chars: int) -> NgramRepetition:
    """Vectorised: sort the window hashes once, mark tokens covered by a repeat of an earlier window.

    top: count x characters of the most frequent window as written (tokens plus n-1 separators), only
    when it occurs twice or more. duplicate: characters of tokens inside any window occurrence after
    its first, each token counted once. Both over the document's characters (Gopher's wording).
    """
    windows = len(hashes)
    if windows < 2 or total_chars == 0:
        return NgramRepetition(0.0, 0.0)
    # One plain sort of (mixed hash high bits | position): equal windows end up adjacent, earliest first.
    # The polynomial window hash is linear, so it is bit-mixed before its low bits make room for the position.
    mixed = hashes ^ (hashes >> np.uint64(31))
    mixed *= MIX_MULTIPLIER
    mixed ^= mixed >> np.uint64(29)
    position_bits = max(1, int(windows - 1).bit_length())
    keys = np.sort((mixed >> np.uint64(position_bits)) << np.uint64(position_bits) | np.arange(windows, dtype=np.uint64))
    window_of_key = keys >> np.uint64(position_bits)
    same_as_previous = window_of_key[1:] == window_of_key[:-1]
    if not same_as_previous.any():
        return NgramRepetition(0.0, 0.0)
    positions = (keys & np.uint64((1 << position_bits) - 1)).astype(np.int64)
    repeat_starts = positions[1:][same_as_previous]
    group_starts = np.flatnonzero(np.concatenate(([True], ~same_as_previous)))
    group_sizes = np.concatenate((group_starts[1:], [windows])) - group_starts
    best = int(group_sizes.max())
    first_position = int(positions[group_starts[group_sizes == best]].min())  # ties: earliest window, like Counter.most_common
    top_chars = (int(token_lengths[first_position: first_position + n].sum()) + separator_chars * (n - 1)) * best
    coverage_delta = np.zeros(len(token_lengths) + 1, dtype=np.int32)
    coverage_delta[repeat_starts] += 1
    coverage_delta[repeat_starts + n] -= 1
    covered = np.cumsum(coverage_delta[:-1]) > 0
    return NgramRepetition(top_chars / total_chars, float(token_lengths[covered].sum()) / total_chars)


class TextView:
    """Statistics of one document, computed once on first use and shared by all rules."""

    def __init__(self, text: str):
        self.text = text

    @cached_property
    def words(self) -> list[str]:
        return self.text.split()

    def word_count(self, split: str) -> int:
        """Words for the word-count rules: whitespace tokens, plus one per identifier join when split == "identifiers"."""
        if split == "whitespace":
            return len(self.words)
        if "_identifier_words" not in self.__dict__:
            self.__dict__["_identifier_words"] = len(self.words) + len(IDENTIFIER_JOIN.findall(self.text))
        return self.__dict__["_identifier_words"]

    @cached_property
    def word_lengths(self) -> np.ndarray:
        return np.fromiter(map(len, self.words), dtype=np.int64, count=len(self.words))

    @cached_property
    def word_ids(self) -> np.ndarray:
        # Python's str hash: equal words, equal ids within this process; nothing outlives the document.
        return np.fromiter(map(hash, self.words), dtype=np.int64, count=len(self.words)).view(np.uint64)

    @cached_property
    def lines(self) -> list[str]:
        """Non-empty lines, stripped (blank lines carry no content and would all be 'duplicates')."""
        return [line for line in (raw.strip() for raw in self.text.splitlines()) if line]

    def content_lines(self, min_words: int) -> list[str]:
        """The non-empty lines of at least `min_words` whitespace words (all of them when min_words <= 1)."""
        if min_words <= 1:
            return self.lines
        cache = self.__dict__.setdefault("_content_lines", {})
        if min_words not in cache:
            cache[min_words] = [line for line in self.lines if len(line.split()) >= min_words]
        return cache[min_words]

    @cached_property
    def paragraphs(self) -> list[str]:
        return [p for p in (raw.strip() for raw in PARAGRAPH_BREAK.split(self.text.strip())) if p]

    @cached_property
    def dense_text(self) -> str:
        """The text without whitespace: the unit of length for space-less scripts."""
        return WHITESPACE.sub("", self.text)

    @cached_property
    def char_ids(self) -> np.ndarray:
        return np.frombuffer(self.dense_text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.uint64)

    def _ngrams(self, kind: str, token_ids: np.ndarray, token_lengths: np.ndarray, n: int, total_chars: int, separator_chars: int) -> NgramRepetition:
        cache = self.__dict__.setdefault(kind, {})  # n -> result; "hashes" -> (n, window hashes)
        if n not in cache:
            if len(token_ids) - n + 1 < 2:
                cache[n] = NgramRepetition(0.0, 0.0)
                return cache[n]
            if cache.get("no_repeats_from", n + 1) <= n:  # no repeated k-gram means no repeated longer one
                cache[n] = NgramRepetition(0.0, 0.0)
                return cache[n]
            last_n, last_hashes = cache.get("hashes", (0, None))
            hashes = window_hashes(token_ids, last_hashes if last_n == n - 1 else None, n)
            cache["hashes"] = (n, hashes)
            cache[n] = ngram_repetition(hashes, token_lengths, n, total_chars, separator_chars)
            if cache[n].duplicate_fraction == 0.0:
                cache["no_repeats_from"] = min(n, cache.get("no_repeats_from", n))
        return cache[n]

    def word_ngrams(self, n: int) -> NgramRepetition:
        return self._ngrams("_word_ngrams", self.word_ids, self.word_lengths, n, len(self.text), 1)

    def char_ngrams(self, n: int) -> NgramRepetition:
        return self._ngrams("_char_ngrams", self.char_ids, np.ones(len(self.char_ids), dtype=np.int64), n, len(self.dense_text), 0)


# ---------------------------------------------------------------- rules: any language
def quality_empty_text(view: TextView, config: QualityConfig) -> Verdict:
    return _verdict_below("quality_empty_text", len(view.text.strip()), 1)


# ---------------------------------------------------------------- Gopher quality
def gopher_too_few_words(view: TextView, config: QualityConfig) -> Verdict:
    return _verdict_below("gopher_too_few_words", view.word_count(config.word_split), config.min_words)


def gopher_too_many_words(view: TextView, config: QualityConfig) -> Verdict:
    return _verdict_above("gopher_too_many_words", view.word_count(config.word_split), config.max_words)


def gopher_mean_word_length_too_short(view: TextView, config: QualityConfig) -> Verdict:
    mean = float(view.word_lengths.mean()) if view.words else 0.0
    return _verdict_below("gopher_mean_word_length_too_short", mean, config.min_mean_word_length)


def gopher_mean_word_length_too_long(view: TextView, config: QualityConfig) -> Verdict:
    mean = float(view.word_lengths.mean()) if view.words else 0.0
    return _verdict_above("gopher_mean_word_length_too_long", mean, config.max_mean_word_length)


def gopher_too_many_hash_symbols(view: TextView, config: QualityConfig) -> Verdict:
    return _verdict_above("gopher_too_many_hash_symbols", view.text.count("#") / max(1, len(view.words)), config.max_hash_per_word)


def gopher_too_many_ellipses(view: TextView, config: QualityConfig) -> Verdict:
    ellipses = view.text.count("...") + view.text.count("…")
    return _verdict_above("gopher_too_many_ellipses", ellipses / max(1, len(view.words)), config.max_ellipsis_per_word)


def gopher_too_many_bullet_lines(view: TextView, config: QualityConfig) -> Verdict:
    bullets = sum(line.startswith(config.bullet_prefixes) for line in view.lines)
    return _verdict_above("gopher_too_many_bullet_lines", bullets / max(1, len(view.lines)), config.max_bullet_line_fraction)


def gopher_too_many_ellipsis_lines(view: TextView, config: QualityConfig) -> Verdict:
    endings = sum(line.endswith(("...", "…")) for line in view.lines)
    return _verdict_above("gopher_too_many_ellipsis_lines", endings / max(1, len(view.lines)), config.max_ellipsis_line_fraction)


def gopher_too_few_alphabetic_words(view: TextView, config: QualityConfig) -> Verdict:
    without_letter = len(NON_ALPHABETIC_WORD.findall(view.text))
    fraction = 1.0 - without_letter / len(view.words) if view.words else 0.0
    return _verdict_below("gopher_too_few_alphabetic_words", fraction, config.min_alphabetic_word_fraction)


def stop_word_pattern(stop_words: tuple[str, ...]) -> re.Pattern[str]:
    return _compiled(r"(?<![^\W\d_])(?:" + "|".join(map(re.escape, stop_words)) + r")(?![^\W\d_])")


def gopher_too_few_stop_words(view: TextView, config: QualityConfig) -> Verdict:
    """Distinct stop words present, case-folded, letters-only word boundaries (seed 001 Lab 1)."""
    present = set(stop_word_pattern(config.stop_words).findall(view.text.lower()))
    return _verdict_below("gopher_too_few_stop_words", len(present), config.min_stop_words)


# ---------------------------------------------------------------- Gopher repetition
def gopher_duplicate_lines(view: TextView, config: QualityConfig) -> Verdict:
    lines = view.content_lines(config.duplicate_line_min_words)
    duplicates, _ = duplicate_counts(lines)
    return _verdict_above("gopher_duplicate_lines", duplicates / max(1, len(lines)), config.max_duplicate_line_fraction)


def gopher_duplicate_paragraphs(view: TextView, config: QualityConfig) -> Verdict:
    duplicates, _ = duplicate_counts(view.paragraphs)
    return _verdict_above("gopher_duplicate_paragraphs", duplicates / max(1, len(view.paragraphs)), config.max_duplicate_paragraph_fraction)


def gopher_duplicate_line_chars(view: TextView, config: QualityConfig) -> Verdict:
    _, chars = duplicate_counts(view.content_lines(config.duplicate_line_min_words))
    return _verdict_above("gopher_duplicate_line_chars", chars / max(1, len(view.text)), config.max_duplicate_line_char_fraction)


def gopher_duplicate_paragraph_chars(view: TextView, config: QualityConfig) -> Verdict:
    _, chars = duplicate_counts(view.paragraphs)
    return _verdict_above("gopher_duplicate_paragraph_chars", chars / max(1, len(view.text)), config.max_duplicate_paragraph_char_fraction)


def gopher_top_ngram_rule(n: int, threshold: float) -> Callable[[TextView, QualityConfig], Verdict]:
    def rule(view: TextView, config: QualityConfig) -> Verdict:
        return _verdict_above(f"gopher_top_{n}gram_coverage", view.word_ngrams(n).top_fraction, threshold)

    rule.__name__ = f"gopher_top_{n}gram_coverage"
    return rule


def gopher_duplicate_ngram_rule(n: int, threshold: float) -> Callable[[TextView, QualityConfig], Verdict]:
    def rule(view: TextView, config: QualityConfig) -> Verdict:
        return _verdict_above(f"gopher_duplicate_{n}gram_coverage", view.word_ngrams(n).duplicate_fraction, threshold)

    rule.__name__ = f"gopher_duplicate_{n}gram_coverage"
    return rule


# ---------------------------------------------------------------- C4 (TFDS clean_page)
@dataclass
class C4Cleaning:
    """Result of C4's line pass: the page verdict, surviving lines and why the others went."""

    page_rule: str | None  # c4_lorem_ipsum | c4_curly_bracket | None
    kept_lines: list[str]
    sentences: int
    removed_lines: dict[str, int]
    citations_removed: int


def c4_clean_lines(text: str, config: QualityConfig, check_braces: bool = True, check_lorem: bool = True) -> C4Cleaning:
    """Line by line, in the TFDS order: long word, citations, end mark, word count, lorem/javascript/brace/policy."""
    removed: Counter[str] = Counter()
    kept: list[str] = []
    sentences = citations = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue  # blank lines are layout, not content; TFDS drops them as 'no end mark'
        if any(len(word) > config.c4_max_word_length for word in line.split()):
            removed["too_long_word"] += 1
            continue
        line, n_citations = CITATION.subn("", line)
        citations += n_citations
        if config.c4_drop_unpunctuated_lines and (not line.endswith(config.c4_end_marks) or line.endswith("...")):
            removed["no_terminal_punct"] += 1
            continue
        if len(line.split()) < config.c4_min_words_per_line:
            removed["too_few_words"] += 1
            continue
        lower = line.lower()
        if check_lorem and "lorem ipsum" in lower:
            return C4Cleaning("c4_lorem_ipsum", kept, sentences, dict(removed), citations)
        if "javascript" in lower:
            removed["javascript"] += 1
            continue
        if check_braces and "{" in line:
            return C4Cleaning("c4_curly_bracket", kept, sentences, dict(removed), citations)
        if any(phrase in lower for phrase in config.c4_policy_substrings):
            removed["policy"] += 1
            continue
        sentences += max(1, len(SENTENCE_END.findall(line)))
        kept.append(line)
    return C4Cleaning(None, kept, sentences, dict(removed), citations)


def _c4(view: TextView, config: QualityConfig) -> C4Cleaning:
    """C4's line pass, run once per document and config (the three C4 rules and the modification share it)."""
    key = ("_c4", id(config))
    if key not in view.__dict__:
        # A skipped page rule must not stop the line pass early, or the kept text would be cut short.
        view.__dict__[key] = c4_clean_lines(view.text, config, check_braces=not rule_skipped("c4_curly_bracket", config.skip_rules),
                                            check_lorem=not rule_skipped("c4_lorem_ipsum", config.skip_rules))
    return view.__dict__[key]


def c4_lorem_ipsum(view: TextView, config: QualityConfig) -> Verdict:
    return Verdict(_c4(view, config).page_rule != "c4_lorem_ipsum", "c4_lorem_ipsum", float(_c4(view, config).page_rule == "c4_lorem_ipsum"), 0.0)


def c4_curly_bracket(view: TextView, config: QualityConfig) -> Verdict:
    return Verdict(_c4(view, config).page_rule != "c4_curly_bracket", "c4_curly_bracket", float(_c4(view, config).page_rule == "c4_curly_bracket"), 0.0)


def c4_too_few_sentences(view: TextView, config: QualityConfig) -> Verdict:
    cleaning = _c4(view, config)
    if cleaning.page_rule is not None:  # the page already failed; sentences were not all counted
        return Verdict(True, "c4_too_few_sentences", float(cleaning.sentences), float(config.c4_min_sentences))
    return _verdict_below("c4_too_few_sentences", cleaning.sentences, config.c4_min_sentences)


# ---------------------------------------------------------------- FineWeb
def fineweb_too_few_terminal_punct_lines(view: TextView, config: QualityConfig) -> Verdict:
    ending = sum(line.endswith(config.fineweb_end_marks) for line in view.lines)
    return _verdict_below("fineweb_too_few_terminal_punct_lines", ending / max(1, len(view.lines)), config.min_terminal_punct_line_fraction)


def fineweb_too_many_short_lines(view: TextView, config: QualityConfig) -> Verdict:
    short = sum(len(line) <= config.short_line_max_chars for line in view.lines)
    return _verdict_above("fineweb_too_many_short_lines", short / max(1, len(view.lines)), config.max_short_line_fraction)


def fineweb_duplicate_line_chars(view: TextView, config: QualityConfig) -> Verdict:
    _, chars = duplicate_counts(view.lines)
    text_chars = len(view.text) - view.text.count("\n")
    return _verdict_above("fineweb_duplicate_line_chars", chars / max(1, text_chars), config.max_fineweb_duplicate_line_char_fraction)


def fineweb_too_many_newlines_per_word(view: TextView, config: QualityConfig) -> Verdict:
    return _verdict_above("fineweb_too_many_newlines_per_word", view.text.count("\n") / max(1, len(view.words)), config.max_newlines_per_word)


# ---------------------------------------------------------------- space-less scripts (Chinese, Japanese, Thai, ...)
def cjk_too_few_chars(view: TextView, config: QualityConfig) -> Verdict:
    return _verdict_below("cjk_too_few_chars", len(view.dense_text), config.cjk_min_chars)


def cjk_too_many_chars(view: TextView, config: QualityConfig) -> Verdict:
    return _verdict_above("cjk_too_many_chars", len(view.dense_text), config.cjk_max_chars)


def zh_too_few_han_chars(view: TextView, config: QualityConfig) -> Verdict:
    letters = len(LETTER.findall(view.text))
    fraction = len(HAN.findall(view.text)) / letters if letters else 0.0
    return _verdict_below("zh_too_few_han_chars", fraction, config.min_han_fraction)


def cjk_duplicate_char_ngram_rule(n: int, threshold: float) -> Callable[[TextView, QualityConfig], Verdict]:
    def rule(view: TextView, config: QualityConfig) -> Verdict:
        return _verdict_above(f"cjk_duplicate_{n}char_coverage", view.char_ngrams(n).duplicate_fraction, threshold)

    rule.__name__ = f"cjk_duplicate_{n}char_coverage"
    return rule


def zh_too_few_function_words(view: TextView, config: QualityConfig) -> Verdict:
    present = set(_compiled("|".join(map(re.escape, config.zh_function_words))).findall(view.text))
    return _verdict_below("zh_too_few_function_words", len(present), config.min_zh_function_words)


# ---------------------------------------------------------------- rule sets
_PATTERNS: dict[str, re.Pattern[str]] = {}


def _compiled(pattern: str) -> re.Pattern[str]:
    if pattern not in _PATTERNS:
        _PATTERNS[pattern] = re.compile(pattern)
    return _PATTERNS[pattern]


def rule_skipped(name: str, skip_rules: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in skip_rules)


Rule = Callable[[TextView, QualityConfig], Verdict]


def whitespace_rules(config: QualityConfig, lang: str | None) -> list[Rule]:
    """Gopher quality, Gopher repetition, C4, FineWeb — in that order (cheap before expensive within each)."""
    rules: list[Rule] = [
        gopher_too_few_words, gopher_too_many_words, gopher_mean_word_length_too_short, gopher_mean_word_length_too_long,
        gopher_too_many_hash_symbols, gopher_too_many_ellipses, gopher_too_many_bullet_lines, gopher_too_many_ellipsis_lines,
        gopher_too_few_alphabetic_words,
    ]
    if lang is None or lang in config.stop_word_langs:
        rules.append(gopher_too_few_stop_words)
    rules += [gopher_duplicate_lines, gopher_duplicate_paragraphs, gopher_duplicate_line_chars, gopher_duplicate_paragraph_chars]
    rules += [gopher_top_ngram_rule(n, t) for n, t in config.max_top_ngram_char_fraction]
    rules += [gopher_duplicate_ngram_rule(n, t) for n, t in config.max_duplicate_ngram_char_fraction]
    rules += [c4_lorem_ipsum, c4_curly_bracket, c4_too_few_sentences]
    rules += [fineweb_too_few_terminal_punct_lines, fineweb_too_many_short_lines, fineweb_duplicate_line_chars, fineweb_too_many_newlines_per_word]
    return rules


def spaceless_rules(config: QualityConfig, lang: str | None) -> list[Rule]:
    """Character rules for scripts without spaces; line/paragraph repetition is whitespace-free and stays."""
    rules: list[Rule] = [cjk_too_few_chars, cjk_too_many_chars]
    if lang is None or lang in config.han_langs:
        rules += [zh_too_few_han_chars, zh_too_few_function_words]
    rules += [gopher_duplicate_lines, gopher_duplicate_paragraphs, gopher_duplicate_line_chars, gopher_duplicate_paragraph_chars]
    rules += [cjk_duplicate_char_ngram_rule(n, t) for n, t in config.max_duplicate_char_ngram_fraction]
    return rules


def uses_spaceless_rules(view: TextView, lang: str | None, config: QualityConfig) -> bool:
    if lang is not None:
        return lang in config.spaceless_langs
    head = view.text[:SCRIPT_SAMPLE_CHARS]  # no language label: decide by the script of the opening
    letters = len(LETTER.findall(head))
    return letters > 0 and len(SPACELESS_SCRIPT.findall(head)) / letters > 0.5


@dataclass
class QualityDecision:
    keep: bool
    failures: list[Verdict]  # in rule order; the first is the one logged
    rule_set: str  # "whitespace" | "spaceless"
    skipped: list[str]
    c4: C4Cleaning | None
    flags: list[Verdict] = field(default_factory=list)  # report-only rules that failed; they removed nothing


@dataclass(frozen=True)
class RulePlan:
    removing: list[Rule]  # in order; the first failure removes the document
    reporting: list[Rule]  # report-only: evaluated, recorded, never remove
    skipped: list[str]


C4_PAGE_RULES = ("c4_lorem_ipsum", "c4_curly_bracket")  # they end C4's line pass, so they cannot be report-only
_PLANS: dict[int, tuple[QualityConfig, dict[tuple[bool, str | None], RulePlan]]] = {}


def rule_plan(config: QualityConfig, lang: str | None, spaceless: bool) -> RulePlan:
    """The rules to run for this config and language, split into removing and report-only; built once, then reused."""
    cached = _PLANS.get(id(config))
    if cached is None or cached[0] is not config:
        if len(_PLANS) > 64:
            _PLANS.clear()
        cached = _PLANS[id(config)] = (config, {})
    key = (spaceless, lang)
    if key not in cached[1]:
        blocked = [name for name in C4_PAGE_RULES if rule_skipped(name, config.report_rules)]
        if blocked:
            raise ValueError(f"quality.report_rules: {blocked} end C4's line pass and cannot be report-only; put them in skip_rules")
        candidates = spaceless_rules(config, lang) if spaceless else whitespace_rules(config, lang)
        skipped = [rule.__name__ for rule in candidates if rule_skipped(rule.__name__, config.skip_rules)]
        applied = [rule for rule in candidates if rule.__name__ not in skipped]
        reporting = [rule for rule in applied if rule_skipped(rule.__name__, config.report_rules)]
        removing = [rule for rule in applied if rule not in reporting]
        if not spaceless and rule_skipped(C4_LINE_FILTER, config.skip_rules):
            skipped.append(C4_LINE_FILTER)
        cached[1][key] = RulePlan(removing, reporting, skipped)
    return cached[1][key]


def evaluate(text: str, lang: str | None, config: QualityConfig) -> QualityDecision:
    """Run the rule set for this language (first failure only, or all rules when config.all_rules)."""
    view = TextView(text)
    empty = quality_empty_text(view, config)
    if not empty.keep:
        return QualityDecision(False, [empty], "none", [], None)
    spaceless = uses_spaceless_rules(view, lang, config)
    plan = rule_plan(config, lang, spaceless)
    failures: list[Verdict] = []
    for rule in plan.removing:
        verdict = rule(view, config)
        if not verdict.keep:
            failures.append(verdict)
            if not config.all_rules:
                break
    flags = [verdict for verdict in (rule(view, config) for rule in plan.reporting) if not verdict.keep]
    c4 = None
    if not failures and not spaceless and C4_LINE_FILTER not in plan.skipped:
        c4 = _c4(view, config)
    return QualityDecision(not failures, failures, "spaceless" if spaceless else "whitespace", plan.skipped, c4, flags)


def profile_configs(config: QualityConfig) -> dict[str, QualityConfig]:
    """The effective config of each profile: the base with that profile's overrides applied."""
    known = {f.name for f in fields(QualityConfig)} - {"profiles"}
    resolved = {}
    for profile, overrides in config.profiles.items():
        unknown = set(overrides) - known
        if unknown:
            raise ValueError(f"quality.profiles.{profile}: unknown fields {sorted(unknown)}; known: {sorted(known)}")
        values = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v for k, v in overrides.items()}
        for listed in ("skip_rules", "report_rules"):  # a profile adds to the base lists
            if listed in values:
                values[listed] = tuple(getattr(config, listed)) + tuple(values[listed])
        resolved[profile] = replace(config, **values)
    return resolved


def quality_shard(docs: pa.Table, config: QualityConfig, context: Any = None) -> ShardOutcome:
    by_profile = profile_configs(config)
    kept: list[dict[str, Any]] = []
    audit: list[dict[str, Any]] = []
    for row in docs.to_pylist():
        meta = json.loads(row["meta"])
        profile = meta.get("profile") or config.default_profile
        if profile not in by_profile:
            raise ValueError(f"quality: document {row['id']} ({row['source']}) has profile {profile!r}; configured profiles: {sorted(by_profile)}")
        effective = by_profile[profile]
        decision = evaluate(row["text"], row["lang"], effective)
        detail: dict[str, Any] = {"profile": profile, "rule_set": decision.rule_set, "lang": row["lang"]}
        if decision.skipped:
            detail["skipped_rules"] = decision.skipped
        flags = [[v.rule, round(v.value, 6), v.threshold] for v in decision.flags]
        if flags:
            detail["report_only_failures"] = flags
        if not decision.keep:
            first = decision.failures[0]
            if config.all_rules:
                detail["all_failures"] = [[v.rule, round(v.value, 6), v.threshold] for v in decision.failures]
            audit.append({"id": row["id"], "action": "removed", "rule": first.rule, "value": first.value, "threshold": first.threshold, "detail": detail})
            continue
        cleaning = decision.c4
        if cleaning is not None and (cleaning.removed_lines or cleaning.citations_removed):
            new_text = "\n".join(cleaning.kept_lines)
            if new_text != row["text"]:
                lines_before = sum(1 for line in row["text"].splitlines() if line.strip())
                audit.append({"id": row["id"], "action": "modified", "rule": "c4_lines_removed", "value": sum(cleaning.removed_lines.values()), "threshold": None,
                              "detail": {**detail, "removed_by_reason": cleaning.removed_lines, "citations_removed": cleaning.citations_removed,
                                         "lines_before": lines_before, "lines_after": len(cleaning.kept_lines), "chars_before": len(row["text"]), "chars_after": len(new_text)}})
                row["text"] = new_text
        if flags:
            row["meta"] = dumps_json({**meta, "quality_flags": flags})
        kept.append(row)
    return ShardOutcome(docs_table(kept), audit)


QUALITY = StageDef(STAGE, VERSION, quality_shard)


def run_quality(config: QualityConfig, input_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest:
    return run_stage(QUALITY, config, input_dir, out_dir, workers)


@task(name="quality", task_run_name="quality")
def quality_task(config: QualityConfig, input_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest:
    return run_quality(config, input_dir, out_dir, workers)
