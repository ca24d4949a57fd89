"""What `hymo report RUN` puts on a data run's page, gathered from the run directory with bounded reads.

Every part is bounded whatever the run's size (docs/corpus.md, "The data report page"):
* counts come from manifests, or from one Arrow column per file (source, lang), never a Python object a document;
* a rule's distribution is its stage's stats sample (tasks.runner.rule_stats): at most VALUES_PER_RULE values
  a rule, per source when there are few sources (the largest MAX_SOURCES - 1, the others pooled);
* texts are read only for the examples, the clusters' members and the searchable documents (ids chosen first);
  a stage's rule examples are chosen among its sampled documents in at most EXAMPLE_SHARDS shards (those holding
  the most sampled rows), so their text reads do not grow with the number of shards;
* the search covers every document when the run has at most SEARCH_DOCS, else at most SEARCH_DOCS documents of
  at most SEARCH_SHARDS shards (those holding the most documents the page shows): their files are the only ones
  it reads, so its reads stay flat however many shards the run has; the page says which, and prints the
  `hymo audit why` command for any other document.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import fields
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests.audit_query import _texts_before, decisions_for_many, funnel, in_shards, sample_by_rule
from manifests.corpus import CorpusManifestError, ingested_by_source, read_corpus_manifest, source_counts
from manifests.run_dir import completed_stages
from manifests.staleness import stale_stages
from tasks.filters.quality import profile_configs
from tasks.filters.quality_config import QualityConfig, rule_skipped, threshold_field
from tasks.filters.rule_evidence import triggering_spans
from tasks.runner.rule_stats import SAMPLE_PER_GROUP, STATS_SCHEMA, bottom_k, doc_rank

MAX_SOURCES = 20  # sources shown apart in a rule's distribution; the others are pooled into one group
VALUES_PER_RULE = 4000  # sampled statistics a rule carries on the page, all sources together
EXAMPLES_PER_SIDE = 3  # documents shown on each side of a threshold
POOL_PER_RULE = 24  # documents a rule's "what if" can name when its threshold moves (spread over the values)
SEARCH_DOCS = 3000  # documents the search box finds; all of them when the run has no more
SEARCH_SHARDS = 8  # shards whose files the search reads when the run has more than SEARCH_DOCS documents
EXAMPLE_SHARDS = 8  # a stage's example documents come from at most this many of its shards (their text is read)
MAX_CLUSTERS = 40  # near-duplicate clusters shown
CLUSTER_ROWS = 2000  # near-duplicate audit rows read to find them (the first audit files)
MEMBERS_PER_CLUSTER = 12
SNIPPET_CHARS = 600
SPANS_PER_EXAMPLE = 64  # highlighted spans an example carries (a rule counting every newline would carry hundreds)
SEARCH_BYTES = 6_000_000  # the search's documents stop here (JSON bytes), however long their audit trails
TEXT_SHARDS = 8  # shards whose text is measured for the tokens-in estimate
MODIFIED_PER_RULE = 2  # examples of each modifying rule (C4 lines, PII masks, ...), with their recorded edits
MODIFIED_CHARS = 1500


def is_data_run(run: Path) -> bool:
    return any(m.files("data") or m.files("audit") for _, m in completed_stages(Path(run)))


def document_stages(run: Path) -> list[tuple[Any, Any]]:
    return [(s, m) for s, m in completed_stages(run) if m.files("data") or m.files("audit")]


def gather(run: Path) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready values."""
    run = Path(run).resolve()
    stages = document_stages(run)
    stale = [entry.line() for entry in stale_stages(run)]
    rules, examples = rule_distributions(run, stages)
    clusters = near_duplicate_clusters(run, stages)
    shown = {**examples, **{m["id"]: m["shard"] for c in clusters for m in c["members"]}}
    search, search_note = searchable(run, stages, shown, rules)
    return {
        "run": str(run),
        "funnel": funnel(run),
        "stale": stale,
        "by_source": per_source(run, stages, corpus_current=not stale),
        "by_lang": per_language(run, stages),
        "rules": rules,
        "clusters": clusters,
        "modified": modification_examples(run, stages),
        "search": search,
        "search_note": search_note,
        "bounds": {"values_per_rule": VALUES_PER_RULE, "sample_per_group": SAMPLE_PER_GROUP, "max_sources": MAX_SOURCES,
                   "search_docs": SEARCH_DOCS, "search_shards": SEARCH_SHARDS, "max_clusters": MAX_CLUSTERS},
    }


# ------------------------------------------------------------------ per source, per language
def per_source(run: Path, stages: list, corpus_current: bool = False) -> list[dict[str, Any]]:
    """Documents in (ingested) and out (the last document stage), tokens out (the mixture's unique tokens), tokens in
    estimated from the characters of TEXT_SHARDS ingest shards and the tokenizer's characters per token of each source.

    The document counts come from corpus.json when the run has one and no stage is stale (`corpus_current`): the
    shards stage counted them with runner tasks, so the page reads no document file for them; else from one Arrow
    column of every ingest and last-stage file."""
    if not stages:
        return []
    counted = corpus_document_counts(run) if corpus_current else None
    if counted is not None:
        docs_in, docs_out = counted
    else:
        docs_in = ingested_by_source(run)
        docs_out = defaultdict(int)
        _, last = stages[-1]
        for f in last.files("data"):
            for row in source_counts(str(last.path_of(f))):
                docs_out[row["values"]] += row["counts"]
    extras = {s.stage: m.extra or {} for s, m in completed_stages(run)}
    tokens_out = {row["name"]: row.get("unique_tokens") for row in extras.get("mixture", {}).get("mixture", {}).get("sources", [])}
    per_token = {name: row.get("chars_per_token") for name, row in extras.get("tokenizer", {}).get("sample_by_source", {}).items()}
    chars_in = chars_by_source(stages[0][1])
    rows = []
    for source in sorted(set(docs_in) | set(docs_out)):
        chars = chars_in.get(source)
        estimate = round(chars / per_token[source]) if chars is not None and per_token.get(source) else None
        rows.append({"source": source, "docs_in": docs_in.get(source, 0), "docs_out": docs_out.get(source, 0),
                     "tokens_in": estimate, "tokens_out": tokens_out.get(source)})
    return rows


def corpus_document_counts(run: Path) -> tuple[dict[str, int], dict[str, int]] | None:
    """(documents ingested, documents out: train + validation) per source from the run's corpus.json, or None."""
    try:
        sources = read_corpus_manifest(run)["sources"]
        return ({row["source"]: row["documents_ingested"] or 0 for row in sources},
                {row["source"]: row["train_documents"] + row["validation_documents"] for row in sources})
    except (CorpusManifestError, KeyError, TypeError):  # no shards stage yet, or a corpus.json without these counts
        return None


def chars_by_source(manifest: Any) -> dict[str, float]:
    """Characters per source at a stage, measured on its first TEXT_SHARDS data files and scaled by their share of rows."""
    files = manifest.files("data")
    measured, total_rows, read_rows = defaultdict(float), sum(f.rows or 0 for f in files), 0
    for f in files[:TEXT_SHARDS]:
        table = pq.read_table(manifest.path_of(f), columns=["source", "text"])
        read_rows += table.num_rows
        grouped = pa.table({"source": table.column("source"), "chars": pc.utf8_length(table.column("text"))})
        for row in grouped.group_by("source").aggregate([("chars", "sum")]).to_pylist():
            measured[row["source"]] += row["chars_sum"]
    scale = total_rows / read_rows if read_rows else 0.0
    return {source: chars * scale for source, chars in measured.items()}


def per_language(run: Path, stages: list) -> list[dict[str, Any]]:
    """Documents per language entering the first stage after language ID, and leaving the last document stage."""
    after_langid = [i for i, (s, _) in enumerate(stages) if s.stage == "langid"]
    if not after_langid:
        return []
    counts_in = lang_counts(stages[after_langid[0]][1])
    counts_out = lang_counts(stages[-1][1])
    extras = {s.stage: m.extra or {} for s, m in completed_stages(run)}
    tokens_out = {row["name"]: row.get("unique_tokens") for row in extras.get("mixture", {}).get("mixture", {}).get("languages", [])}
    return [{"lang": lang, "docs_in": counts_in.get(lang, 0), "docs_out": counts_out.get(lang, 0), "tokens_out": tokens_out.get(lang)}
            for lang in sorted(set(counts_in) | set(counts_out), key=lambda x: -counts_in.get(x, 0))]


def lang_counts(manifest: Any) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for f in manifest.files("data"):
        for row in pc.value_counts(pq.read_table(manifest.path_of(f), columns=["lang"]).column("lang")).to_pylist():
            counts[row["values"] or "none"] += row["counts"]
    return dict(counts)


# ------------------------------------------------------------------ rules
def merged_stats(manifest: Any) -> tuple[pa.Table, dict[tuple[str, str], int]]:
    """A stage's stats files merged: the bottom-SAMPLE_PER_GROUP sample per (rule, source) of the whole stage, each row
    with the shard it was measured in (`shard`, the file's name), and the exact number of documents that reached each
    (rule, source). One file in memory at a time."""
    reached: dict[tuple[str, str], int] = defaultdict(int)
    sample = None
    columns = [f.name for f in STATS_SCHEMA if f.name != "reached"]
    for f in manifest.files("stats"):
        table = pq.read_table(manifest.path_of(f))
        firsts = table.group_by(["rule", "source"]).aggregate([("reached", "max")])
        for row in firsts.to_pylist():
            reached[(row["rule"], row["source"])] += row["reached_max"]
        part = table.select(columns).append_column("shard", pa.array([Path(f.path).stem] * table.num_rows, pa.string()))
        sample = bottom_k(part if sample is None else pa.concat_tables([sample, part]), SAMPLE_PER_GROUP)
    empty = pa.schema([*(f for f in STATS_SCHEMA if f.name != "reached"), pa.field("shard", pa.string())]).empty_table()
    return (sample if sample is not None else empty), dict(reached)


def quality_config_of(manifest: Any) -> QualityConfig:
    known = {f.name for f in fields(QualityConfig)}
    values = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
              for k, v in (manifest.config or {}).items() if k in known}
    return QualityConfig(**values)


def threshold_paths(rule: str, config: QualityConfig, stage: str) -> dict[str, dict[str, Any]]:
    """profile -> the config path that sets this rule's threshold for it (`quality.min_words`, or
    `quality.profiles.web.min_words` when the profile overrides it), its current value and report-only flag."""
    found = threshold_field(rule)
    resolved = profile_configs(config)
    paths = {}
    for profile in sorted(set(resolved) | {config.default_profile}):
        effective = resolved.get(profile, config)
        report_only = rule_skipped(rule, effective.report_rules)
        if found is None:
            paths[profile] = {"key": None, "report_only": report_only}
            continue
        name, n = found
        overridden = name in config.profiles.get(profile, {})
        field_value = getattr(effective, name)
        current = dict(field_value).get(n) if n is not None else field_value
        paths[profile] = {"key": f"{stage}.profiles.{profile}.{name}" if overridden else f"{stage}.{name}", "n": n,
                          "field": [list(x) for x in field_value] if n is not None else field_value, "current": current,
                          "integer": n is None and isinstance(field_value, int) and not isinstance(field_value, bool),
                          "report_only": report_only}
    return paths


# Stages other than quality whose rule compares a statistic with one config field: rule -> field.
STAGE_THRESHOLD_FIELDS = {"langid": {"langid_low_score": "min_score"}}


def field_paths(rule: str, config: dict[str, Any], stage: str) -> dict[str, dict[str, Any]]:
    """threshold_paths for a stage without profiles: one path, its field in the stage's config."""
    name = STAGE_THRESHOLD_FIELDS.get(stage, {}).get(rule)
    if name is None or name not in config:
        return {"": {"key": None, "report_only": False}}
    value = config[name]
    return {"": {"key": f"{stage}.{name}", "n": None, "field": value, "current": value, "report_only": False,
                 "integer": isinstance(value, int) and not isinstance(value, bool)}}


def rule_distributions(run: Path, stages: list) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Per rule of each stage that records statistics: its groups of sampled values (weights that scale them to the
    documents that reached it), its threshold controls, its removal count, and examples. Also the examples' shards
    (id -> shard)."""
    rules, example_shards = [], {}
    for stage_dir, manifest in stages:
        if not manifest.files("stats"):
            continue
        sample, reached = merged_stats(manifest)
        quality = stage_dir.stage == "quality"
        config = quality_config_of(manifest) if quality else QualityConfig()  # QualityConfig: the spans' word lists
        by_rule: dict[str, list[dict[str, Any]]] = defaultdict(list)
        rows = sample.to_pylist()
        for row in rows:
            by_rule[row["rule"]].append(row)
        readable = example_shards_of(rows)
        stage_rules = []
        for rule_name in sorted(by_rule, key=lambda r: (-manifest.counts.get("removed", {}).get(r, 0), r)):
            rows = by_rule[rule_name]
            paths = threshold_paths(rule_name, config, stage_dir.stage) if quality else field_paths(rule_name, manifest.config or {}, stage_dir.stage)
            entry = rule_entry(stage_dir.stage, rule_name, rows, reached, paths, config.default_profile if quality else "",
                               manifest.counts.get("removed", {}).get(rule_name, 0), readable)
            stage_rules.append(entry)
        shard_of = {e["id"]: e.pop("shard") for entry in stage_rules for e in entry["examples"]}
        texts = _texts_before(run, stage_dir.position, shard_of, hinted_only=True) if shard_of else {}  # as they entered the stage
        for entry in stage_rules:
            for example in entry["examples"]:
                example["text"], example["spans"] = snippet_with_spans(texts.get(example["id"], ""), entry["rule"], config)
        rules += stage_rules
        example_shards.update(shard_of)
    return rules, example_shards


def example_shards_of(rows: list[dict[str, Any]]) -> set[str] | None:
    """The EXAMPLE_SHARDS shards holding the most of a stage's sampled rows (ties by name), or None (every shard) when
    the sample spans no more: a uniform sample spreads over every shard, and each shard an example sits in is a read."""
    per_shard: dict[str, int] = defaultdict(int)
    for row in rows:
        per_shard[row.get("shard")] += 1
    if len(per_shard) <= EXAMPLE_SHARDS:
        return None
    return set(sorted(per_shard, key=lambda shard: (-per_shard[shard], str(shard)))[:EXAMPLE_SHARDS])


def rule_entry(stage: str, rule: str, rows: list[dict[str, Any]], reached: dict[tuple[str, str], int],
               paths: dict[str, dict[str, Any]], default_profile: str, removed: int,
               readable: set[str] | None = None) -> dict[str, Any]:
    keys = sorted({p["key"] for p in paths.values() if p["key"] is not None})
    sources = sorted({r["source"] for r in rows}, key=lambda s: (-reached.get((rule, s), 0), s))
    shown, pooled = sources[:MAX_SOURCES - 1], sources[MAX_SOURCES - 1:]
    if len(pooled) == 1:
        shown, pooled = shown + pooled, []
    per_group = max(50, min(SAMPLE_PER_GROUP, VALUES_PER_RULE // max(1, len(shown) + bool(pooled))))
    groups = [(s, [r for r in rows if r["source"] == s], reached.get((rule, s), 0)) for s in shown]
    if pooled:
        groups.append((f"{len(pooled)} other sources", [r for r in rows if r["source"] in pooled], sum(reached.get((rule, s), 0) for s in pooled)))
    entries, sampled = [], []
    for label, members, count in groups:
        members = sorted(members, key=lambda r: (r["rank"], r["id"]))[:per_group]  # bottom-k of a bottom-k sample
        sampled += members
        weight = count / len(members) if members else 0.0
        split: dict[tuple[int, bool], list[float]] = defaultdict(list)
        for r in members:
            path = paths.get(r["profile"]) or paths[default_profile]
            split[(keys.index(path["key"]) if path["key"] in keys else -1, path["report_only"])].append(round(r["value"], 6))
        entries += [{"source": label, "path": path_index, "report_only": report_only, "weight": weight, "values": sorted(values)}
                    for (path_index, report_only), values in sorted(split.items())]
    controls = []
    for key in keys:
        path = next(p for p in paths.values() if p["key"] == key)
        controls.append({"key": key, "current": path["current"], "integer": path["integer"], "n": path["n"], "field": path["field"],
                         "profiles": sorted(p for p, v in paths.items() if v["key"] == key)})
    fires = next((r["fires_when"] for r in rows if r["fires_when"]), "")
    if not fires:  # every sampled value sat on the threshold: the field's name says the side (a yes/no rule fires at 1 > 0)
        fires = "<" if keys and keys[0].rsplit(".", 1)[-1].startswith(("min_", "c4_min_", "cjk_min_")) else ">"
    main = controls[0]["current"] if controls else (rows[0]["threshold"] if rows else None)
    return {"stage": stage, "rule": rule, "reached": sum(reached.get((rule, s), 0) for s in sources), "removed": removed,
            "fires_when": fires, "threshold": main, "controls": controls, "entries": entries,
            "sampled": len(sampled) < sum(reached.get((rule, s), 0) for s in sources),
            "examples": pick_examples(sampled if readable is None else [r for r in sampled if r.get("shard") in readable], main),
            "report_only_profiles": sorted(p for p, v in paths.items() if v["report_only"])}


def pick_examples(rows: list[dict[str, Any]], threshold: float | None) -> list[dict[str, Any]]:
    """The documents nearest the threshold on each side, and a spread over the values (for the what-if)."""
    if not rows:
        return []
    ordered = sorted(rows, key=lambda r: (r["value"], r["rank"]))
    chosen: dict[str, dict[str, Any]] = {}
    if threshold is not None:
        fired = [r for r in ordered if r["fired"]]
        passed = [r for r in ordered if not r["fired"]]
        near = lambda r: (abs(r["value"] - threshold), r["rank"])  # noqa: E731
        for r in sorted(fired, key=near)[:EXAMPLES_PER_SIDE] + sorted(passed, key=near)[:EXAMPLES_PER_SIDE]:
            chosen[r["id"]] = r
    step = max(1, len(ordered) // POOL_PER_RULE)
    for r in ordered[::step][:POOL_PER_RULE]:
        chosen.setdefault(r["id"], r)
    return [{"id": r["id"], "source": r["source"], "value": r["value"], "fired": r["fired"], "profile": r["profile"], "shard": r.get("shard")}
            for r in sorted(chosen.values(), key=lambda r: (r["value"], r["rank"]))]


def snippet_with_spans(text: str, rule: str, config: QualityConfig) -> tuple[str, list[list[Any]]]:
    """The opening SNIPPET_CHARS of the text and the spans in it that made the rule's statistic."""
    snippet = text[:SNIPPET_CHARS]
    spans = [[start, min(end, len(snippet)), label] for start, end, label in triggering_spans(rule, text, config) if start < len(snippet)]
    return snippet, spans[:SPANS_PER_EXAMPLE]


# ------------------------------------------------------------------ modifications
def modification_examples(run: Path, stages: list) -> list[dict[str, Any]]:
    """A few documents of each modifying rule, as they entered the stage, with the audit row's `edits` (the lines it
    removed, the spans it masked) to highlight; rows written before edits were recorded show their detail only."""
    shown = []
    for stage_dir, manifest in stages:
        rules = sorted(manifest.counts.get("modified", {}))
        if not rules:
            continue
        rows = sample_by_rule(run, stage_dir.stage, rules, MODIFIED_PER_RULE, with_text=False)
        texts = _texts_before(run, stage_dir.position, {row["id"]: row["shard"] for row in rows}, hinted_only=True)
        for row in rows:
            text, edits = texts.get(row["id"], ""), row["detail"].get("edits") or []
            start = max(0, min((e[0] for e in edits), default=0) - 200)
            window = text[start:start + MODIFIED_CHARS]
            spans = [[max(0, a - start), min(b - start, len(window)), label] for a, b, label in edits if b > start and a < start + len(window)]
            detail = {k: v for k, v in row["detail"].items() if k != "edits"}
            shown.append({"stage": stage_dir.stage, "rule": row["rule"], "id": row["id"], "count": manifest.counts["modified"][row["rule"]],
                          "offset": start, "text": window, "spans": spans, "recorded_edits": "edits" in row["detail"],
                          "detail": json.dumps(detail, ensure_ascii=False)[:400]})
    return shown


# ------------------------------------------------------------------ near duplicates
def near_duplicate_clusters(run: Path, stages: list) -> list[dict[str, Any]]:
    """Clusters of the fuzzy dedup stage: keeper and removed members with their Jaccard, the largest first,
    from the first CLUSTER_ROWS removals of its audit log; sizes from clusters.parquet when the stage wrote one."""
    found = [(s, m) for s, m in stages if s.stage == "dedup_fuzzy"]
    if not found:
        return []
    stage_dir, manifest = found[0]
    members: dict[str, list[dict[str, Any]]] = defaultdict(list)
    read = 0
    for f in manifest.files("audit"):
        if read >= CLUSTER_ROWS:
            break
        table = pq.read_table(manifest.path_of(f), columns=["id", "action", "detail"])
        for row in table.slice(0, CLUSTER_ROWS - read).to_pylist():
            if row["action"] != "removed":
                continue
            detail = json.loads(row["detail"])
            if "kept_id" in detail:
                members[detail["kept_id"]].append({"id": row["id"], "jaccard": detail.get("jaccard"), "matched_id": detail.get("matched_id"),
                                                   "shard": Path(f.path).stem})
        read += table.num_rows
    chosen = sorted(members, key=lambda k: (-len(members[k]), k))[:MAX_CLUSTERS]
    sizes: dict[str, int] = {}
    clusters_file = stage_dir.path / "clusters.parquet"
    if chosen and clusters_file.exists():
        table = pq.read_table(clusters_file, columns=["kept_id"], filters=[("kept_id", "in", chosen)])
        sizes = {row["values"]: row["counts"] for row in pc.value_counts(table.column("kept_id")).to_pylist()}
    # The keeper's shard is not recorded: it is looked for in its members' shards only (a bounded read; else no text).
    hints = {doc_id: m["shard"] for k in chosen for m in members[k][:MEMBERS_PER_CLUSTER] for doc_id in (m["id"], k)}
    texts = _texts_before(run, stage_dir.position, hints, hinted_only=True)
    return [{"keeper": {"id": k, "text": texts.get(k, "")[:300]},
             "members": [{**m, "text": texts.get(m["id"], "")[:300]} for m in sorted(members[k], key=lambda m: (-(m["jaccard"] or 0), m["id"]))[:MEMBERS_PER_CLUSTER]],
             "size": sizes.get(k, len(members[k]) + 1)} for k in chosen]


# ------------------------------------------------------------------ search
def searchable(run: Path, stages: list, shown: dict[str, str], rules: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """The documents the search box finds, each with its keys (id, URL, record id) and `audit why`'s answer.

    `shown`: id -> shard of the documents the page shows. A run of more than SEARCH_DOCS documents is searched in
    SEARCH_SHARDS of its shards only (every stage keeps a document in the shard of the same name), so the files
    read here, and the rows, do not grow with the number of shards."""
    if not stages:
        return [], ""
    _, first = stages[0]
    total = first.counts.get("in", 0)
    if total <= SEARCH_DOCS:
        shards = None
        ids = first_stage_ids(first, None)
        note = f"every document of the run ({total:,}) can be found here"
    else:
        names = sorted({Path(f.path).stem for f in first.files("data") + first.files("audit")})
        per_shard: dict[str, int] = defaultdict(int)
        for shard in shown.values():
            per_shard[shard] += 1
        shards = set(sorted(names, key=lambda name: (-per_shard.get(name, 0), name))[:SEARCH_SHARDS])
        on_page = sorted(doc_id for doc_id, shard in shown.items() if shard in shards)
        others = sorted(set(first_stage_ids(first, shards)) - set(on_page), key=doc_rank)  # a uniform sample: the smallest id hashes
        ids = (on_page + others)[:SEARCH_DOCS]
        note = (f"the run has {total:,} documents in {len(names):,} shards; this page's search reads {len(shards)} of them (those holding "
                f"the most documents the page shows) and finds {len(ids):,} documents there: the examples and cluster members in them and "
                f"a uniform sample. For any other document it prints the command that answers: `hymo audit why {run} KEY`")
    ids = list(dict.fromkeys(ids))
    keys = document_keys(first, ids, shards)
    trails = decisions_for_many(run, ids, shards)
    entries, size = [], 0
    for doc_id in (i for i in ids if i in trails):
        entry = {**keys.get(doc_id, {"id": doc_id}), "why": trails[doc_id]}
        size += len(json.dumps(entry, ensure_ascii=False))
        if size > SEARCH_BYTES:
            note += f"; the page's search stops at {SEARCH_BYTES / 1e6:g} MB of audit trails ({len(entries):,} documents)"
            break
        entries.append(entry)
    return entries, note


def first_stage_ids(first: Any, shards: set[str] | None) -> list[str]:
    """The ids that entered the first document stage: its documents and those it removed (of `shards`, or all)."""
    ids = []
    for f in in_shards(first.files("data"), shards):
        ids += pq.read_table(first.path_of(f), columns=["id"]).column("id").to_pylist()
    for f in in_shards(first.files("audit"), shards):
        table = pq.read_table(first.path_of(f), columns=["id", "action"])
        ids += table.filter(pc.equal(table.column("action"), "removed")).column("id").to_pylist()
    return ids


def document_keys(first: Any, ids: list[str], shards: set[str] | None = None) -> dict[str, dict[str, Any]]:
    """id -> {id, url, record_id, file, ordinal} from the first stage's documents, or its audit row for one it removed
    (read in the files of `shards`, or in all)."""
    wanted = pa.array(ids, pa.string())
    found: dict[str, dict[str, Any]] = {}
    for f in in_shards(first.files("data"), shards):
        table = pq.read_table(first.path_of(f), columns=["id", "url", "meta"])
        for row in table.filter(pc.is_in(table.column("id"), value_set=wanted)).to_pylist():
            meta = json.loads(row["meta"])
            found[row["id"]] = {"id": row["id"], "url": row["url"], "record_id": meta.get("record_id"), "file": meta.get("origin_file"),
                                "ordinal": meta.get("ordinal")}
    for f in in_shards(first.files("audit"), shards):
        table = pq.read_table(first.path_of(f), columns=["id", "detail"])
        for row in table.filter(pc.is_in(table.column("id"), value_set=wanted)).to_pylist():
            if row["id"] not in found:
                detail = json.loads(row["detail"])
                found[row["id"]] = {"id": row["id"], "url": detail.get("uri"), "record_id": detail.get("record_id"), "file": detail.get("file"),
                                    "ordinal": detail.get("ordinal")}
    return found

