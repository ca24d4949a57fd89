"""Sources on an object store: a real S3 API (moto's server on 127.0.0.1) read through fsspec, against the local run.

The server counts what it serves (object GETs and their body bytes), so "each remote file is read once per run"
is checked by counting, in whichever process the ingest tasks run."""
from __future__ import annotations

import hashlib
import socket
import threading
from collections import Counter
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


class ServedObjects:
    """Per object key of BUCKET: GET requests and body bytes the server sent (listings and HEADs not counted)."""

    def __init__(self) -> None:
        self.gets: Counter = Counter()
        self.bytes: Counter = Counter()
        self.lock = threading.Lock()

    def clear(self) -> None:
        with self.lock:
            self.gets.clear()
            self.bytes.clear()

    def app(self, inner):
        def counting(environ, start_response):
            path = environ.get("PATH_INFO", "")
            key = path.removeprefix(f"/{BUCKET}/") if environ["REQUEST_METHOD"] == "GET" and path.startswith(f"/{BUCKET}/") else None
            for chunk in inner(environ, start_response):
                if key:
                    with self.lock:
                        self.bytes[key] += len(chunk)
                yield chunk
            if key:
                with self.lock:
                    self.gets[key] += 1
        return counting


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3 server (its own WSGI app and request handler, as ThreadedMotoServer runs them) behind a counter."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    served = ServedObjects()
    server = make_server("127.0.0.1", free_port(), served.app(DomainDispatcherApplication(create_backend_app)), True,
                         request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", served
    server.shutdown()
    thread.join()


@pytest.fixture
def served(s3_endpoint):
    return s3_endpoint[1]


@pytest.fixture
def s3(s3_endpoint, monkeypatch):
    """Credentials and endpoint from the environment, as a user would set them; a bucket holding the sample's files."""
    import s3fs
    import zstandard

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_ENDPOINT_URL_S3": s3_endpoint[0]}.items():
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


def test_s3_sources_give_the_local_runs_documents_ids_included(tmp_path, s3, served, monkeypatch):
    local_docs, local_audit = ingest(tmp_path, specs_at(tmp_path / "local", str(WARC), str(JSONL)), "local")
    # a local JSONL this size would be read as 4 byte ranges; a remote one stays one stream: ranges would read it twice
    monkeypatch.setattr("tasks.ingest.ingest.JSONL_SPLIT_BYTES", 300_000)
    served.clear()
    remote_docs, remote_audit = ingest(tmp_path, specs_at(tmp_path / "s3", f"s3://{BUCKET}/crawl/sample.warc.gz",
                                                          f"s3://{BUCKET}/prose/enwiki.jsonl"), "s3")
    assert remote_docs.num_rows > 100 and remote_docs.equals(local_docs)
    assert remote_audit.equals(local_audit)
    assert served.bytes == {"crawl/sample.warc.gz": WARC.stat().st_size, "prose/enwiki.jsonl": JSONL.stat().st_size}
    # a prefix globbed, the file zstd-compressed: same documents by text and URL; the JSONL's ids differ, as its
    # path inside the source does (part/enwiki.jsonl.zst: another file, issue 45), the WARC's do not
    packed, _ = ingest(tmp_path, specs_at(tmp_path / "packed", f"s3://{BUCKET}/crawl/", f"s3://{BUCKET}/packed/", glob="**/*.jsonl*"), "packed")
    assert packed.select(["text", "url"]).equals(local_docs.select(["text", "url"]))
    same = [a == b for a, b in zip(packed.column("id").to_pylist(), local_docs.column("id").to_pylist())]
    assert same == [doc.startswith("crawl-") for doc in local_docs.column("id").to_pylist()]


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


def test_a_remote_file_is_read_once_per_run_and_not_at_all_while_its_etag_holds(tmp_path, s3, served):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tasks.runner.stage_runner import StageWouldRun, probing

    lines = JSONL.read_bytes().splitlines(keepends=True)[:40]
    s3.pipe_file(f"{BUCKET}/small/docs.jsonl", b"".join(lines))
    parquet_path = tmp_path / "docs.parquet"  # Parquet is read by seeking: it is streamed once into a local file
    pq.write_table(pa.table({"text": [f"Document number {i} about the river and the mill." for i in range(40)]}), parquet_path)
    s3.put_file(str(parquet_path), f"{BUCKET}/tables/docs.parquet")
    specs = specs_at(tmp_path / "specs", f"s3://{BUCKET}/crawl/sample.warc.gz", f"s3://{BUCKET}/small/docs.jsonl")
    specs.append(write_spec(tmp_path / "specs", "tables", "parquet", f"s3://{BUCKET}/tables/"))
    sources = [load_spec_file(s) for s in specs]
    sizes = {"crawl/sample.warc.gz": WARC.stat().st_size, "small/docs.jsonl": len(b"".join(lines)), "tables/docs.parquet": parquet_path.stat().st_size}
    out = tmp_path / "run" / "01_ingest"

    def ingest_once():
        return run_ingest(sources, IngestConfig(), out, workers=1)

    served.clear()
    with probing(), pytest.raises(StageWouldRun):  # the orchestrator's cache probe of a fresh run: nothing read
        ingest_once()
    assert served.bytes == {}
    first = ingest_once()
    assert served.bytes == sizes and set(served.gets.values()) == {1}  # each object once: digest and documents from one stream
    digests = {i["file"].rsplit("/", 1)[-1]: i["sha256"] for i in first.inputs}
    assert digests["sample.warc.gz"] == hashlib.sha256(WARC.read_bytes()).hexdigest()
    assert digests["docs.parquet"] == hashlib.sha256(parquet_path.read_bytes()).hexdigest()

    served.clear()  # unchanged objects (same ETag and size): the probe and the run read no byte
    with probing():
        assert ingest_once().cache_key == first.cache_key
    assert ingest_once().cache_key == first.cache_key and served.gets == {}

    rewritten = b"".join(lines) + b'{"url": "https://en.example/new", "text": "One more line of prose."}\n'
    s3.pipe_file(f"{BUCKET}/small/docs.jsonl", rewritten)
    served.clear()  # one object rewritten: the stage recomputes, reading each object once (the changed one hashed as it is read)
    changed = ingest_once()
    assert served.bytes == {**sizes, "small/docs.jsonl": len(rewritten)} and set(served.gets.values()) == {1}
    assert changed.cache_key != first.cache_key and changed.counts["kept"] == first.counts["kept"] + 1
