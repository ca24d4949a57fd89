"""`[pretrain] nproc = 2` inside `hymo run`: the whole DAG ends in a two-rank torchrun training whose
sharded checkpoint the stage publishes and a single process can load."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO, write_pipeline_config


def test_hymo_run_with_pretrain_nproc_2_trains_on_two_ranks(prefect_harness: str, tmp_path: Path, monkeypatch) -> None:
    from datetime import datetime, timezone

    from hymo_core.checkpoint.load import load_model

    started = datetime.now(timezone.utc)

    config = write_pipeline_config(tmp_path / "config", extra="[pretrain]\nnproc = 2\n")
    out = tmp_path / "run"
    env = {**os.environ, "PREFECT_API_URL": prefect_harness, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "flows", "run", "--config", str(config), "--out", str(out)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    # Under torchrun too: the training lines in the run log and the live training artifact (read from metrics.jsonl).
    assert "train step 1/" in result.stdout + result.stderr
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    monkeypatch.setenv("PREFECT_API_URL", prefect_harness)
    with get_client(sync_client=True) as client:
        training = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["hymo-pretrain-training"])))
    assert any(a.created >= started and "| step | loss | lr | tokens/s |" in a.data for a in training)

    (stage,) = out.glob("*_pretrain")
    summary = json.loads((stage / "summary.json").read_text())
    assert summary["world_size"] == 2
    manifest = json.loads((stage / "manifest.json").read_text())
    assert manifest["complete"] is True
    published = json.dumps(manifest)
    assert "__0_0.distcp" in published and "__1_0.distcp" in published  # one shard file per rank, both in the manifest
    model, metadata = load_model(stage / summary["checkpoint"])  # resharded into this one process
    assert metadata["world_size"] == 2
    assert sum(p.numel() for p in model.parameters()) == summary["parameters"]
