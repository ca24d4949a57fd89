"""The global passes on a Dask cluster: same bytes as the local process pool, and a worker killed mid-stage changes nothing."""
from __future__ import annotations

import json

import pytest
from dask_faults import link_key_partition_killing_its_worker_once, signature_shard_killing_its_worker_once

import tasks.dedup.fuzzy as dedup_fuzzy
import tasks.runner.stage_runner as stage_runner
from bench.templated_site import templated_site
from manifests.stage_manifest import read_manifest
from manifests.benchmark_sets import benchmark_path, read_benchmark
from tasks.dedup.decontam import DecontamConfig, run_decontam
from tasks.dedup.exact import DedupExactConfig, run_dedup_exact
from tasks.dedup.fuzzy import DedupFuzzyConfig, run_dedup_fuzzy
from tasks.runner.stage_runner import cluster_workers, default_workers, on_dask_cluster


DECONTAM_CONFIG = DecontamConfig(benchmarks=("humaneval", "gsm8k"))


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster, set_as_default=False) as client:  # not the default client, as prefect-dask makes it
            yield client


@pytest.fixture(scope="module")
def corpus():
    site = templated_site(pages=280, copies=12, variants=12, seed=9)  # a bucket of ≥ 64 pages: bulk exact path
    texts = dict(zip(site.ids, site.texts))
    texts |= {f"zz-exact-{i}": texts[site.ids[i]] for i in range(5)}  # exact copies for dedup_exact
    prompt = dict(read_benchmark(benchmark_path("humaneval")))["HumanEval/0"]
    texts |= {"zz-leak-0": "A blog post.\n" + prompt, "zz-leak-1": "Homework: " + prompt.upper()}  # for decontam
    return texts


def outputs(stage_dir) -> dict[str, str]:
    return {o.path: o.sha256 for o in read_manifest(stage_dir).outputs}


def test_dedup_stages_give_the_same_bytes_on_any_runner_and_partition_count(tmp_path, upstream, corpus, client, monkeypatch):
    """Process pool (2 workers, 4 key/rank partitions), one worker in-process (1 partition), Dask with 3 workers (6, then 9)."""
    source = upstream(corpus, shards=5)
    run_decontam(DECONTAM_CONFIG, source, tmp_path / "decontam-local", workers=2)
    run_dedup_exact(DedupExactConfig(), source, tmp_path / "exact-local", workers=2)
    local = run_dedup_fuzzy(DedupFuzzyConfig(), tmp_path / "exact-local", tmp_path / "fuzzy-local", workers=2)
    monkeypatch.setattr(stage_runner, "PARTITIONS_PER_WORKER", 1)
    run_decontam(DECONTAM_CONFIG, source, tmp_path / "decontam-one", workers=1)
    run_dedup_exact(DedupExactConfig(), source, tmp_path / "exact-one", workers=1)
    one = run_dedup_fuzzy(DedupFuzzyConfig(), tmp_path / "exact-one", tmp_path / "fuzzy-one", workers=1)
    with on_dask_cluster(client):
        assert default_workers() == cluster_workers(client) == 3
        decontam = run_decontam(DECONTAM_CONFIG, source, tmp_path / "decontam-dask", workers=1)
        run_dedup_exact(DedupExactConfig(), source, tmp_path / "exact-dask", workers=1)
        for per_worker in (2, 3):
            monkeypatch.setattr(stage_runner, "PARTITIONS_PER_WORKER", per_worker)
            dask = run_dedup_fuzzy(DedupFuzzyConfig(), tmp_path / "exact-dask", tmp_path / f"fuzzy-dask-{per_worker}", workers=1)
            assert dask.extra["context"]["partitions"] == 3 * per_worker
    assert [local.extra["context"]["partitions"], one.extra["context"]["partitions"]] == [4, 1]
    assert outputs(tmp_path / "decontam-dask") == outputs(tmp_path / "decontam-local") == outputs(tmp_path / "decontam-one")
    assert decontam.counts["removed"] == {"contaminated": 2}
    assert outputs(tmp_path / "exact-dask") == outputs(tmp_path / "exact-local") == outputs(tmp_path / "exact-one")
    fuzzy = outputs(tmp_path / "fuzzy-local")
    assert outputs(tmp_path / "fuzzy-one") == outputs(tmp_path / "fuzzy-dask-2") == outputs(tmp_path / "fuzzy-dask-3") == fuzzy
    stats = dask.extra["context"]
    assert local.counts["removed"] and stats["largest_bucket"] >= 64 and stats["bulk_exact_pairs"] and stats["verified_pairs"]


def test_a_worker_killed_during_dedup_fuzzy_changes_nothing(tmp_path, upstream, corpus, client, monkeypatch):
    """One worker dies in a signature task, another in a bucket-partition task: Dask reruns both, the bytes are the same."""
    source = upstream(corpus, shards=5)
    run_dedup_fuzzy(DedupFuzzyConfig(), source, tmp_path / "fuzzy-local", workers=1)
    monkeypatch.setattr(dedup_fuzzy, "signature_shard", signature_shard_killing_its_worker_once)
    monkeypatch.setattr(dedup_fuzzy, "link_key_partition", link_key_partition_killing_its_worker_once)
    with on_dask_cluster(client):
        run_dedup_fuzzy(DedupFuzzyConfig(), source, tmp_path / "fuzzy-dask", workers=3)
    killed = sorted(p.name for p in tmp_path.glob("**/killed-a-worker-*"))  # the faults did happen, on Dask workers
    assert killed == ["killed-a-worker-in-buckets", "killed-a-worker-in-signatures"]
    assert outputs(tmp_path / "fuzzy-dask") == outputs(tmp_path / "fuzzy-local")


def test_ingest_gives_the_same_bytes_on_any_runner(tmp_path, client, monkeypatch):
    """Source files (the JSONL one as 4 byte ranges) mapped as tasks, shards cut where one sequential pass cuts them:
    process pool, 1 worker, Dask."""
    from conftest import SAMPLE, write_spec

    import tasks.ingest.ingest as ingest_module
    from manifests.sources import load_spec_file
    from tasks.ingest.ingest import IngestConfig, run_ingest

    monkeypatch.setattr(ingest_module, "JSONL_SPLIT_BYTES", 300_000)  # enwiki.jsonl is 1.1 MB

    specs = [load_spec_file(write_spec(tmp_path, "crawl", "warc", str(SAMPLE / "warc" / "sample.warc.gz"))),
             load_spec_file(write_spec(tmp_path, "prose", "jsonl", str(SAMPLE / "prose-enwiki")))]
    config = IngestConfig(docs_per_shard=70, bytes_per_shard=200_000)
    local = run_ingest(specs, config, tmp_path / "ingest-local", workers=2)
    run_ingest(specs, config, tmp_path / "ingest-one", workers=1)
    with on_dask_cluster(client):
        run_ingest(specs, config, tmp_path / "ingest-dask")
    assert outputs(tmp_path / "ingest-dask") == outputs(tmp_path / "ingest-local") == outputs(tmp_path / "ingest-one")
    assert len(local.files("data")) > 3 and local.counts["kept"] > 200


def test_extraction_on_dask_keeps_page_deadlines_and_gives_the_local_bytes(tmp_path, html_dir, client):
    from conftest import write_spec

    from manifests.sources import load_spec_file
    from tasks.ingest.extract import ExtractConfig, run_extract
    from tasks.ingest.ingest import IngestConfig, run_ingest
    from tasks.runner.stage_runner import read_stage_audit

    (html_dir / "slow.html").write_text("<html><body>" + "<p>many words in a paragraph here</p>" * 300_000 + "</body></html>")
    spec = write_spec(tmp_path, "pages", "html_dir", str(html_dir), glob="*.html", url_prefix="https://example.org/")
    run_ingest([load_spec_file(spec)], IngestConfig(docs_per_shard=4), tmp_path / "ingest")
    config = ExtractConfig(timeout_s=4.0, max_html_bytes=50 << 20)
    run_extract(config, tmp_path / "ingest", tmp_path / "extract-local", workers=2)
    with on_dask_cluster(client):
        run_extract(config, tmp_path / "ingest", tmp_path / "extract-dask")
    assert outputs(tmp_path / "extract-dask") == outputs(tmp_path / "extract-local")
    audit = read_stage_audit(tmp_path / "extract-dask").to_pylist()
    rules = {json.loads(row["detail"])["url"]: row["rule"] for row in audit if row["rule"] != "html_main_text"}
    assert rules == {"https://example.org/slow.html": "extract_timeout"}


def test_every_worker_checks_the_run_directory_and_the_files_tasks_open(tmp_path, client):
    from tasks.runner.shared_paths import PROBE_PREFIX, SharedPathError, check_shared_paths

    model = tmp_path / "lid.bin"
    model.write_bytes(b"model")
    check_shared_paths(client, tmp_path, [("langid.model_path", str(model))])  # all seen: passes, and leaves no probe behind
    assert not list(tmp_path.glob(f"{PROBE_PREFIX}*"))
    with pytest.raises(SharedPathError, match=r"^Dask worker tcp://\S+ cannot see the langid.model_path .*/gone.bin: put it on a mount") as error:
        check_shared_paths(client, tmp_path, [("langid.model_path", str(model)), ("langid.model_path", str(tmp_path / "gone.bin"))])
    assert "\n" not in str(error.value)
