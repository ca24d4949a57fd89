"""Text normalisation, tokens and n-gram hashes shared by exact dedup, fuzzy dedup and decontamination.

Seed 001, "精确重复" / "近似重复和 Jaccard 相似度": lower-case, collapse
whitespace; shingles are sets of consecutive word 5-grams. Scripts written
without spaces (Chinese, Japanese, Thai, ...) have no words to count, so each
of their characters is a token and the n-grams become character n-grams.

N-grams are hashed to 64 bits by combining per-token hashes with numpy, so a
shard of documents is hashed with a few array operations instead of one
Python string per shingle. Two different shingles share a hash with
probability ~2^-64 per pair; the exact Jaccard computed on these hashes
equals the Jaccard of the shingle strings unless such a collision happens.
"""
from __future__ import annotations

import re
from typing import Iterable

import numpy as np
import xxhash

NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
WORD = re.compile(r"[^\W_]+")
# Scripts written without spaces between words: Thai, Lao, Myanmar, Khmer, kana, CJK ideographs.
SPACELESS_CHARS = "\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
SPACELESS = re.compile(f"[{SPACELESS_CHARS}]")
SPACELESS_OR_WORD = re.compile(f"[{SPACELESS_CHARS}]|(?:(?![{SPACELESS_CHARS}])[^\\W_])+")
# ASCII text takes a 3x faster path with the same result as WORD.findall: punctuation -> space, split.
ASCII_PUNCTUATION_TO_SPACE = {code: " " for code in range(128) if not chr(code).isalnum()}
DIGITS = "0123456789"
NON_ASCII = re.compile(r"[^\x00-\x7f]")

# Odd 64-bit constants (splitmix64 / xxhash primes) for combining and finalising hashes.
COMBINE = np.uint64(0x9E3779B97F4A7C15)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)
SHIFT30, SHIFT27, SHIFT31 = np.uint64(30), np.uint64(27), np.uint64(31)


def normalise(text: str) -> str:
    r"""The exact-duplicate key text: lower-case, whitespace runs collapsed to one space, trimmed.

    `str.split()` and the regex's `\s` share one whitespace definition (CPython's Py_UNICODE_ISSPACE), so this
    is `re.sub(r"\s+", " ", text.lower()).strip()` at a fraction of the regex's cost."""
    return " ".join(text.lower().split())


def tokens(text: str, fold_numbers: bool = True) -> list[str]:
    """Lower-cased word tokens (runs of letters/digits); one token per character of space-less scripts.

    `fold_numbers` maps every number to "0" so that pages differing only in dates
    or counters look alike (near-duplicate detection); decontamination keeps
    numbers, because a GSM8K answer is its numbers.
    """
    text = text.lower()
    if fold_numbers and any(digit in text for digit in DIGITS):
        text = NUMBER.sub("0", text)
    if text.isascii():
        return text.translate(ASCII_PUNCTUATION_TO_SPACE).split()
    if SPACELESS.search(text):
        return SPACELESS_OR_WORD.findall(text)
    if not any(char.isalnum() for char in set(NON_ASCII.findall(text))):
        # Mostly-English pages whose only non-ASCII characters are punctuation (curly quotes, dashes): those
        # separate words as any non-word character does, so '?' stands in for them and the ASCII path applies.
        return text.encode("ascii", "replace").decode("ascii").translate(ASCII_PUNCTUATION_TO_SPACE).split()
    return WORD.findall(text)


class TokenHashCache(dict):
    """token -> 64-bit hash, computed once per distinct token (the vocabulary is far smaller than the text)."""

    max_entries = 1 << 21

    def __missing__(self, token: str) -> int:
        if len(self) >= self.max_entries:
            self.clear()
        value = xxhash.xxh64_intdigest(token.encode("utf-8"))
        self[token] = value
        return value


def mix64(values: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, in place on a uint64 array: every input bit affects every output bit."""
    values ^= values >> SHIFT30
    values *= MIX1
    values ^= values >> SHIFT27
    values *= MIX2
    values ^= values >> SHIFT31
    return values


def ngram_hashes(token_hashes: np.ndarray, n: int) -> np.ndarray:
    """Hash of every window of n consecutive tokens (position-sensitive), as uint64."""
    count = len(token_hashes) - n + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint64)
    combined = token_hashes[:count].copy()
    for offset in range(1, n):
        combined *= COMBINE
        combined += token_hashes[offset: offset + count]
    return mix64(combined)


def batch_ngram_hashes(docs_tokens: Iterable[list[str]], n: int, cache: TokenHashCache) -> tuple[np.ndarray, np.ndarray]:
    """N-gram hashes of many documents at once: (hashes concatenated in document order, offsets).

    Document i's hashes are `hashes[offsets[i]:offsets[i+1]]`; a document with
    fewer than n tokens has none (an empty shingle set carries no evidence).
    """
    lookup = cache.__getitem__
    all_hashes: list[int] = []
    lengths: list[int] = []
    for doc_tokens in docs_tokens:
        all_hashes.extend(map(lookup, doc_tokens))
        lengths.append(len(doc_tokens))
    return ngram_hashes_by_document(np.array(all_hashes, dtype=np.uint64), np.asarray(lengths, dtype=np.int64), n)


def ngram_hashes_by_document(token_hashes: np.ndarray, lengths: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """`batch_ngram_hashes` from the documents' token hashes, concatenated, and their token counts."""
    token_starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=token_starts[1:])
    windows = ngram_hashes(token_hashes, n)
    counts = np.maximum(lengths.astype(np.int64) - n + 1, 0)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    if not len(windows):
        return windows, offsets
    # Keep windows that start and end inside one document: document d's start at token_starts[d].
    first_window = np.repeat(token_starts[:-1], counts)
    within = np.arange(offsets[-1]) - np.repeat(offsets[:-1], counts)
    return windows[first_window + within], offsets


def sorted_set(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values (np.unique without its per-call overhead, which dominates on small arrays)."""
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def jaccard_of_sets(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard of two sets given as sorted unique arrays; two empty sets are identical (1.0)."""
    if not len(a) and not len(b):
        return 1.0
    merged = np.sort(np.concatenate((a, b)))
    shared = int(np.count_nonzero(merged[1:] == merged[:-1]))  # each shared value appears exactly twice
    return shared / (len(a) + len(b) - shared)
