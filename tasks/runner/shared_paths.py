"""What every Dask worker must see before a multi-machine run starts: the run directory and the files tasks open.

Tasks read and write the run directory by absolute path, and open local sources,
model files and filter plugins by path. On several machines those paths must be
one shared mount at the same place everywhere; a worker that sees a different
(or no) directory would write its outputs where the flow never looks. So before
the first stage, every worker checks each path, and the run directory by a
probe file the flow host has just written (same path, same token: same mount).
Only the standard library here: each worker imports this module.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

PROBE_PREFIX = ".hymo-mount-probe-"


class SharedPathError(RuntimeError):
    """A worker cannot see a path the run needs; the message names the worker, what the path is for, and the path."""


def unseen(paths: list[tuple[str, str]], probe: str, token: str) -> list[tuple[str, str]]:
    """On a worker: the (what, path) it cannot see; the run directory counts as seen only if the probe holds `token`."""
    missing = [(what, path) for what, path in paths if not os.path.exists(path)]
    try:
        seen = Path(probe).read_text(encoding="utf-8") == token
    except OSError:
        seen = False
    if not seen:
        missing.insert(0, ("run directory (the flow host's probe file is not there)", str(Path(probe).parent)))
    return missing


def check_shared_paths(client: Any, run: Path, paths: list[tuple[str, str]]) -> None:
    """Every worker of the cluster behind `client` sees `run` (as the same mount) and each (what, path); else one line."""
    token = secrets.token_hex(16)
    probe = Path(run) / f"{PROBE_PREFIX}{token[:12]}"
    probe.write_text(token, encoding="utf-8")
    try:
        answers = client.run(unseen, paths, str(probe), token)
    finally:
        probe.unlink(missing_ok=True)
    for worker, missing in sorted(answers.items()):
        if missing:
            what, path = missing[0]
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise SharedPathError(f"Dask worker {worker} cannot see the {what} {path}{more}: put it on a mount every machine "
                                  "shares, at the same path")
