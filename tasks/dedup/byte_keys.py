"""Exact dedup's key (`shingles.normalise`) and its SHA-1 for a batch of documents, from the column's UTF-8 bytes.

`normalise` lower-cases and joins the whitespace-separated words with one
space. For a document whose non-ASCII characters are all unchanged by
lower() and none is whitespace (all but a few web pages: curly quotes,
accents, CJK are such characters; upper-case accented letters and the
no-break space are not), that is a byte rule: ASCII letters lower-cased,
each run of ASCII whitespace between two words one space, leading and
trailing runs dropped. This module applies it to a whole batch with numpy
and hashes each key's bytes; other documents go through `normalise`.
tests/tasks/dedup/test_byte_keys.py checks the keys against `normalise`.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Callable

import numpy as np
import pyarrow as pa

from tasks.dedup.byte_tokens import needs_python, utf8_buffers
from tasks.dedup.shingles import normalise

SPACE = ord(" ")


@lru_cache(maxsize=1 << 16)
def key_rule_holds(code_point: int) -> bool:
    """Whether `normalise` leaves this non-ASCII character as it is: lower() keeps it and it separates no words."""
    char = chr(code_point)
    return char.lower() == char and not char.isspace()


def byte_rule_keys(data: np.ndarray, offsets: np.ndarray, skip: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(key bytes of every document concatenated, key offsets) by the byte rule; documents in `skip` get an empty key.

    A space run is kept as one space where it follows a word of its document and is not the document's last run
    with no word after it; only those run starts are materialised as positions, every other step is a mask."""
    space = (data == SPACE) | ((data - np.uint8(9)) < 5) | ((data - np.uint8(28)) < 4)  # ASCII_SPACE, as uint8 compares
    word = ~space
    for doc in np.flatnonzero(skip).tolist():
        word[offsets[doc]: offsets[doc + 1]] = False
    run_starts = np.zeros(len(data), bool)
    run_starts[1:] = space[1:] & word[:-1]
    run_starts[offsets[:-1][offsets[:-1] < len(data)]] = False  # a document's first byte follows no word of its own
    runs = np.flatnonzero(run_starts)
    last_run = np.searchsorted(runs, offsets[1:]) - 1  # each document's last run start, if in the document
    ends_in_space = np.diff(offsets) > 0
    ends_in_space[ends_in_space] = space[offsets[1:][ends_in_space] - 1]
    trailing = ends_in_space & (last_run >= 0) & (runs[np.maximum(last_run, 0)] >= offsets[:-1]) if len(runs) else ends_in_space & False
    runs = np.delete(runs, last_run[trailing])
    keep = word
    keep[runs] = True
    source = data.copy()
    source[runs] = SPACE
    key = source[keep]
    key |= ((key - np.uint8(ord("A"))) < 26).view(np.uint8) << 5
    lengths = np.zeros(len(offsets) - 1, np.int64)
    filled = np.diff(offsets) > 0
    if filled.any():  # bytes kept per non-empty document: its segment runs to the next non-empty one's start
        lengths[filled] = np.add.reduceat(keep, offsets[:-1][filled], dtype=np.int64)
    return key, np.concatenate(([0], np.cumsum(lengths)))


def sha1_digest(key_utf8: bytes | memoryview) -> bytes:
    return hashlib.sha1(key_utf8).digest()


def batch_key_digests(texts: pa.Array, normalised: bool = True, digest: Callable[[bytes | memoryview], bytes] = sha1_digest
                      ) -> tuple[list[bytes], list[int]]:
    """(`digest` of each document's key in UTF-8, the key's length in bytes) for a string column; the key is
    `normalise(text)`, or the text itself when not `normalised`."""
    data, offsets = utf8_buffers(texts)
    skip = needs_python(data, offsets, key_rule_holds) if normalised else np.zeros(len(offsets) - 1, bool)
    key, key_offsets = byte_rule_keys(data, offsets, skip) if normalised else (data, offsets)
    view = memoryview(key)
    bounds = key_offsets.tolist()
    digests = [digest(view[start:stop]) for start, stop in zip(bounds, bounds[1:])]
    lengths = np.diff(key_offsets).tolist()
    for doc in np.flatnonzero(skip).tolist():
        key_utf8 = normalise(texts[doc].as_py()).encode("utf-8")
        digests[doc], lengths[doc] = digest(key_utf8), len(key_utf8)
    return digests, lengths


def batch_key_texts(texts: pa.Array, normalised: bool = True) -> pa.Array:
    """Each document's key as an Arrow string array: `normalise(text)`, or the text itself when not `normalised`."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    if not normalised:
        return texts
    data, offsets = utf8_buffers(texts)
    skip = needs_python(data, offsets, key_rule_holds)
    key, key_offsets = byte_rule_keys(data, offsets, skip)
    keys = pa.LargeStringArray.from_buffers(len(texts), pa.py_buffer(key_offsets.astype(np.int64)), pa.py_buffer(key)).cast(pa.string())
    if not skip.any():
        return keys
    pieces, done = [], 0
    for doc in np.flatnonzero(skip).tolist():
        pieces += [keys.slice(done, doc - done), pa.array([normalise(texts[doc].as_py())], pa.string())]
        done = doc + 1
    return pa.concat_arrays([*pieces, keys.slice(done)])
