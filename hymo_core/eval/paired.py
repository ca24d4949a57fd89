"""Several checkpoints judged under one protocol: the same held-out windows and cloze items, paired differences.

Seed 001: when two checkpoints are evaluated on the same items, report the item
count and a paired comparison; whether two separate intervals overlap does not
decide it. So every checkpoint here is scored on one held-out set (the same
windows: the corpus's fixed set for the first checkpoint's window length, or
`batches` of its batch size when asked) and one cloze file,
and each later checkpoint is compared with the first item by item: the mean
difference, its standard error sd(d) / sqrt(n), and a 95 % interval.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import torch

from hymo_core.checkpoint.load import load_model
from hymo_core.checkpoint.tokenizer_identity import check_corpus_tokenizer
from hymo_core.eval.evaluation import SAMPLE_CLOZE, load_cloze, load_tokenizer, score_cloze
from hymo_core.eval.heldout import HeldOutSet, evaluate_heldout
from hymo_core.train.data import CorpusReader


def paired_difference(first: Sequence[float], other: Sequence[float]) -> dict[str, float]:
    """other - first, item by item: mean, standard error, 95 % interval, n."""
    if len(first) != len(other) or not first:
        raise ValueError(f"paired items must match one to one and be non-empty, got {len(first)} and {len(other)}")
    diffs = [b - a for a, b in zip(first, other)]
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) if n > 1 else 0.0
    se = sd / math.sqrt(n)
    return {"mean": mean, "stderr": se, "ci95_low": mean - 1.96 * se, "ci95_high": mean + 1.96 * se, "n": n}


def run_name(path: str | Path) -> str:
    """The training run a checkpoint belongs to: the directory above `checkpoints/` (or the checkpoint's own directory)."""
    path = Path(path).resolve()
    parent = path.parent
    return str(parent.parent if parent.name == "checkpoints" else parent)


def labels(rows: Sequence[dict[str, Any]]) -> list[str]:
    """`RUN@step` for each row, RUN the shortest tail of the run's path that tells the runs apart."""
    parts = [Path(r["run"]).parts for r in rows]
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        keyed = [f"{n}@{r['step']}" for n, r in zip(names, rows)]
        if len(set(keyed)) == len(keyed) or depth == max(len(p) for p in parts):
            break
    return [f"{n}@step {r['step']}" for n, r in zip(names, rows)]


def score_checkpoint(path: str | Path, held: HeldOutSet, reader: CorpusReader, cloze_items, device: torch.device) -> dict[str, Any]:
    model, payload = load_model(path, device)
    check_corpus_tokenizer(payload, path, reader)
    if model.config.vocab_size != reader.vocab_size:
        raise ValueError(f"{path}: vocab_size {model.config.vocab_size}, but {reader.path} has {reader.vocab_size}")
    result = evaluate_heldout(model, held, device)
    row: dict[str, Any] = {"checkpoint": str(path), "step": payload["state"]["step"], "run": run_name(path), "val_loss": result.loss,
                           "val_bpb": result.groups["all"]["bpb"], "groups": result.to_record()["groups"], "window_losses": result.window_losses,
                           "averaged_from": len(payload.get("averaged_from") or []) or None}
    if cloze_items is not None:
        scores = score_cloze(model, load_tokenizer(reader.root / reader.manifest["tokenizer"]["path"]), cloze_items, device)
        row["cloze_correct"] = [int(item["norm_pick"] == item["answer"]) for item in scores["per_item"]]
        row["cloze_accuracy"] = scores["accuracy_length_normalised"]
    return row


def compare_checkpoints(paths: Sequence[str | Path], corpus: str | Path, batches: int | None = None, cloze: str | Path | None = None,
                        device: torch.device | str = "cpu") -> dict[str, Any]:
    """Every checkpoint on the same windows and items; each later one paired against the first."""
    if len(paths) < 2:
        raise ValueError("a paired comparison needs at least two checkpoints")
    device = torch.device(device)
    reader = CorpusReader(corpus)
    _, first_payload = load_model(paths[0])
    recipe = first_payload["train_config"]
    held = (HeldOutSet.from_corpus(reader, recipe["seq_len"], recipe["batch_size"], max_batches=batches) if batches
            else HeldOutSet.corpus_default(reader, recipe["seq_len"], recipe["batch_size"]))
    if len(held) == 0:
        raise ValueError(f"{reader.path}: no validation window of {recipe['seq_len'] + 1} tokens to compare on")
    has_tokenizer = bool((reader.manifest.get("tokenizer") or {}).get("path"))
    items = load_cloze(cloze or SAMPLE_CLOZE) if has_tokenizer else None
    rows = [score_checkpoint(p, held, reader, items, device) for p in paths]
    base = rows[0]
    comparisons = []
    for row in rows[1:]:
        entry = {"checkpoint": row["checkpoint"], "against": base["checkpoint"],
                 "held_out_loss": paired_difference(base["window_losses"], row["window_losses"])}
        if items is not None:
            entry["cloze_accuracy"] = paired_difference(base["cloze_correct"], row["cloze_correct"])
        comparisons.append(entry)
    return {"corpus": str(reader.path), "windows": len(held), "selection": held.selection, "cloze_items": len(items) if items else 0,
            "checkpoints": [{k: v for k, v in r.items() if k not in ("window_losses", "cloze_correct")} for r in rows],
            "comparisons": comparisons}


def comparison_lines(result: dict[str, Any]) -> list[str]:
    """What `hymo eval A B ...` prints."""
    lines = [f"{len(result['checkpoints'])} checkpoints on the same {result['windows']} held-out windows ({result['selection']}) "
             f"and {result['cloze_items']} cloze items of {result['corpus']}"]
    names = labels(result["checkpoints"])
    for name, row in zip(names, result["checkpoints"]):
        cloze = f", cloze {row['cloze_accuracy']:.3f}" if "cloze_accuracy" in row else ""
        lines.append(f"  {name}: held-out loss {row['val_loss']:.4f}{cloze}  ({row['checkpoint']})")
    for index, entry in enumerate(result["comparisons"], 1):
        for metric, d in ((k, v) for k, v in entry.items() if isinstance(v, dict)):
            lines.append(f"  {names[index]} - {names[0]}: {metric} {d['mean']:+.4f} ± {d['stderr']:.4f} "
                         f"(95 % [{d['ci95_low']:+.4f}, {d['ci95_high']:+.4f}], n={d['n']} paired)")
    return lines
