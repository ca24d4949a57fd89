"""Extraction: HTML pages -> main text with trafilatura; mojibake repaired with ftfy.

Each HTML page runs in a supervised child process with a time limit, so a
pathological page costs `timeout_s`, not the stage. Every failure and every
change is an audit row: extract_timeout / extract_error / extract_empty /
extract_not_html / extract_too_large, and the modifications html_main_text
(with the extractor that produced the text: trafilatura, or a fallback when
trafilatura found nothing in a page with visible text) and mojibake_repaired.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests.audit_edits import changed_spans, edits_detail
from manifests.schema import docs_table
from manifests.stage_manifest import StageManifest, read_manifest
from tasks.ingest.extract_page import extract_page, repair_mojibake
from tasks.ingest.mojibake import trigger_class_re2
from tasks.runner.stage_runner import ShardOutcome, StageDef, dask_client, default_workers, job_progress, run_stage
from tasks.ingest.watchdog import ERROR, OK, TIMEOUT, SupervisedPool

STAGE = "extract"
VERSION = "1"
HTML_META = '"content_type":"html"'  # how an HTML page's meta reads: meta is canonical JSON (manifests.schema)
HTML_SNIFF = re.compile(rb"<\s*(!doctype\s+html|html|head|body|div|p|article|main|section|table|span|a\s|title)\b", re.I)
# Each fresh extraction child parses this once, untimed: trafilatura's first calls load lazily
# (seconds on a busy machine), which must not be charged to a real page's time limit.
WARMUP_PAGE = (
    "<!DOCTYPE html><html><head><title>Warm-up</title></head><body>"
    "<nav><ul><li><a href='/'>Home</a></li><li><a href='/docs'>Docs</a></li></ul></nav>"
    "<main><article><h1>Warm-up page</h1><p>First paragraph of the warm-up page, long enough to count as text.</p>"
    "<p>Second paragraph with a <b>bold</b> word and a <a href='/x'>link</a>.</p>"
    "<table><tr><td>cell</td><td>value</td></tr></table></article></main>"
    "<footer><p>Copyright 2026. Privacy policy.</p></footer></body></html>"
)


@dataclass(frozen=True)
class ExtractConfig:
    timeout_s: float = 20.0  # per page; a hung page is killed, logged and skipped
    max_html_bytes: int = 5 << 20  # larger pages are quarantined instead of parsed
    favor: str = "balanced"  # balanced | precision | recall (trafilatura's trade-off)
    include_tables: bool = True
    include_comments: bool = False
    min_chars: int = 1  # extracted text shorter than this counts as empty
    repair_encoding: bool = True
    # Trafilatura found nothing but the page shows at least this many words: use a fallback extractor
    # (audited with the path used); 0 turns the fallback off.
    fallback_min_words: int = 50


def looks_like_html(text: str) -> bool:
    return HTML_SNIFF.search(text[:65536].encode("utf-8", "ignore")) is not None


def first_difference(before: str, after: str, width: int = 40) -> dict[str, str]:
    i = next((k for k, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
    return {"before": before[max(0, i - 10): i + width], "after": after[max(0, i - 10): i + width]}


def page_job(html: str, url: str, config: ExtractConfig) -> tuple[str, str, str, bool, bool, bool, int]:
    return (html, url, config.favor, config.include_tables, config.include_comments, config.repair_encoding, config.fallback_min_words)


def extraction_pool(config: ExtractConfig, workers: int) -> SupervisedPool:
    return SupervisedPool(extract_page, config.timeout_s, warmup=page_job(WARMUP_PAGE, "https://example.org/warm-up", config), workers=workers)


def holds_html_meta(meta: pa.Array | pa.ChunkedArray) -> bool:
    """Whether some document of this meta column may be an HTML page (never a false "no": a page's meta holds HTML_META)."""
    return len(meta) > 0 and bool(pc.any(pc.match_substring(meta, HTML_META)).as_py())


def mojibake_row(doc_id: str, text: str, repaired: str) -> dict[str, Any]:
    changed = sum(a != b for a, b in zip(text, repaired)) + abs(len(repaired) - len(text))
    return {"id": doc_id, "action": "modified", "rule": "mojibake_repaired", "value": changed,
            "detail": {**first_difference(text, repaired), **edits_detail(changed_spans(text, repaired, "mojibake"))}}


def repair_text_shard(docs: pa.Table, config: ExtractConfig) -> ShardOutcome:
    """A shard without an HTML page: its only work is the encoding repair, done on the column.

    Only texts holding a character some mojibake pattern needs (one vectorised regex over the column) reach
    ftfy's line test; the others, and every other column, pass through as they were read: no row is rebuilt."""
    if not config.repair_encoding or not len(docs):
        return ShardOutcome(docs, [])
    import numpy as np

    text = docs.column("text")
    suspects = np.flatnonzero(pc.match_substring_regex(text, trigger_class_re2()).to_numpy(zero_copy_only=False))
    ids = pc.take(docs.column("id"), suspects).to_pylist()
    audit, repairs = [], {}
    for index, doc_id, before in zip(suspects.tolist(), ids, pc.take(text, suspects).to_pylist()):
        repaired = repair_mojibake(before)
        if repaired != before:
            audit.append(mojibake_row(doc_id, before, repaired))
            repairs[index] = repaired
    if repairs:  # only the repaired texts are swapped in: the shard's other texts never become Python strings
        mask = np.zeros(len(docs), dtype=bool)
        mask[list(repairs)] = True
        field = docs.schema.field("text")
        swapped = pc.replace_with_mask(text.combine_chunks(), pa.array(mask), pa.array(list(repairs.values()), field.type))
        docs = docs.set_column(docs.schema.get_field_index("text"), field, swapped)
    return ShardOutcome(docs, audit)


def extract_shard(docs: pa.Table, config: ExtractConfig, context: Any = None, pool: SupervisedPool | None = None,
                  children: int | None = None) -> ShardOutcome:
    """One shard; its pages go to `pool` (the stage's children), or to `children` started for this shard alone."""
    if not holds_html_meta(docs.column("meta")):
        return repair_text_shard(docs, config)
    rows = docs.to_pylist()
    audit: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    jobs, job_rows, sizes = [], [], []
    for row in rows:
        meta = json.loads(row["meta"])
        row["meta"] = meta
        if meta.get("content_type") != "html":
            kept.append(row)
            continue
        size = len(row["text"].encode("utf-8"))
        if size > config.max_html_bytes:
            audit.append({"id": row["id"], "action": "removed", "rule": "extract_too_large", "value": size, "threshold": config.max_html_bytes, "detail": {"url": row["url"]}})
        elif not looks_like_html(row["text"]):
            audit.append({"id": row["id"], "action": "removed", "rule": "extract_not_html", "detail": {"url": row["url"], "head": row["text"][:80]}})
        else:
            jobs.append(page_job(row["text"], row["url"], config))
            job_rows.append(row)
            sizes.append(size)
    progress, skipped = job_progress(), len(rows) - len(jobs)  # documents of this shard done: skipped ones, then pages
    if not jobs:
        outcomes = []
    elif pool is not None:
        outcomes = pool.map(jobs, costs=sizes, on_answer=lambda pages: progress(skipped + pages))
    else:
        with extraction_pool(config, children or default_workers()) as own:
            outcomes = own.map(jobs, costs=sizes)
    repaired_in_child: dict[str, str] = {}
    for row, (status, answer) in zip(job_rows, outcomes):
        result, repaired, extractor = answer if status == OK else (answer, None, "")
        html_chars = len(row["text"])
        if status == TIMEOUT:
            audit.append({"id": row["id"], "action": "removed", "rule": "extract_timeout", "value": config.timeout_s, "threshold": config.timeout_s, "detail": {"url": row["url"], "html_chars": html_chars}})
        elif status == ERROR:
            audit.append({"id": row["id"], "action": "removed", "rule": "extract_error", "detail": {"url": row["url"], "error": result}})
        elif status == OK and (result is None or len(result.strip()) < config.min_chars):
            audit.append({"id": row["id"], "action": "removed", "rule": "extract_empty", "value": len((result or "").strip()), "threshold": config.min_chars, "detail": {"url": row["url"], "html_chars": html_chars}})
        else:
            row["text"] = result
            audit.append({"id": row["id"], "action": "modified", "rule": "html_main_text", "value": len(result),
                          "detail": {"html_chars": html_chars, "text_chars": len(result), "extractor": extractor, **edits_detail([(0, html_chars, "html_to_text")])}})
            kept.append(row)
            if repaired is not None:
                repaired_in_child[row["id"]] = repaired
    if config.repair_encoding:
        for row in kept:
            repaired = repaired_in_child.get(row["id"]) or repair_mojibake(row["text"])
            if repaired != row["text"]:
                audit.append(mojibake_row(row["id"], row["text"], repaired))
                row["text"] = repaired
    order = {row["id"]: i for i, row in enumerate(rows)}
    kept.sort(key=lambda r: order[r["id"]])
    return ShardOutcome(docs_table(kept), audit)


def any_html(input_dir: Path) -> bool:
    """Whether some upstream document may be an HTML page, from the meta column alone, shard by shard until one is.

    A false "yes" (a user meta value holding the same text) only keeps the shared page pool; an HTML page's
    meta always holds it. The read is the meta column, a small part of what the stage reads anyway."""
    manifest = read_manifest(Path(input_dir), verify=False)
    for data in manifest.files("data"):
        meta = pq.read_table(manifest.path_of(data), columns=["meta"]).column("meta")
        if holds_html_meta(meta):
            return True
    return False


def run_extract(config: ExtractConfig, input_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest:
    if dask_client() is not None:
        # On a cluster each shard (a batch of ≤ docs_per_shard pages) is a Dask task with one supervised
        # child of its own: the per-page deadline and the kill of a hung page work on every machine.
        return run_stage(StageDef(STAGE, VERSION, partial(extract_shard, children=1)), config, input_dir, out_dir)
    if not any_html(input_dir):
        # Text records only: each shard's work is its encoding repair, so the shards themselves go to the workers.
        return run_stage(StageDef(STAGE, VERSION, extract_shard), config, input_dir, out_dir, workers)
    # Pages, not shards, are spread over the cores (HTML is often concentrated in a few shards),
    # by one set of children that serves every shard of the stage.
    with extraction_pool(config, workers or default_workers()) as pool:
        return run_stage(StageDef(STAGE, VERSION, partial(extract_shard, pool=pool)), config, input_dir, out_dir, workers=1)
