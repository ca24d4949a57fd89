"""Prefect's task cache, keyed by the stage contract: Prefect's own "Cached" state, refresh_cache and retries.

The key is the stage-contract key (stage, version, config, input digests) that the
stage itself computes: the stage function is run under `probing()`, which stops at
its cache check. The key is valid only while the published stage verifies:

* published under the key, files intact (stat or sha256)  -> the key; Prefect
  finds the record and the task run is "Cached" (or, with no record yet, runs,
  finds the stage published, and records it);
* published under the key but a file changed or vanished   -> no key: the task
  runs and recomputes, Prefect reads no record;
* not published under this key (new config, new inputs)     -> the key; no
  record can exist (see below), the task computes and records.

Records are kept inside the stage directory (`NN_stage/.prefect-cache/`): a stage
that is recomputed is swapped in as a new directory, so records of an output
that no longer exists go away with it, and a copied run directory keeps its cache.
"""
from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect.cache_policies import CachePolicy

from manifests.stage_manifest import MANIFEST_NAME
from tasks.runner.stage_runner import StageWouldRun, probing

from flows.stages import previous_stage_path, stage_entry, stage_path

CACHE_DIR = ".prefect-cache"


def record_dir(run: Path, name: str, config: Any) -> Path:
    """Where Prefect keeps this stage's cache records (an absolute path: workers may change directory)."""
    return (stage_path(Path(run), name, config) / CACHE_DIR).resolve()


def drop_failure_record(stage_dir: Path) -> None:
    """After a failed stage task: Prefect stores the task's exception as a result record in the stage's record
    folder, and for a stage that never published, that record would be the only thing in its directory (a run
    stopped by a bad input file, a pretrain refusing a stale corpus). The record is never read (Prefect caches
    completed runs only), so the directory goes: a failed stage leaves nothing behind."""
    if (Path(stage_dir) / MANIFEST_NAME).exists():
        return  # a published stage: its records describe what it published
    shutil.rmtree(Path(stage_dir) / CACHE_DIR, ignore_errors=True)
    with contextlib.suppress(OSError):
        Path(stage_dir).rmdir()  # only when empty


def contract_key(name: str, config: Any, run: Path) -> str | None:
    """The stage-contract key when it can be trusted as a Prefect cache key, else None (see module doc)."""
    with probing():
        try:
            entry = stage_entry(config, name)
            manifest = entry.run(config, run, previous_stage_path(run, name, config), stage_path(run, name, config))
        except StageWouldRun as miss:
            return None if miss.published_key == miss.key else miss.key
        except Exception:  # e.g. a missing input: the task itself runs and reports it in its own words
            return None
    return manifest.cache_key


@dataclass
class StageContractCache(CachePolicy):
    """Cache key of a stage task: its stage-contract key (the task's `name`, `config` and `run` parameters)."""

    def compute_key(self, task_ctx: Any, inputs: dict[str, Any], flow_parameters: dict[str, Any], **kwargs: Any) -> str | None:
        return contract_key(inputs["name"], inputs["config"], Path(inputs["run"]))


STAGE_CONTRACT = StageContractCache()
