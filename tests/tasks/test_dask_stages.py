"""The global passes on a Dask cluster: same bytes as the local process pool, and a worker killed mid-stage changes nothing."""
from __future__ import annotations

import pytest
from dask_faults import signature_shard_killing_its_worker_once

import tasks.dedup_fuzzy as dedup_fuzzy
from bench.templated_site import templated_site
from manifests.stage_manifest import read_manifest
from tasks.dedup_exact import DedupExactConfig, run_dedup_exact
from tasks.dedup_fuzzy import DedupFuzzyConfig, run_dedup_fuzzy
from tasks.stage_runner import cluster_workers, default_workers, on_dask_cluster


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, Client(cluster) as client:
        yield client


@pytest.fixture(scope="module")
def corpus():
    site = templated_site(pages=150, copies=12, variants=12, seed=9)
    texts = dict(zip(site.ids, site.texts))
    texts |= {f"zz-exact-{i}": texts[site.ids[i]] for i in range(5)}  # exact copies for dedup_exact
    return texts


def outputs(stage_dir) -> dict[str, str]:
    return {o.path: o.sha256 for o in read_manifest(stage_dir).outputs}


def test_dedup_stages_on_dask_give_the_process_pools_bytes(tmp_path, upstream, corpus, client):
    source = upstream(corpus, shards=5)
    run_dedup_exact(DedupExactConfig(), source, tmp_path / "exact-local", workers=2)
    run_dedup_fuzzy(DedupFuzzyConfig(), tmp_path / "exact-local", tmp_path / "fuzzy-local", workers=2)
    with on_dask_cluster(client):
        assert default_workers() == cluster_workers(client) == 3
        run_dedup_exact(DedupExactConfig(), source, tmp_path / "exact-dask", workers=1)
        fuzzy = run_dedup_fuzzy(DedupFuzzyConfig(), tmp_path / "exact-dask", tmp_path / "fuzzy-dask", workers=1)
    assert outputs(tmp_path / "exact-dask") == outputs(tmp_path / "exact-local")
    assert outputs(tmp_path / "fuzzy-dask") == outputs(tmp_path / "fuzzy-local") and fuzzy.counts["removed"]


def test_a_worker_killed_during_dedup_fuzzy_changes_nothing(tmp_path, upstream, corpus, client, monkeypatch):
    source = upstream(corpus, shards=5)
    run_dedup_fuzzy(DedupFuzzyConfig(), source, tmp_path / "fuzzy-local", workers=1)
    monkeypatch.setattr(dedup_fuzzy, "signature_shard", signature_shard_killing_its_worker_once)
    with on_dask_cluster(client):
        run_dedup_fuzzy(DedupFuzzyConfig(), source, tmp_path / "fuzzy-dask", workers=3)
    assert any(tmp_path.glob("**/killed-a-worker"))  # the fault did happen, on a Dask worker
    assert outputs(tmp_path / "fuzzy-dask") == outputs(tmp_path / "fuzzy-local")
