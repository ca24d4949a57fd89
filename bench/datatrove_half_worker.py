"""Runs inside the datatrove bench venv (never imported by HyMo): FineWeb's processing chain over JSONL shards, stage by stage.

  <bench-venv>/bin/python bench/datatrove_half_worker.py SHARD_DIR WORK_DIR RESULT_JSON --lid-model lid.176.ftz \
      --tokenizer tokenizer.json [--workers 2]

The stages, each one LocalPipelineExecutor run (tasks = workers, except MinHash's bucket and cluster steps), as
datatrove's FineWeb example lays them out:
  langid   JsonlReader -> LanguageFilter(en, 0.65) -> JsonlWriter
  quality  JsonlReader -> GopherRepetitionFilter -> GopherQualityFilter -> C4QualityFilter(filter_no_terminal_punct=False)
           -> FineWebQualityFilter -> JsonlWriter
  mh1..4   the 4-stage MinHash dedup, MinhashConfig() defaults (5-grams, 14 buckets x 8 hashes); mh4 writes the removed
           documents through an exclusion writer
  tokenize JsonlReader -> PIIFormatter -> DocumentTokenizer(tokenizer.json, eos <|endoftext|>, shuffled)
LanguageFilter downloads nothing: its FT176LID is replaced by one that loads --lid-model (HyMo's bundled lid.176.ftz,
the compressed form of the lid.176.bin datatrove would fetch; same labels). Each stage's start and end (time.time())
go to RESULT_JSON, with the ids kept after langid and quality, the ids MinHash removed, and the token count.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def local_lid(model_path: str, languages: list[str]):
    """datatrove's lid.176 predictor, loading a local model file instead of downloading one."""
    from datatrove.utils.lid import FT176LID

    class LocalFT176LID(FT176LID):
        @property
        def model(self):
            if self._model is None:
                from fasttext.FastText import _FastText

                self._model = _FastText(model_path)
            return self._model

    return LocalFT176LID(languages)


def read_ids(folder: Path) -> list[str]:
    ids = []
    for path in sorted(folder.glob("*.jsonl")):
        with path.open(encoding="utf-8") as handle:
            ids.extend(json.loads(line)["id"] for line in handle if line.strip())
    return ids


def stages(args: argparse.Namespace, work: Path) -> list[tuple[str, object]]:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import MinhashDedupSignature
    from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter
    from datatrove.pipeline.filters import C4QualityFilter, FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter, LanguageFilter
    from datatrove.pipeline.formatters import PIIFormatter
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import DocumentTokenizer
    from datatrove.pipeline.writers import JsonlWriter

    workers = args.workers

    def reader(folder: Path | str):
        return JsonlReader(str(folder), glob_pattern="*.jsonl", text_key="text", id_key="id")

    def executor(name: str, pipeline: list, tasks: int = workers, pool: int = workers):
        return LocalPipelineExecutor(pipeline, tasks=tasks, workers=pool, logging_dir=str(work / "logs" / name))

    language = LanguageFilter(languages=["en"], language_threshold=0.65)
    language.model = local_lid(args.lid_model, ["en"])
    config = MinhashConfig()
    return [
        ("langid", executor("langid", [reader(args.shards), language, JsonlWriter(str(work / "langid"), compression=None)])),
        ("quality", executor("quality", [reader(work / "langid"), GopherRepetitionFilter(), GopherQualityFilter(),
                                         C4QualityFilter(filter_no_terminal_punct=False), FineWebQualityFilter(),
                                         JsonlWriter(str(work / "quality"), compression=None)])),
        ("minhash_signatures", executor("mh1", [reader(work / "quality"),
                                                MinhashDedupSignature(output_folder=str(work / "sigs"), config=config, language="en")])),
        ("minhash_buckets", executor("mh2", [MinhashDedupBuckets(input_folder=str(work / "sigs"), output_folder=str(work / "buckets"),
                                                                 config=config)], tasks=config.num_buckets)),
        ("minhash_cluster", executor("mh3", [MinhashDedupCluster(input_folder=str(work / "buckets"), output_folder=str(work / "remove_ids"),
                                                                 config=config)], tasks=1, pool=1)),
        ("minhash_filter", executor("mh4", [reader(work / "quality"),
                                            MinhashDedupFilter(input_folder=str(work / "remove_ids"),
                                                               exclusion_writer=JsonlWriter(str(work / "removed"), compression=None)),
                                            JsonlWriter(str(work / "deduped"), compression=None)])),
        ("tokenize", executor("tokenize", [reader(work / "deduped"), PIIFormatter(),
                                           DocumentTokenizer(output_folder=str(work / "tokens"), tokenizer_name_or_path=args.tokenizer,
                                                             eos_token="<|endoftext|>", seed=0)])),
    ]


def token_count(work: Path) -> int:
    total = 0
    for path in (work / "tokens").glob("*.metadata"):
        first = path.read_text(encoding="utf-8").splitlines()[1:2]
        total += int(first[0]) if first and first[0].strip().isdigit() else 0
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shards")
    parser.add_argument("work")
    parser.add_argument("result")
    parser.add_argument("--lid-model", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    work = Path(args.work)
    timeline = {}
    for name, executor in stages(args, work):
        started = time.time()
        executor.run()
        timeline[name] = [started, time.time()]
    from importlib.metadata import version

    Path(args.result).write_text(json.dumps({
        "version": version("datatrove"), "timeline": timeline, "kept_langid": read_ids(work / "langid"),
        "kept_quality": read_ids(work / "quality"), "removed_dedup": read_ids(work / "removed"), "tokens": token_count(work)}))


if __name__ == "__main__":
    main()
