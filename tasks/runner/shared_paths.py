"""What every Dask worker must see before a multi-machine run starts: the run directory and the files tasks open.

Tasks read and write the run directory by absolute path, and open local sources,
model files and filter plugins by path. On several machines those paths must be
one shared mount at the same place everywhere; a worker that sees a different
(or no) directory would write its outputs where the flow never looks. So before
the first stage, every worker checks each path, and the run directory by a
probe file the flow host has just written (same path, same token: same mount).
It also checks what stages do on that mount (STORAGE_NEEDS): publish a stage by
renaming a directory (atomically, within one directory), lock a file with flock
(the run lock), and memory-map files (dedup_fuzzy's labels, token
files); an object-store FUSE mount that fakes any of these is refused, not met
later as a corrupt stage. And it compares the worker's code with the flow host's
(tasks/runner/code_version.py): a worker running other code would compute other bytes.
Only the standard library here: each worker imports this module.
"""
from __future__ import annotations

import errno
import fcntl
import mmap
import os
import secrets
import shutil
import socket
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


STORAGE_NEEDS = "atomic directory rename, flock and mmap"


def storage_problems(run: str, token: str) -> list[tuple[str, str]]:
    """On a worker: what the run directory's filesystem does not do that stages need, as (what, detail)."""
    scratch = Path(run) / f"{PROBE_PREFIX}{token[:12]}-{socket.gethostname()}-{os.getpid()}"
    problems: list[tuple[str, str]] = []
    try:
        (scratch / "staged").mkdir(parents=True)
        (scratch / "staged" / "file").write_bytes(b"hymo" * 1024)
        os.rename(scratch / "staged", scratch / "published")  # how every stage publishes
        if (scratch / "staged").exists() or (scratch / "published" / "file").read_bytes() != b"hymo" * 1024:
            problems.append(("run directory's filesystem", "a renamed directory is not moved whole (stages publish by renaming one)"))
        with open(scratch / "lock", "w") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(handle, fcntl.LOCK_UN)
            except OSError as exc:
                problems.append(("run directory's filesystem", f"flock fails ({errno.errorcode.get(exc.errno, exc.errno)}: the run lock needs it)"))
        with open(scratch / "published" / "file", "rb") as handle:
            try:
                with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    if mapped[:4] != b"hymo":
                        problems.append(("run directory's filesystem", "a memory-mapped file reads other bytes"))
            except (OSError, ValueError) as exc:
                problems.append(("run directory's filesystem", f"mmap fails ({exc}: dedup_fuzzy and the trainer map files)"))
    except OSError as exc:
        problems.append(("run directory's filesystem", f"cannot create, rename or read a probe directory ({exc})"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return problems


def worker_check(paths: list[tuple[str, str]], probe: str, token: str, host_code: str) -> list[tuple[str, str]]:
    """On a worker: every problem as (what, detail): other code than the flow host's, unseen paths, storage it lacks."""
    from tasks.runner.code_version import code_digest, code_version

    problems = []
    if code_digest() != host_code:
        problems.append(("code", f"HyMo {code_version()} with code digest {code_digest()[:12]}, the flow host's is {host_code[:12]}"))
    missing = unseen(paths, probe, token)
    problems += missing
    if not missing or missing[0][1] != str(Path(probe).parent):
        problems += storage_problems(str(Path(probe).parent), token)
    return problems


def check_shared_paths(client: Any, run: Path, paths: list[tuple[str, str]]) -> None:
    """Every worker of the cluster behind `client` runs the flow host's code, sees `run` (as the same mount, with
    STORAGE_NEEDS) and each (what, path); else one line naming the worker and the first problem."""
    from tasks.runner.code_version import code_digest

    token = secrets.token_hex(16)
    probe = Path(run) / f"{PROBE_PREFIX}{token[:12]}"
    probe.write_text(token, encoding="utf-8")
    try:
        answers = client.run(worker_check, paths, str(probe), token, code_digest())
    finally:
        probe.unlink(missing_ok=True)
    for worker, missing in sorted(answers.items()):
        if missing:
            what, path = missing[0]
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            if what == "code":
                raise SharedPathError(f"Dask worker {worker} runs other code than the flow host ({path}){more}: install the same "
                                      "HyMo checkout on every machine and restart the workers")
            if what == "run directory's filesystem":
                raise SharedPathError(f"Dask worker {worker}: the run directory {run} is on storage that lacks what stages need: "
                                      f"{path}{more}; use a filesystem with {STORAGE_NEEDS} (NFS, Lustre, a local disk)")
            raise SharedPathError(f"Dask worker {worker} cannot see the {what} {path}{more}: put it on a mount every machine "
                                  "shares, at the same path")
