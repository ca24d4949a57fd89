"""A directory that appears whole or not at all: built beside its final name, renamed into place.

The work directory comes from `mkdtemp`, which makes it 0700 whatever the umask says (and some writers
make their files 0600 the same way), so before the rename every directory and file gets the mode a
plain `mkdir` / `open` would have given it under this process's umask: 0755 / 0644 under the usual 022.
An export or a release is meant to be read by others.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


def current_umask() -> int:
    """This process's umask, read without changing it where /proc says it (os.umask can only swap, racing threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


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
        umask = current_umask()
        for path in [work, *work.rglob("*")]:
            if path.is_symlink():
                continue
            if path.is_dir():
                os.chmod(path, 0o777 & ~umask)
            elif path.is_file():
                executable = path.stat().st_mode & 0o111
                os.chmod(path, (0o777 if executable else 0o666) & ~umask)
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
        if out.exists():
            out.rmdir()
        work.rename(out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
