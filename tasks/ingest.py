"""Ingestion: source specs in, bounded Parquet shards of documents with stable ids out.

Ids are derived from source + origin URI + ordinal inside that origin (the line of
a JSONL file, the record of a WARC), so they survive re-runs, other machines and
other shard sizes. A broken *record* is quarantined with a rule; a broken *file*
(truncated gzip, unreadable Parquet) fails the stage before anything is published.
A source path may be an fsspec URL (s3://bucket/prefix, gs://, hf://, ...):
its files are listed and streamed through fsspec (tasks/source_fs.py), and a
file's path inside the source, hence every id, is the same as from a local copy.
A source whose glob matches no file is an error, not an empty stage.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from prefect import task

from manifests.digest import sha256_file
from manifests.file_stats import path_stat, read_stats
from manifests.schema import docs_table
from manifests.sources import SourceSpec
from manifests.stage_manifest import StageManifest, StageNotComplete, read_manifest
from tasks.decoding import decode_payload, strip_controls
from tasks.source_fs import InputFileError, RemoteFile, is_url, list_remote, open_stream, remote_digest
from tasks.source_walk import reached_through_link, walk_matching
from tasks.stage_runner import StageWriter, progress_bar, published_under, stage_cache_key

STAGE = "ingest"
VERSION = "1"


@dataclass(frozen=True)
class IngestConfig:
    docs_per_shard: int = 256  # bounded shards: parallelism and memory per worker
    bytes_per_shard: int = 64 << 20
    parquet_batch_rows: int = 1024  # streaming batch for Parquet / HF sources


@dataclass
class RawRecord:
    uri: str
    ordinal: int
    payload: bytes | str | None  # None when the record itself is broken
    content_type: str  # html | text
    meta: dict[str, Any]
    origin_file: str
    problem: str | None = None  # a record-level defect found while reading
    problem_detail: str = ""
    charset: str | None = None  # declared by the transport (a WARC record's HTTP Content-Type)


def make_doc_id(source: str, uri: str, ordinal: int) -> str:
    digest = hashlib.blake2b(f"{uri}\x00{ordinal}".encode("utf-8"), digest_size=8).hexdigest()
    return f"{source}-{digest}"


def source_pattern(spec: SourceSpec) -> str:
    return spec.glob if spec.glob != "**/*" else {"jsonl": "**/*.jsonl*", "parquet": "**/*.parquet", "warc": "**/*.warc*"}.get(spec.kind, "**/*")


def source_files(spec: SourceSpec) -> tuple[list[Path | RemoteFile], list[tuple[Path, str]]]:
    """The source's files, and the links under it that cannot be read (with why): those are audited."""
    if is_url(spec.path):
        return list_remote(spec.name, spec.path, source_pattern(spec), spec.kind == "hf_disk"), []
    root = spec.root
    if not root.exists():
        raise InputFileError(f"source {spec.name}: path {root} does not exist")
    if root.is_file():
        return [root], []
    if spec.kind == "hf_disk":
        return [root], []
    files, unreadable = walk_matching(root, source_pattern(spec))
    if not files and not unreadable:
        raise InputFileError(f"source {spec.name}: {root} has no file matching {source_pattern(spec)!r}")
    return files, unreadable


def relative_uri(spec: SourceSpec, path: Path) -> str:
    rel = relative_file(spec, path)
    return f"{spec.url_prefix}{rel}" if spec.url_prefix else f"file://{spec.name}/{rel}"


def relative_file(spec: SourceSpec, path: Path) -> str:
    """The file's path inside its source: recorded instead of a machine-local absolute path."""
    if isinstance(path, RemoteFile):
        return path.relative
    root = spec.root
    return path.name if root.is_file() or root == path else path.relative_to(root).as_posix()


def read_html_or_text(spec: SourceSpec, path: Path, content_type: str) -> Iterator[RawRecord]:
    try:
        if isinstance(path, RemoteFile):
            with open_stream(path, spec.name) as handle:
                payload = handle.read()
        else:
            payload = path.read_bytes()
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read ({exc})") from exc
    yield RawRecord(relative_uri(spec, path), 0, payload, content_type, {}, relative_file(spec, path))


def open_maybe_gzip(path: Path | RemoteFile, source: str = ""):
    """A binary stream of the file, .gz and .zst decompressed on the fly."""
    if isinstance(path, RemoteFile):
        return open_stream(path, source)
    if path.suffix == ".zst":
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True))
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_jsonl(spec: SourceSpec, path: Path) -> Iterator[RawRecord]:
    base_uri = relative_uri(spec, path)
    try:
        with open_maybe_gzip(path, spec.name) as handle:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    if not isinstance(record, dict):
                        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
                    text = record.get(spec.text_field)
                    if not isinstance(text, str):
                        raise ValueError(f"field {spec.text_field!r} is missing or not a string")
                except ValueError as exc:  # JSONDecodeError is a ValueError
                    yield RawRecord(f"{base_uri}#L{line_no}", line_no, None, "text", {}, relative_file(spec, path), "malformed_record", f"line {line_no}: {exc}")
                    continue
                uri = record.get(spec.url_field) or f"{base_uri}#L{line_no}"
                meta = record.get("meta") if isinstance(record.get("meta"), dict) else {}
                content_type = meta.pop("content_type", None) or record.get("content_type") or "text"
                yield RawRecord(str(uri), line_no, text, content_type, meta, relative_file(spec, path))
    except (EOFError, OSError, zlib.error) as exc:
        raise InputFileError(f"{path}: unreadable or truncated ({exc})") from exc


def read_parquet(spec: SourceSpec, path: Path, batch_rows: int) -> Iterator[RawRecord]:
    base_uri = relative_uri(spec, path)
    try:
        parquet = pq.ParquetFile(path.open() if isinstance(path, RemoteFile) else path)
        if spec.text_field not in parquet.schema_arrow.names:
            raise InputFileError(f"{path}: no column {spec.text_field!r} (columns: {parquet.schema_arrow.names})")
        columns = [c for c in (spec.text_field, spec.url_field) if c in parquet.schema_arrow.names]
        ordinal = 0
        for batch in parquet.iter_batches(batch_size=batch_rows, columns=columns):
            texts = batch.column(spec.text_field).to_pylist()
            urls = batch.column(spec.url_field).to_pylist() if spec.url_field in columns else [None] * len(texts)
            for text, url in zip(texts, urls):
                uri = url or f"{base_uri}#row{ordinal}"
                if not isinstance(text, str):
                    yield RawRecord(uri, ordinal, None, "text", {}, relative_file(spec, path), "malformed_record", f"row {ordinal}: {spec.text_field} is null")
                else:
                    yield RawRecord(uri, ordinal, text, "text", {}, relative_file(spec, path))
                ordinal += 1
    except (pa.ArrowException, OSError) as exc:
        raise InputFileError(f"{path}: unreadable Parquet ({exc})") from exc


def read_warc(spec: SourceSpec, path: Path) -> Iterator[RawRecord]:
    from warcio.archiveiterator import ArchiveIterator
    from warcio.exceptions import ArchiveLoadFailed

    try:
        if path.suffix == ".gz":
            check_gzip_complete(path)
        with (path.open() if isinstance(path, RemoteFile) else open(path, "rb")) as handle:
            for ordinal, record in enumerate(ArchiveIterator(handle)):
                uri = record.rec_headers.get_header("WARC-Target-URI") or f"{relative_uri(spec, path)}#rec{ordinal}"
                if record.rec_type == "response":
                    mime = (record.http_headers.get_header("Content-Type") or "") if record.http_headers else ""
                    if mime and "html" not in mime.lower():  # images, PDFs, scripts: counted, not read
                        yield RawRecord(uri, ordinal, None, "html", {}, relative_file(spec, path), "not_html", mime.split(";")[0].strip())
                        continue
                    yield RawRecord(uri, ordinal, record.content_stream().read(), "html", {"warc_date": record.rec_headers.get_header("WARC-Date")}, relative_file(spec, path), charset=mime or None)
                elif record.rec_type == "conversion":  # WET plain text
                    yield RawRecord(uri, ordinal, record.content_stream().read(), "text", {"warc_date": record.rec_headers.get_header("WARC-Date")}, relative_file(spec, path))
    except (ArchiveLoadFailed, EOFError, OSError, zlib.error) as exc:
        raise InputFileError(f"{path}: unreadable or truncated WARC ({exc})") from exc


def check_gzip_complete(path: Path) -> None:
    """warcio silently drops a truncated last record; a full gzip pass notices the cut."""
    with open_maybe_gzip(path) as handle:
        while handle.read(1 << 20):
            pass


def read_hf_disk(spec: SourceSpec, path: Path, batch_rows: int) -> Iterator[RawRecord]:
    import datasets

    try:
        if isinstance(path, RemoteFile):
            dataset = datasets.load_from_disk(path.url)  # fsspec URL: datasets streams the Arrow files through it
            if isinstance(dataset, datasets.DatasetDict):
                dataset = dataset["train"] if "train" in dataset else dataset[sorted(dataset)[0]]
            rows = dataset.iter(batch_size=batch_rows)
        elif (path / "dataset_info.json").exists() or (path / "state.json").exists() or (path / "dataset_dict.json").exists():
            dataset = datasets.load_from_disk(str(path))  # memory-mapped Arrow: iterating streams it
            if isinstance(dataset, datasets.DatasetDict):
                dataset = dataset["train"] if "train" in dataset else dataset[sorted(dataset)[0]]
            rows = dataset.iter(batch_size=batch_rows)
        else:
            rows = datasets.load_dataset(str(path), split="train", streaming=True).iter(batch_size=batch_rows)
        ordinal = 0
        for batch in rows:
            texts = batch[spec.text_field]
            urls = batch.get(spec.url_field) or [None] * len(texts)
            for text, url in zip(texts, urls):
                uri = url or f"hf://{spec.name}#row{ordinal}"
                if isinstance(text, str):
                    yield RawRecord(uri, ordinal, text, "text", {}, relative_file(spec, path))
                else:
                    yield RawRecord(uri, ordinal, None, "text", {}, relative_file(spec, path), "malformed_record", f"row {ordinal}: {spec.text_field} is not a string")
                ordinal += 1
    except (KeyError, FileNotFoundError, ValueError) as exc:
        raise InputFileError(f"{path}: cannot read Hugging Face dataset ({exc})") from exc


def iter_source(spec: SourceSpec, files: list[Path], config: IngestConfig) -> Iterator[RawRecord]:
    for path in files:
        if spec.kind == "html_dir":
            yield from read_html_or_text(spec, path, "html")
        elif spec.kind == "text_dir":
            yield from read_html_or_text(spec, path, "text")
        elif spec.kind == "jsonl":
            yield from read_jsonl(spec, path)
        elif spec.kind == "parquet":
            yield from read_parquet(spec, path, config.parquet_batch_rows)
        elif spec.kind == "warc":
            yield from read_warc(spec, path)
        elif spec.kind == "hf_disk":
            yield from read_hf_disk(spec, path, config.parquet_batch_rows)


def to_document(spec: SourceSpec, raw: RawRecord) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """One raw record -> (document or None, audit rows)."""
    doc_id = make_doc_id(spec.name, raw.uri, raw.ordinal)
    where = {"file": raw.origin_file, "uri": raw.uri, "ordinal": raw.ordinal}
    if raw.problem:
        detail_key = "content_type" if raw.problem == "not_html" else "error"
        return None, [{"id": doc_id, "action": "removed", "rule": f"ingest_{raw.problem}", "detail": {**where, detail_key: raw.problem_detail}}]
    audit: list[dict[str, Any]] = []
    meta = {**raw.meta, "content_type": raw.content_type, "origin_file": raw.origin_file, "ordinal": raw.ordinal, "profile": spec.profile}
    if isinstance(raw.payload, bytes):
        decoded = decode_payload(raw.payload, raw.charset)
        if decoded.problem:
            return None, [{"id": doc_id, "action": "removed", "rule": f"ingest_{decoded.problem}", "value": len(raw.payload), "detail": {**where, "why": decoded.detail} if decoded.detail else where}]
        text = decoded.text
        meta["encoding"] = decoded.encoding
        if decoded.guessed:
            audit.append({"id": doc_id, "action": "modified", "rule": "ingest_encoding_guessed", "value": decoded.confidence,
                          "detail": {**where, "encoding": decoded.encoding, "method": decoded.method, "confidence": decoded.confidence}})
    else:
        text = raw.payload or ""
    text, stripped = strip_controls(text)  # Arrow keeps NULs and escapes, but no downstream consumer wants them
    if not text.strip():
        return None, [{"id": doc_id, "action": "removed", "rule": "ingest_empty", "value": 0, "detail": where}]
    if stripped:
        audit.append({"id": doc_id, "action": "modified", "rule": "ingest_control_chars_removed", "value": stripped, "detail": where})
    doc = {"id": doc_id, "text": text, "source": spec.name, "url": raw.uri, "lang": None, "lang_score": None, "meta": meta}
    return doc, audit


def unique_files(specs: list[SourceSpec]) -> tuple[list[tuple[SourceSpec, list[Path]]], list[str], list[dict[str, Any]]]:
    """Each input file once: a path named twice (same or different source) is read only the first time.

    Returns the plan, the skipped paths, and audit rows for what symlinks made
    us skip: a second path to a file already read, or a link that cannot be read.
    """
    seen: dict[Path, tuple[str, bool]] = {}  # real path -> (the uri it was first read as, through a symlink)
    skipped: list[str] = []
    link_rows: list[dict[str, Any]] = []
    plan: list[tuple[SourceSpec, list[Path]]] = []
    names: set[str] = set()
    for spec in specs:
        if spec.name in names:
            skipped.append(f"source {spec.name} listed twice")
            continue
        names.add(spec.name)
        files = []
        found, unreadable = source_files(spec)
        for path, reason in unreadable:
            link_rows.append(skipped_link_row(spec, path, reason, os.readlink(path) if path.is_symlink() else ""))
        for path in found:
            remote = isinstance(path, RemoteFile)
            real = path.url if remote else path.resolve()
            linked = not remote and spec.root.is_dir() and reached_through_link(spec.root, path)
            if real in seen:
                skipped.append(str(path))
                if linked or seen[real][1]:  # a symlink made the second path: say so per document
                    link_rows.append(skipped_link_row(spec, path, "same_file_already_read", seen[real][0]))
                continue
            seen[real] = (relative_uri(spec, path), linked)
            files.append(path)
        plan.append((spec, files))
    return plan, skipped, link_rows


def skipped_link_row(spec: SourceSpec, path: Path, reason: str, target: str) -> dict[str, Any]:
    uri = relative_uri(spec, path)
    return {"id": make_doc_id(spec.name, uri, 0), "action": "removed", "rule": "ingest_symlink_skipped",
            "detail": {"file": relative_file(spec, path), "uri": uri, "reason": reason, "target": target}}


def input_listing(plan: list[tuple[SourceSpec, list[Path]]], published: Path | None = None) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """(sha256 of every source file, their stats). A local file whose stat equals the one recorded when
    `published` (the previous ingest output) was written keeps its recorded sha256 unread."""
    known = recorded_inputs(published) if published is not None else {}
    listing, stats = [], {}
    for spec, files in plan:
        for path in files:
            entry = {"source": spec.name, "file": relative_uri(spec, path)}
            name = f"{entry['source']}:{entry['file']}"
            stats[name] = None if isinstance(path, RemoteFile) else path_stat(path)
            recorded_stat, recorded_sha = known.get(name, (None, None))
            trusted = stats[name] is not None and recorded_stat == stats[name]
            entry["sha256"] = recorded_sha if trusted else input_digest(spec, path)
            listing.append(entry)
    return listing, stats


def recorded_inputs(stage_dir: Path) -> dict[str, tuple[Any, str]]:
    """source:file -> (stat at publish, sha256) of a published ingest stage; empty when there is none."""
    try:
        manifest = read_manifest(stage_dir, verify=False)
    except StageNotComplete:
        return {}
    stats = read_stats(stage_dir).get("inputs", {})
    return {f"{i['source']}:{i['file']}": (stats.get(f"{i['source']}:{i['file']}"), i["sha256"]) for i in manifest.inputs if "file" in i}


def input_digest(spec: SourceSpec, path: Path | RemoteFile) -> str:
    if isinstance(path, RemoteFile):
        return remote_digest(path, spec.name)
    return sha256_file(path) if path.is_file() else dir_digest(path)


def dir_digest(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(file.relative_to(path).as_posix().encode() + b"\0" + sha256_file(file).encode())
    return digest.hexdigest()


def run_ingest(specs: list[SourceSpec], config: IngestConfig, out_dir: Path) -> StageManifest:
    """Read every source into shards; a no-op when the same files and config were already ingested."""
    plan, skipped, link_rows = unique_files(specs)
    inputs, input_stats = input_listing(plan, Path(out_dir))
    settings = {"ingest": asdict(config), "sources": [s.public() for s, _ in plan]}
    key = stage_cache_key(STAGE, VERSION, settings, [i["sha256"] for i in inputs])
    if (published := published_under(Path(out_dir), key)) is not None:
        return published
    writer = StageWriter(STAGE, VERSION, settings, key, inputs, Path(out_dir))
    try:
        shard_index, buffer, audit, buffer_bytes = 0, [], list(link_rows), 0
        total = sum(len(files) for _, files in plan)
        with progress_bar(STAGE, total) as advance:
            for spec, files in plan:
                for path in files:
                    for raw in iter_source(spec, [path], config):
                        doc, rows = to_document(spec, raw)
                        audit.extend(rows)
                        if doc is not None:
                            buffer.append(doc)
                            buffer_bytes += len(doc["text"])
                        if len(buffer) >= config.docs_per_shard or buffer_bytes >= config.bytes_per_shard:
                            writer.write_shard(shard_index, docs_table(buffer), audit)
                            shard_index, buffer, audit, buffer_bytes = shard_index + 1, [], [], 0
                    advance(1)
        if buffer or audit or shard_index == 0:
            writer.write_shard(shard_index, docs_table(buffer), audit)
        return writer.publish({"skipped_duplicate_inputs": skipped, "sources": [s.public() for s, _ in plan]}, input_stats)
    except BaseException:
        writer.abandon()
        raise


@task(name="ingest", task_run_name="ingest")
def ingest_task(specs: list[SourceSpec], config: IngestConfig, out_dir: Path) -> StageManifest:
    return run_ingest(specs, config, out_dir)
