"""Fixtures for stage tests: publish documents as an upstream stage directory."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from manifests.schema import DOC_SCHEMA
from tasks.stage_runner import StageWriter


def publish_docs(out_dir: Path, texts_by_id: dict[str, str], shards: int = 1) -> Path:
    """An `ingest`-like stage holding these documents, split round-robin over `shards` shards."""
    ids = list(texts_by_id)
    writer = StageWriter("ingest", "test", {}, f"test-{out_dir.name}-{shards}", [], out_dir)
    for shard in range(shards):
        shard_ids = ids[shard::shards]
        n = len(shard_ids)
        table = pa.table({"id": shard_ids, "text": [texts_by_id[i] for i in shard_ids], "source": ["test"] * n,
                          "url": [f"test://{i}" for i in shard_ids], "lang": pa.nulls(n, pa.string()),
                          "lang_score": pa.nulls(n, pa.float32()), "meta": ["{}"] * n}, schema=DOC_SCHEMA)
        writer.write_shard(shard, table, [])
    writer.publish()
    return out_dir


@pytest.fixture
def upstream(tmp_path: Path):
    def make(texts_by_id: dict[str, str], shards: int = 1, name: str = "ingest") -> Path:
        return publish_docs(tmp_path / name, texts_by_id, shards)
    return make
