"""Answers to "why was this document removed?" read straight from the audit Parquet files."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests.corpus import source_of_id
from manifests.run_dir import completed_stages, find_stage

TEXT_BATCH_ROWS = 1024  # upstream rows decoded at a time while snippets are looked up


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


def decisions_for(run: Path, doc_id: str, shard: str | None = None) -> dict[str, Any]:
    """Every stage's decision about one document, in pipeline order, stopping where it was removed; `shard` (as
    find_documents names it): read that shard's files only."""
    found = decisions_for_many(run, [doc_id], {shard} if shard is not None else None)
    if doc_id not in found:
        raise KeyError(f"{run}: no stage has a document with id {doc_id!r}")
    return found[doc_id]


def in_shards(files: list[Any], shards: set[str] | None) -> list[Any]:
    """The files of these shards (a stage names each file by the shard it came from), or all of them."""
    return files if shards is None else [f for f in files if Path(f.path).stem in shards]


def decisions_for_many(run: Path, doc_ids: list[str], shards: set[str] | None = None) -> dict[str, dict[str, Any]]:
    """`decisions_for` of several documents, each stage's files read once for all of them (the data report's search).
    Ids no stage has are left out. `shards`: the shards that hold the documents (every stage keeps a document in the
    shard of the same name), so only their files are read; None reads every file."""
    wanted = pa.array(list(dict.fromkeys(doc_ids)), pa.string())
    trails: dict[str, list[dict[str, Any]]] = {doc_id: [] for doc_id in wanted.to_pylist()}
    final: dict[str, str] = {}
    done: set[str] = set()
    for stage_dir, manifest in completed_stages(run):
        if not manifest.files("data") and not manifest.files("audit"):
            continue  # not a document stage (tokenizer, mixture, ...)
        open_ids = [doc_id for doc_id in trails if doc_id not in done]
        if not open_ids:
            break
        open_set = pa.array(open_ids, pa.string())
        rows_of: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for audit_file in in_shards(manifest.files("audit"), shards):
            table = pq.read_table(manifest.path_of(audit_file))
            for row in table.filter(pc.is_in(table.column("id"), value_set=open_set)).to_pylist():
                rows_of[row["id"]].append(row)
        in_data: set[str] = set()
        for data_file in in_shards(manifest.files("data"), shards):
            ids = pq.read_table(manifest.path_of(data_file), columns=["id"]).column("id")
            in_data.update(ids.filter(pc.is_in(ids, value_set=open_set)).to_pylist())
        for doc_id in open_ids:
            rows = rows_of.get(doc_id, [])
            entries = [{"action": r["action"], "rule": r["rule"], "value": r["value"], "threshold": r["threshold"], "detail": json.loads(r["detail"])}
                       for r in rows]
            removed = [r for r in rows if r["action"] == "removed"]
            seen = bool(trails[doc_id])
            if removed:
                trails[doc_id].append({"stage": stage_dir.stage, "decision": "removed", "entries": entries})
                final[doc_id] = f"removed at {stage_dir.stage} ({removed[0]['rule']})"
                done.add(doc_id)
            elif doc_id in in_data:
                decision = "kept (modified)" if any(r["action"] == "modified" for r in rows) else "kept"
                if any(r["action"] == "routed" for r in rows):
                    decision = "kept (routed: " + ", ".join(r["rule"] for r in rows if r["action"] == "routed") + ")"
                trails[doc_id].append({"stage": stage_dir.stage, "decision": decision, "entries": entries})
                final[doc_id] = "kept"
            elif seen:
                trails[doc_id].append({"stage": stage_dir.stage, "decision": "absent", "entries": entries})
                final[doc_id] = f"absent from {stage_dir.stage}"
                done.add(doc_id)
    return {doc_id: {"id": doc_id, "final": final[doc_id], "stages": trail} for doc_id, trail in trails.items() if trail}


def quarantined_files(run: Path) -> list[dict[str, str]]:
    """The input files ingest left out whole (`on_bad_file = "quarantine"`): [{"file", "uri", "reason"}], in audit order."""
    stages = [(s, m) for s, m in completed_stages(run) if s.stage == "ingest"]
    if not stages:
        return []
    _, manifest = stages[0]
    files = []
    for audit_file in manifest.files("audit"):
        table = pq.read_table(manifest.path_of(audit_file), columns=["rule", "detail"], filters=[("rule", "=", "ingest_bad_file")])
        files.extend(json.loads(detail) for detail in table.column("detail").to_pylist())
    return files


def find_documents(run: Path, key: str) -> list[dict[str, Any]]:
    """The documents `key` names: a HyMo id, else the user's own id (`meta.record_id`) or a URL, looked up
    in the first document stage (ingest): its documents and the audit rows of what it removed.

    Returns [{"id", "source", "file", "ordinal", "url", "record_id", "shard"}] in shard order; one entry for a
    HyMo id ({"id", "shard"}), several when a URL (or a user's id) is in several files or snapshots. `shard` is
    the shard that holds the document at every stage (a stage keeps a document in the shard of the same name),
    so a reader of one document reads that shard's files only. A HyMo id is looked for shard by shard, the
    first stage's data files (then its audit files, then the other stages') one id column at a time, until found."""
    stages = [(s, m) for s, m in completed_stages(run) if m.files("data") or m.files("audit")]
    if not stages:
        return []
    _, first = stages[0]
    candidates = [(first, f) for f in first.files("data")] + [(m, f) for _, m in stages for f in m.files("audit")]
    for manifest, f in candidates:
        if _filter_file(manifest.path_of(f), "id", key, ["id"]).num_rows:
            return [{"id": key, "shard": Path(f.path).stem}]
    quoted = json.dumps(key, ensure_ascii=False)
    found: dict[str, dict[str, Any]] = {}
    for data_file in first.files("data"):
        table = pq.read_table(first.path_of(data_file), columns=["id", "url", "meta"])
        hit = pc.or_(pc.equal(table.column("url"), key), pc.match_substring(table.column("meta"), f'"record_id":{quoted}'))
        for row in table.filter(hit).to_pylist():
            meta = json.loads(row["meta"])
            if row["url"] == key or meta.get("record_id") == key:
                found.setdefault(row["id"], {"id": row["id"], "file": meta.get("origin_file"), "ordinal": meta.get("ordinal"),
                                             "url": row["url"], "record_id": meta.get("record_id"), "shard": Path(data_file.path).stem})
    for audit_file in first.files("audit"):
        table = pq.read_table(first.path_of(audit_file), columns=["id", "detail"])
        hit = pc.or_(pc.match_substring(table.column("detail"), f'"uri":{quoted}'), pc.match_substring(table.column("detail"), f'"record_id":{quoted}'))
        for row in table.filter(hit).to_pylist():
            detail = json.loads(row["detail"])
            if detail.get("uri") == key or detail.get("record_id") == key:
                found.setdefault(row["id"], {"id": row["id"], "file": detail.get("file"), "ordinal": detail.get("ordinal"),
                                             "url": detail.get("uri"), "record_id": detail.get("record_id"), "shard": Path(audit_file.path).stem})
    for entry in found.values():
        entry["source"] = source_of_id(entry["id"])
    return list(found.values())


def sample_removed(run: Path, stage: str, rule: str | None = None, n: int = 10, with_text: bool = True) -> list[dict[str, Any]]:
    """Up to n audit rows of one stage (optionally one rule), with a snippet of the document as it entered."""
    return sample_by_rule(run, stage, [rule] if rule is not None else None, n, with_text)


def sample_by_rule(run: Path, stage: str, rules: list[str] | None, n: int, with_text: bool = True) -> list[dict[str, Any]]:
    """Up to n audit rows per rule (n in all when `rules` is None), in audit order, with snippets; each row also names
    the shard of the audit file it came from (`shard`).

    The audit log is read one file at a time, its `rule` column first, and
    only until every rule has its n rows: the flow host samples every stage
    after it runs, so this must cost a few files, not the whole log (a
    concatenated log grew the host by ~300 bytes a removed document). The
    snippets come from the upstream shard of the same name as each row's
    audit file (stages keep shard names), the other shards only for ids not there.
    """
    _, manifest = find_stage(run, stage)
    wanted = {rule: [] for rule in rules} if rules is not None else None
    first: list[dict[str, Any]] = []
    shard_of: dict[str, str] = {}
    for audit_file in manifest.files("audit"):
        need = {rule: n - len(rows) for rule, rows in wanted.items() if len(rows) < n} if wanted is not None else None
        if (need is not None and not need) or (need is None and len(first) >= n):
            break
        path = manifest.path_of(audit_file)
        rule_column = pq.read_table(path, columns=["rule"]).column("rule")
        if need is None:
            indices = {None: pa.array(range(min(n - len(first), len(rule_column))), pa.int64())}
        else:
            indices = {rule: pc.indices_nonzero(pc.equal(rule_column, rule))[:count] for rule, count in need.items()}
        if not any(len(chosen) for chosen in indices.values()):
            continue
        table = pq.read_table(path)
        for rule, chosen in indices.items():
            rows = [{**row, "shard": Path(audit_file.path).stem} for row in table.take(chosen).to_pylist()]
            (first if rule is None else wanted[rule]).extend(rows)
            shard_of.update((row["id"], row["shard"]) for row in rows)
    picked = first if wanted is None else [row for rule in rules for row in wanted[rule]]
    if with_text and picked:
        texts = _texts_before(run, find_stage(run, stage)[0].position, shard_of)
        for row in picked:
            row["snippet"] = (texts.get(row["id"]) or "")[:200]
    for row in picked:
        row["detail"] = json.loads(row["detail"])
    return picked


def _texts_before(run: Path, position: tuple[int, str], shard_of: dict[str, str], hinted_only: bool = False) -> dict[str, str]:
    """The text the documents had when they entered the stage at `position` (StageDir.position).

    `shard_of`: id -> the shard its audit row came from; that upstream shard is
    read first (its ids, then its texts in batches only if one is there), the
    others only for the ids still missing (never, with `hinted_only`: the reads are then bounded by the shards named).
    """
    previous = [(s, m) for s, m in completed_stages(run) if s.position < position]
    if not previous:
        return {}
    return texts_in(previous[-1][1], shard_of, hinted_only)


def texts_in(manifest: Any, shard_of: dict[str, str], hinted_only: bool = False) -> dict[str, str]:
    """The texts of these ids in one stage's data files (`shard_of`: id -> the shard it is likely in, read first;
    with `hinted_only`, the only one read: an id elsewhere gets no text)."""
    data_files = manifest.files("data")
    likely = set(shard_of.values())
    ordered = [f for f in data_files if Path(f.path).stem in likely] + ([] if hinted_only else [f for f in data_files if Path(f.path).stem not in likely])
    found: dict[str, str] = {}
    for data_file in ordered:
        missing = [doc_id for doc_id in shard_of if doc_id not in found]
        if not missing:
            break
        path = manifest.path_of(data_file)
        wanted = pa.array(missing)
        if not pc.any(pc.is_in(pq.read_table(path, columns=["id"]).column("id"), value_set=wanted)).as_py():
            continue
        parquet = pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)  # streamed: a shard's text is never held whole
        for batch in parquet.iter_batches(TEXT_BATCH_ROWS, columns=["id", "text"], use_threads=False):
            picked = batch.filter(pc.is_in(batch.column("id"), value_set=wanted))
            found.update(zip(picked.column("id").to_pylist(), picked.column("text").to_pylist()))
    return found
