"""The stage manifest: what a stage produced, from what, under which config.

A stage directory exists for readers only when its `manifest.json` says
`complete: true` (written last) and every listed file matches its sha256. The
everyday check trusts a file whose (size, mtime_ns, inode) is the one recorded
at publish (manifests.file_stats) and hashes the rest; `full` hashes every file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from manifests.atomic import atomic_write_text
from manifests.digest import canonical_json, sha256_bytes, sha256_file
from manifests.file_stats import file_stat, read_stats

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1


class StageNotComplete(RuntimeError):
    """The stage directory has no complete manifest: treat it as absent."""


class DigestMismatch(RuntimeError):
    """A file listed in a manifest does not hold the bytes the manifest recorded; `stage_dir` names the stage
    directory, so the fix line can name the run and the stage to recompute."""

    def __init__(self, message: str, stage_dir: Path | None = None):
        super().__init__(message)
        self.stage_dir = stage_dir


@dataclass
class OutputFile:
    path: str  # relative to the stage directory
    sha256: str
    rows: int | None
    kind: str  # data | audit | artifact

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "rows": self.rows, "kind": self.kind}


@dataclass
class StageManifest:
    stage: str
    stage_version: str
    config: dict[str, Any]
    config_hash: str
    cache_key: str
    code_version: str
    inputs: list[dict[str, str]]  # [{"stage_dir": ..., "digest": ...}] or source files
    outputs: list[OutputFile]
    shards: list[str]
    counts: dict[str, Any]
    wall_time_s: float
    extra: dict[str, Any] = field(default_factory=dict)
    complete: bool = True
    directory: Path | None = None

    @property
    def digest(self) -> str:
        """Identity of what the stage produced: its key and its output bytes, not its timing."""
        return manifest_digest(self.cache_key, self.outputs)

    def files(self, kind: str) -> list[OutputFile]:
        return [f for f in self.outputs if f.kind == kind]

    def path_of(self, output: OutputFile) -> Path:
        assert self.directory is not None, "manifest was not read from disk"
        return self.directory / output.path

    def to_json(self) -> dict[str, Any]:
        # `complete` is the last key so a torn write can never carry it.
        return {
            "format_version": FORMAT_VERSION,
            "stage": self.stage,
            "stage_version": self.stage_version,
            "config": self.config,
            "config_hash": self.config_hash,
            "cache_key": self.cache_key,
            "code_version": self.code_version,
            "inputs": self.inputs,
            "outputs": [o.to_json() for o in self.outputs],
            "shards": self.shards,
            "counts": self.counts,
            "wall_time_s": round(self.wall_time_s, 3),
            "extra": self.extra,
            "digest": self.digest,
            "complete": self.complete,
        }


def manifest_digest(cache_key: str, outputs: list[OutputFile]) -> str:
    listing = [[o.path, o.sha256] for o in sorted(outputs, key=lambda o: o.path)]
    return sha256_bytes(canonical_json({"cache_key": cache_key, "outputs": listing}).encode())


def write_manifest(stage_dir: Path, manifest: StageManifest) -> None:
    atomic_write_text(Path(stage_dir) / MANIFEST_NAME, json.dumps(manifest.to_json(), indent=2, ensure_ascii=False) + "\n")


def read_manifest(stage_dir: Path, verify: bool = True, full: bool = False) -> StageManifest:
    """Read a stage's manifest; refuse an incomplete stage or (when `verify`) a file whose bytes changed.

    `full`: hash every file instead of trusting the ones whose stat is unchanged since publish."""
    stage_dir = Path(stage_dir)
    path = stage_dir / MANIFEST_NAME
    if not path.is_file():
        raise StageNotComplete(f"{stage_dir}: no {MANIFEST_NAME}; the stage never finished")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise StageNotComplete(f"{path}: unreadable manifest ({exc})") from exc
    if raw.get("complete") is not True:
        raise StageNotComplete(f"{path}: manifest is not marked complete")
    if raw.get("format_version") != FORMAT_VERSION:
        raise StageNotComplete(f"{path}: manifest format {raw.get('format_version')} is not {FORMAT_VERSION}")
    manifest = StageManifest(
        stage=raw["stage"],
        stage_version=raw["stage_version"],
        config=raw["config"],
        config_hash=raw["config_hash"],
        cache_key=raw["cache_key"],
        code_version=raw["code_version"],
        inputs=raw["inputs"],
        outputs=[OutputFile(**o) for o in raw["outputs"]],
        shards=raw["shards"],
        counts=raw["counts"],
        wall_time_s=raw["wall_time_s"],
        extra=raw.get("extra", {}),
        complete=True,
        directory=stage_dir,
    )
    if raw.get("digest") != manifest.digest:
        raise DigestMismatch(f"{path}: recorded digest does not match its output listing", stage_dir)
    if verify:
        verify_outputs(manifest, full)
    return manifest


def verify_outputs(manifest: StageManifest, full: bool = False) -> None:
    recorded = {} if full else read_stats(manifest.directory).get("outputs", {})
    for output in manifest.outputs:
        file_path = manifest.path_of(output)
        try:
            if recorded.get(output.path) == file_stat(file_path) and file_path.is_file():
                continue  # same size, mtime and inode as when published: the bytes hashed then
        except FileNotFoundError:
            raise DigestMismatch(f"{file_path}: listed in {manifest.stage} manifest but missing", manifest.directory) from None
        if not file_path.is_file():
            raise DigestMismatch(f"{file_path}: listed in {manifest.stage} manifest but missing", manifest.directory)
        actual = sha256_file(file_path)
        if actual != output.sha256:
            raise DigestMismatch(f"{file_path}: sha256 {actual[:12]}… but manifest recorded {output.sha256[:12]}…", manifest.directory)


def is_complete(stage_dir: Path, cache_key: str | None = None, verify: bool = True, full: bool = False) -> bool:
    """True when the stage is published (and, if given, under this cache key) with intact files."""
    try:
        manifest = read_manifest(stage_dir, verify=False)
        if cache_key is not None and manifest.cache_key != cache_key:
            return False  # published under another key: no need to look at its files
        if verify:
            verify_outputs(manifest, full)
    except (StageNotComplete, DigestMismatch):
        return False
    return True
