"""One document as the quality rules see it: words, lines, paragraphs and n-gram repetition, each computed
once on first use (`TextView`); word counts and word n-grams come from the batch's `WordNgrams`, character n-grams are hashed here."""
from __future__ import annotations

import re
from collections import Counter

import numpy as np

from tasks.filters.lazy_stats import NgramRepetition, cached_property
from tasks.filters.word_ngrams import LETTER, DocRepeats, WordNgrams



NON_ALPHABETIC_WORD = re.compile(r"(?<!\S)(?:[\d_]|[^\w\s])+(?!\S)")  # a token with no letter at all
HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f]")
SPACELESS_SCRIPT = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\U00020000-\U0002fa1f]")
PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n\s*")
WHITESPACE = re.compile(r"\s+")
CITATION = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]")
SCRIPT_SAMPLE_CHARS = 20_000  # enough text to tell scripts apart without scanning a 5 MB page
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


def window_hashes(token_ids: np.ndarray, previous: np.ndarray | None, n: int) -> np.ndarray:
    """Hashes of every n-token window, built from the (n-1)-token window hashes in one vector step."""
    windows = len(token_ids) - n + 1
    if n == 1 or previous is None:
        hashes = token_ids[:windows].copy()
        for offset in range(1, n):
            hashes = hashes * HASH_MULTIPLIER + token_ids[offset: offset + windows]
        return hashes
    return previous[:windows] * HASH_MULTIPLIER + token_ids[n - 1:]


def ngram_repetition(hashes: np.ndarray, token_lengths: np.ndarray, n: int, total_chars: int,
                     separator_chars: int) -> "NgramRepetition | RepeatedWindows":
    """Vectorised: sort the window hashes once; what the rules ask of the repeats is computed when asked.

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
    # (ufunc calls and in-place ndarray methods, not numpy's Python wrappers: this runs ~3 times a document)
    position_bits = max(1, int(windows - 1).bit_length())
    position_mask = np.uint64((1 << position_bits) - 1)
    keys = mixed & ~position_mask
    keys |= np.arange(windows, dtype=np.uint64)
    keys.sort()
    window_of_key = keys >> np.uint64(position_bits)
    same_as_previous = window_of_key[1:] == window_of_key[:-1]
    if not np.count_nonzero(same_as_previous):
        return NgramRepetition(0.0, 0.0)
    positions = (keys & position_mask).astype(np.int64)
    return RepeatedWindows(positions, same_as_previous, token_lengths, n, total_chars, separator_chars)


class RepeatedWindows:
    """The sorted windows of an n whose windows repeat: the top n-gram rules read `top_fraction`, the duplicate rules
    `duplicate_fraction`, and neither pays for the other (each n is asked for one of them)."""

    def __init__(self, positions: np.ndarray, same_as_previous: np.ndarray, token_lengths: np.ndarray, n: int, total_chars: int,
                 separator_chars: int):
        self.positions, self.same_as_previous, self.token_lengths = positions, same_as_previous, token_lengths
        self.n, self.total_chars, self.separator_chars = n, total_chars, separator_chars

    @cached_property
    def top_fraction(self) -> float:
        group_starts = np.flatnonzero(np.concatenate(([True], ~self.same_as_previous)))
        group_sizes = np.concatenate((group_starts[1:], [len(self.positions)])) - group_starts
        best = int(np.maximum.reduce(group_sizes))
        first_position = int(np.minimum.reduce(self.positions[group_starts[group_sizes == best]]))  # ties: earliest window, like Counter.most_common
        top_chars = (int(np.add.reduce(self.token_lengths[first_position: first_position + self.n])) + self.separator_chars * (self.n - 1)) * best
        return top_chars / self.total_chars

    @cached_property
    def duplicate_fraction(self) -> float:
        repeat_starts = self.positions[1:][self.same_as_previous]
        coverage_delta = np.zeros(len(self.token_lengths) + 1, dtype=np.int32)
        coverage_delta[repeat_starts] += 1
        coverage_delta[repeat_starts + self.n] -= 1
        covered = np.cumsum(coverage_delta[:-1]) > 0
        return float(self.token_lengths[covered].sum()) / self.total_chars


class TextView:
    """Statistics of one document, computed once on first use and shared by all rules. Given the `WordNgrams` of
    the batch it belongs to (and its index there), its word counts and word n-grams are read from the batch."""

    def __init__(self, text: str, batch: WordNgrams | None = None, index: int = 0):
        self.text, self.batch, self.index = text, batch, index

    @cached_property
    def words(self) -> list[str]:
        return self.text.split()

    @cached_property
    def n_words(self) -> int:
        """Whitespace words."""
        return self.batch.word_count(self.index) if self.batch is not None else len(self.words)

    def word_count(self, split: str) -> int:
        """Words for the word-count rules: whitespace tokens, plus one per identifier join when split == "identifiers"."""
        if split == "whitespace":
            return self.n_words
        if "_identifier_words" not in self.__dict__:
            self.__dict__["_identifier_words"] = self.n_words + len(IDENTIFIER_JOIN.findall(self.text))
        return self.__dict__["_identifier_words"]

    @cached_property
    def mean_word_length(self) -> float:
        """Mean characters per whitespace word (0 without words): the integer total over the count."""
        if not self.n_words:
            return 0.0
        chars = self.batch.word_chars(self.index) if self.batch is not None else sum(map(len, self.words))
        return chars / self.n_words

    @cached_property
    def newlines(self) -> int:
        """'\\n' characters (FineWeb's two newline rules)."""
        return self.text.count("\n")

    @cached_property
    def lower(self) -> str:
        """The text lower-cased (the stop-word rule and C4's page-level phrase scans read it)."""
        return self.text.lower()

    @cached_property
    def raw_lines(self) -> list[str]:
        """str.splitlines(): C4's line pass numbers these (its audit evidence locates lines by them)."""
        return self.text.splitlines()

    @cached_property
    def stripped_lines(self) -> list[str]:
        """Every line stripped, blank ones kept as "" (C4's pass and `lines` share this one pass)."""
        return list(map(str.strip, self.raw_lines))

    @cached_property
    def lines(self) -> list[str]:
        """Non-empty lines, stripped (blank lines carry no content and would all be 'duplicates')."""
        return list(filter(None, self.stripped_lines))

    def content_lines(self, min_words: int) -> list[str]:
        """The non-empty lines of at least `min_words` whitespace words (all of them when min_words <= 1)."""
        if min_words <= 1:
            return self.lines
        cache = self.__dict__.setdefault("_content_lines", {})
        if min_words not in cache:
            cache[min_words] = [line for line in self.lines if len(line.split()) >= min_words]
        return cache[min_words]

    def line_duplicates(self, min_words: int) -> tuple[int, int]:
        """duplicate_counts of content_lines(min_words), counted once for the Gopher and FineWeb rules that read it."""
        cache = self.__dict__.setdefault("_line_duplicates", {})
        key = max(min_words, 1)  # content_lines is every line at 1 and below
        if key not in cache:
            cache[key] = duplicate_counts(self.content_lines(min_words))
        return cache[key]

    @cached_property
    def paragraph_duplicates(self) -> tuple[int, int]:
        return duplicate_counts(self.paragraphs)

    @cached_property
    def paragraphs(self) -> list[str]:
        return list(filter(None, map(str.strip, PARAGRAPH_BREAK.split(self.text.strip()))))

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
            if isinstance(cache[n], NgramRepetition):  # no window repeats (a RepeatedWindows always has some)
                cache["no_repeats_from"] = min(n, cache.get("no_repeats_from", n))
        return cache[n]

    def duplicate_bound(self, kind: str, n: int) -> float | None:
        """An upper bound on the duplicate n-gram coverage, from a shorter n already measured (None if none was).

        Coverage never grows with n: a later occurrence of a repeated n-gram starts a later occurrence of its
        (n-1)-gram prefix and of its (n-1)-gram suffix, which together cover the same tokens. So a document already
        under a threshold at n-1 is under it at n, and that rule need not be measured (Gopher's limits fall with n).
        """
        bound = None
        for m, result in self.__dict__.get(kind, {}).items():
            # a measured coverage sits in the result's __dict__: a NgramRepetition's field, or a cached property once asked
            known = result.__dict__.get("duplicate_fraction") if type(m) is int and m < n else None
            if known is not None and (bound is None or known < bound):
                bound = known
        return bound

    def word_ngrams(self, n: int) -> NgramRepetition | DocRepeats:
        """Word n-gram repetition, measured for the whole batch at once (a batch of this one text when it has none)."""
        cache = self.__dict__.setdefault("_word_ngrams", {})
        if n not in cache:
            if self.batch is None:
                self.batch, self.index = WordNgrams([self.text]), 0
            cache[n] = self.batch.repetition(self.index, n)
        return cache[n]

    def char_ngrams(self, n: int) -> NgramRepetition:
        return self._ngrams("_char_ngrams", self.char_ids, np.ones(len(self.char_ids), dtype=np.int64), n, len(self.dense_text), 0)
