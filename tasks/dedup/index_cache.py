"""The decontamination n-gram index, kept on disk between runs: tokenising the bundled benchmarks (~30k items,
1.5M 13-grams) costs the flow host about a second of every decontam run, for an index that changes only when
a benchmark file, the settings or the tokeniser does.

The key is the sha256 of those three: each file's (name, sha256), the n-gram size and item cap, and the bytes
of tasks/dedup/shingles.py (tokens and n-gram hashes) with INDEX_FORMAT. An entry is a directory written whole
and renamed into place; each array is read only after its bytes match the digest recorded beside it, and an
entry that is missing, partial or corrupt is rebuilt and rewritten, never trusted. Where the cache cannot be
written (a read-only home), the index is built in memory as before.

Location: $HYMO_CACHE, else $XDG_CACHE_HOME/hymo, else ~/.cache/hymo; under it decontam-index/KEY/.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from tasks.dedup import shingles
from tasks.dedup.minhash import ChecksumMismatch, read_checked_array, write_checked_array

CACHE_ENV = "HYMO_CACHE"
INDEX_FORMAT = 1  # bump when BenchmarkIndex's fields or their meaning change
ARRAYS = ("hashes", "benchmark_of", "item_of")


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hymo"


def index_key(files: tuple[tuple[str, str, str], ...], ngram_size: int, max_items_per_ngram: int) -> str:
    """(name, path, sha256) files: the path is left out, so a moved installation finds its entry."""
    tokeniser = hashlib.sha256(Path(shingles.__file__).read_bytes()).hexdigest()
    spec = [INDEX_FORMAT, [[name, sha256] for name, _, sha256 in files], ngram_size, max_items_per_ngram, tokeniser]
    return hashlib.sha256(json.dumps(spec).encode()).hexdigest()


def load(entry: Path) -> dict[str, Any] | None:
    """The entry's fields (arrays checked against their digests), or None when it is absent or does not check."""
    try:
        meta = json.loads((entry / "index.json").read_text())
        return {**meta["fields"], **{name: read_checked_array(entry / f"{name}.npy", meta["sha256"][name], mmap=False) for name in ARRAYS}}
    except (OSError, ValueError, KeyError, TypeError, ChecksumMismatch):  # absent, partial, or bytes unlike their digest
        return None


def store(entry: Path, arrays: dict[str, Any], fields: dict[str, Any]) -> None:
    """Write the entry in a sibling temporary directory and rename it into place (a reader sees all or nothing)."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        digests = {name: write_checked_array(staging / f"{name}.npy", arrays[name]) for name in ARRAYS}
        (staging / "index.json").write_text(json.dumps({"sha256": digests, "fields": fields}))
        shutil.rmtree(entry, ignore_errors=True)  # a corrupt entry being replaced
        staging.rename(entry)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def cached(key: str, build: Callable[[], tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """The entry for `key`, built by `build()` -> (arrays, JSON fields) when absent or unreadable."""
    entry = cache_root() / "decontam-index" / key
    found = load(entry)
    if found is not None:
        return found
    arrays, fields = build()
    try:
        store(entry, arrays, fields)
    except OSError:  # no writable cache: this run builds in memory, as every run did before the cache
        pass
    return {**fields, **arrays}
