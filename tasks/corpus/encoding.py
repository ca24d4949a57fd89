"""Tokenising many documents fast: the one encode path of the mixture and shards stages.

Three things make it beat a per-document `encode` loop on every core:
* `encode_batch_fast` runs a whole batch on the Rust thread pool without
  computing character offsets nobody reads;
* batches are cut by characters, not documents, and a very long document is
  cut into pieces first, so no single page keeps one core busy while the
  others wait at the end of a batch;
* the next batch is encoded (GIL released) while the caller handles the
  previous one, so Python bookkeeping overlaps Rust work.

What is left is the encode itself: a shard task costs what `encode_batch_fast`
on its texts costs. The BPE word cache is not the limit (its default 10,000
words encode the 50k bench corpus as fast as a million-word cache), nor are
glibc's malloc settings or rayon's hand-off; the regex pre-tokenizer and the
allocations per pre-token and per token inside tokenizers are.

Cutting is exact, not approximate: a piece ends after a newline with
non-whitespace on both sides. The byte-level pre-tokenizer (GPT-2 regex, no
prefix space) makes such a newline a pre-token of its own whether or not the
text goes on after it, and BPE never merges across pre-tokens, so the pieces'
ids concatenate to the whole text's ids. (A newline inside a whitespace run
is not safe: at the end of a piece the run would become one pre-token.)
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from itertools import chain
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.runner.worker_threads import cap_native_threads

UINT16_LIMIT = 1 << 16
BATCH_CHARS = 500_000  # characters per encode call: every core has work, the pipeline overlaps, memory stays small
PIECE_CHARS = 1 << 16  # longer documents are cut into pieces of about this many characters


def is_safe_cut(text: str, newline: int) -> bool:
    """A lone newline between two non-whitespace characters: always a pre-token of its own."""
    return 0 < newline < len(text) - 1 and not text[newline - 1].isspace() and not text[newline + 1].isspace()


def split_long_text(text: str, size: int = PIECE_CHARS) -> list[str]:
    """`text` in pieces of >= `size` characters, each cut after a newline with non-whitespace either side."""
    if len(text) <= size:
        return [text]
    pieces, start = [], 0
    while len(text) - start > size:
        cut = text.find("\n", start + size - 1)
        while cut != -1 and not is_safe_cut(text, cut):
            cut = text.find("\n", cut + 1)
        if cut == -1:
            break
        pieces.append(text[start:cut + 1])
        start = cut + 1
    pieces.append(text[start:])
    return pieces


def encode_texts(tokenizer, texts: list[str], piece_chars: int = PIECE_CHARS) -> list[list[int]]:
    """Each text's ids (no special tokens added), equal to `tokenizer.encode(text).ids`."""
    pieces: list[str] = []
    owners: list[int] = []
    for i, text in enumerate(texts):
        cut = split_long_text(text, piece_chars)
        pieces.extend(cut)
        owners.extend([i] * len(cut))
    cap_native_threads()
    encodings = tokenizer.encode_batch_fast(pieces, add_special_tokens=False)
    if len(pieces) == len(texts):
        return [e.ids for e in encodings]
    ids: list[list[int]] = [[] for _ in texts]
    for owner, encoding in zip(owners, encodings):
        ids[owner].extend(encoding.ids)
    return ids


def char_batches(tables: Iterable[pa.Table], budget: int = BATCH_CHARS, column: str = "text") -> Iterator[pa.Table]:
    """Regroup document tables into tables of about `budget` characters (at least one document each), in order."""
    held: list[pa.Table] = []
    chars = 0
    for table in tables:
        if table.num_rows == 0:
            continue
        ends = np.cumsum(pc.utf8_length(table.column(column)).to_numpy(zero_copy_only=False).astype(np.int64))
        start = 0
        while start < table.num_rows:
            before = int(ends[start - 1]) if start else 0
            stop = max(start + 1, int(np.searchsorted(ends, before + budget - chars, side="right")))
            stop = min(stop, table.num_rows)
            held.append(table.slice(start, stop - start))
            chars += int(ends[stop - 1]) - before
            start = stop
            if chars >= budget:
                yield pa.concat_tables(held)
                held, chars = [], 0
    if held:
        yield pa.concat_tables(held)


def encoded_batches(tokenizer, tables: Iterable[pa.Table], column: str = "text") -> Iterator[tuple[pa.Table, list[list[int]]]]:
    """(batch, ids of each row's text) in input order; batch k+1 encodes while the caller handles batch k."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="encode") as pool:
        pending: tuple[pa.Table, Future] | None = None
        for batch in char_batches(tables, column=column):
            future = pool.submit(encode_texts, tokenizer, batch.column(column).to_pylist())
            if pending is not None:
                yield pending[0], pending[1].result()
            pending = (batch, future)
        if pending is not None:
            yield pending[0], pending[1].result()


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id (added tokens included) is below 65,536 (seed 001), else uint32; little-endian."""
    return np.dtype("<u2") if vocab_size <= UINT16_LIMIT else np.dtype("<u4")


def ids_with_eos(ids: list[list[int]], eos_id: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """One flat array: each document's ids then EOS; and each document's length in it (EOS included)."""
    lengths = np.fromiter((len(x) + 1 for x in ids), dtype=np.int64, count=len(ids))
    flat = np.full(int(lengths.sum()), eos_id, dtype=dtype)
    is_text = np.ones(len(flat), dtype=bool)
    is_text[np.cumsum(lengths) - 1] = False
    flat[is_text] = np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(is_text.sum()))
    return flat, lengths


def encode_to_file(tokenizer, tables: Iterable[pa.Table], eos_id: int, dtype: np.dtype, path, digest=None) -> Iterator[tuple[pa.Table, np.ndarray]]:
    """Tokenise documents in order, each one's ids then EOS appended to the flat file at `path` (and to `digest`, a
    hashlib object, if given: the file's digest without reading it back); yields (batch, each document's length in the
    file) as the batches are written."""
    with open(path, "wb") as handle:
        for batch, ids in encoded_batches(tokenizer, tables):
            flat, lengths = ids_with_eos(ids, eos_id, dtype)
            data = flat.tobytes()
            handle.write(data)
            if digest is not None:
                digest.update(data)
            yield batch, lengths
