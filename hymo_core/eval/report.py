"""`hymo eval CKPT --suite NAME`: run a suite on a checkpoint, add held-out perplexity, write eval.json and eval.md.

The tokenizer and the validation split come from the corpus the checkpoint was
trained on: given with `corpus`, or found by walking up from the checkpoint to a
run directory whose `NN_shards/corpus.json` has the digest the checkpoint
recorded (a pretrain stage's checkpoints live inside their run directory).
Files are written atomically; the JSON keeps every item's scores so a
number in the table can be traced to the items behind it.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from hymo_core.checkpoint.load import load_model
from hymo_core.checkpoint.tokenizer_identity import check_corpus_tokenizer
from hymo_core.eval.heldout import HeldOutSet, evaluate_heldout
from hymo_core.train.data import CorpusError, CorpusReader
from hymo_core.eval.sandbox import memory_bound, require_isolation
from hymo_core.eval.metrics import bits_per_byte
from hymo_core.eval.suite import FEWSHOT_SEED, GENERATION_BATCH, SUITES, markdown_table, run_task
from hymo_core.eval.evaluation import load_tokenizer
from hymo_core.threads import ThreadChoice, choose_threads, using_threads

EVAL_JSON = "eval.json"
EVAL_MD = "eval.md"


def find_corpus(checkpoint: Path, digest: str) -> CorpusReader:
    """The corpus whose manifest digest is `digest`: the one a training directory above `checkpoint` recorded in its
    summary.json (`hymo train --out`), else the one in a run directory above it."""
    for directory in Path(checkpoint).resolve().parents:
        recorded = recorded_corpus(directory)
        if recorded is not None and recorded.get("digest") == digest and Path(recorded["path"]).is_file():
            return CorpusReader(recorded["path"])
        for manifest in sorted(directory.glob("[0-9][0-9]_shards/corpus.json")):
            reader = CorpusReader(manifest, verify=False)
            if reader.digest == digest:
                return CorpusReader(manifest)
    raise CorpusError(f"{checkpoint}: no run directory above it holds the corpus {digest[:12]}… it was trained on; pass --corpus")


def recorded_corpus(directory: Path) -> dict[str, Any] | None:
    """The corpus a training directory's summary.json records ({"path", "digest", "tokenizer_sha256"}), if any."""
    summary = Path(directory) / "summary.json"
    try:
        return json.loads(summary.read_text(encoding="utf-8")).get("corpus") if summary.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None


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
    """Token-weighted loss on the held-out windows the trainer validates on (`HeldOutSet.from_corpus`: eval_batches
    batches, round-robin over the sources and languages that lead them), so a checkpoint's held-out loss here is its
    training run's val_loss; and bits per byte, the same summed loss over the UTF-8 bytes its target tokens spell
    (OLMo/Paloma's; EOS targets add loss and no bytes). None without a full batch."""
    held = HeldOutSet.from_corpus(reader, train_config["seq_len"], train_config["batch_size"],
                                  max_batches=batches or train_config["eval_batches"])
    if len(held) < train_config["batch_size"]:
        return None
    result = evaluate_heldout(model, held, device)
    every = result.groups["all"]
    out = {"split": "validation", "windows": held.selection, "loss": every["loss"], "perplexity": math.exp(min(every["loss"], 50)),
           "ln_vocab": math.log(reader.vocab_size), "tokens": every["tokens"], "batches": held.batch_count(),
           "label": "the trainer's held-out set (val_loss in training/metrics.jsonl): eval_batches batches of validation windows"}
    if every["bytes"]:
        out.update({"bytes": every["bytes"], "bits_per_byte": bits_per_byte(every["loss"] * every["tokens"], every["bytes"]),
                    "bits_per_byte_label": "OLMo/Paloma bits per byte: summed loss / (ln 2 * UTF-8 bytes of the targets)",
                    "groups": {name: row for name, row in result.groups.items() if name != "all"}})
    return out


@contextlib.contextmanager
def pinned_threads(requested: int | None = None) -> Iterator[ThreadChoice]:
    """Intra-op threads from the project's one policy (--threads > HYMO_THREADS > OMP_NUM_THREADS > usable
    CPUs; `hymo_core.threads`) for the suite's duration, inter-op 1. The process's own count and variables come
    back afterwards: an eval inside a longer-lived process (a flow, a test session) must not become the next
    run's "HYMO_THREADS". Every sandboxed HumanEval program gets 1 (`sandbox.PROGRAM_THREADS`)."""
    with using_threads(choose_threads(requested)) as choice:
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set, or inter-op work has started in this process
            pass
        yield choice


def run_suite(checkpoint: str | Path, suite: str = "default", corpus: str | Path | None = None, limit: int | None = None,
              out: str | Path | None = None, device: torch.device | str = "cpu", mmlu_format: str = "rc",
              max_new_tokens: dict[str, int] | None = None, log: Any = print, unsafe_exec: bool = False, num_fewshot: int = 0,
              fewshot_seed: int = FEWSHOT_SEED, generation_batch_size: int = GENERATION_BATCH, threads: int | None = None) -> dict[str, Any]:
    """Every task of `suite`, then perplexity; returns the eval.json content. eval.json (and eval.md) in `out`
    are rewritten atomically after every task, so a killed eval keeps the tasks it finished.
    `generation_batch_size`: GSM8K / HumanEval prompts decoded together (no number depends on it).
    `threads`: intra-op threads (default: the thread policy's choice, recorded as eval.json's "threads")."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
    sandbox = require_isolation(unsafe_exec) if "humaneval" in SUITES[suite] else None  # refuse before loading anything
    with pinned_threads(threads) as choice:
        checkpoint = Path(checkpoint)
        device = torch.device(device)
        torch.manual_seed(0)  # nothing here samples; fixed anyway so a future sampled metric is reproducible
        model, payload = load_model(checkpoint, device)
        reader = CorpusReader(corpus) if corpus else find_corpus(checkpoint, payload["manifest_digest"])
        check_corpus_tokenizer(payload, checkpoint, reader)
        if reader.vocab_size != model.config.vocab_size:
            raise ValueError(f"{checkpoint}: vocab_size {model.config.vocab_size}, but {reader.path} has {reader.vocab_size}")
        tokenizer = load_tokenizer(reader.root / reader.manifest["tokenizer"]["path"])
        results: dict[str, Any] = {"checkpoint": str(checkpoint), "step": payload["state"]["step"], "suite": suite, "limit": limit,
                                   "num_fewshot": num_fewshot, "fewshot_seed": fewshot_seed if num_fewshot else None,
                                   "corpus": str(reader.path), "corpus_digest": reader.digest,
                                   "same_corpus": payload["manifest_digest"] == reader.digest, "sandbox": sandbox,
                                   "sandbox_memory": memory_bound(sandbox == "unsafe").to_json() if sandbox else None,
                                   "threads": choice.to_json(), "complete": False, "tasks": {}}
        for task in SUITES[suite]:
            started = time.perf_counter()
            results["tasks"][task] = run_task(task, model, tokenizer, limit=limit, eos_id=reader.eos_id, device=device,
                                              mmlu_format=mmlu_format, max_new_tokens=max_new_tokens, unsafe_exec=unsafe_exec,
                                              num_fewshot=num_fewshot, fewshot_seed=fewshot_seed,
                                              generation_batch_size=generation_batch_size)
            results["tasks"][task]["seconds"] = time.perf_counter() - started
            if out is not None:
                write_report(results, Path(out))  # before anything else can fail or be interrupted
            log(f"{task}: {results['tasks'][task]['items']} items in {results['tasks'][task]['seconds']:.1f} s")
        results["perplexity"] = held_out_perplexity(model, reader, payload["train_config"], device)
        results["complete"] = True
        if out is not None:
            write_report(results, Path(out))
        return results


def _atomic_write(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _finite(value: Any) -> Any:
    """NaN (a standard error of fewer than two items) as null: eval.json stays strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def write_report(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    _atomic_write(out / EVAL_JSON, json.dumps(_finite(results), indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    title = f"# {results['checkpoint']} (step {results['step']}), suite `{results['suite']}`" + (f", first {results['limit']} items per task" if results["limit"] else "")
    _atomic_write(out / EVAL_MD, title + "\n\n" + markdown_table(results))
