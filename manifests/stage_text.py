"""One document's text at one stage, the text it entered that stage with, and what the stage did to it.

`hymo audit show RUN ID --stage S [--diff]` reads it: S's data files for the text it published, the
previous document stage's for the text it read (a stage's `edits` index that one), and S's audit rows.
Every read filters by id. Given the document's shard (`audit_query.find_documents` names it: a stage keeps a
document in the shard of the same name), only that shard's files are read at S and at the stage before, whatever
the number of shards; without it, each stage's shards are searched one id column at a time.
"""
from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from manifests.audit_query import in_shards, texts_in
from manifests.run_dir import completed_stages, find_stage


def document_at(run: Path, doc_id: str, stage: str, shard: str | None = None) -> dict[str, Any]:
    """{"id", "stage", "decision", "text" (None when S removed it or never saw it), "entered" (None at the first
    stage), "previous_stage", "rows" (S's audit rows, detail parsed)}; KeyError for a stage that holds no documents.
    `shard`: the shard that holds the document (read alone), or None to search every shard."""
    stage_dir, manifest = find_stage(run, stage)
    if not manifest.files("data") and not manifest.files("audit"):
        raise KeyError(f"{run}: {stage} holds no documents (an artifact stage); name a document stage, e.g. quality")
    rows = []
    only = {shard} if shard is not None else None
    for audit_file in in_shards(manifest.files("audit"), only):
        table = pq.read_table(manifest.path_of(audit_file), filters=[("id", "=", doc_id)])
        rows += [{**row, "detail": json.loads(row["detail"])} for row in table.to_pylist()]
    hint = {doc_id: shard or ""}
    text = texts_in(manifest, hint, hinted_only=shard is not None).get(doc_id)
    previous = [(s, m) for s, m in completed_stages(run) if s.position < stage_dir.position and (m.files("data") or m.files("audit"))]
    entered = texts_in(previous[-1][1], hint, hinted_only=shard is not None).get(doc_id) if previous else None
    if any(row["action"] == "removed" for row in rows):
        decision = "removed (" + ", ".join(row["rule"] for row in rows if row["action"] == "removed") + ")"
    elif text is None:
        decision = "absent (removed before this stage)" if entered is None and previous else "absent"
    else:
        decision = "modified" if any(row["action"] == "modified" for row in rows) else "kept unchanged"
        routed = [row["rule"] for row in rows if row["action"] == "routed"]
        decision += f" (routed: {', '.join(routed)})" if routed else ""
    return {"id": doc_id, "stage": stage_dir.stage, "decision": decision, "text": text, "entered": entered,
            "previous_stage": previous[-1][0].stage if previous else None, "rows": rows}


def edits_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """Every edit of the stage's modifying rows, with the characters of the entered text it covers."""
    found = []
    entered = answer["entered"] or ""
    for row in answer["rows"]:
        for start, end, label in row["detail"].get("edits", []):
            found.append({"rule": row["rule"], "start": start, "end": end, "label": label, "text": entered[start:end]})
        if "edits_total" in row["detail"]:
            found.append({"rule": row["rule"], "more": row["detail"]["edits_total"] - len(row["detail"]["edits"])})
    return found


def unified_diff(answer: dict[str, Any]) -> list[str]:
    """The entered text against the stage's text, line by line (a removed document: against nothing)."""
    before, after = answer["entered"] or "", answer["text"] or ""
    names = (f"{answer['previous_stage'] or 'source'}/{answer['id']}", f"{answer['stage']}/{answer['id']}")
    return list(difflib.unified_diff(before.splitlines(), after.splitlines(), *names, lineterm=""))
