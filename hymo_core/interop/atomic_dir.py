"""A directory that appears whole or not at all: built beside its final name, renamed into place."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def new_directory(out: Path, what: str) -> Iterator[Path]:
    """Yield a work directory beside `out` (absent or empty) and rename it to `out` when the block succeeds.

    A failure (or a kill) leaves `out` as it was; only a hidden `.NAME.*` work directory can remain.
    """
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out}: exists and is not an empty directory; write the {what} into a new one")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield work
        for path in work.rglob("*"):
            if path.is_file():
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
        if out.exists():
            out.rmdir()
        work.rename(out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
