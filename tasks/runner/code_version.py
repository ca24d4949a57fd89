"""The code version recorded in every manifest: package version plus git commit when known."""
from __future__ import annotations

import functools
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
