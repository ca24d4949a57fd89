"""Fixtures for stage tests: publish documents as an upstream stage directory."""
from __future__ import annotations

from pathlib import Path

import pytest

from manifests.schema import docs_table
from tasks.stage_runner import StageWriter


def publish_docs(out_dir: Path, texts_by_id: dict[str, str], shards: int = 1) -> Path:
    """An `ingest`-like stage holding these documents, split round-robin over `shards` shards."""
    ids = list(texts_by_id)
    writer = StageWriter("ingest", "test", {}, f"test-{out_dir.name}-{shards}", [], out_dir)
    for shard in range(shards):
        rows = [{"id": doc_id, "text": texts_by_id[doc_id], "source": "test", "url": f"test://{doc_id}", "lang": None,
                 "lang_score": None, "meta": {}} for doc_id in ids[shard::shards]]
        writer.write_shard(shard, docs_table(rows), [])
    writer.publish()
    return out_dir


@pytest.fixture
def upstream(tmp_path: Path):
    def make(texts_by_id: dict[str, str], shards: int = 1, name: str = "ingest") -> Path:
        return publish_docs(tmp_path / name, texts_by_id, shards)
    return make
