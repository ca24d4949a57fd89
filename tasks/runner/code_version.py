"""The code version recorded in every manifest: package version plus git commit when known; and a digest of
the code itself, which the cluster probe compares between the flow host and every worker (a commit does not
see uncommitted edits or a stale install). Only the standard library: every Dask worker imports this module."""
from __future__ import annotations

import functools
import hashlib
import subprocess
from importlib import metadata
from pathlib import Path


@functools.cache
def code_version() -> str:
    try:
        version = metadata.version("hymo")
    except metadata.PackageNotFoundError:
        version = "0+unknown"
    repo = Path(__file__).resolve().parents[2]
    if (repo / ".git").exists():
        try:
            sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            sha = ""
        if sha:
            return f"{version}+g{sha}"
    return version


CODE_PACKAGES = ("flows", "hymo_core", "manifests", "tasks")


@functools.cache
def code_digest() -> str:
    """sha256 over the path and bytes of every .py file of HyMo's packages, as this process would import them."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for package in CODE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()
