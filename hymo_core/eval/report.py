"""`hymo eval CKPT --suite NAME`: run a suite on a checkpoint, add held-out perplexity, write eval.json and eval.md.

The tokenizer and the validation split come from the corpus the checkpoint was
trained on: given with `corpus`, or found by walking up from the checkpoint to a
run directory whose `NN_shards/corpus.json` has the digest the checkpoint
recorded (a pretrain stage's checkpoints live inside their run directory).
Files are written atomically; the JSON keeps every item's scores so a
number in the table can be traced to the items behind it.
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from hymo_core.checkpoint.load import load_model
from hymo_core.train.data import CorpusError, CorpusReader, ValidationLoader
from hymo_core.eval.sandbox import require_isolation
from hymo_core.eval.suite import SUITES, markdown_table, run_task
from hymo_core.eval.evaluation import load_tokenizer
from hymo_core.train.trainer import evaluate

EVAL_JSON = "eval.json"
EVAL_MD = "eval.md"


def find_corpus(checkpoint: Path, digest: str) -> CorpusReader:
    """The corpus of the run directory above `checkpoint` whose manifest digest is `digest`."""
    for directory in Path(checkpoint).resolve().parents:
        for manifest in sorted(directory.glob("[0-9][0-9]_shards/corpus.json")):
            reader = CorpusReader(manifest, verify=False)
            if reader.digest == digest:
                return CorpusReader(manifest)
    raise CorpusError(f"{checkpoint}: no run directory above it holds the corpus {digest[:12]}… it was trained on; pass --corpus")


def default_out(checkpoint: str | Path) -> Path:
    """RUN/eval/NN_stage-STEP for a published stage's checkpoint (a stage directory is never written after
    it is published), else CKPT_DIR/../eval/STEP."""
    checkpoint = Path(checkpoint).resolve()
    owner = checkpoint.parent.parent
    if (owner / "manifest.json").is_file() and owner.name[:2].isdigit():
        return owner.parent / "eval" / f"{owner.name}-{checkpoint.stem}"
    return owner / "eval" / checkpoint.stem


def held_out_perplexity(model: torch.nn.Module, reader: CorpusReader, train_config: dict[str, Any], device: torch.device,
                        batches: int | None = None) -> dict[str, Any] | None:
    """Token-weighted loss on the fixed validation prefix the trainer validates on; None without a full batch."""
    loader = ValidationLoader(reader, train_config["seq_len"], train_config["batch_size"], max_batches=batches or train_config["eval_batches"])
    if len(loader) == 0:
        return None
    loss = evaluate(model, loader, device)
    return {"split": "validation", "loss": loss, "perplexity": math.exp(min(loss, 50)), "ln_vocab": math.log(reader.vocab_size),
            "tokens": len(loader) * train_config["batch_size"] * train_config["seq_len"], "batches": len(loader)}


def run_suite(checkpoint: str | Path, suite: str = "default", corpus: str | Path | None = None, limit: int | None = None,
              out: str | Path | None = None, device: torch.device | str = "cpu", mmlu_format: str = "rc",
              max_new_tokens: dict[str, int] | None = None, log: Any = print, unsafe_exec: bool = False) -> dict[str, Any]:
    """Every task of `suite`, then perplexity; returns the eval.json content and writes it (and eval.md) into `out`."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
    sandbox = require_isolation(unsafe_exec) if "humaneval" in SUITES[suite] else None  # refuse before loading anything
    checkpoint = Path(checkpoint)
    device = torch.device(device)
    torch.manual_seed(0)  # nothing here samples; fixed anyway so a future sampled metric is reproducible
    model, payload = load_model(checkpoint, device)
    reader = CorpusReader(corpus) if corpus else find_corpus(checkpoint, payload["manifest_digest"])
    if reader.vocab_size != model.config.vocab_size:
        raise ValueError(f"{checkpoint}: vocab_size {model.config.vocab_size}, but {reader.path} has {reader.vocab_size}")
    tokenizer = load_tokenizer(reader.root / reader.manifest["tokenizer"]["path"])
    results: dict[str, Any] = {"checkpoint": str(checkpoint), "step": payload["state"]["step"], "suite": suite, "limit": limit,
                               "corpus": str(reader.path), "corpus_digest": reader.digest,
                               "same_corpus": payload["manifest_digest"] == reader.digest, "sandbox": sandbox, "tasks": {}}
    for task in SUITES[suite]:
        started = time.perf_counter()
        results["tasks"][task] = run_task(task, model, tokenizer, limit=limit, eos_id=reader.eos_id, device=device,
                                          mmlu_format=mmlu_format, max_new_tokens=max_new_tokens, unsafe_exec=unsafe_exec)
        results["tasks"][task]["seconds"] = time.perf_counter() - started
        log(f"{task}: {results['tasks'][task]['items']} items in {results['tasks'][task]['seconds']:.1f} s")
    results["perplexity"] = held_out_perplexity(model, reader, payload["train_config"], device)
    if out is not None:
        write_report(results, Path(out))
    return results


def _atomic_write(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def write_report(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    _atomic_write(out / EVAL_JSON, json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    title = f"# {results['checkpoint']} (step {results['step']}), suite `{results['suite']}`" + (f", first {results['limit']} items per task" if results["limit"] else "")
    _atomic_write(out / EVAL_MD, title + "\n\n" + markdown_table(results))
