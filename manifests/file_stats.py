"""Cheap identity of published files: (size, mtime_ns, inode) recorded when a stage publishes.

Checking that a cached stage is intact must not re-read the corpus on every run. At publish
a stage records each output's stat beside the sha256 in its manifest; a later check trusts a
file whose stat is unchanged and hashes only files whose stat moved (all of them with
`--verify`). Ingest does the same for its source files. The record is a sidecar, not part of
manifest.json: inodes and mtimes differ between two runs, manifest bytes must not.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from manifests.atomic import atomic_write_text

STATS_NAME = ".file_stats.json"


def file_stat(path: Path) -> list[int]:
    """What changes when a file is rewritten, replaced or touched; raises FileNotFoundError."""
    stat = os.stat(path)
    return [stat.st_size, stat.st_mtime_ns, stat.st_ino]


def tree_stat(path: Path) -> str:
    """One fingerprint of every file's stat under a directory (a source given as a folder)."""
    digest = hashlib.sha256()
    for file in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path).as_posix()}\0{file_stat(file)}\n".encode())
    return digest.hexdigest()


def path_stat(path: Path) -> Any:
    return file_stat(path) if Path(path).is_file() else tree_stat(path)


def read_stats(stage_dir: Path) -> dict[str, dict[str, Any]]:
    """The recorded stats, or nothing (every file then gets hashed) when the sidecar is absent or unreadable."""
    try:
        raw = json.loads((Path(stage_dir) / STATS_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def write_stats(stage_dir: Path, outputs: list[str], inputs: dict[str, Any] | None = None) -> None:
    """Record the stat of `outputs` (paths relative to `stage_dir`) and of named inputs."""
    stage_dir = Path(stage_dir)
    record = {"outputs": {rel: file_stat(stage_dir / rel) for rel in outputs}, "inputs": inputs or {}}
    atomic_write_text(stage_dir / STATS_NAME, json.dumps(record, sort_keys=True) + "\n")
