"""Digest every file of a run directory, so a refactor can show that the sample's outputs did not change.

    hymo run --config bench/sample_digests.toml --out runs/digests      # on main, then on the change
    python bench/sample_digests.py runs/digests --record bench/sample_digests.json   # on main
    python bench/sample_digests.py runs/digests --check bench/sample_digests.json    # on the change: prints a table

The recorded list (bench/sample_digests.json) was recorded on the layout move; the move's parent
commit gave the same digests (docs/benchmarks-history.md, "Layout move: the sample's outputs unchanged").
Re-recorded by this script on issue 45's document ids (they hash the snapshot and the file inside
the source, so every id changed, and with the ids the dedup keepers, the split and every later file). Re-recorded on issue 56's audit evidence: against the same run on its
parent commit only audit files (and the manifests listing their sha256) differ, by added `detail.edits`
and exact_duplicate's value and threshold; the recording before it no longer matched main's manifests.
Re-recorded after round 5's merge (issues 53-58): against the issue 56 recording, every data, audit and token file
is equal; new are langid's and quality's stats/ samples (the report page's histograms) and report.html; changed are
the manifests listing them (stage versions 2), config.json and ingest's manifest (`max_malformed_share`, issue 55),
and pretrain's checkpoint and metrics: the optimizer batched per shape group and the fused head + loss sum in
another order (equal within fp32 rounding, tests/hymo_core/train/test_optimizer_launches.py and test_step_traffic.py).

Data, audit and token files are hashed byte for byte. What legitimately differs between two runs of
equal outputs is left out, and only that: in JSON files the timings, the code version, the config's directory (the checkout's path) and the keys
that digest code (a stage's cache key digests its rule modules' syntax trees, so moving a module
changes it, and with it every later stage's input digest and manifest digest), and in a manifest the
byte digests of the JSON and checkpoint files it lists (those are compared normalised); in checkpoints, the
pickle's bytes (they name the optimizer's module) -- a checkpoint is digested as its tensors and
counters instead; in metrics, the timings.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

# Keys whose values depend on the code's text or on the clock, not on the outputs.
VOLATILE_KEYS = {"cache_key", "code_version", "wall_time_s", "session_seconds", "tokens_per_s", "step_seconds", "elapsed_s",
                 "data_wait_s", "seconds", "utilisation", "device_flops", "data_wait_fraction", "max_data_wait_s", "compute_s",
                 "model_flops_per_s", "mfu", "peak_memory_bytes",
                 "config_dir"}  # where the checkout lies (relative plugin paths resolve against it), not an output
MANIFEST_DIGESTS = {"digest"}  # manifest.json's own digest and its inputs' digests fold in the cache key


def _strip(value: Any, drop: set[str]) -> Any:
    """`value` without volatile keys (and `*_seconds` timings); bundled files named from the package root on."""
    if isinstance(value, dict):
        return {k: _strip(v, drop) for k, v in value.items() if k not in drop and not k.endswith("_seconds")}
    if isinstance(value, list):
        return [_strip(v, drop) for v in value]
    if isinstance(value, str) and value.startswith("/") and "/manifests/" in value:
        return "manifests/" + value.split("/manifests/", 1)[1]  # where the checkout lies is not an output
    return value


def _json_digest(path: Path) -> str:
    drop = VOLATILE_KEYS | (MANIFEST_DIGESTS if path.name == "manifest.json" else set())
    if path.suffix == ".jsonl":
        records = [_strip(json.loads(line), drop) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        records = _strip(json.loads(path.read_text(encoding="utf-8")), drop)
    if path.name == "manifest.json":  # files compared by their normalised digest are not compared by their bytes here
        for output in records.get("outputs", []):
            if output["path"].endswith((".json", ".jsonl", ".pt")):
                output.pop("sha256", None)
    return hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()


def _tensor_digest(value: Any, digest: Any) -> None:
    import torch

    if isinstance(value, torch.Tensor):
        digest.update(str(value.dtype).encode() + str(tuple(value.shape)).encode())
        digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            if key not in VOLATILE_KEYS and key != "optimizer_type":
                digest.update(str(key).encode())
                _tensor_digest(value[key], digest)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _tensor_digest(item, digest)
    else:
        digest.update(repr(value).encode())


def _checkpoint_digest(path: Path) -> str:
    import torch

    payload = torch.load(path, map_location="cpu", weights_only=True)
    digest = hashlib.sha256()
    _tensor_digest({k: v for k, v in payload.items() if k not in ("runtime",)}, digest)
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    if path.suffix in (".json", ".jsonl"):
        return _json_digest(path)
    if path.suffix == ".pt":
        return _checkpoint_digest(path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_digests(run: Path) -> dict[str, str]:
    """Relative path -> digest for every published file of the run directory. Hidden files and directories
    (the run lock, Prefect's cache records named by cache key, file-stat records with inodes, a stage's
    work directory) are plumbing, not outputs."""
    return {str(path.relative_to(run)): file_digest(path) for path in sorted(run.rglob("*"))
            if path.is_file() and not any(part.startswith(".") for part in path.relative_to(run).parts)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--record", type=Path, help="write the digest list here")
    group.add_argument("--check", type=Path, help="compare with the digest list recorded here")
    args = parser.parse_args(argv)
    digests = run_digests(args.run)
    if args.record:
        args.record.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"{len(digests)} files recorded in {args.record}")
        return 0
    recorded = json.loads(args.check.read_text(encoding="utf-8"))
    missing = sorted(set(recorded) - set(digests))
    extra = sorted(set(digests) - set(recorded))
    changed = sorted(p for p in set(recorded) & set(digests) if recorded[p] != digests[p])
    print("| files | equal | changed | missing | new |\n|---|---|---|---|---|")
    print(f"| {len(recorded)} | {len(recorded) - len(changed) - len(missing)} | {len(changed)} | {len(missing)} | {len(extra)} |")
    for label, paths in (("changed", changed), ("missing", missing), ("new", extra)):
        for path in paths:
            print(f"{label}: {path}")
    return 1 if changed or missing or extra else 0


if __name__ == "__main__":
    sys.exit(main())
