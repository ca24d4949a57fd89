"""Answers to "why was this document removed?" read straight from the audit Parquet files."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests.run_dir import completed_stages, find_stage


def funnel(run: Path) -> list[dict[str, Any]]:
    """Per stage: in, kept, removed per rule, modified per rule (from the manifests' counts)."""
    rows = []
    for stage_dir, manifest in completed_stages(run):
        counts = manifest.counts
        rows.append({
            "stage": stage_dir.stage,
            "dir": stage_dir.path.name,
            "in": counts.get("in", 0),
            "kept": counts.get("kept", 0),
            "removed": counts.get("removed", {}),
            "modified": counts.get("modified", {}),
            "routed": counts.get("routed", {}),
            "wall_time_s": manifest.wall_time_s,
            "documents": bool(manifest.files("data") or manifest.files("audit")),
        })
    return rows


def _filter_file(path: Path, column: str, value: str, columns: list[str] | None = None) -> pa.Table:
    return pq.read_table(path, columns=columns, filters=[(column, "=", value)])


def decisions_for(run: Path, doc_id: str) -> dict[str, Any]:
    """Every stage's decision about one document, in pipeline order, stopping where it was removed."""
    trail: list[dict[str, Any]] = []
    seen_anywhere = False
    final = "unknown"
    for stage_dir, manifest in completed_stages(run):
        if not manifest.files("data") and not manifest.files("audit"):
            continue  # not a document stage (tokenizer, mixture, ...)
        rows = []
        for audit_file in manifest.files("audit"):
            table = _filter_file(manifest.path_of(audit_file), "id", doc_id)
            rows.extend(table.to_pylist())
        removed = [r for r in rows if r["action"] == "removed"]
        in_data = any(_filter_file(manifest.path_of(f), "id", doc_id, ["id"]).num_rows for f in manifest.files("data")) if not removed else False
        entries = [
            {"action": r["action"], "rule": r["rule"], "value": r["value"], "threshold": r["threshold"], "detail": json.loads(r["detail"])}
            for r in rows
        ]
        if removed:
            seen_anywhere = True
            trail.append({"stage": stage_dir.stage, "decision": "removed", "entries": entries})
            final = f"removed at {stage_dir.stage} ({removed[0]['rule']})"
            break
        if in_data:
            seen_anywhere = True
            decision = "kept (modified)" if any(r["action"] == "modified" for r in rows) else "kept"
            if any(r["action"] == "routed" for r in rows):
                decision = "kept (routed: " + ", ".join(r["rule"] for r in rows if r["action"] == "routed") + ")"
            trail.append({"stage": stage_dir.stage, "decision": decision, "entries": entries})
            final = "kept"
        elif seen_anywhere:
            trail.append({"stage": stage_dir.stage, "decision": "absent", "entries": entries})
            final = f"absent from {stage_dir.stage}"
            break
    if not seen_anywhere:
        raise KeyError(f"{run}: no stage has a document with id {doc_id!r}")
    return {"id": doc_id, "final": final, "stages": trail}


def sample_removed(run: Path, stage: str, rule: str | None = None, n: int = 10, with_text: bool = True) -> list[dict[str, Any]]:
    """Up to n audit rows of one stage (optionally one rule), with a snippet of the document as it entered."""
    return sample_by_rule(run, stage, [rule] if rule is not None else None, n, with_text)


def sample_by_rule(run: Path, stage: str, rules: list[str] | None, n: int, with_text: bool = True) -> list[dict[str, Any]]:
    """Up to n audit rows per rule (n in all when `rules` is None), in audit order, with snippets.

    One read of the audit log and one of the upstream text for every rule at
    once: a stage with a dozen rules is sampled in one pass, not a dozen.
    """
    stage_dir, manifest = find_stage(run, stage)
    tables = [pq.read_table(manifest.path_of(f)) for f in manifest.files("audit")]
    if not tables:
        return []
    audit = pa.concat_tables(tables)
    if rules is None:
        picked = audit.slice(0, n).to_pylist()
    else:
        rule_column = audit.column("rule")
        picked = [row for rule in rules for row in audit.take(pc.indices_nonzero(pc.equal(rule_column, rule))[:n]).to_pylist()]
    if with_text and picked:
        texts = _texts_before(run, stage_dir.position, [r["id"] for r in picked])
        for row in picked:
            row["snippet"] = (texts.get(row["id"]) or "")[:200]
    for row in picked:
        row["detail"] = json.loads(row["detail"])
    return picked


def _texts_before(run: Path, position: tuple[int, str], ids: list[str]) -> dict[str, str]:
    """The text the documents had when they entered the stage at `position` (StageDir.position)."""
    previous = [(s, m) for s, m in completed_stages(run) if s.position < position]
    if not previous:
        return {}
    _, manifest = previous[-1]
    wanted = pa.array(ids)
    found: dict[str, str] = {}
    for data_file in manifest.files("data"):
        table = pq.read_table(manifest.path_of(data_file), columns=["id", "text"])
        table = table.filter(pc.is_in(table.column("id"), value_set=wanted))
        found.update(zip(table.column("id").to_pylist(), table.column("text").to_pylist()))
    return found
