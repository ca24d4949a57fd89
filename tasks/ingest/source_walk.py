"""Listing a source directory's files the way a user who made symlinks expects.

`Path.glob` (Python 3.11) lists symlinked files but silently does not descend
into symlinked directories, and says nothing about links that point nowhere.
Here symlinked directories are followed once (a directory reached again, e.g.
through a loop, is not walked twice), and every link that cannot be read is
returned with the reason, so ingestion audits it instead of losing it quietly.
"""
from __future__ import annotations

import os
from fnmatch import fnmatchcase
from pathlib import Path


def glob_match(parts: list[str], pattern: list[str]) -> bool:
    """`parts` (a relative path's components) match the glob `pattern` components; `**` spans any depth."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(glob_match(parts[i:], pattern[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatchcase(parts[0], pattern[0]) and glob_match(parts[1:], pattern[1:])


def walk_matching(root: Path, pattern: str) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(files under `root` matching `pattern`, sorted; [(unreadable link, reason)]) following directory links once."""
    root = Path(root)
    wanted = [p for p in pattern.split("/") if p]
    files: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    walked: set[str] = set()
    for current, dirnames, filenames in os.walk(root, followlinks=True):
        real = os.path.realpath(current)
        if real in walked:  # a link back to a directory already walked (a loop, or two links to one place)
            dirnames[:] = []
            skipped.append((Path(current), "link_to_walked_directory"))
            continue
        walked.add(real)
        dirnames.sort()
        for name in filenames:
            path = Path(current) / name
            if not glob_match(path.relative_to(root).parts, wanted):
                continue
            if path.is_file():
                files.append(path)
            elif path.is_symlink():
                skipped.append((path, "dangling_symlink"))
    return sorted(files), sorted(skipped)


def reached_through_link(root: Path, path: Path) -> bool:
    """True when a symlink lies between `root` and `path` (the file's real path is elsewhere)."""
    return Path(os.path.realpath(path)) != Path(os.path.realpath(root)) / Path(path).relative_to(root)
