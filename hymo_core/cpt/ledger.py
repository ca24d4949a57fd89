"""The record of a CPT run's hashes kept outside its directory, so that editing the run cannot also edit it.

At the start (before the first update) and at the end, `run_cpt` appends one JSON line with the
sha256 of the gate, the manifest, the base checkpoint and the measurements to the ledger, by default
`cpt_ledger.jsonl` in OUT's parent directory, and hands the same record to `on_record` (the
Prefect flow writes it to the run log and to an artifact, which live in the Prefect server).
`hymo cpt verify RUN` compares the run's files with the run's start and end records.

Two rules make appending a forged verdict visible:

* a run has one start and one end record: `append_record` refuses a second, and `run_records`
  reports a ledger that holds two (appended by hand) as tampered;
* each line carries `prev_sha256`, the sha256 of the line before it (`GENESIS` for the first), so
  an edited or deleted line breaks every link after it; `read_ledger` names the first broken one.
  A forger who rewrites the whole tail still has to match the Prefect artifacts, which hold the
  same records (and their links) outside the machine's filesystem.

A run is found by its `run_id` (written into its manifest at the start), so a copy of the run
directory is verified against the original's records; records naming the same directory are
counted too, so re-using a directory for a second start is caught either way.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Any

LEDGER_FILE = "cpt_ledger.jsonl"
GENESIS = "0" * 64
STAGES = ("start", "end")


class LedgerError(ValueError):
    """The ledger is malformed, broken in its chain, or holds a second start/end record for a run (one line)."""


def default_ledger(out: str | Path) -> Path:
    return Path(out).resolve().parent / LEDGER_FILE


def canonical_sha256(payload: Any) -> str:
    """sha256 of a JSON value written with sorted keys and no spaces (for values not yet in a file)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def line_sha256(line: str) -> str:
    """The link the next record carries: sha256 of one ledger line as written, without its newline."""
    return hashlib.sha256(line.rstrip("\n").encode("utf-8")).hexdigest()


def _parse(ledger: Path, text: str) -> list[tuple[int, str, dict[str, Any]]]:
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((number, line, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise LedgerError(f"{ledger}:{number}: not JSON ({exc})") from exc
    return rows


def _check_chain(ledger: Path, rows: list[tuple[int, str, dict[str, Any]]]) -> None:
    previous = GENESIS
    for number, line, record in rows:
        if "prev_sha256" not in record:
            raise LedgerError(f"{ledger}:{number}: no prev_sha256: a ledger written before its lines were chained, or an "
                              "inserted line; verify older runs with that ledger's records by hand, and give new runs --ledger NEW")
        if record.get("prev_sha256") != previous:
            raise LedgerError(f"{ledger}:{number}: prev_sha256 {str(record.get('prev_sha256'))[:12]}… is not the sha256 of the line "
                              f"before it ({previous[:12]}…); the ledger was edited")
        previous = line_sha256(line)


def read_ledger(ledger: str | Path) -> list[dict[str, Any]]:
    """Every record, after checking each line's link to the one before it ([] when there is no ledger)."""
    ledger = Path(ledger)
    if not ledger.is_file():
        return []
    rows = _parse(ledger, ledger.read_text(encoding="utf-8"))
    _check_chain(ledger, rows)
    return [record for _, _, record in rows]


def _belongs(record: dict[str, Any], run_id: str | None, run_path: str | None) -> bool:
    return bool((run_id and record.get("run_id") == run_id) or (run_path and record.get("run") == run_path))


def append_record(ledger: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Append one line linked to the last, flushed and fsynced (a crash keeps every record written before it),
    under an exclusive lock; refuses a broken chain and a second record of the same stage for the run.
    Returns the record as written (with its `prev_sha256`)."""
    ledger = Path(ledger)
    ledger.parent.mkdir(parents=True, exist_ok=True)
    with open(ledger, "a+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        rows = _parse(ledger, handle.read())
        _check_chain(ledger, rows)
        stage = record.get("stage")
        for number, _, earlier in rows:
            if stage in STAGES and earlier.get("stage") == stage and _belongs(earlier, record.get("run_id"), record.get("run")):
                raise LedgerError(f"{ledger}:{number}: already holds the {stage} record of run {record.get('run')} "
                                  f"({record.get('run_id')}); a run directory has one {stage} record: choose another --out or --ledger")
        written = {**record, "prev_sha256": line_sha256(rows[-1][1]) if rows else GENESIS}
        handle.write(json.dumps(written, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return written


def run_records(ledger: str | Path, run: str | Path, run_id: str | None = None) -> dict[str, dict[str, Any]]:
    """The `start` and `end` record of the run with `run_id` (or at directory `run`); {} when it has none.
    Raises LedgerError on a broken chain or on two records of one stage (a verdict appended after the fact)."""
    target = str(Path(run).resolve())
    found: dict[str, dict[str, Any]] = {}
    for record in read_ledger(ledger):
        if not _belongs(record, run_id, target):
            continue
        stage = record.get("stage", "")
        if stage in found:
            raise LedgerError(f"{ledger}: two {stage} records for run {record.get('run')} ({record.get('run_id')}): "
                              f"one at {found[stage].get('time')}, another at {record.get('time')}; a record was appended after the run")
        found[stage] = record
    return found
