"""The one fastText binding (`fasttext-numpy2`, `import fasttext`) behind language ID and the quality classifier.

Models load once per process and are kept (spawned shard workers each load
their own copy). fastText reads one line per prediction, so documents are
folded onto one line the same way everywhere.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

LABEL_PREFIX = "__label__"
# fastText reads one line; newlines and other control characters become spaces.
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


class ModelFileMissing(RuntimeError):
    """A configured fastText model file does not exist."""


def one_line(text: str) -> str:
    """The whole document as the single line fastText expects; lone surrogates replaced so C++ can read it."""
    line = CONTROL_CHARS.sub(" ", text).strip()
    return line.encode("utf-8", "replace").decode("utf-8") if not line.isascii() else line


@lru_cache(maxsize=8)
def load_fasttext(path: str) -> Any:
    import fasttext

    if not Path(path).is_file():
        raise ModelFileMissing(f"{path}: fastText model file not found")
    return fasttext.load_model(path)
