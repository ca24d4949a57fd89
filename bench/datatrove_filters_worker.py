"""Runs inside the datatrove bench venv (never imported by HyMo): times datatrove's filter chain, records its decisions.

  <bench-venv>/bin/python bench/datatrove_filters_worker.py SHARD_DIR OUT_JSON --workers 2

1. The chain GopherQuality -> GopherRepetition -> C4Quality -> FineWebQuality with
   LocalPipelineExecutor(tasks=workers, workers=workers), reader and writer
   included, wall time of executor.run().
2. One process, every filter applied on its own to every document's original
   text: its keep/drop and reason (for the agreement table) and CPU seconds per filter.
C4 is configured with the TFDS numbers (5 words per line, 3 sentences), as HyMo is.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def build_filters():
    from datatrove.pipeline.filters import C4QualityFilter, FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter

    return {
        "gopher_quality": GopherQualityFilter(),
        "gopher_repetition": GopherRepetitionFilter(),
        "c4": C4QualityFilter(min_words_per_line=5, min_num_sentences=3),
        "fineweb": FineWebQualityFilter(),
    }


def run_chain(shard_dir: Path, out_dir: Path, workers: int) -> float:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    filters = build_filters()
    pipeline = [JsonlReader(str(shard_dir), glob_pattern="*.jsonl", text_key="text", id_key="id"),
                filters["gopher_quality"], filters["gopher_repetition"], filters["c4"], filters["fineweb"],
                JsonlWriter(str(out_dir / "kept"), compression=None)]
    executor = LocalPipelineExecutor(pipeline, tasks=workers, workers=workers, logging_dir=str(out_dir / "logs"))
    started = time.perf_counter()
    executor.run()
    return time.perf_counter() - started


def per_document(shard_dir: Path) -> tuple[dict, dict]:
    from datatrove.data import Document

    filters = build_filters()
    seconds = {name: 0.0 for name in filters}
    decisions: dict[str, dict] = {}
    for shard in sorted(shard_dir.glob("*.jsonl")):
        for line in shard.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            row = {}
            for name, step in filters.items():
                doc = Document(text=record["text"], id=record["id"])
                started = time.perf_counter()
                result = step.filter(doc)
                seconds[name] += time.perf_counter() - started
                keep, reason = (result, None) if isinstance(result, bool) else result
                row[name] = [bool(keep), reason]
            decisions[record["id"]] = row
    return decisions, seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shard_dir")
    parser.add_argument("out_json")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--work", default="/tmp/hymo-bench-datatrove")
    args = parser.parse_args()
    import datatrove

    work = Path(args.work)
    chain_s = run_chain(Path(args.shard_dir), work, args.workers)
    decisions, seconds = per_document(Path(args.shard_dir))
    Path(args.out_json).write_text(json.dumps({"version": datatrove.__version__ if hasattr(datatrove, "__version__") else "?",
                                               "chain_wall_s": chain_s, "filter_cpu_s": seconds, "decisions": decisions}))


if __name__ == "__main__":
    main()
