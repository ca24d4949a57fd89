"""`shingles.tokens` and the token hashes of a batch of documents, computed on the UTF-8 bytes of an Arrow column.

For most web text `tokens` is a byte-level rule: its tokens are the maximal
runs of letters and digits, lower-cased, every other character a separator;
with `fold_numbers`, a number (ASCII digits joined by single `.` or `,`)
becomes "0". This module applies that rule to a whole batch with numpy, and
hashes every token with xxh64 the same way (`xxh64_of_tokens`), so no Python
string is made per token. A non-ASCII character is a separator (curly quotes,
dashes), a letter whose lower case is one character of the same UTF-8 length
(é, É, ß, Ж: its lowered bytes are copied in), or outside the rule
(`token_class`: a space-less script, a decimal digit, a lower case of another
length or that depends on context). Documents with a character outside the
rule go through `tokens` and the token hash cache as before. Both ways give
the same token hashes in the same order; tests/tasks/dedup/test_byte_tokens.py
checks them against `tokens` + xxhash.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from tasks.dedup.shingles import SPACELESS, TokenHashCache, tokens

P1, P2, P3 = np.uint64(0x9E3779B185EBCA87), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9)
P4, P5 = np.uint64(0x85EBCA77C2B2AE63), np.uint64(0x27D4EB2F165667C5)
SHORT_TOKEN = 32  # xxh64 hashes shorter inputs without its four-lane stripe loop; longer (rare) tokens are hashed by xxhash
ZERO, DOT, COMMA = ord("0"), ord("."), ord(",")


def _rotl(values: np.ndarray, bits: int) -> np.ndarray:
    return (values << np.uint64(bits)) | (values >> np.uint64(64 - bits))


def xxh64_of_tokens(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """xxh64 (seed 0) of every token `data[starts[i]:starts[i] + lengths[i]]`, as uint64: `xxhash.xxh64_intdigest`'s values.

    Tokens shorter than SHORT_TOKEN bytes take xxh64's short-input path, vectorised over all of them (one step
    per 8-byte lane, 4-byte word and trailing byte); the few longer ones are hashed one by one."""
    padded = np.zeros(len(data) + 8, np.uint8)
    padded[: len(data)] = data
    words64 = np.ndarray((len(data) + 1,), "<u8", padded, 0, (1,))  # an unaligned little-endian word at every byte
    words32 = np.ndarray((len(data) + 5,), "<u4", padded, 0, (1,))
    starts, lengths = starts.astype(np.int64), lengths.astype(np.int64)
    with np.errstate(over="ignore"):
        hashes = P5 + lengths.astype(np.uint64)
        for lane in range(SHORT_TOKEN // 8 - 1):
            rows = np.flatnonzero(lengths >= 8 * (lane + 1))
            if not len(rows):
                break
            k1 = _rotl(words64[starts[rows] + 8 * lane] * P2, 31) * P1
            hashes[rows] = _rotl(hashes[rows] ^ k1, 27) * P1 + P4
        done = lengths & ~7
        rows = np.flatnonzero(lengths & 4)
        hashes[rows] = _rotl(hashes[rows] ^ (words32[starts[rows] + done[rows]].astype(np.uint64) * P1), 23) * P2 + P3
        done = done + (lengths & 4)
        for _ in range(3):
            rows = np.flatnonzero(done < lengths)
            if not len(rows):
                break
            hashes[rows] = _rotl(hashes[rows] ^ (padded[starts[rows] + done[rows]].astype(np.uint64) * P5), 11) * P1
            done[rows] += 1
        hashes ^= hashes >> np.uint64(33)
        hashes *= P2
        hashes ^= hashes >> np.uint64(29)
        hashes *= P3
        hashes ^= hashes >> np.uint64(32)
    for row in np.flatnonzero(lengths >= SHORT_TOKEN).tolist():
        hashes[row] = xxhash.xxh64_intdigest(data[starts[row]: starts[row] + lengths[row]].tobytes())
    return hashes


def xxh64_of_packed_tokens(data: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """`xxh64_of_tokens` of tokens stored back to back (token i is `data[starts[i]:starts[i + 1]]`, the last one up to
    the end), each distinct token hashed once: text repeats its words (a 2,737-document shard holds 580k tokens and
    ~20k distinct ones). The tokens are an Arrow binary array over `data` as it is, made distinct by Arrow's hash
    table (`dictionary_encode`), whose dictionary is hashed and then taken back by index."""
    offsets = np.empty(len(starts) + 1, np.int64)
    offsets[:-1], offsets[-1] = starts, len(data)
    tokens = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(starts), [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    encoded = pc.dictionary_encode(tokens)
    distinct = encoded.dictionary
    _, distinct_offsets, distinct_data = distinct.buffers()
    bounds = np.frombuffer(distinct_offsets, np.int64, count=len(distinct) + 1, offset=8 * distinct.offset)
    distinct_bytes = np.frombuffer(distinct_data, np.uint8) if distinct_data is not None else np.zeros(0, np.uint8)
    return xxh64_of_tokens(distinct_bytes, bounds[:-1], np.diff(bounds))[encoded.indices.to_numpy(zero_copy_only=False)]


@lru_cache(maxsize=1 << 16)
def byte_rule_holds(code_point: int) -> bool:
    """Whether `tokens` treats this non-ASCII character as the byte rule does: a separator that lower() keeps."""
    char = chr(code_point)
    return not char.isalnum() and char.lower() == char and not SPACELESS.match(char)


SEPARATOR, LETTER, OUTSIDE = 0, 1, 2
FINAL_SIGMA = 0x3A3  # Σ: str.lower() writes ς at the end of a word, σ elsewhere (Unicode's Final_Sigma context)


@lru_cache(maxsize=1 << 16)
def token_class(code_point: int) -> tuple[int, bytes]:
    """How `tokens` treats this non-ASCII character, with the UTF-8 bytes of its lower case where it is a LETTER:
    one character, of the same UTF-8 length, whatever its neighbours, a letter or digit that is no decimal digit
    (which NUMBER would fold) and of no space-less script."""
    if byte_rule_holds(code_point):
        return SEPARATOR, b""
    char = chr(code_point)
    lowered = char.lower()
    if (code_point == FINAL_SIGMA or len(lowered) != 1 or not lowered.isalnum() or lowered.isdecimal()
            or SPACELESS.match(lowered) or len(lowered.encode()) != len(char.encode())):
        return OUTSIDE, b""
    return LETTER, lowered.encode()


def code_points(data: np.ndarray, leads: np.ndarray) -> np.ndarray:
    """The code point of the UTF-8 sequence starting at each lead byte position (valid UTF-8, as Arrow strings are)."""
    padded = np.zeros(len(data) + 3, np.int64)
    padded[: len(data)] = data
    first = padded[leads]
    cont = [padded[leads + k] & 0x3F for k in (1, 2, 3)]
    two = ((first & 0x1F) << 6) | cont[0]
    three = ((first & 0x0F) << 12) | (cont[0] << 6) | cont[1]
    four = ((first & 0x07) << 18) | (cont[0] << 12) | (cont[1] << 6) | cont[2]
    return np.where(first < 0xE0, two, np.where(first < 0xF0, three, four))


def non_ascii_characters(data: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the lead byte position of every non-ASCII character, the distinct code points, each character's index into them)."""
    leads = np.flatnonzero(data >= 0xC0)
    if not len(leads):
        return leads, np.zeros(0, np.int64), np.zeros(0, np.int64)
    distinct, inverse = np.unique(code_points(data, leads), return_inverse=True)
    return leads, distinct, inverse


def needs_python(data: np.ndarray, offsets: np.ndarray, rule_holds: Callable[[int], bool] = byte_rule_holds) -> np.ndarray:
    """Per document: True where some non-ASCII character breaks the byte rule (`rule_holds` says which do not)."""
    leads, distinct, inverse = non_ascii_characters(data)
    flagged = np.zeros(len(offsets) - 1, bool)
    breaks = np.array([not rule_holds(point) for point in distinct.tolist()], bool)[inverse]
    flagged[np.searchsorted(offsets, leads[breaks], side="right") - 1] = True
    return flagged
    points = code_points(data, leads)
    distinct = np.unique(points)
    bad = distinct[[not rule_holds(int(point)) for point in distinct.tolist()]]
    if len(bad):
        flagged[np.unique(np.searchsorted(offsets, leads[np.isin(points, bad)], side="right") - 1)] = True
    return flagged


def non_ascii_classes(data: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(per document: True where some character is OUTSIDE the byte rule; the positions of every byte of the LETTER
    characters of the other documents; the lower-cased byte for each of those positions)."""
    flagged = np.zeros(len(offsets) - 1, bool)
    leads, distinct, inverse = non_ascii_characters(data)
    if not len(leads):
        return flagged, np.zeros(0, np.int64), np.zeros(0, np.uint8)
    classes = [token_class(point) for point in distinct.tolist()]
    kinds = np.array([kind for kind, _ in classes], np.int8)[inverse]
    documents = np.searchsorted(offsets, leads, side="right") - 1
    flagged[documents[kinds == OUTSIDE]] = True
    letters = np.flatnonzero((kinds == LETTER) & ~flagged[documents])
    lowered = np.zeros((len(distinct), 4), np.uint8)
    for row, (kind, encoded) in enumerate(classes):
        lowered[row, : len(encoded)] = np.frombuffer(encoded, np.uint8)
    widths = np.array([len(encoded) for _, encoded in classes], np.int64)[inverse[letters]]
    rows, starts = inverse[letters], leads[letters]
    positions = np.concatenate([starts[widths > k] + k for k in range(4)])
    values = np.concatenate([lowered[rows[widths > k], k] for k in range(4)])
    return flagged, positions, values


def utf8_buffers(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, offsets from 0) of a string array, without copying its text."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    offset_type = np.int64 if pa.types.is_large_string(texts.type) else np.int32
    _, offsets_buffer, data_buffer = texts.buffers()
    offsets = np.frombuffer(offsets_buffer, offset_type)[texts.offset: texts.offset + len(texts) + 1].astype(np.int64)
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    return data[offsets[0]: offsets[-1]], offsets - offsets[0]


def byte_rule_tokens(data: np.ndarray, offsets: np.ndarray, skip: np.ndarray, fold_numbers: bool,
                     letter_bytes: np.ndarray | None = None, lowered_bytes: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokens of every document not in `skip` by the byte rule: (token bytes back to back, token starts, tokens per document).
    `letter_bytes` are the positions of the bytes of non-ASCII letters, `lowered_bytes` what they lower-case to.

    The masks are computed over the whole batch as if it were one text, then corrected at the few bytes
    where a document begins or ends (nothing joins across documents)."""
    firsts = offsets[:-1][np.diff(offsets) > 0]  # first byte of each non-empty document
    digit = (data - np.uint8(ZERO)) < 10  # uint8 arithmetic wraps: one compare per class
    lowered = data | np.uint8(0x20)  # an ASCII letter's lower case; a digit already has that bit
    token_byte = (lowered - np.uint8(ord("a"))) < 26
    token_byte |= digit
    if letter_bytes is not None and len(letter_bytes):
        token_byte[letter_bytes] = True
        lowered[letter_bytes] = lowered_bytes
    for doc in np.flatnonzero(skip).tolist():
        token_byte[offsets[doc]: offsets[doc + 1]] = False
    if fold_numbers:
        numeric = digit
        joiner = (data == DOT) | (data == COMMA)
        # A joiner at a document's edge may see the neighbour's digit and needs no fix: at the last byte it is
        # dropped like every byte after a digit; at the first it begins the number it folds into "0" anyway.
        joined = joiner[1:-1] & numeric[:-2] & numeric[2:]
        joined &= token_byte[:-2] & token_byte[2:]  # not inside a document left to `tokens`
        numeric[1:-1] |= joined
        token_byte[1:-1] |= joined
        keep = token_byte.copy()  # a number's bytes after its first are dropped, its first becomes "0"
        keep[1:] &= ~(numeric[1:] & numeric[:-1])
        keep[firsts] = token_byte[firsts]
        out = np.compress(keep, lowered)
        out[out <= ord("9")] = ZERO
    else:
        keep = token_byte
        out = np.compress(keep, lowered)
    starts_here = token_byte.copy()
    starts_here[1:] &= ~token_byte[:-1]
    starts_here[firsts] = token_byte[firsts]
    token_starts = np.flatnonzero(np.compress(keep, starts_here))  # np.compress: ~2.5x a boolean index's speed here
    per_doc = np.diff(np.searchsorted(np.flatnonzero(starts_here), offsets))
    return out, token_starts, per_doc


def batch_token_hashes(texts: pa.Array, fold_numbers: bool, cache: TokenHashCache) -> tuple[np.ndarray, np.ndarray]:
    """(token hashes of every document concatenated in order, tokens per document): `cache[t] for t in tokens(text)` of each."""
    data, offsets = utf8_buffers(texts)
    skip, letter_bytes, lowered_bytes = non_ascii_classes(data, offsets)
    out, starts, per_doc = byte_rule_tokens(data, offsets, skip, fold_numbers, letter_bytes, lowered_bytes)
    hashes = xxh64_of_packed_tokens(out, starts)
    if not skip.any():
        return hashes, per_doc
    python_docs = np.flatnonzero(skip)
    lookup = cache.__getitem__
    python_hashes = []
    for doc in python_docs.tolist():
        doc_tokens = tokens(texts[doc].as_py(), fold_numbers)
        per_doc[doc] = len(doc_tokens)
        python_hashes.append(np.fromiter(map(lookup, doc_tokens), np.uint64, len(doc_tokens)))
    ends = np.cumsum(per_doc)
    merged = np.empty(int(ends[-1]) if len(ends) else 0, np.uint64)
    from_python = np.zeros(len(merged), bool)
    for doc, values in zip(python_docs.tolist(), python_hashes):
        from_python[ends[doc] - len(values): ends[doc]] = True
        merged[ends[doc] - len(values): ends[doc]] = values
    merged[~from_python] = hashes
    return merged, per_doc
