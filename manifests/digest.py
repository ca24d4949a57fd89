"""Content digests and the stage cache key.

The cache key is hash(stage, stage version, config, input digests): equal keys
mean equal outputs, so a re-run with an equal key may skip the work.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

CHUNK = 1 << 20


def sha256_bytes(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def sha256_file(path: Path) -> str:
    """One buffer of CHUNK bytes a call, filled again and again: what a file's digest holds does not grow with the file
    (ingest hashes its sources in threads of the flow host)."""
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while read := handle.readinto(buffer):
            digest.update(view[:read])
    return digest.hexdigest()


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def config_hash(config: dict[str, Any]) -> str:
    return sha256_bytes(canonical_json(config).encode("utf-8"))


def cache_key(stage: str, version: str, config: dict[str, Any], input_digests: list[str]) -> str:
    return sha256_bytes(
        canonical_json({"stage": stage, "version": version, "config": config, "inputs": sorted(input_digests)}).encode("utf-8")
    )
