import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.corpus.split import (SPLIT_DOCS_SCHEMA, SplitConfig, choose_validation, families_of, is_validation, iter_split_docs,
                                validation_mask)
from tasks.runner.stage_runner import read_stage_audit, read_stage_docs


def docs_of(n, source="s"):
    return [{"id": f"{source}-{i:03d}", "source": source, "n_bytes": 400} for i in range(n)]


def choose(docs, links, config):
    family, _ = families_of([d["id"] for d in docs], links)
    return choose_validation(pa.Table.from_pylist(docs, schema=SPLIT_DOCS_SCHEMA), family, config)


def test_families_union_exact_and_fuzzy_relations_through_a_removed_member():
    survivors = ["a", "b", "c", "d"]
    # x was removed as an exact copy of a, and fuzzy-clustered with b: a and b are one family of 3
    family, sizes = families_of(survivors, [("x", "a"), ("x", "b")])
    assert family[0] == family[1] == "a" != family[2]
    assert sizes == [3, 3, 1, 1]


def test_family_never_crosses_sides():
    docs = docs_of(40)
    links = [(f"s-{i:03d}", f"s-{i + 1:03d}") for i in range(0, 40, 4)]  # families of two
    for seed in range(5):
        chosen = choose(docs, links, SplitConfig(validation_fraction=0.3, seed=seed))
        assert chosen
        for member, kept in links:
            assert (member in chosen) == (kept in chosen)


def test_split_is_seeded_and_respects_fraction():
    docs = docs_of(100)
    first = choose(docs, [], SplitConfig(validation_fraction=0.1, seed=1))
    assert first == choose(list(reversed(docs)), [], SplitConfig(validation_fraction=0.1, seed=1))
    assert len(first) == 10
    assert first != choose(docs, [], SplitConfig(validation_fraction=0.1, seed=2))


def test_token_budget_per_source():
    docs = docs_of(50, "a") + docs_of(50, "b")
    chosen = choose(docs, [], SplitConfig(validation_tokens_per_source=1000, bytes_per_token_estimate=4.0))
    # 100 estimated tokens per document: 10 documents reach 1,000 tokens in each source
    assert sum(i.startswith("a-") for i in chosen) == 10
    assert sum(i.startswith("b-") for i in chosen) == 10


def test_single_family_source_stays_in_training():
    docs = docs_of(3)
    assert choose(docs, [("s-000", "s-001"), ("s-001", "s-002")], SplitConfig(validation_fraction=0.5)) == set()


def test_stage_routes_validation_documents_and_keeps_all(tiny_run):
    before = read_stage_docs(tiny_run / "03_dedup_fuzzy")
    after = read_stage_docs(tiny_run / "04_split")
    assert sorted(before.column("id").to_pylist()) == sorted(after.column("id").to_pylist())
    audit = read_stage_audit(tiny_run / "04_split").to_pylist()
    assert audit and {r["action"] for r in audit} == {"routed"} and {r["rule"] for r in audit} == {"held_out"}
    validation_ids = {t for table in iter_split_docs(tiny_run / "04_split", "validation", ["id"]) for t in table.column("id").to_pylist()}
    assert validation_ids == {r["id"] for r in audit}
    clusters = pq.read_table(tiny_run / "03_dedup_fuzzy" / "clusters.parquet").to_pylist()
    kept_ids = {c["kept_id"] for c in clusters}
    held_out_originals = [r for r in audit if r["id"] in kept_ids]
    assert held_out_originals  # seed 0 holds out at least one original whose near copy was removed
    for row in held_out_originals:
        assert json.loads(row["detail"])["family_size"] == 2  # the removed copy counts in the family


def test_shard_jobs_carry_their_own_part_of_the_choice_not_the_choice(tiny_run, tmp_path):
    """Pickled into every shard job: its size must not grow with the corpus (thousands of shards at 1M documents)."""
    import pickle

    from manifests.stage_manifest import read_manifest
    from tasks.corpus.split import plan_split

    upstream = read_manifest(tiny_run / "03_dedup_fuzzy")
    plan = plan_split(upstream, SplitConfig(validation_fraction=0.5), tmp_path)
    shards = [f.path.split("/")[-1].removesuffix(".parquet") for f in upstream.files("data")]
    parts = {shard: plan.for_shard(shard) for shard in shards}
    chosen = [pq.read_table(part.path) for part in parts.values() if part.path]
    assert chosen and plan.validation_documents == sum(t.num_rows for t in chosen) > 10
    for shard, part in parts.items():
        if part.path is None:
            continue
        ids = pq.read_table(part.path).column("id").to_pylist()
        assert ids == sorted(ids)
        on_shard = set(pq.read_table(upstream.directory / "data" / f"{shard}.parquet", columns=["id"]).column("id").to_pylist())
        assert set(ids) <= on_shard  # a shard's file holds only that shard's documents
        assert len(pickle.dumps(part)) < 400


def test_split_plans_from_columns_its_shard_tasks_return_without_reading_text_here(tiny_run, tmp_path, monkeypatch):
    """The texts are read by one runner task per shard; the flow host gets ids, sources and sizes, and the same choice."""
    import pyarrow.parquet as pq_module

    from manifests.stage_manifest import read_manifest
    from tasks.corpus import split as split_module
    from tasks.corpus.split import plan_split
    from tasks.runner.stage_runner import StageWriter

    docs = read_stage_docs(tiny_run / "03_dedup_fuzzy")
    writer = StageWriter("dedup_fuzzy", "test", {}, "in-three", [], tmp_path / "run" / "03_dedup_fuzzy")
    third = docs.num_rows // 3
    for index, start in enumerate((0, third, 2 * third)):
        writer.write_shard(index, docs.slice(start, third if index < 2 else docs.num_rows - start), [])
    upstream = writer.publish()
    config = SplitConfig(validation_fraction=0.3)
    here = plan_split(upstream, config, tmp_path / "here", workers=1)
    real_read_table = pq_module.read_table

    def no_text_here(path, *args, columns=None, **kwargs):
        assert "text" not in (columns or ["text"]), f"the flow host read texts of {path}"
        return real_read_table(path, *args, columns=columns, **kwargs)

    monkeypatch.setattr(split_module.pq, "read_table", no_text_here)  # spawned workers import their own pyarrow
    on_workers = plan_split(read_manifest(upstream.directory), config, tmp_path / "workers", workers=2)
    assert on_workers.validation_documents == here.validation_documents > 0
    assert {s: f[1] for s, f in on_workers.validation.files.items()} == {s: f[1] for s, f in here.validation.files.items()}


def test_the_validation_mask_parses_only_meta_that_can_name_a_split_and_answers_as_json_does():
    metas = ['{"profile": "web"}', '{"split": "validation"}', '{"note": "split here", "split": "validation"}',
             '{"spl\\u0069t": "validation"}', '{"title": "caf\\u00e9"}', '{"split": "train"}', '{"x": "\\"split\\""}', "{}"]
    expected = np.array([is_validation(m) for m in metas])
    assert expected.tolist() == [False, True, True, True, False, False, False, False]
    assert np.array_equal(validation_mask(pa.chunked_array([metas[:3], metas[3:]])), expected)


def test_routing_a_shard_rewrites_only_the_held_out_meta_and_copies_no_text_into_python(monkeypatch):
    """Two of 200 documents of 20 KB each routed: the shard comes back as the one-table layout (DOC_SCHEMA, same values)
    with those two metas changed, and the Python heap never holds the texts (the row-by-row rebuild held all 4 MB)."""
    import tracemalloc

    import tasks.corpus.split as split_module
    from manifests.schema import DOC_SCHEMA, docs_table
    from tasks.corpus.split import HELD_OUT_RULE, split_shard
    from tasks.corpus.split_tasks import VALIDATION_SCHEMA

    rows = [{"id": f"d{i:03d}", "text": f"{i} " + "x" * 20_000, "source": "s", "url": None if i == 7 else f"u{i}", "lang": "en" if i % 3 else None,
             "lang_score": 0.5, "meta": json.dumps({"b": i, "a": "é"})} for i in range(200)]
    docs = docs_table(rows)
    held = pa.table({"id": ["d150", "d007"], "family_id": ["d007", "d007"], "family_size": [2, 2]}, schema=VALIDATION_SCHEMA)
    monkeypatch.setattr(split_module, "shard_rows", lambda part, schema: held)
    tracemalloc.start()
    try:
        outcome = split_shard(docs, SplitConfig(seed=3), None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    for row in rows:
        if row["id"] in ("d007", "d150"):
            row["meta"] = {**json.loads(row["meta"]), "split": "validation"}
    assert outcome.kept.schema == DOC_SCHEMA and outcome.kept.equals(docs_table(rows))
    assert [(a["id"], a["rule"], a["value"], a["detail"]) for a in outcome.audit] == [
        ("d007", HELD_OUT_RULE, 2, {"family_id": "d007", "family_size": 2, "seed": 3}),
        ("d150", HELD_OUT_RULE, 2, {"family_id": "d007", "family_size": 2, "seed": 3})]
    assert peak < 1_000_000, peak
