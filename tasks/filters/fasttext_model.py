"""The one fastText binding (`fasttext-numpy2`, `import fasttext`) behind language ID and the quality classifier.

Models load once per process per file content (sha256) and are kept (spawned
shard workers each load their own copy); a file overwritten at the same path
loads again. fastText reads one line per prediction, so documents are
folded onto one line the same way everywhere.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import pyarrow as pa

from manifests.digest import sha256_file

LABEL_PREFIX = "__label__"
# fastText reads one line; newlines and other control characters become spaces.
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


class ModelFileMissing(RuntimeError):
    """A configured fastText model file does not exist."""


# CONTROL_CHARS in RE2's syntax, for Arrow's column-wise replace (one C++ pass over a batch's texts).
CONTROL_CHARS_RE2 = r"[\x00-\x1f\x7f-\x{9f}\x{2028}\x{2029}]+"


def one_line(text: str) -> str:
    """The whole document as the single line fastText expects; lone surrogates replaced so C++ can read it."""
    line = CONTROL_CHARS.sub(" ", text).strip()
    return line.encode("utf-8", "replace").decode("utf-8") if not line.isascii() else line


def one_lines(texts: pa.Array | pa.ChunkedArray) -> list[str]:
    """`one_line` of every text of an Arrow string column: the control characters replaced by Arrow in one pass
    (Python's `re.sub` per document cost langid ~50 us a page), the rest as `one_line` does. Arrow strings are
    valid UTF-8, so no lone surrogate is left to replace."""
    import pyarrow.compute as pc

    return [line.strip() for line in pc.replace_substring_regex(texts, pattern=CONTROL_CHARS_RE2, replacement=" ").to_pylist()]


def load_fasttext(path: str) -> Any:
    """The model in the file at `path` now, loaded once per process per content (sha256).

    Keyed by content, not path: a long-lived worker (Dask) must not keep scoring
    with the model that was at this path before it was overwritten, while the
    stage's cache key already holds the new file's sha256.
    """
    if not Path(path).is_file():
        raise ModelFileMissing(f"{path}: fastText model file not found")
    return _load_model(path, model_sha256(path))


def model_sha256(path: str) -> str:
    """sha256 of a model file, hashed again only when its stat (inode, size, mtime) changed."""
    stat = Path(path).stat()
    return _sha256_of(str(Path(path).resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=32)
def _sha256_of(path: str, inode: int, size: int, mtime_ns: int) -> str:
    return sha256_file(Path(path))


@lru_cache(maxsize=8)
def _load_model(path: str, sha256: str) -> Any:
    import fasttext

    model = fasttext.load_model(path)
    if model_sha256(path) != sha256:
        raise ModelFileMissing(f"{path}: fastText model file changed while it was being loaded; re-run the stage")
    return model
