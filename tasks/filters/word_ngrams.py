"""Gopher's word n-gram repetition measured for a whole batch of documents at once: one whitespace split of the
batch's text column (Arrow), then for each n one sort over the batch's candidate windows, not one per document.

A shard's documents average ~200 words, so per-document numpy work was mostly call overhead (~25 calls per n).
Here the arrays hold the batch's words end to end; a document is a range of them and no window crosses one.

Windows are grouped exactly: two words by their strings (Arrow's dictionary encoding), a longer window by the ids
of its two overlapping shorter windows. Only a window whose two (n-1)-windows both repeat can repeat, so each
n > 2 sorts just those candidates (on the 50k bench corpus: 24 % of the words start a repeated pair, 8 % a
repeated 9-gram). Each document gets the numbers Gopher's definition gives: the top n-gram (ties: the earliest),
and the characters of the tokens under an occurrence after the first. The same words give each document's count
of words without a letter (Gopher's alphabetic-word rule) in one pass over their bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.filters.lazy_stats import NgramRepetition, cached_property

LETTER = re.compile(r"[^\W\d_]")  # a letter in any script (tasks.filters.text_view and the rules use it too)


def sorted_groups(keys: np.ndarray, positions: np.ndarray, key_bits: int, position_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions, keys) ordered by (key, position): one sort of packed integers where both fit in 64 bits."""
    if key_bits + position_bits <= 64:
        packed = (keys.astype(np.uint64) << np.uint64(position_bits)) | positions.astype(np.uint64)
        packed.sort()
        return (packed & np.uint64((1 << position_bits) - 1)).astype(np.int64), packed >> np.uint64(position_bits)
    order = np.lexsort((positions, keys))
    return positions[order], keys[order]


@dataclass
class Level:
    """The repeated windows of one n across the batch, and per document what Gopher's two n-gram rules read."""

    positions: np.ndarray  # int64, ascending: start (word index in the batch) of every window that repeats in its document
    group: np.ndarray  # int64, beside positions: the window's group (same words, same document), dense 0..groups-1
    groups: int
    has_repeats: np.ndarray  # bool per document
    top_chars: np.ndarray  # int64 per document: characters of the top n-gram as written (words + separators) x its count
    duplicate_chars: np.ndarray  # int64 per document: characters of the words under an occurrence after the first


class WordNgrams:
    """The whitespace words of a batch of texts and, one n at a time on first use, their n-gram repetition."""

    def __init__(self, texts: pa.Array | pa.ChunkedArray | list[str]):
        if isinstance(texts, list):
            texts = pa.array(texts, pa.string())
        if isinstance(texts, pa.ChunkedArray):
            texts = texts.combine_chunks()
        # Arrow's whitespace is str.split's (every code point agrees, tests/tasks/filters/test_word_ngrams.py); it keeps
        # an empty piece before leading and after trailing whitespace, which str.split drops.
        pieces = pc.utf8_split_whitespace(texts)
        words, parents = pc.list_flatten(pieces), pc.list_parent_indices(pieces)
        lengths = pc.utf8_length(words)
        nonempty = pc.greater(lengths, 0)
        self.words = words.filter(nonempty)
        self.docs = len(texts)
        self.lengths = lengths.filter(nonempty).to_numpy().astype(np.int64)
        self.doc_of = parents.filter(nonempty).to_numpy().astype(np.int64)
        self.word_ids = pc.dictionary_encode(self.words).indices.to_numpy().astype(np.int64)
        self.vocabulary = int(self.word_ids.max(initial=-1)) + 1
        self.word_counts = np.bincount(self.doc_of, minlength=self.docs)
        self.starts = np.concatenate(([0], np.cumsum(self.word_counts)))
        self.length_prefix = np.concatenate(([0], np.cumsum(self.lengths)))
        self.text_chars = pc.utf8_length(texts).to_numpy(zero_copy_only=False).astype(np.int64)
        self.position_bits = max(1, int(len(self.lengths) - 1).bit_length())
        self.levels: dict[int, Level] = {}

    def word_count(self, doc: int) -> int:
        return int(self.word_counts[doc])

    @cached_property
    def without_letter(self) -> np.ndarray:
        """Per document, the words with no letter (`LETTER`, Gopher's alphabetic-word rule): an ASCII word has one
        iff one of its bytes is A-Z or a-z (counted over the words' UTF-8 bytes at once); the few others by regex."""
        offsets, data = self.words.buffers()[1:3]
        offsets = np.frombuffer(offsets, dtype=np.int64 if pa.types.is_large_string(self.words.type) else np.int32)
        offsets = offsets[self.words.offset: self.words.offset + len(self.words) + 1].astype(np.int64)
        data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
        if not len(self.words):
            return np.zeros(self.docs, dtype=np.int64)
        folded = data[offsets[0]: offsets[-1]] | np.uint8(0x20)
        starts = offsets[:-1] - offsets[0]  # every word has a byte, so each reduceat range is its word
        has_letter = np.logical_or.reduceat((folded >= ord("a")) & (folded <= ord("z")), starts)
        non_ascii = np.flatnonzero(np.logical_or.reduceat(data[offsets[0]: offsets[-1]] >= 0x80, starts))
        has_letter[non_ascii] = [LETTER.search(word) is not None for word in self.words.take(pa.array(non_ascii)).to_pylist()]
        return np.bincount(self.doc_of[~has_letter], minlength=self.docs)

    def word_chars(self, doc: int) -> int:
        return int(self.length_prefix[self.starts[doc + 1]] - self.length_prefix[self.starts[doc]])

    def repetition(self, doc: int, n: int) -> "NgramRepetition | DocRepeats":
        level = self.level(n)
        if not level.has_repeats[doc]:
            return NgramRepetition(0.0, 0.0)
        return DocRepeats(level, doc, int(self.text_chars[doc]))

    def level(self, n: int) -> Level:
        if n not in self.levels:
            self.levels[n] = self.pairs() if n == 2 else self.longer(self.level(n - 1), n)
        return self.levels[n]

    def pairs(self) -> Level:
        """Two-word windows grouped by their two words' ids (the batch's dictionary: split by document below)."""
        at = np.flatnonzero(self.doc_of[1:] == self.doc_of[:-1])
        vocabulary = np.int64(max(1, self.vocabulary))
        keys = self.word_ids[at] * vocabulary + self.word_ids[at + 1]
        return self.grouped(keys, at, max(1, int(int(vocabulary) ** 2 - 1).bit_length()), 2)

    def longer(self, shorter: Level, n: int) -> Level:
        """The n-word windows whose two (n-1)-word windows (at p and p + 1) both repeat, grouped by that pair."""
        at, group = shorter.positions, shorter.group
        adjacent = at[1:] == at[:-1] + 1  # both windows repeat in their document, and they overlap: the same one
        groups = np.int64(shorter.groups)
        keys = group[:-1][adjacent] * groups + group[1:][adjacent]
        return self.grouped(keys, at[:-1][adjacent], max(1, int(shorter.groups * shorter.groups - 1).bit_length()), n)

    def grouped(self, keys: np.ndarray, candidates: np.ndarray, key_bits: int, n: int) -> Level:
        """Group the windows starting at `candidates` (ascending) by (key, document); keep the repeated ones, still in
        position order, and measure each document. The sort carries each window's index, which is its position order."""
        index, sorted_keys = sorted_groups(keys, np.arange(len(candidates)), key_bits, max(1, int(len(candidates) - 1).bit_length()))
        order = candidates[index]
        new_group = np.ones(len(order), dtype=bool)
        new_group[1:] = sorted_keys[1:] != sorted_keys[:-1]
        if n == 2:  # word ids are the batch's; a longer window's group (from pair groups) is its document's already
            new_group[1:] |= self.doc_of[order[1:]] != self.doc_of[order[:-1]]
        starts = np.flatnonzero(new_group)
        sizes = np.diff(np.append(starts, len(order)))
        repeated_group = sizes >= 2
        member = np.repeat(repeated_group, sizes)
        groups = int(np.count_nonzero(repeated_group))
        repeats = np.zeros(len(candidates), dtype=bool)
        repeats[index[member]] = True
        group_of = np.zeros(len(candidates), dtype=np.int64)
        group_of[index[member]] = np.repeat(np.arange(groups), sizes[repeated_group])
        positions, group = candidates[repeats], group_of[repeats]
        level = Level(positions, group, groups, np.zeros(self.docs, dtype=bool), np.zeros(self.docs, dtype=np.int64),
                      np.zeros(self.docs, dtype=np.int64))
        if groups:
            first_positions = order[starts[repeated_group]]
            self.measure(level, first_positions, sizes[repeated_group], positions[first_positions[group] != positions], n)
        return level

    def measure(self, level: Level, first_positions: np.ndarray, counts: np.ndarray, repeat_starts: np.ndarray, n: int) -> None:
        """Per document: the top n-gram (most occurrences, ties to the earliest first occurrence) and the characters
        of the words under an occurrence after its group's first (each word once; `repeat_starts` ascending)."""
        group_docs = self.doc_of[first_positions]
        level.has_repeats[group_docs] = True
        most = np.zeros(self.docs, dtype=np.int64)
        np.maximum.at(most, group_docs, counts)
        top = counts == most[group_docs]
        earliest = np.full(self.docs, len(self.lengths), dtype=np.int64)
        np.minimum.at(earliest, group_docs[top], first_positions[top])
        docs = np.flatnonzero(level.has_repeats)
        at = earliest[docs]
        level.top_chars[docs] = (self.length_prefix[at + n] - self.length_prefix[at] + (n - 1)) * most[docs]
        # Windows of one length, in start order: each covers from where the one before it stopped (or its start).
        covered_from = np.maximum(repeat_starts, np.concatenate(([0], repeat_starts[:-1] + n)))
        chars = self.length_prefix[repeat_starts + n] - self.length_prefix[covered_from]
        level.duplicate_chars[:] = np.bincount(self.doc_of[repeat_starts], weights=chars, minlength=self.docs).astype(np.int64)


class DocRepeats:
    """One document's repeated n-grams, read from its batch; each fraction computed when a rule asks for it (the
    duplicate-coverage bound in TextView counts only the fractions asked for)."""

    def __init__(self, level: Level, doc: int, total_chars: int):
        self.level, self.doc, self.total_chars = level, doc, total_chars

    @cached_property
    def top_fraction(self) -> float:
        return int(self.level.top_chars[self.doc]) / self.total_chars

    @cached_property
    def duplicate_fraction(self) -> float:
        return float(int(self.level.duplicate_chars[self.doc])) / self.total_chars
