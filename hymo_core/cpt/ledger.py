"""The record of a CPT run's hashes kept outside its directory, so that editing the run cannot also edit it.

At the start (before the first update) and at the end, `run_cpt` appends one JSON line with the
sha256 of the gate, the manifest, the base checkpoint and the measurements to the ledger, by default
`cpt_ledger.jsonl` in OUT's parent directory, and hands the same record to `on_record` (the
Prefect flow writes it to the run log and to an artifact, which live in the Prefect server).
`hymo cpt verify RUN` compares the run's files with the ledger's last start and end records.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

LEDGER_FILE = "cpt_ledger.jsonl"


def default_ledger(out: str | Path) -> Path:
    return Path(out).resolve().parent / LEDGER_FILE


def canonical_sha256(payload: Any) -> str:
    """sha256 of a JSON value written with sorted keys and no spaces (for values not yet in a file)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def append_record(ledger: Path, record: dict[str, Any]) -> None:
    """One line, flushed and fsynced: a crash keeps every record written before it."""
    ledger.parent.mkdir(parents=True, exist_ok=True)
    with open(ledger, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def run_records(ledger: Path, run: str | Path) -> dict[str, dict[str, Any]]:
    """The last `start` and `end` record of `run` in the ledger ({} when it has none)."""
    found: dict[str, dict[str, Any]] = {}
    if not Path(ledger).is_file():
        return found
    target = str(Path(run).resolve())
    for number, line in enumerate(Path(ledger).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{ledger}:{number}: not JSON ({exc})") from exc
        if record.get("run") == target:
            found[record.get("stage", "")] = record
    return found
