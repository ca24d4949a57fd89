"""The corpus manifest: the one file the trainer reads, and the end of the data half.

`corpus.json` lives in the shards stage directory beside the token files it
lists (paths are relative to it). It records, per source: origin, snapshot,
licence, filters applied with counts, documents and tokens kept, weight and
epochs; the tokenizer's file, sha256 and vocab size; the token dtype; every
shard with its sha256 and token count (train and validation apart); the
validation split; and `digest`, the sha256 of the canonical JSON of everything
else, which the trainer stores in its checkpoints to refuse a resume on a
different corpus. `hymo_core.train.data` recomputes the same digest without
importing this module (hymo_core stays free of the pipeline).
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests.atomic import atomic_write_text
from manifests.digest import canonical_json, sha256_bytes
from manifests.run_dir import completed_stages, find_stage

CORPUS_FILE = "corpus.json"
CORPUS_FORMAT = 1
TOKEN_DTYPES = ("uint16", "uint32")
REQUIRED_KEYS = ("format_version", "dtype", "tokenizer", "sources", "mixture", "shards", "validation", "digest")


class CorpusManifestError(ValueError):
    """A corpus manifest is missing, malformed, or its digest does not match its content."""


def corpus_digest(payload: dict[str, Any]) -> str:
    return sha256_bytes(canonical_json({k: v for k, v in payload.items() if k != "digest"}).encode("utf-8"))


def write_corpus_manifest(path: Path, payload: dict[str, Any]) -> dict[str, Any]:
    payload = {**payload, "format_version": CORPUS_FORMAT}
    payload["digest"] = corpus_digest(payload)
    validate_corpus(payload, str(path))
    atomic_write_text(Path(path), json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    return payload


def validate_corpus(payload: dict[str, Any], where: str) -> None:
    missing = [k for k in REQUIRED_KEYS if k not in payload]
    if missing:
        raise CorpusManifestError(f"{where}: corpus manifest lacks {', '.join(missing)}")
    if payload["format_version"] != CORPUS_FORMAT:
        raise CorpusManifestError(f"{where}: corpus manifest format {payload['format_version']} is not {CORPUS_FORMAT}")
    if payload["dtype"] not in TOKEN_DTYPES:
        raise CorpusManifestError(f"{where}: dtype {payload['dtype']!r} is not one of {TOKEN_DTYPES}")
    for side in ("train", "validation"):
        for shard in payload["shards"].get(side, []):
            for key in ("path", "sha256", "tokens", "index_path", "index_sha256"):
                if key not in shard:
                    raise CorpusManifestError(f"{where}: {side} shard {shard.get('path')!r} lacks {key}")
    if payload["digest"] != corpus_digest(payload):
        raise CorpusManifestError(f"{where}: recorded digest does not match the manifest's content")


def read_corpus_manifest(path: Path) -> dict[str, Any]:
    path = locate_corpus_manifest(Path(path))
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CorpusManifestError(f"{path}: unreadable corpus manifest ({exc})") from exc
    validate_corpus(payload, str(path))
    return payload


def locate_corpus_manifest(path: Path) -> Path:
    """Accept corpus.json itself, the shards stage directory, or a run directory."""
    if path.is_file():
        return path
    if (path / CORPUS_FILE).is_file():
        return path / CORPUS_FILE
    try:
        stage_dir, _ = find_stage(path, "shards")
    except (KeyError, FileNotFoundError) as exc:
        raise CorpusManifestError(f"{path}: no {CORPUS_FILE} here and no completed shards stage") from exc
    return stage_dir.path / CORPUS_FILE


def source_of_id(doc_id: str) -> str:
    """Ingestion ids are `<source>-<16 hex>`: the source survives without a join."""
    return doc_id.rsplit("-", 1)[0]


def source_column(ids: pa.ChunkedArray | pa.Array) -> pa.Array:
    """`source_of_id` for a whole column of ids, in Arrow (no Python string per row)."""
    return pc.replace_substring_regex(ids, pattern="-[^-]*$", replacement="", max_replacements=1)


def action_counts(path: Path, actions: tuple[str, ...]) -> list[dict[str, Any]]:
    """One audit file's (source, action, rule, count) for the given actions, groups in order of first appearance."""
    table = pq.read_table(path, columns=["id", "action", "rule"])
    table = table.filter(pc.is_in(table.column("action"), value_set=pa.array(actions)))
    grouped = pa.table({"source": source_column(table.column("id")), "action": table.column("action"), "rule": table.column("rule")})
    return grouped.group_by(["source", "action", "rule"], use_threads=False).aggregate([([], "count_all")]).to_pylist()


# Runs fn(*job) for every job and yields the results in any order (the shards stage passes its worker pool).
Mapper = Callable[[Callable[..., Any], list[tuple]], Iterable[Any]]


def serial_map(fn: Callable[..., Any], jobs: list[tuple]) -> Iterator[Any]:
    return (fn(*job) for job in jobs)


def labelled_action_counts(label: str, path: str, actions: tuple[str, ...]) -> tuple[str, list[dict[str, Any]]]:
    """Task: `action_counts` of one audit file, tagged with its stage (the file's ids are read where this runs)."""
    return label, action_counts(Path(path), actions)


def source_counts(path: str) -> list[dict[str, Any]]:
    """Task: documents per source in one data file."""
    return pc.value_counts(pq.read_table(path, columns=["source"]).column("source")).to_pylist()


def filters_by_source(run: Path, before_order: int | None = None, mapper: Mapper = serial_map) -> dict[str, dict[str, dict[str, int]]]:
    """source -> "stage.rule" -> {"removed": n, "modified": n} over the document stages before `before_order` (all when None).
    Each audit file is counted in Arrow by one `mapper` job, so the caller holds (source, rule) sums, never an id."""
    jobs = [(stage_dir.stage, str(manifest.path_of(audit_file)), ("removed", "modified"))
            for stage_dir, manifest in completed_stages(run) if before_order is None or stage_dir.order < before_order
            for audit_file in manifest.files("audit")]
    counts: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(lambda: {"removed": 0, "modified": 0}))
    for stage, rows in mapper(labelled_action_counts, jobs):
        for row in rows:
            counts[row["source"]][f"{stage}.{row['rule']}"][row["action"]] += row["count_all"]
    return {s: dict(sorted(rules.items())) for s, rules in sorted(counts.items())}


def source_provenance(run: Path) -> dict[str, dict[str, Any]]:
    """Origin, snapshot and licence of each source, as ingestion recorded them."""
    try:
        _, ingest = find_stage(run, "ingest")
    except KeyError:
        return {}
    return {s["name"]: {"origin": s.get("origin"), "snapshot": s.get("snapshot"), "license": s.get("license"), "kind": s.get("kind"), "profile": s.get("profile")}
            for s in ingest.extra.get("sources", [])}


def ingested_by_source(run: Path, mapper: Mapper = serial_map) -> dict[str, int]:
    """Documents ingested per source (kept and removed), one `mapper` job per ingest data or audit file."""
    try:
        _, ingest = find_stage(run, "ingest")
    except KeyError:
        return {}
    counts: dict[str, int] = defaultdict(int)
    for rows in mapper(source_counts, [(str(ingest.path_of(f)),) for f in ingest.files("data")]):
        for row in rows:
            counts[row["values"]] += row["counts"]
    jobs = [("ingest", str(ingest.path_of(f)), ("removed",)) for f in ingest.files("audit")]
    for _, rows in mapper(labelled_action_counts, jobs):
        for row in rows:
            counts[row["source"]] += row["count_all"]
    return dict(sorted(counts.items()))
