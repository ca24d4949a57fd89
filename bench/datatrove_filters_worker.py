"""Runs inside the datatrove bench venv (never imported by HyMo): times datatrove's filter chain, records its decisions.

  <bench-venv>/bin/python bench/datatrove_filters_worker.py SHARD_DIR OUT_JSON --workers 2

1. The chain GopherQuality -> GopherRepetition -> C4Quality -> FineWebQuality with
   LocalPipelineExecutor(tasks=workers, workers=workers), reader and writer
   included, wall time of executor.run().
2. One process, every filter applied on its own to every document's original
   text: its keep/drop and reason (for the agreement table) and the CPU seconds
   (time.process_time) each filter spent on each document. The chain's CPU cost
   is then the sum, per document, of the filters up to its first failure —
   robust to other load on a shared machine, unlike wall time.
C4 is configured with the TFDS numbers (5 words per line, 3 sentences), as HyMo is.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def whitespace_tokenizer():
    """datatrove's filters with HyMo's tokenisation: whitespace words, sentences ending at . ! ? runs."""
    import re

    from datatrove.utils.word_tokenizers import WordTokenizer

    sentence_end = re.compile(r"[.!?]+[\"')\]]*(?=\s|$)")

    class WhitespaceTokenizer(WordTokenizer):
        def word_tokenize(self, text):
            return text.split()

        def span_tokenize(self, text):
            ends = [m.end() for m in sentence_end.finditer(text)] or [len(text)]
            return list(zip([0] + ends[:-1], ends))

        def sent_tokenize(self, text):
            return [text[a:b] for a, b in self.span_tokenize(text)]

    return WhitespaceTokenizer("en")


def build_filters(language=None):
    from datatrove.pipeline.filters import C4QualityFilter, FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter

    kwargs = {} if language is None else {"language": language}
    return {
        "gopher_quality": GopherQualityFilter(**kwargs),
        "gopher_repetition": GopherRepetitionFilter(**kwargs),
        "c4": C4QualityFilter(min_words_per_line=5, min_num_sentences=3, **kwargs),
        "fineweb": FineWebQualityFilter(**kwargs),
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


def per_document(shard_dir: Path) -> tuple[dict, dict, float]:
    from datatrove.data import Document

    filters = build_filters()
    aligned = build_filters(whitespace_tokenizer())
    seconds = {name: 0.0 for name in filters}
    decisions: dict[str, dict] = {}
    chain_cpu = 0.0
    for shard in sorted(shard_dir.glob("*.jsonl")):
        for line in shard.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            row = {}
            failed = False
            for name, step in filters.items():  # chain order
                doc = Document(text=record["text"], id=record["id"])
                started = time.process_time()
                result = step.filter(doc)
                spent = time.process_time() - started
                seconds[name] += spent
                if not failed:
                    chain_cpu += spent
                keep, reason = (result, None) if isinstance(result, bool) else result
                failed = failed or not keep
                row[name] = [bool(keep), reason]
                result = aligned[name].filter(Document(text=record["text"], id=record["id"]))
                keep, reason = (result, None) if isinstance(result, bool) else result
                row[name + "_ws"] = [bool(keep), reason]
            decisions[record["id"]] = row
    return decisions, seconds, chain_cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shard_dir")
    parser.add_argument("out_json")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--work", default="/tmp/hymo-bench-datatrove")
    args = parser.parse_args()
    work = Path(args.work)
    chain_s = run_chain(Path(args.shard_dir), work, args.workers)
    decisions, seconds, chain_cpu = per_document(Path(args.shard_dir))
    from importlib.metadata import version

    Path(args.out_json).write_text(json.dumps({"version": version("datatrove"), "chain_wall_s": chain_s, "chain_cpu_s": chain_cpu,
                                               "filter_cpu_s": seconds, "decisions": decisions}))


if __name__ == "__main__":
    main()
