"""Ingestion: source specs in, bounded Parquet shards of documents with stable ids out.

Ids are derived from the source's name and snapshot, the file's path inside the
source, the record's URI and its ordinal inside that file (the line of a JSONL file,
the record of a WARC), so they survive re-runs, other machines and other shard
sizes, and two snapshot files holding the same URL at the same line get two ids.
The record's own id (`id_field` of the spec; a WARC record's WARC-Record-ID) is kept
in `meta.record_id`. A broken *record* is quarantined with a rule; a broken *file*
fails the stage before anything is published,
naming every broken file of the run (`on_bad_file = "fail"`, the default), or, with
`on_bad_file = "quarantine"`, is left out whole with one audit row
`ingest_bad_file` (file, reason) while the other files are ingested. A file is good only when its
container says it ended (gzip's trailer, every zstd frame's end, each WARC record's Content-Length,
Parquet's footer) and its first bytes agree with its name (gzip or zstd data named .jsonl, binary
data in a JSONL file: bad); one with more than `max_malformed_share` of its records malformed is
bad too, and one that holds no record is audited `ingest_empty_file`.
A source path may be an fsspec URL (s3://bucket/prefix, gs://, hf://, ...):
its files are listed and streamed through fsspec (tasks/ingest/source_fs.py), and a
file's path inside the source, hence every id, is the same as from a local copy.
A source whose glob matches no file is an error, not an empty stage.

How it runs: every source file, and every JSONL_SPLIT_BYTES byte range of an
uncompressed JSONL file (its lines numbered from a first pass of newline-count
tasks), is a task of the runner (process pool, or Dask tasks on a cluster;
sources are streamed by whoever runs the task, so local paths must be on
shared storage there, fsspec URLs need not be), which
writes the file's documents and audit rows, in record order, to intermediate
Parquet files in the stage's work directory. The planning process then cuts
the concatenated record stream into shards exactly where one sequential pass
would (after the record that reaches `bytes_per_shard` bytes of UTF-8 text or
`docs_per_shard` documents), and one task per shard copies its slices into
the shard: the same bytes as reading everything in one process, for any
number of workers. Source digests (for the cache key) are tasks too.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import tempfile
import zlib
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from manifests.audit_edits import edits_detail
from manifests.digest import sha256_file
from manifests.file_stats import path_stat, read_stats
from manifests.schema import AUDIT_SCHEMA, DOC_SCHEMA, audit_table, docs_table
from manifests.sources import SourceSpec
from manifests.stage_manifest import StageManifest, StageNotComplete, read_manifest
from tasks.ingest.decoding import BINARY_CONTROL_SHARE, CONTROL_TEXT, SNIFF_BYTES, binary_reason, decode_payload, guessed_spans, strip_controls
from tasks.ingest.source_fs import InputFileError, RemoteFile, is_url, list_remote, open_content, open_stream, remote_digest
from tasks.ingest.source_walk import reached_through_link, walk_matching
from tasks.runner.stage_runner import (StageWriter, dask_client, default_workers, key_needs_reading, map_shards, progress_bar, published_under,
                                       shard_name, stage_cache_key, write_shard_files)

STAGE = "ingest"
VERSION = "1"
FILE_PARTS_DIR = "_files"  # under the work directory: each source file's documents and audit rows
JSONL_SPLIT_BYTES = 64 << 20  # an uncompressed JSONL file larger than this is read as byte ranges of this size, in parallel
FILE_BATCH_ROWS = 256  # rows per record batch of those files: a shard task reads only the batches it needs
# Those files are Arrow IPC with LZ4 buffers, not Parquet: each record is written there once and read back once by its
# shard task, so Parquet's encoding and compression (paid again for the published shard) would be spent twice.
PARTS_WRITE_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")


class BadInputFiles(InputFileError):
    """`on_bad_file = "fail"` met bad files: one line naming them with their reasons, the first BAD_FILES_NAMED in full."""

    def __init__(self, reasons: list[str] | str):
        if isinstance(reasons, str):  # unpickled: the message itself
            super().__init__(reasons)
            return
        named = "; ".join(reasons[:BAD_FILES_NAMED])
        more = f"; and {len(reasons) - BAD_FILES_NAMED} more" if len(reasons) > BAD_FILES_NAMED else ""
        super().__init__(f"{len(reasons)} input file{'s' if len(reasons) > 1 else ''} cannot be read, nothing was published: {named}{more}")


BAD_FILES_NAMED = 5  # a run of 10,000 cut downloads names five; "quarantine" lists them all (`hymo audit summary`)


@dataclass(frozen=True)
class IngestConfig:
    # Shards are sized by text: ~128 MB of UTF-8 text each, so 100M web documents make ~10k files per stage
    # rather than ~390k at a fixed 256 documents; the document cap bounds a shard of very short documents (a
    # stage holds one shard's kept rows and audit rows at a time). The same config cuts the same shards.
    bytes_per_shard: int = 128_000_000
    docs_per_shard: int = 100_000
    parquet_batch_rows: int = 1024  # streaming batch for Parquet / HF sources
    # A file that cannot be read whole (truncated download, unreadable Parquet): "fail" stops the stage naming
    # every such file of the run; "quarantine" leaves each out with an `ingest_bad_file` audit row and goes on.
    on_bad_file: Literal["fail", "quarantine"] = "fail"
    # Errors are counted per file (a large plain JSONL file read as byte ranges: over all of them): a file with
    # a few broken records keeps its good ones, each broken one audited `ingest_malformed_record`; a file where more than
    # this share of the records is broken is not a file of records at all (a CSV or a log named .jsonl,
    # a column of nulls) and is a bad file under `on_bad_file`. 1.0: never.
    max_malformed_share: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_malformed_share <= 1.0:
            raise ValueError(f"[ingest] max_malformed_share = {self.max_malformed_share}: must be between 0 and 1")


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
    record_id: str | None = None  # the record's own id in its source (`id_field`, WARC-Record-ID)


def make_doc_id(source: str, snapshot: str, file: str, uri: str, ordinal: int) -> str:
    """`source-<16 hex>`: unique per (snapshot, file inside the source, record), the same on every re-run."""
    key = f"{snapshot}\x00{file}\x00{uri}\x00{ordinal}"
    return f"{source}-{hashlib.blake2b(key.encode('utf-8'), digest_size=8).hexdigest()}"


def record_id(value: Any) -> str | None:
    """The user's own id of a record as a string (None when it has none)."""
    return None if value is None or value == "" else str(value)


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
    """One file, one record (an empty file is an empty page). A `.gz`/`.zst` page is decompressed; a gzip or zstd
    stream under a plain name is a bad file; other binary content (an image served as .html) is the record's
    `ingest_binary` row, as in a WARC."""
    try:
        with open_source_file(path, spec.name) as handle:
            payload = handle.read()  # an empty page stays one record: `ingest_empty`, like an empty WARC response
    except (EOFError, OSError, zlib.error) as exc:
        raise InputFileError(f"{path}: unreadable or truncated ({exc})") from exc
    yield RawRecord(relative_uri(spec, path), 0, payload, content_type, {}, relative_file(spec, path))


def open_source_file(path: Path | RemoteFile, source: str = "", name_must_agree: bool = True):
    """A binary stream of the file's content, decompressed as its first bytes say (source_fs.open_content): a cut
    gzip or zstd stream raises TruncatedInput (an OSError) where it ends; a compression the name does not admit
    (`name_must_agree`) is an InputFileError."""
    if isinstance(path, RemoteFile):
        return open_stream(path, source, name_must_agree)
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read ({exc})") from exc
    return open_content(handle, path, name_must_agree)


def check_text_head(path: Path | RemoteFile, handle: Any, kind: str) -> None:
    """A text format (JSONL) whose first bytes are binary (an archive, an image, mostly control bytes) is a bad
    file: read line by line it would only give malformed records."""
    head = handle.peek(SNIFF_BYTES)[:SNIFF_BYTES]
    reason = binary_reason(head) if head else None
    if reason:
        raise InputFileError(f"{path}: binary content ({reason.replace(':', ' ')}) in a {kind} file")


def read_jsonl(spec: SourceSpec, path: Path, byte_range: tuple[int, int, int] | None = None) -> Iterator[RawRecord]:
    """The records of a JSONL file, or of the lines starting in byte_range = (start, stop, newlines before start)."""
    base_uri, origin = relative_uri(spec, path), relative_file(spec, path)  # once per file, not per line
    try:
        with open_source_file(path, spec.name) if byte_range is None else open_plain(path, spec.name) as handle:
            if byte_range is None or byte_range[0] == 0:
                check_text_head(path, handle, "JSONL")
            for line_no, line in enumerate(handle, start=1) if byte_range is None else range_lines(handle, *byte_range):
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
                    yield RawRecord(f"{base_uri}#L{line_no}", line_no, None, "text", {}, origin, "malformed_record", f"line {line_no}: {exc}")
                    continue
                uri = record.get(spec.url_field) or f"{base_uri}#L{line_no}"
                meta = record.get("meta") if isinstance(record.get("meta"), dict) else {}
                content_type = meta.pop("content_type", None) or record.get("content_type") or "text"
                yield RawRecord(str(uri), line_no, text, content_type, meta, origin, record_id=record_id(record.get(spec.id_field)))
    except (EOFError, OSError, zlib.error) as exc:
        raise InputFileError(f"{path}: unreadable or truncated ({exc})") from exc


def open_plain(path: Path | RemoteFile, source: str):
    """A seekable binary handle on an uncompressed file."""
    return open_stream(path, source) if isinstance(path, RemoteFile) else open(path, "rb")


def splittable(spec: SourceSpec, path: Path | RemoteFile) -> int:
    """The size of a local uncompressed JSONL file big enough to be read as several byte ranges, else 0.

    A remote file is one task: ranges need their newlines counted first, which would read it twice."""
    if spec.kind != "jsonl" or path.suffix in (".gz", ".zst") or isinstance(path, RemoteFile):
        return 0
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InputFileError(f"source {spec.name}: cannot read the size of {path} ({exc})") from exc
    return size if size > JSONL_SPLIT_BYTES else 0


def count_newlines(spec: SourceSpec, path: Path | RemoteFile, start: int, stop: int) -> int:
    """Task: newlines in bytes [start, stop) of a plain file (numbering the lines of the next range)."""
    count = 0
    with open_plain(path, spec.name) as handle:
        handle.seek(start)
        while start < stop and (chunk := handle.read(min(8 << 20, stop - start))):
            count += chunk.count(b"\n")
            start += len(chunk)
    return count


def range_lines(handle, start: int, stop: int, newlines_before: int) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of the lines that start in [start, stop), numbered as a whole-file pass numbers them.

    `newlines_before`: newlines in [0, start). Line n starts after the (n-1)-th
    newline, so the first line starting at or after `start` is number
    newlines_before + 1 when the byte before `start` is a newline; otherwise
    the line holding `start` began earlier (it belongs to the range before)
    and the first line of this range is the one after it.
    """
    line_no, position = 1, start
    if start > 0:
        handle.seek(start - 1)
        line_no = newlines_before + 1
        if handle.read(1) != b"\n":
            position += len(handle.readline())  # the rest of a line that started before `start`
            line_no += 1
    while position < stop:
        line = handle.readline()
        if not line:
            return
        yield line_no, line
        line_no += 1
        position += len(line)


def read_parquet(spec: SourceSpec, path: Path, batch_rows: int) -> Iterator[RawRecord]:
    base_uri = relative_uri(spec, path)
    with tempfile.TemporaryFile() if isinstance(path, RemoteFile) else contextlib.nullcontext(path) as local:
        if isinstance(path, RemoteFile):  # Parquet is read by seeking: one streamed copy, then the local file
            with path.open() as handle:
                shutil.copyfileobj(handle, local, 8 << 20)
            local.seek(0)
        yield from parquet_records(spec, path, local, base_uri, batch_rows)


def parquet_records(spec: SourceSpec, path: Path | RemoteFile, local: Any, base_uri: str, batch_rows: int) -> Iterator[RawRecord]:
    origin = relative_file(spec, path)
    try:
        parquet = pq.ParquetFile(local)
        if spec.text_field not in parquet.schema_arrow.names:
            raise InputFileError(f"{path}: no column {spec.text_field!r} (columns: {parquet.schema_arrow.names})")
        columns = [c for c in dict.fromkeys((spec.text_field, spec.url_field, spec.id_field)) if c in parquet.schema_arrow.names]
        ordinal = 0
        for batch in parquet.iter_batches(batch_size=batch_rows, columns=columns):
            texts = batch.column(spec.text_field).to_pylist()
            urls = batch.column(spec.url_field).to_pylist() if spec.url_field in columns else [None] * len(texts)
            own = batch.column(spec.id_field).to_pylist() if spec.id_field in columns else [None] * len(texts)
            for text, url, own_id in zip(texts, urls, own):
                uri = url or f"{base_uri}#row{ordinal}"
                if not isinstance(text, str):
                    yield RawRecord(uri, ordinal, None, "text", {}, origin, "malformed_record", f"row {ordinal}: {spec.text_field} is null", record_id=record_id(own_id))
                else:
                    yield RawRecord(uri, ordinal, text, "text", {}, origin, record_id=record_id(own_id))
                ordinal += 1
    except (pa.ArrowException, OSError) as exc:
        raise InputFileError(f"{path}: unreadable Parquet ({exc})") from exc


def read_warc(spec: SourceSpec, path: Path) -> Iterator[RawRecord]:
    """The response (HTML) and conversion (WET text) records of a WARC, .gz or plain. A file ends well only when
    its gzip members all end and every record holds its `Content-Length` bytes: warcio itself returns a cut
    record short, and drops a cut gzip member, without an error."""
    from warcio.archiveiterator import ArchiveIterator
    from warcio.exceptions import ArchiveLoadFailed

    base_uri, origin = relative_uri(spec, path), relative_file(spec, path)  # once per file, not per record
    try:
        with open_source_file(path, spec.name, name_must_agree=False) as content:  # gunzipped here: a cut member fails the read
            handle = io.BufferedReader(CountingReader(content))
            records = ArchiveIterator(handle)
            for ordinal, record in enumerate(records):
                raw = warc_record(record, ordinal, base_uri, origin)
                check_record_complete(record, ordinal)
                if raw is not None:
                    yield raw
            while handle.read(1 << 20):
                pass
            if handle.tell() > records.offset:  # warcio ends quietly on a record cut inside its header block
                raise EOFError(f"{handle.tell() - records.offset} bytes after the last complete record are not a whole record")
    except (ArchiveLoadFailed, EOFError, OSError, zlib.error) as exc:
        raise InputFileError(f"{path}: unreadable or truncated WARC ({exc})") from exc
    except (AttributeError, KeyError, ValueError, TypeError) as exc:  # warcio on a record cut inside its headers
        raise InputFileError(f"{path}: unreadable or truncated WARC ({type(exc).__name__} in warcio: {exc})") from exc


def warc_record(record: Any, ordinal: int, base_uri: str, origin: str) -> RawRecord | None:
    """A response record's page (or its content type, when not HTML), a conversion record's text; None for the rest."""
    uri = record.rec_headers.get_header("WARC-Target-URI") or f"{base_uri}#rec{ordinal}"
    own_id = record.rec_headers.get_header("WARC-Record-ID")
    if record.rec_type == "response":
        mime = (record.http_headers.get_header("Content-Type") or "") if record.http_headers else ""
        if mime and "html" not in mime.lower():  # images, PDFs, scripts: counted, not read
            return RawRecord(uri, ordinal, None, "html", {}, origin, "not_html", mime.split(";")[0].strip(), record_id=own_id)
        return RawRecord(uri, ordinal, record.content_stream().read(), "html", {"warc_date": record.rec_headers.get_header("WARC-Date")}, origin, charset=mime or None, record_id=own_id)
    if record.rec_type == "conversion":  # WET plain text
        return RawRecord(uri, ordinal, record.content_stream().read(), "text", {"warc_date": record.rec_headers.get_header("WARC-Date")}, origin, record_id=own_id)
    return None


class CountingReader(io.RawIOBase):
    """A stream's bytes and how many have passed (`tell`): where a WARC's last complete record ended is compared
    with where the stream ended."""

    def __init__(self, handle: Any):
        self.handle, self.position = handle, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.handle.read(len(buffer))
        buffer[:len(data)] = data
        self.position += len(data)
        return len(data)

    def tell(self) -> int:
        return self.position


def check_record_complete(record: Any, ordinal: int) -> None:
    """EOFError when the file ended before this record's `Content-Length` bytes (a plain .warc cut mid-record), or
    inside its header block."""
    from warcio.limitreader import LimitReader

    if record.length is None:  # WARC requires it: warcio leaves it out of a header block the file ended inside
        raise EOFError(f"record {ordinal} has no Content-Length (the file ends inside its headers)")
    stream = record.raw_stream
    while stream.read(1 << 20):  # what the reader left of the record (all of it, for a record not read)
        pass
    if isinstance(stream, LimitReader) and stream.limit > 0:
        declared = record.rec_headers.get_header("Content-Length")
        raise EOFError(f"record {ordinal} ends {stream.limit} bytes short of its Content-Length {declared}")


def read_hf_disk(spec: SourceSpec, path: Path, batch_rows: int) -> Iterator[RawRecord]:
    import datasets

    origin = relative_file(spec, path)
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
            own = batch.get(spec.id_field) or [None] * len(texts)
            for text, url, own_id in zip(texts, urls, own):
                uri = url or f"hf://{spec.name}#row{ordinal}"
                if isinstance(text, str):
                    yield RawRecord(uri, ordinal, text, "text", {}, origin, record_id=record_id(own_id))
                else:
                    yield RawRecord(uri, ordinal, None, "text", {}, origin, "malformed_record", f"row {ordinal}: {spec.text_field} is not a string", record_id=record_id(own_id))
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


def problem_statistic(problem: str, why: str) -> tuple[float | None, float | None]:
    """The measured value and the limit behind an undecodable payload: non-blank characters against 1 for an empty
    one, the share of control bytes against BINARY_CONTROL_SHARE for a binary one (none for a file signature)."""
    if problem == "empty":
        return 0.0, 1.0
    if why.startswith("control_share:"):
        return float(why.partition(":")[2]), BINARY_CONTROL_SHARE
    return None, None


def to_document(spec: SourceSpec, raw: RawRecord) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """One raw record -> (document or None, audit rows)."""
    doc_id = make_doc_id(spec.name, spec.snapshot, raw.origin_file, raw.uri, raw.ordinal)
    where = {"file": raw.origin_file, "uri": raw.uri, "ordinal": raw.ordinal}
    if raw.record_id is not None:
        where["record_id"] = raw.record_id
    if raw.problem:
        detail_key = "content_type" if raw.problem == "not_html" else "error"
        return None, [{"id": doc_id, "action": "removed", "rule": f"ingest_{raw.problem}", "detail": {**where, detail_key: raw.problem_detail}}]
    audit: list[dict[str, Any]] = []
    meta = {**raw.meta, "content_type": raw.content_type, "origin_file": raw.origin_file, "ordinal": raw.ordinal, "profile": spec.profile}
    if raw.record_id is not None:
        meta["record_id"] = raw.record_id
    if isinstance(raw.payload, bytes):
        decoded = decode_payload(raw.payload, raw.charset)
        if decoded.problem:
            detail = {**where, "why": decoded.detail, "bytes": len(raw.payload)} if decoded.detail else {**where, "bytes": len(raw.payload)}
            value, threshold = problem_statistic(decoded.problem, decoded.detail)
            return None, [{"id": doc_id, "action": "removed", "rule": f"ingest_{decoded.problem}", "value": value, "threshold": threshold, "detail": detail}]
        text = decoded.text
        meta["encoding"] = decoded.encoding
        if decoded.guessed:
            audit.append({"id": doc_id, "action": "modified", "rule": "ingest_encoding_guessed", "value": decoded.confidence,
                          "detail": {**where, "encoding": decoded.encoding, "method": decoded.method, "confidence": decoded.confidence,
                                     **edits_detail(guessed_spans(text, decoded.encoding))}})
    else:
        text = raw.payload or ""
    decoded_text = text
    text, stripped = strip_controls(text)  # Arrow keeps NULs and escapes, but no downstream consumer wants them
    if not text.strip():
        return None, [{"id": doc_id, "action": "removed", "rule": "ingest_empty", "value": 0, "threshold": 1, "detail": where}]
    if stripped:
        controls = ((m.start(), m.end(), "control_chars") for m in CONTROL_TEXT.finditer(decoded_text))
        audit.append({"id": doc_id, "action": "modified", "rule": "ingest_control_chars_removed", "value": stripped,
                      "detail": {**where, **edits_detail(controls)}})
    doc = {"id": doc_id, "text": text, "source": spec.name, "url": raw.uri, "lang": None, "lang_score": None, "meta": meta}
    return doc, audit


def unique_files(specs: list[SourceSpec]) -> tuple[list[tuple[SourceSpec, list[Path]]], list[str], list[dict[str, Any]]]:
    """Each input file once: a path named twice (same or different source) is read only the first time; the same
    spec listed twice is read once, two different specs with one name are an error.

    Returns the plan, the skipped paths, and audit rows for what symlinks made
    us skip: a second path to a file already read, or a link that cannot be read.
    """
    seen: dict[Path, tuple[str, bool]] = {}  # real path -> (the uri it was first read as, through a symlink)
    skipped: list[str] = []
    link_rows: list[dict[str, Any]] = []
    plan: list[tuple[SourceSpec, list[Path]]] = []
    names: dict[str, SourceSpec] = {}
    for spec in specs:
        if spec.name in names:
            if spec != names[spec.name] or spec.root != names[spec.name].root:  # the pre-flight names both spec files; a caller of this function gets the two paths
                raise InputFileError(f"two different sources are named {spec.name!r} (paths {names[spec.name].root} and {spec.root}): "
                                     "the second would never be read; give each source spec its own name")
            skipped.append(f"source {spec.name} listed twice")
            continue
        names[spec.name] = spec
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
    return {"id": make_doc_id(spec.name, spec.snapshot, relative_file(spec, path), uri, 0), "action": "removed", "rule": "ingest_symlink_skipped",
            "detail": {"file": relative_file(spec, path), "uri": uri, "reason": reason, "target": target}}


# (local path, its stat) -> sha256, for this process: the flow's cache-key probe hashes the sources, and the
# ingest task run that follows reuses those digests instead of reading every source file a second time. An
# unchanged stat is what the recorded inputs of a published ingest are trusted on too.
HASHED: dict[tuple[str, str], str] = {}


def input_listing(plan: list[tuple[SourceSpec, list[Path]]], published: Path | None = None,
                  workers: int = 1) -> tuple[list[dict[str, str]], dict[str, Any], dict[str, int]]:
    """(sha256 of every source file, their stats, remote files hashed later: url -> listing index).

    A file whose stat (local: size, mtime, inode; remote: size and the store's version token) equals the
    one recorded when `published` (the previous ingest output) was written keeps its recorded sha256
    unread. Other local files are hashed by runner tasks; other remote files are left to the task that
    ingests them, which hashes the same stream (one read per run)."""
    known = recorded_inputs(published) if published is not None else {}
    listing, stats, jobs, deferred, memo_keys = [], {}, [], {}, {}
    for spec, files in plan:
        for path in files:
            entry = {"source": spec.name, "file": relative_uri(spec, path)}
            name = f"{entry['source']}:{entry['file']}"
            remote = isinstance(path, RemoteFile)
            stats[name] = (list(path.stat) if path.stat else None) if remote else path_stat(path)
            recorded_stat, recorded_sha = known.get(name, (None, None))
            if stats[name] is not None and recorded_stat == stats[name]:
                entry["sha256"] = recorded_sha
            elif not remote and (hashed := HASHED.get(memo := (str(path), json.dumps(stats[name])))) is not None:
                entry["sha256"] = hashed
            elif remote and spec.kind != "hf_disk":  # a dataset directory is read by `datasets` itself: hashed apart
                deferred[path.url] = len(listing)
            else:
                if not remote:
                    memo_keys[len(listing)] = memo
                jobs.append((len(listing), spec, path))
            listing.append(entry)
    for index, digest in source_digests(jobs, workers):
        listing[index]["sha256"] = digest
        if (memo := memo_keys.get(index)) is not None:
            HASHED[memo] = digest
    return listing, stats, deferred


def indexed_digest(index: int, spec: SourceSpec, path: Path | RemoteFile) -> tuple[int, str]:
    return index, input_digest(spec, path)


def source_digests(jobs: list[tuple[int, SourceSpec, Path | RemoteFile]], workers: int) -> Iterator[tuple[int, str]]:
    """(listing index, sha256) of every job, as they finish. On this host, in `workers` threads: hashlib hashes
    without the GIL, so threads read as fast as pool workers would, and the stage's cache key (which the flow
    computes before the stage's task run starts) no longer waits for worker processes to start and import. On a
    Dask cluster its workers read the files, as every other map of the stage."""
    if dask_client() is not None:
        yield from map_shards(indexed_digest, jobs, workers, "ingest digests", [1] * len(jobs))
        return
    with progress_bar("ingest digests", len(jobs)) as advance, ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for future in as_completed([pool.submit(indexed_digest, *job) for job in jobs]):
            advance(1)
            yield future.result()


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


RECORDS_CHUNK = 1 << 18  # records read at a time while cutting shards: the cut pass holds ~4 arrays of this many × 8 B (≈ 8 MB)


@dataclass(frozen=True)
class FileRecords:
    """What one source file gave: where its documents, audit rows and per-record accounting are, and totals.

    The per-record accounting (has a document, its text in UTF-8 bytes, audit rows; int64 × 3 a record)
    stays in `records_path`, a .npy file beside the documents: the flow host holds this summary per file,
    never a value per record, and the shard cuts are computed from those files by a task."""

    index: int
    docs_path: str
    audit_path: str
    records_path: str
    records: int
    docs: int
    text_bytes: int
    audit_rows: int
    digest: tuple[str, str] | None = None  # (url, sha256) of a remote file hashed while it was read
    bad: str = ""  # why the file cannot be read (its documents are left out, one audit row says so)
    malformed: int = 0  # its `ingest_malformed_record` rows: a split file is judged on the sum of its ranges'
    first_malformed: str = ""


def ingest_file(index: int, spec: SourceSpec, path: Path | RemoteFile, config: IngestConfig, parts_dir: str,
                byte_range: tuple[int, int, int] | None = None, digest: bool = False) -> FileRecords:
    """Task: one source file's (or byte range's) documents and audit rows, streamed into two Arrow files of FILE_BATCH_ROWS-row batches.

    `digest`: a remote file whose sha256 is not known yet; it is hashed from the stream read here."""
    if digest:
        path = path.digesting()
    docs_path, audit_path = Path(parts_dir) / f"{index:06d}.docs.arrow", Path(parts_dir) / f"{index:06d}.audit.arrow"
    records_path = Path(parts_dir) / f"{index:06d}.records.npy"
    docs_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_docs, tmp_audit = docs_path.with_suffix(".tmp"), audit_path.with_suffix(".tmp")
    bad, malformed, first_malformed = "", 0, ""
    try:
        records, malformed, first_malformed = write_file_parts(spec, path, config, byte_range, tmp_docs, tmp_audit)
    except InputFileError as exc:  # the whole file is left out: no document of it, one row saying why
        bad = str(exc)
        records = write_bad_parts(spec, path, byte_range, bad, tmp_docs, tmp_audit)
    table = publish_parts(records, tmp_docs, docs_path, tmp_audit, audit_path, records_path)
    sha = None
    if digest:  # complete unless no reader opened the file (then it is hashed apart, a second read)
        sha = (not bad and path.tap.hexdigest()) or remote_digest(path, spec.name)
    totals = table.sum(axis=0).tolist() if len(table) else [0, 0, 0]
    return FileRecords(index, str(docs_path), str(audit_path), str(records_path), len(table), *map(int, totals),
                       (path.url, sha) if digest else None, bad, malformed, first_malformed)


def write_bad_parts(spec: SourceSpec, path: Path | RemoteFile, byte_range: tuple[int, int, int] | None, reason: str,
                    tmp_docs: Path, tmp_audit: Path) -> list[tuple[int, int, int]]:
    """A left-out file's parts: no document, one `ingest_bad_file` row (none for a split file's later ranges)."""
    write_part(DOC_SCHEMA.empty_table(), tmp_docs)
    if not reason:
        write_part(AUDIT_SCHEMA.empty_table(), tmp_audit)
        return []
    write_part(audit_table([bad_file_row(spec, path, byte_range, reason)]), tmp_audit)
    return [(0, 0, 1)]


def part_writer(path: Path, schema: pa.Schema) -> pa.ipc.RecordBatchFileWriter:
    return pa.ipc.new_file(str(path), schema, options=PARTS_WRITE_OPTIONS)


def write_part(table: pa.Table, path: Path) -> None:
    with part_writer(path, table.schema) as writer:
        writer.write_table(table, max_chunksize=FILE_BATCH_ROWS)


def publish_parts(records: list[tuple[int, int, int]], tmp_docs: Path, docs_path: Path, tmp_audit: Path, audit_path: Path, records_path: Path):
    """Move a file's three parts into place (a task rerun after a dead worker rewrites all three from the start)."""
    import numpy as np

    table = np.asarray(records, dtype=np.int64).reshape(-1, 3)
    with open(records_path.with_suffix(".tmp"), "wb") as handle:
        np.save(handle, table)
    os.replace(tmp_docs, docs_path)
    os.replace(tmp_audit, audit_path)
    os.replace(records_path.with_suffix(".tmp"), records_path)
    return table


def too_malformed(path: Path | RemoteFile, malformed: int, records: int, first: str, config: IngestConfig) -> str:
    """Why a file with this many malformed records among `records` is a bad file ("" when it is not)."""
    if malformed <= config.max_malformed_share * records:
        return ""
    return (f"{path}: {malformed} of its {records} records are malformed, more than [ingest] max_malformed_share"
            f" = {config.max_malformed_share} (first: {first})")


def judge_split_files(jobs: list[tuple], files: list[FileRecords], config: IngestConfig) -> list[FileRecords]:
    """A large JSONL file read as byte ranges is judged whole: when its ranges' malformed records together pass
    `max_malformed_share`, every range is left out and its first holds the file's `ingest_bad_file` row."""
    ranges: dict[str, list[int]] = {}
    for position, job in enumerate(jobs):
        if len(job) > 5 and job[5] is not None:
            ranges.setdefault(str(job[2]), []).append(position)
    for positions in ranges.values():
        parts = [files[p] for p in positions]
        if any(f.bad for f in parts):
            continue
        total = sum(f.records for f in parts)
        reason = too_malformed(jobs[positions[0]][2], sum(f.malformed for f in parts), total,
                               next((f.first_malformed for f in parts if f.first_malformed), ""), config)
        if not reason:
            continue
        for order, position in enumerate(positions):
            _, spec, path, _, _, byte_range, *_ = jobs[position]
            part = files[position]
            docs_path, audit_path = Path(part.docs_path), Path(part.audit_path)
            tmp_docs, tmp_audit = docs_path.with_suffix(".tmp"), audit_path.with_suffix(".tmp")
            records = write_bad_parts(spec, path, None, reason if order == 0 else "", tmp_docs, tmp_audit)
            table = publish_parts(records, tmp_docs, docs_path, tmp_audit, audit_path, Path(part.records_path))
            files[position] = replace(part, records=len(table), docs=0, text_bytes=0, audit_rows=len(table), bad=reason if order == 0 else "")
    return files


def bad_file_row(spec: SourceSpec, path: Path | RemoteFile, byte_range: tuple[int, int, int] | None, reason: str) -> dict[str, Any]:
    """The audit row of a file (or byte range) that cannot be read: an id of its own, the file and why."""
    file, uri = relative_file(spec, path), relative_uri(spec, path)
    if byte_range is not None:
        uri += f"#bytes={byte_range[0]}-{byte_range[1]}"
    return {"id": make_doc_id(spec.name, spec.snapshot, file, uri, -1), "stage": STAGE, "action": "removed", "rule": "ingest_bad_file",
            "detail": {"file": file, "uri": uri, "reason": reason}}


def write_file_parts(spec: SourceSpec, path: Path | RemoteFile, config: IngestConfig, byte_range: tuple[int, int, int] | None,
                     tmp_docs: Path, tmp_audit: Path) -> tuple[list[tuple[int, int, int]], int, str]:
    """Stream one file's documents and audit rows into the two files; its per-record accounting, and its malformed
    records (how many, the first's error)."""
    records: list[tuple[int, int, int]] = []  # this task's own accounting, one file's worth; written to records_path
    docs, audit = [], []
    malformed, first_malformed = 0, ""
    with part_writer(tmp_docs, DOC_SCHEMA) as doc_writer, part_writer(tmp_audit, AUDIT_SCHEMA) as audit_writer:
        for raw in iter_source(spec, [path], config) if byte_range is None else read_jsonl(spec, path, byte_range):
            doc, rows = to_document(spec, raw)
            if raw.problem == "malformed_record":
                malformed += 1
                first_malformed = first_malformed or raw.problem_detail
            records.append((doc is not None, len(doc["text"].encode("utf-8", "surrogatepass")) if doc is not None else 0, len(rows)))
            audit.extend({**row, "stage": STAGE} for row in rows)
            if doc is not None:
                docs.append(doc)
            if len(docs) >= FILE_BATCH_ROWS:
                doc_writer.write_table(docs_table(docs[:FILE_BATCH_ROWS]))
                docs = docs[FILE_BATCH_ROWS:]
            if len(audit) >= FILE_BATCH_ROWS:
                audit_writer.write_table(audit_table(audit[:FILE_BATCH_ROWS]))
                audit = audit[FILE_BATCH_ROWS:]
        if byte_range is None and (reason := too_malformed(path, malformed, len(records), first_malformed, config)):
            raise InputFileError(reason)
        if not records and byte_range is None:  # a file with nothing in it says so, whatever its kind
            records.append((0, 0, 1))
            audit.append(empty_file_row(spec, path))
        if docs:
            doc_writer.write_table(docs_table(docs))
        if audit:
            audit_writer.write_table(audit_table(audit))
    return records, malformed, first_malformed


def empty_file_row(spec: SourceSpec, path: Path | RemoteFile) -> dict[str, Any]:
    """The audit row of a file that holds no record (zero bytes, blank lines only, a Parquet of no rows)."""
    return {**bad_file_row(spec, path, None, "the file holds no record"), "rule": "ingest_empty_file"}


def shard_pieces(files: list[tuple[int, str]], config: IngestConfig) -> list[list[tuple[int, int, int, int, int]]]:
    """Task: cut the record stream of all files, in order, where one sequential pass would start a new shard.

    `files`: (file index, its records .npy) in stream order. A shard ends after the
    record that brings it to `bytes_per_shard` bytes of UTF-8 text or
    `docs_per_shard` documents; the audit rows of a record belong to the shard
    it falls in. Returns per shard its pieces (file, first document, last + 1,
    first audit row, last + 1). The records are read RECORDS_CHUNK at a time
    and each cut is a binary search in the chunk's running sums: memory and
    Python work per chunk and per cut, not per record.
    """
    import numpy as np

    shards: list[list[tuple[int, int, int, int, int]]] = [[]]
    shard_docs = shard_bytes = 0
    for index, records_path in files:
        table = np.load(records_path, mmap_mode="r")
        doc_at = audit_at = doc_from = audit_from = 0
        for first in range(0, len(table), RECORDS_CHUNK):
            chunk = np.asarray(table[first:first + RECORDS_CHUNK])
            docs, text, rows = (np.cumsum(chunk[:, column]) for column in range(3))
            position = base_docs = base_bytes = 0
            while position < len(chunk):
                by_docs = np.searchsorted(docs[position:], config.docs_per_shard - shard_docs + base_docs, "left")
                by_bytes = np.searchsorted(text[position:], config.bytes_per_shard - shard_bytes + base_bytes, "left")
                cut = position + int(min(by_docs, by_bytes))
                if cut >= len(chunk):
                    break
                shards[-1].append((index, doc_from, doc_at + int(docs[cut]), audit_from, audit_at + int(rows[cut])))
                shards.append([])
                doc_from, audit_from = doc_at + int(docs[cut]), audit_at + int(rows[cut])
                shard_docs = shard_bytes = 0
                base_docs, base_bytes, position = int(docs[cut]), int(text[cut]), cut + 1
            shard_docs += int(docs[-1]) - base_docs
            shard_bytes += int(text[-1]) - base_bytes
            doc_at += int(docs[-1])
            audit_at += int(rows[-1])
        del table
        if doc_at > doc_from or audit_at > audit_from:
            shards[-1].append((index, doc_from, doc_at, audit_from, audit_at))
    return shards


def read_rows(path: str, start: int, stop: int, schema: pa.Schema) -> pa.Table:
    """Rows [start, stop) of an intermediate file, reading only the record batches that hold them."""
    if stop <= start:
        return schema.empty_table()
    reader = pa.ipc.open_file(pa.memory_map(path))
    groups = range(start // FILE_BATCH_ROWS, min((stop - 1) // FILE_BATCH_ROWS + 1, reader.num_record_batches))
    table = pa.Table.from_batches([reader.get_batch(group) for group in groups], schema=schema)
    rows = table.slice(start - groups[0] * FILE_BATCH_ROWS, stop - start)
    if rows.num_rows != stop - start:
        raise InputFileError(f"{path}: intermediate file has {table.num_rows} rows where {stop - start} were expected; nothing was published")
    return rows


def write_ingest_shard(index: int, pieces: list[tuple[int, int, int, int, int]], files: dict[int, tuple[str, str]],
                       link_rows: list[dict[str, Any]], work_dir: str) -> Any:
    """Task: one output shard from its slices of the files' documents and audit rows."""
    docs = [read_rows(files[file][0], doc_from, doc_to, DOC_SCHEMA) for file, doc_from, doc_to, _, _ in pieces]
    audit = [audit_table([{**row, "stage": STAGE} for row in link_rows])] if link_rows else []
    audit += [read_rows(files[file][1], audit_from, audit_to, AUDIT_SCHEMA) for file, _, _, audit_from, audit_to in pieces]
    kept = pa.concat_tables(docs).combine_chunks() if docs else DOC_SCHEMA.empty_table()
    rows = pa.concat_tables(audit).combine_chunks() if audit else AUDIT_SCHEMA.empty_table()
    return write_shard_files(Path(work_dir), STAGE, shard_name(index), kept, rows, None)


def file_jobs(plan: list[tuple[SourceSpec, list[Path]]], config: IngestConfig, parts_dir: str, workers: int,
              digest_urls: frozenset[str] = frozenset()) -> list[tuple]:
    """`ingest_file` jobs in stream order: one per file, or per byte range of a large uncompressed local JSONL file;
    a remote file in `digest_urls` is hashed by its job."""
    pieces = []  # (spec, path, None) or (spec, path, (start, stop))
    for spec, files in plan:
        for path in files:
            size = splittable(spec, path)
            starts = list(range(0, size, JSONL_SPLIT_BYTES)) if size else [None]
            pieces.extend((spec, path, (start, min(start + JSONL_SPLIT_BYTES, size)) if size else None) for start in starts)
    ranged = [(spec, path, *span) for spec, path, span in pieces if span is not None]
    counts = [0] * len(ranged)
    for index, count in map_shards(indexed_newlines, list(enumerate(ranged)), workers, "ingest line counts", [1] * len(ranged)):
        counts[index] = count
    jobs, before, ranged_index, last_path = [], 0, 0, None
    for index, (spec, path, span) in enumerate(pieces):
        if span is None:
            jobs.append((index, spec, path, config, parts_dir, None, isinstance(path, RemoteFile) and path.url in digest_urls))
            continue
        if path is not last_path:
            before, last_path = 0, path
        jobs.append((index, spec, path, config, parts_dir, (span[0], span[1], before)))
        before += counts[ranged_index]
        ranged_index += 1
    return jobs


def indexed_newlines(index: int, job: tuple) -> tuple[int, int]:
    return index, count_newlines(*job)


def run_ingest(specs: list[SourceSpec], config: IngestConfig, out_dir: Path, workers: int | None = None) -> StageManifest:
    """Read every source into shards; a no-op when the same files and config were already ingested."""
    workers = workers or default_workers()
    plan, skipped, link_rows = unique_files(specs)
    inputs, input_stats, deferred = input_listing(plan, Path(out_dir), workers)
    settings = {"ingest": asdict(config), "sources": [s.public() for s, _ in plan]}
    key = ""
    if deferred:  # new or changed remote files: the key needs their bytes, which the ingest tasks hash as they read
        key_needs_reading()
    else:
        key = stage_cache_key(STAGE, VERSION, settings, [i["sha256"] for i in inputs])
        if (published := published_under(Path(out_dir), key)) is not None:
            return published
    writer = StageWriter(STAGE, VERSION, settings, key, inputs, Path(out_dir))
    parts_dir = writer.work_dir / FILE_PARTS_DIR
    try:
        jobs = file_jobs(plan, config, str(parts_dir), workers, frozenset(deferred))
        files = sorted(map_shards(ingest_file, jobs, workers, STAGE, [1] * len(jobs)), key=lambda f: f.index)
        files = judge_split_files(jobs, files, config)
        bad = [f.bad for f in files if f.bad]
        if bad and config.on_bad_file != "quarantine":
            raise BadInputFiles(bad)
        if deferred:
            for url, sha in (f.digest for f in files if f.digest):
                inputs[deferred[url]]["sha256"] = sha
            writer.key = stage_cache_key(STAGE, VERSION, settings, [i["sha256"] for i in inputs])
            if (published := published_under(Path(out_dir), writer.key)) is not None:  # rewritten with the same bytes
                writer.abandon()
                return published
        pieces = next(iter(map_shards(shard_pieces, [([(f.index, f.records_path) for f in files], config)], workers, "ingest cuts", [1])))
        if len(pieces) > 1 and not pieces[-1]:
            pieces.pop()  # the stream ended exactly at a cut: no empty last shard (unless it is the only one)
        paths = {f.index: (f.docs_path, f.audit_path) for f in files}
        shard_jobs = [(index, shard, {file: paths[file] for file, *_ in shard}, link_rows if index == 0 else [], str(writer.work_dir))
                      for index, shard in enumerate(pieces)]
        sizes = [sum(doc_to - doc_from for _, doc_from, doc_to, _, _ in shard) for shard in pieces]
        for result in map_shards(write_ingest_shard, shard_jobs, workers, "ingest shards", sizes):
            writer.add_result(result)
        shutil.rmtree(parts_dir)
        return writer.publish({"skipped_duplicate_inputs": skipped, "sources": [s.public() for s, _ in plan]}, input_stats)
    except BaseException:
        writer.abandon()
        raise
