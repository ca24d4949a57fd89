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

Trust model. The chain is unkeyed: anyone who can write the ledger can rewrite every line and recompute
every link, and `read_ledger` then passes. What stops that forger is a copy out of their reach: the
Prefect artifacts (when a server answers), or a key. With `HYMO_CPT_LEDGER_KEY_FILE` (a file whose bytes
are the key) or `HYMO_CPT_LEDGER_KEY` set, every line written carries `hmac_sha256`, an HMAC-SHA256 of
the line without that field, and a reader with the key refuses a line whose HMAC does not match, and
a run record that carries none. Keep the key where the run's writers cannot read it (a CI secret): who
holds the key can still forge.

A run is found by its `run_id` (written into its manifest at the start), so a copy of the run
directory is verified against the original's records; records naming the same directory are
counted too, so re-using a directory for a second start is caught either way.
"""
from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

LEDGER_FILE = "cpt_ledger.jsonl"
KEY_FILE_ENV = "HYMO_CPT_LEDGER_KEY_FILE"  # a file whose bytes (trailing newline dropped) are the HMAC key
KEY_ENV = "HYMO_CPT_LEDGER_KEY"  # the key itself, for a CI secret
HMAC_FIELD = "hmac_sha256"
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


def ledger_key() -> bytes | None:
    """The HMAC key from $HYMO_CPT_LEDGER_KEY_FILE, else $HYMO_CPT_LEDGER_KEY; None when neither is set."""
    path = os.environ.get(KEY_FILE_ENV)
    if path:
        try:
            key = Path(path).read_bytes().rstrip(b"\r\n")
        except OSError as exc:
            raise LedgerError(f"${KEY_FILE_ENV} = {path}: cannot read the ledger key ({exc.strerror})") from None
        if not key:
            raise LedgerError(f"${KEY_FILE_ENV} = {path}: the key file is empty")
        return key
    value = os.environ.get(KEY_ENV)
    return value.encode("utf-8") if value else None


def record_hmac(key: bytes, record: dict[str, Any]) -> str:
    """HMAC-SHA256 of the record as written, without its own HMAC field."""
    body = json.dumps({k: v for k, v in record.items() if k != HMAC_FIELD}, sort_keys=True)
    return hmac.new(key, body.encode("utf-8"), "sha256").hexdigest()


def _check_keys(ledger: Path, rows: list[tuple[int, str, dict[str, Any]]], key: bytes | None) -> None:
    """With a key: every HMAC a line carries must match (a line without one predates the key; `run_records` requires
    one on the run's own records)."""
    if key is None:
        return
    for number, _, record in rows:
        if HMAC_FIELD in record and not hmac.compare_digest(str(record[HMAC_FIELD]), record_hmac(key, record)):
            raise LedgerError(f"{ledger}:{number}: {HMAC_FIELD} does not match the ledger key: the line was written or "
                              "rewritten without the key")


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
    _check_keys(ledger, rows, ledger_key())
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
        key = ledger_key()
        if key is not None:
            written[HMAC_FIELD] = record_hmac(key, written)
        handle.write(json.dumps(written, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return written


def run_records(ledger: str | Path, run: str | Path, run_id: str | None = None) -> dict[str, dict[str, Any]]:
    """The `start` and `end` record of the run with `run_id` (or at directory `run`); {} when it has none.
    Raises LedgerError on a broken chain or on two records of one stage (a verdict appended after the fact)."""
    target = str(Path(run).resolve())
    found: dict[str, dict[str, Any]] = {}
    keyed = ledger_key() is not None
    for record in read_ledger(ledger):
        if not _belongs(record, run_id, target):
            continue
        if keyed and HMAC_FIELD not in record:
            raise LedgerError(f"{ledger}: the {record.get('stage')} record of run {record.get('run')} carries no {HMAC_FIELD}, "
                              "though a ledger key is set: it was written without the key")
        stage = record.get("stage", "")
        if stage in found:
            raise LedgerError(f"{ledger}: two {stage} records for run {record.get('run')} ({record.get('run_id')}): "
                              f"one at {found[stage].get('time')}, another at {record.get('time')}; a record was appended after the run")
        found[stage] = record
    return found
