"""plan_split at scale: its runner tasks give the in-memory reference's choice, and the flow host's traffic does not grow with N."""
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from manifests.atomic import atomic_write_parquet
from manifests.schema import DOC_SCHEMA
from tasks.corpus.split import SPLIT_DOCS_SCHEMA, SplitConfig, choose_validation, families_of, plan_split
from tasks.corpus.split_tasks import RelationError
from tasks.runner import stage_runner
from tasks.runner.host_traffic import count_host_traffic
from tasks.runner.stage_runner import StageWriter

SOURCES = ("web", "wiki", "code")


def docs_table(ids, rng):
    rows = [{"id": doc_id, "text": "x" * rng.randint(1, 60), "source": rng.choice(SOURCES), "url": "", "lang": "en", "lang_score": 1.0,
             "meta": "{}"} for doc_id in ids]
    return pa.Table.from_pylist(rows, schema=DOC_SCHEMA)


def write_stage(path, stage, shards, audits=(), artifact=None):
    writer = StageWriter(stage, "test", {}, f"{stage}-key", [], path)
    for index, table in enumerate(shards):
        writer.write_shard(index, table, audits[index] if audits else [])
    if artifact is not None:
        atomic_write_parquet(writer.work_dir / "clusters.parquet", artifact)  # as dedup_fuzzy writes it: 16,384-row groups
        writer.add_artifact("clusters.parquet", artifact.num_rows)
    return writer.publish()


def related_run(root, documents, rows_per_shard, seed=0, exact_copy_in_cluster=False):
    """A run with dedup_exact (removed copies naming their keeper) and dedup_fuzzy (clusters.parquet) before split.

    Returns (split's upstream manifest, surviving docs as id/source/n_bytes, every (member, kept) relation)."""
    rng = random.Random(seed)
    ids = [f"d{rng.randrange(10**9):09d}-{i}" for i in range(documents)]  # not in shard order
    survivors_of_exact = ids
    exact_pairs = [(f"c{i:06d}", rng.choice(ids)) for i in range(documents // 10)]  # removed copies, some ids below their keeper's
    clusters, fuzzy_removed = [], set()
    pool = ids[:]
    rng.shuffle(pool)
    for start in range(0, documents // 3, 3):
        group = sorted(pool[start:start + rng.randint(2, 3)])
        clusters += [(member, group[0]) for member in group]
        fuzzy_removed.update(group[1:])
    if exact_copy_in_cluster:
        clusters.append((exact_pairs[0][0], exact_pairs[0][0]))
    survivors = [doc_id for doc_id in survivors_of_exact if doc_id not in fuzzy_removed]
    exact_audit = [{"id": member, "action": "removed", "rule": "exact_duplicate", "value": None, "threshold": None,
                    "detail": json.dumps({"kept_id": kept})} for member, kept in exact_pairs]
    table = docs_table(survivors, rng)
    shards = [table.slice(start, rows_per_shard) for start in range(0, table.num_rows, rows_per_shard)]
    run = root / "run"
    write_stage(run / "01_dedup_exact", "dedup_exact", shards, [exact_audit[i::len(shards)] for i in range(len(shards))])
    clusters_table = pa.table({"id": [m for m, _ in clusters], "cluster_id": [k for _, k in clusters], "kept_id": [k for _, k in clusters]})
    upstream = write_stage(run / "02_dedup_fuzzy", "dedup_fuzzy", shards, artifact=clusters_table)
    sizes = pa.table([table.column("id"), table.column("source"), pa.array([len(t.encode()) for t in table.column("text").to_pylist()], pa.int64())],
                     schema=SPLIT_DOCS_SCHEMA)
    return upstream, sizes, exact_pairs + clusters


def planned_rows(plan):
    return [row for shard in sorted(plan.validation.files) for row in pq.read_table(plan.validation.files[shard][0]).to_pylist()]


@pytest.mark.parametrize("ranges", [2, 7])
def test_tasks_choose_what_the_in_memory_reference_chooses(tmp_path, monkeypatch, ranges):
    """Families across exact and fuzzy relations, several sources, fraction and token budgets, seeds, and rank ranges
    cut inside a source's choice: the same validation rows, family ids and sizes as families_of + choose_validation."""
    monkeypatch.setattr(stage_runner, "PARTITIONS_PER_WORKER", ranges)  # partition_count(1 worker, tiny data) = ranges
    upstream, sizes, relations = related_run(tmp_path, 600, 50)
    family, family_size = families_of(sizes.column("id").to_pylist(), relations)
    assert max(family_size) >= 3 and any(f != i for f, i in zip(family, sizes.column("id").to_pylist()))
    configs = [SplitConfig(validation_fraction=0.2, seed=3), SplitConfig(validation_fraction=0.05, min_validation_docs_per_source=12),
               SplitConfig(validation_tokens_per_source=900, bytes_per_token_estimate=3.0, seed=1), SplitConfig(validation_fraction=0.0), SplitConfig(validation_fraction=1.0)]
    for index, config in enumerate(configs):
        plan = plan_split(upstream, config, tmp_path / f"plan-{ranges}-{index}", workers=1)
        expected_ids = choose_validation(sizes, family, config)
        of = {doc_id: (f, s) for doc_id, f, s in zip(sizes.column("id").to_pylist(), family, family_size)}
        expected = sorted((doc_id, *of[doc_id]) for doc_id in expected_ids)
        got = sorted((row["id"], row["family_id"], row["family_size"]) for row in planned_rows(plan))
        assert got == expected, config
        assert plan.validation_documents == len(expected) and plan.documents == sizes.num_rows and plan.families == len(set(family))
        assert not (tmp_path / f"plan-{ranges}-{index}" / "_split_spill").exists()


def test_an_exact_copy_inside_a_near_duplicate_cluster_is_refused(tmp_path):
    upstream, _, _ = related_run(tmp_path, 100, 25, exact_copy_in_cluster=True)
    with pytest.raises(RelationError, match="two duplicate families"):
        plan_split(upstream, SplitConfig(), tmp_path / "plan", workers=1)


def host_bytes_per_shard(root, documents, rows_per_shard):
    upstream, _, _ = related_run(root, documents, rows_per_shard)
    with count_host_traffic() as traffic:
        plan_split(upstream, SplitConfig(validation_fraction=0.5), root / "plan", workers=1)
    return traffic.total() / len(upstream.files("data"))


def test_host_traffic_per_shard_grows_neither_with_the_corpus_nor_with_the_shard(tmp_path):
    """Bytes the flow host sends and receives per shard: the same at N and 8N documents (8x the shards), and the same when
    each shard holds 8x the documents. main's design received every document's (id, source, size): 8x at 8x the shard."""
    small = host_bytes_per_shard(tmp_path / "n", 240, 30)
    more_shards = host_bytes_per_shard(tmp_path / "8n", 1920, 30)
    bigger_shards = host_bytes_per_shard(tmp_path / "8n-wide", 1920, 240)
    assert more_shards <= 1.2 * small, (small, more_shards)
    assert bigger_shards <= 1.2 * small, (small, bigger_shards)


def test_split_on_a_dask_cluster_gives_the_local_bytes(tmp_path):
    """Every planning task pickled to Dask workers (2 processes, 4 partitions) writes what the inline run (2 partitions) writes."""
    from distributed import Client, LocalCluster

    from manifests.stage_manifest import read_manifest
    from tasks.corpus.split import run_split
    from tasks.runner.stage_runner import on_dask_cluster

    upstream, _, _ = related_run(tmp_path, 400, 40)
    config = SplitConfig(validation_fraction=0.3)
    local = run_split(config, upstream.directory, tmp_path / "split-local", workers=1)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
        with Client(cluster, set_as_default=False) as client, on_dask_cluster(client):
            dask = run_split(config, upstream.directory, tmp_path / "split-dask", workers=1)
    assert {o.path: o.sha256 for o in read_manifest(dask.directory).outputs} == {o.path: o.sha256 for o in local.outputs}
    assert any(o.path.startswith("validation/") for o in local.outputs) and local.counts["routed"]["held_out"] > 50
