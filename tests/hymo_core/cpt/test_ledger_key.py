"""The CPT ledger's trust model (issue 58): the chain alone is unkeyed, so a forger who rewrites every line passes it;
with a key (HYMO_CPT_LEDGER_KEY_FILE) every line carries an HMAC that such a forger cannot recompute."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hymo_core.cpt.ledger import (HMAC_FIELD, KEY_ENV, KEY_FILE_ENV, LedgerError, append_record, line_sha256, read_ledger,
                                  run_records)


def write_run(ledger: Path, run: Path) -> None:
    append_record(ledger, {"stage": "start", "run": str(run.resolve()), "run_id": "r1", "gate_sha256": "a" * 64, "time": 1})
    append_record(ledger, {"stage": "end", "run": str(run.resolve()), "run_id": "r1", "verdict": "fail", "time": 2})


def rewrite_every_line(ledger: Path, strip_hmac: bool = False) -> None:
    """The forger: the end record's verdict turned to pass, every link recomputed (no key)."""
    lines, previous = [], "0" * 64
    for line in ledger.read_text().splitlines():
        record = json.loads(line)
        if record.get("stage") == "end":
            record["verdict"] = "pass"
        if strip_hmac:
            record.pop(HMAC_FIELD, None)
        record["prev_sha256"] = previous
        lines.append(json.dumps(record, sort_keys=True))
        previous = line_sha256(lines[-1])
    ledger.write_text("\n".join(lines) + "\n")


def test_without_a_key_a_rewritten_chain_passes(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    monkeypatch.delenv(KEY_ENV, raising=False)
    ledger = tmp_path / "cpt_ledger.jsonl"
    write_run(ledger, tmp_path / "run")
    rewrite_every_line(ledger)
    assert run_records(ledger, tmp_path / "run", "r1")["end"]["verdict"] == "pass"  # what docs/reliability.md says


def test_with_a_key_every_line_is_signed_and_a_rewrite_is_refused(tmp_path, monkeypatch):
    key = tmp_path / "ledger.key"
    key.write_text("s3cret\n")
    monkeypatch.setenv(KEY_FILE_ENV, str(key))
    ledger = tmp_path / "cpt_ledger.jsonl"
    write_run(ledger, tmp_path / "run")
    records = run_records(ledger, tmp_path / "run", "r1")
    assert all(len(r[HMAC_FIELD]) == 64 for r in records.values()) and records["end"]["verdict"] == "fail"

    original = ledger.read_text()
    rewrite_every_line(ledger)  # the chain links, the HMACs do not match
    with pytest.raises(LedgerError, match=rf"cpt_ledger.jsonl:2: {HMAC_FIELD} does not match the ledger key"):
        read_ledger(ledger)
    ledger.write_text(original)
    rewrite_every_line(ledger, strip_hmac=True)  # HMACs dropped: the run's records are unsigned
    with pytest.raises(LedgerError, match=f"carries no {HMAC_FIELD}, though a ledger key is set"):
        run_records(ledger, tmp_path / "run", "r1")

    monkeypatch.setenv(KEY_FILE_ENV, str(tmp_path / "missing.key"))
    with pytest.raises(LedgerError, match="cannot read the ledger key"):
        read_ledger(ledger)
    monkeypatch.delenv(KEY_FILE_ENV)
    monkeypatch.setenv(KEY_ENV, "another key")  # the key as a CI secret: the original lines do not verify under it
    ledger.write_text(original)
    with pytest.raises(LedgerError, match="does not match the ledger key"):
        read_ledger(ledger)
