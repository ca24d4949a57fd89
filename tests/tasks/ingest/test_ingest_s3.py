"""Sources on an object store: a real S3 API (moto's server on 127.0.0.1) read through fsspec, against the local run."""
from __future__ import annotations

import socket
from pathlib import Path

import pyarrow.compute as pc
import pytest
from conftest import SAMPLE, write_spec

from manifests.sources import load_spec_file
from tasks.ingest.ingest import IngestConfig, InputFileError, run_ingest
from tasks.runner.stage_runner import read_stage_audit, read_stage_docs, shutdown_worker_pools

BUCKET = "hymo-sources"
WARC = SAMPLE / "warc" / "sample.warc.gz"
JSONL = SAMPLE / "prose-enwiki" / "enwiki.jsonl"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint, monkeypatch):
    """Credentials and endpoint from the environment, as a user would set them; a bucket holding the sample's files."""
    import s3fs
    import zstandard

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_ENDPOINT_URL_S3": s3_endpoint}.items():
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()
    shutdown_worker_pools()  # ingest tasks run in pool workers: new ones see these variables, as a worker started with them would
    fs = s3fs.S3FileSystem()
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
        fs.put_file(str(WARC), f"{BUCKET}/crawl/sample.warc.gz")
        fs.put_file(str(JSONL), f"{BUCKET}/prose/enwiki.jsonl")
        fs.pipe_file(f"{BUCKET}/packed/part/enwiki.jsonl.zst", zstandard.ZstdCompressor().compress(JSONL.read_bytes()))
    yield fs
    s3fs.S3FileSystem.clear_instance_cache()


def ingest(tmp_path: Path, specs: list[Path], out: str):
    manifest = run_ingest([load_spec_file(s) for s in specs], IngestConfig(), tmp_path / out)
    return read_stage_docs(manifest.directory), read_stage_audit(manifest.directory)


def specs_at(directory: Path, warc: str, jsonl: str, **jsonl_extra: str) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    return [write_spec(directory, "crawl", "warc", warc), write_spec(directory, "prose", "jsonl", jsonl, **jsonl_extra)]


def test_s3_sources_give_the_local_runs_documents_ids_included(tmp_path, s3, monkeypatch):
    local_docs, local_audit = ingest(tmp_path, specs_at(tmp_path / "local", str(WARC), str(JSONL)), "local")
    monkeypatch.setattr("tasks.ingest.ingest.JSONL_SPLIT_BYTES", 300_000)  # the remote JSONL (1.1 MB) read as 4 ranged streams
    remote_docs, remote_audit = ingest(tmp_path, specs_at(tmp_path / "s3", f"s3://{BUCKET}/crawl/sample.warc.gz",
                                                          f"s3://{BUCKET}/prose/enwiki.jsonl"), "s3")
    assert remote_docs.num_rows > 100 and remote_docs.equals(local_docs)
    assert remote_audit.equals(local_audit)
    # a prefix globbed, the file zstd-compressed: same documents by id and text
    packed, _ = ingest(tmp_path, specs_at(tmp_path / "packed", f"s3://{BUCKET}/crawl/", f"s3://{BUCKET}/packed/", glob="**/*.jsonl*"), "packed")
    assert packed.select(["id", "text", "url"]).equals(local_docs.select(["id", "text", "url"]))


def test_unreachable_or_empty_sources_fail_in_one_line_and_write_nothing(tmp_path, s3, monkeypatch):
    cases = {"no_bucket": ("s3://no-such-bucket-hymo/enwiki.jsonl", {}, "cannot list s3://no-such-bucket-hymo/enwiki.jsonl"),
             "no_match": (f"s3://{BUCKET}/prose/", {"glob": "**/*.parquet"}, f"s3://{BUCKET}/prose/ has no file matching"),
             "no_match_local": (str(tmp_path), {"glob": "*.jsonl"}, "has no file matching")}
    for case, (path, extra, message) in cases.items():
        spec = write_spec(tmp_path, "prose", "jsonl", path, **extra)
        with pytest.raises(InputFileError, match="source prose: .*" + message.replace(".", r"\.")) as error:
            run_ingest([load_spec_file(spec)], IngestConfig(), tmp_path / case)
        assert "\n" not in str(error.value) and not (tmp_path / case).exists()
    # no credentials anywhere: named with source and URL
    import s3fs

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    for name, value in {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": str(tmp_path / "none"),
                        "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()
    spec = write_spec(tmp_path, "prose", "jsonl", f"s3://{BUCKET}/prose/enwiki.jsonl")
    with pytest.raises(InputFileError, match=f"source prose: cannot list s3://{BUCKET}/prose/enwiki.jsonl .*NoCredentialsError"):
        run_ingest([load_spec_file(spec)], IngestConfig(), tmp_path / "anonymous")
    assert not (tmp_path / "anonymous").exists()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    # nothing listening: a network error, named with source and URL
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    s3fs.S3FileSystem.clear_instance_cache()
    spec = write_spec(tmp_path, "prose", "jsonl", f"s3://{BUCKET}/prose/enwiki.jsonl")
    with pytest.raises(InputFileError, match=f"source prose: cannot list s3://{BUCKET}/prose/enwiki.jsonl") as error:
        run_ingest([load_spec_file(spec)], IngestConfig(), tmp_path / "offline")
    assert "\n" not in str(error.value) and not (tmp_path / "offline").exists()
