"""One document as the quality rules see it: words, lines, paragraphs and n-gram repetition, each computed
once on first use (`TextView`), with the hashing that makes n-gram counts vectorised."""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np



NON_ALPHABETIC_WORD = re.compile(r"(?<!\S)(?:[\d_]|[^\w\s])+(?!\S)")  # a token with no letter at all
LETTER = re.compile(r"[^\W\d_]")
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


class cached_property:  # noqa: N801 (used as functools.cached_property is)
    """functools.cached_property without its per-first-access lock (Python 3.11 takes an RLock each time): a
    document's view lives in one thread, and the quality stage makes ~7 first accesses a document."""

    def __init__(self, compute):
        self.compute, self.name, self.__doc__ = compute, compute.__name__, compute.__doc__

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.compute(instance)  # later reads find it in __dict__ first
        return value


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
    def mean_word_length(self) -> float:
        """Mean characters per whitespace word (0 without words): the integer total over the count, which is
        numpy's mean of `word_lengths` exactly (an int64 sum below 2**53 is exact in float64) without its ~5 us."""
        return sum(map(len, self.words)) / len(self.words) if self.words else 0.0

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
            if isinstance(cache[n], NgramRepetition):  # no window repeats (a RepeatedWindows always has some)
                cache["no_repeats_from"] = min(n, cache.get("no_repeats_from", n))
        return cache[n]

    def duplicate_bound(self, kind: str, n: int) -> float | None:
        """An upper bound on the duplicate n-gram coverage, from a shorter n already measured (None if none was).

        Coverage never grows with n: a later occurrence of a repeated n-gram starts a later occurrence of its
        (n-1)-gram prefix and of its (n-1)-gram suffix, which together cover the same tokens. So a document already
        under a threshold at n-1 is under it at n, and that rule need not be measured (Gopher's limits fall with n).
        """
        known = [result.duplicate_fraction for m, result in self.__dict__.get(kind, {}).items()
                 if isinstance(m, int) and m < n and (isinstance(result, NgramRepetition) or "duplicate_fraction" in result.__dict__)]
        return min(known, default=None)

    def word_ngrams(self, n: int) -> NgramRepetition:
        return self._ngrams("_word_ngrams", self.word_ids, self.word_lengths, n, len(self.text), 1)

    def char_ngrams(self, n: int) -> NgramRepetition:
        return self._ngrams("_char_ngrams", self.char_ids, np.ones(len(self.char_ids), dtype=np.int64), n, len(self.dense_text), 0)
