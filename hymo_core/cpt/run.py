"""Continued pretraining from a base checkpoint on a domain corpus with general replay, judged by a gate fixed in advance.

Seed 001 (CPT section, Lab 5). In order:

1. the gate file is written into OUT (or copied there) and parsed; the base
   checkpoint, both corpora and their shared tokenizer are checked;
2. the base is measured: per-sequence and per-document loss on fixed domain
   and general held-out batches (the first `eval_batches` validation batches
   of each, through the training run's held-out machinery,
   hymo_core.eval.heldout, so each eval row also has its loss per source and
   language), and, if the gate asks, per-item correctness on the first N task items;
3. `cpt_manifest.json` records the gate's sha256, the lineage (base file
   and weights digests, corpus digests) and the recipe; only then
4. training starts: a fresh optimizer (the base's moments are not reused),
   warmup then cosine to `min_lr_ratio * peak_lr`, batches from
   `ReplayLoader`, held-out losses logged every `eval_interval` updates,
   the gate's hash re-checked at each of those and at the end;
5. the same measurements on the result go to `measurements.json`, and the
   verdict is computed from the gate file (re-hashed) and those numbers only,
   into `summary.json` with the lineage base → CPT checkpoint → verdict.

The trainer's loop (`hymo_core.train.trainer.train`) runs the updates unchanged;
this module only wires loaders, hooks and bookkeeping around it.
"""
from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

from hymo_core.checkpoint.common import weights_sha256
from hymo_core.cpt.config import CptConfig  # noqa: F401 (re-exported: the recipe beside its runner)
from hymo_core.checkpoint.load import load_model
from hymo_core.checkpoint.tokenizer_identity import check_corpus_tokenizer
from hymo_core.checkpoint.single import save_checkpoint
from hymo_core.eval.heldout import HeldOutSet, evaluate_heldout
from hymo_core.train.data import CorpusError, CorpusReader, TokenLoader
from manifests.staleness import refuse_stale_corpus
from hymo_core.cpt.gate import GATE_FILE, Criterion, GateError, GateTampered, check_sample_sizes, gate_text, judge, parse_gate, read_gate
from hymo_core.train.optim import build_optimizer
from hymo_core.cpt.ledger import append_record, canonical_sha256, default_ledger
from hymo_core.cpt.replay import ReplayLoader
from hymo_core.train.trainer import TrainHooks, TrainState, train
from manifests.digest import sha256_file

MANIFEST_FILE = "cpt_manifest.json"
MEASUREMENTS_FILE = "measurements.json"
SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"
LAB5_GATE = (Criterion("domain_loss_reduction", ">=", 1.00), Criterion("general_loss_rise", "<=", 0.20))  # seed 001, Lab 5's toy gate


# ---------------------------------------------------------------- measurements


def held_out_set(reader: CorpusReader, seq_len: int, batch_size: int, eval_batches: int) -> HeldOutSet:
    """The first `eval_batches` validation batches, in order (not balanced): the gate pairs on fixed documents."""
    return HeldOutSet.from_corpus(reader, seq_len, batch_size, max_batches=eval_batches, balanced=False)


def held_out_losses(model: nn.Module, held: HeldOutSet, device: torch.device, eos_id: int | None = None) -> dict[str, Any]:
    """Mean cross-entropy of every held-out sequence, in window order, and per whole document (the unit
    the gate pairs on): summed loss and token count of each run of targets ending in EOS (or at a shard's
    or the prefix's end). The windows are consecutive and their targets do not overlap, so each target
    token belongs to exactly one document. `groups`: the loss per source and language of the same tokens.

    The losses come from `evaluate_heldout` (mode, attention probe and every RNG restored afterwards).
    """
    result = evaluate_heldout(model, held, device, token_losses=True)
    ce_WT = result.token_losses_WT
    doc_sums: list[float] = []
    doc_tokens: list[int] = []
    open_sum, open_tokens, shard = 0.0, 0, None
    for _, y_BT, rows in held.batches():
        for row, window in enumerate(range(rows.start, rows.start + y_BT.shape[0])):
            window_shard = int(held.windows[window][0])
            if window_shard != shard and open_tokens:
                doc_sums.append(open_sum), doc_tokens.append(open_tokens)
                open_sum, open_tokens = 0.0, 0
            shard = window_shard
            ends = (y_BT[row] == eos_id).nonzero().flatten().tolist() if eos_id is not None else []
            start = 0
            for end in [*ends, y_BT.shape[1] - 1]:
                open_sum += float(ce_WT[window, start:end + 1].sum())
                open_tokens += end + 1 - start
                start = end + 1
                if end in ends:
                    doc_sums.append(open_sum), doc_tokens.append(open_tokens)
                    open_sum, open_tokens = 0.0, 0
    if open_tokens:
        doc_sums.append(open_sum), doc_tokens.append(open_tokens)
    return {"sequences": ce_WT.mean(dim=1).tolist(), "doc_loss_sums": doc_sums, "doc_tokens": doc_tokens,
            "groups": result.to_record()["groups"]}


def task_correct(model: nn.Module, tokenizer, eos_id: int, task: str, items: int, device: torch.device) -> list[int]:
    """1/0 per item (length-normalised pick, the suite's headline) on the first `items` items of `task`."""
    from hymo_core.eval.suite import run_task

    result = run_task(task, model, tokenizer, limit=items, eos_id=eos_id, device=device)
    if "per_item" not in result or "pick_per_char" not in result["per_item"][0]:
        raise GateError(f"gate task {task!r} is not a multiple-choice task of the suite")
    return [int(row["pick_per_char"] == row["answer"]) for row in result["per_item"]]


def measure(model: nn.Module, held_out: dict[str, HeldOutSet], tasks: Sequence[Criterion], tokenizer, eos_id: int,
            device: torch.device, groups: dict[str, dict[str, Any]] | None = None) -> dict[str, list]:
    """The paired units (per-sequence and per-document losses, per-item task correctness); `groups`, when
    given, also receives each held-out set's loss per source and language (for the eval rows, not the gate)."""
    out: dict[str, list] = {}
    for name, held in held_out.items():
        losses = held_out_losses(model, held, device, eos_id)
        out[f"{name}_loss"] = losses["sequences"]
        out[f"{name}_doc_loss_sums"], out[f"{name}_doc_tokens"] = losses["doc_loss_sums"], losses["doc_tokens"]
        if groups is not None:
            groups[name] = losses["groups"]
    for criterion in tasks:
        out[f"task:{criterion.task}"] = task_correct(model, tokenizer, eos_id, criterion.task, criterion.paired_items, device)
    return out


def _document_differences(base: dict[str, list], adapted: dict[str, list], name: str, sign: float) -> dict[str, Any] | list[float]:
    """Per-document summed differences (sign * (CPT - base)) and token counts; per sequence for a run
    measured before documents were recorded."""
    if f"{name}_doc_loss_sums" not in base:
        return [sign * (a - b) for b, a in zip(base[f"{name}_loss"], adapted[f"{name}_loss"])]
    if base[f"{name}_doc_tokens"] != adapted[f"{name}_doc_tokens"]:
        raise GateError(f"the {name} held-out documents differ between base and CPT measurements")
    return {"difference_sums": [sign * (a - b) for b, a in zip(base[f"{name}_doc_loss_sums"], adapted[f"{name}_doc_loss_sums"])],
            "tokens": base[f"{name}_doc_tokens"]}


def paired_differences(base: dict[str, list], adapted: dict[str, list]) -> dict[str, Any]:
    """Differences oriented as the gate's metrics: reduction = base - CPT, rise = CPT - base, drop = base - CPT."""
    paired: dict[str, Any] = {"domain_loss_reduction": _document_differences(base, adapted, "domain", -1.0),
                              "general_loss_rise": _document_differences(base, adapted, "general", 1.0)}
    for key in base:
        if key.startswith("task:"):
            paired[f"task_accuracy_drop:{key.removeprefix('task:')}"] = [b - a for b, a in zip(base[key], adapted[key])]
    return paired


# ---------------------------------------------------------------- bookkeeping


def write_json(path: Path, payload: dict[str, Any]) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def corpus_entry(reader: CorpusReader, out: Path) -> dict[str, Any]:
    """Where a corpus is, three ways, and what it is: the path as given, absolute, and relative to the run directory
    (a run copied with its corpora beside it), and the digest that says which of them is still this corpus
    (`hymo cpt verify` tries them all, from any working directory)."""
    absolute = reader.path.resolve()
    return {"corpus": str(reader.path), "corpus_absolute": str(absolute),
            "corpus_from_run": os.path.relpath(absolute, out.resolve()), "digest": reader.digest}


def tokenizer_identity(reader: CorpusReader) -> tuple[Any, ...]:
    """What makes two corpora's token ids mean the same thing: the tokenizer file's hash, V and EOS."""
    entry = reader.manifest.get("tokenizer", {})
    return entry.get("sha256"), entry.get("vocab_size"), reader.eos_id


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _headline_losses(measured: dict[str, list]) -> dict[str, float]:
    """Mean per-sequence loss and task accuracy of one side (documents' sums are not means)."""
    return {name: mean(values) for name, values in measured.items() if name.endswith("_loss") or name.startswith("task:")}


def judge_run(out: str | Path) -> dict[str, Any]:
    """The verdict of a finished run, from its gate file (hash checked) and measurements only; writes summary.json
    with the measurements' sha256 (`hymo cpt verify` re-measures the checkpoints instead of trusting them)."""
    out = Path(out)
    manifest = json.loads((out / MANIFEST_FILE).read_text(encoding="utf-8"))
    criteria, gate_sha256 = read_gate(out / GATE_FILE, manifest["gate"]["sha256"])
    measurements = json.loads((out / MEASUREMENTS_FILE).read_text(encoding="utf-8"))
    verdict = judge(criteria, paired_differences(measurements["base"], measurements["cpt"]))
    summary = {
        "verdict": verdict,
        "gate": {"path": GATE_FILE, "sha256": gate_sha256},
        "measurements": {"path": MEASUREMENTS_FILE, "sha256": sha256_file(out / MEASUREMENTS_FILE)},
        "losses": {side: _headline_losses(measurements[side]) for side in ("base", "cpt")},
        "replay": measurements["replay"],
        "lineage": {"base_checkpoint": manifest["base"]["checkpoint"], "base_checkpoint_sha256": manifest["base"]["sha256"],
                    "base_weights_sha256": manifest["base"]["weights_sha256"], "cpt_run": str(out),
                    "cpt_checkpoint": str(out / measurements["checkpoint"]["path"]), "cpt_checkpoint_sha256": measurements["checkpoint"]["sha256"],
                    "cpt_weights_sha256": measurements["checkpoint"]["weights_sha256"], "gate_sha256": gate_sha256,
                    "verdict": "pass" if verdict["passed"] else "fail"},
        "recipe": manifest["recipe"],
    }
    write_json(out / SUMMARY_FILE, summary)
    return summary


def write_gate(out: Path, gate: str | Path | Sequence[Criterion] | None) -> tuple[list[Criterion], str]:
    """gate.toml in OUT, from a file, from criteria, or Lab 5's gate; parsed before anything else happens."""
    target = out / GATE_FILE
    if isinstance(gate, (str, Path)):
        payload = Path(gate).read_bytes()
        parse_gate(payload.decode("utf-8"), str(gate))
    else:
        payload = gate_text(list(gate or LAB5_GATE)).encode("utf-8")
    temporary = target.with_name(target.name + ".tmp")
    temporary.write_bytes(payload)
    os.replace(temporary, target)
    return read_gate(target)


# ---------------------------------------------------------------- the run


def run_cpt(base_checkpoint: str | Path, domain: str | Path, general: str | Path, out: str | Path, config: CptConfig = CptConfig(),
            gate: str | Path | Sequence[Criterion] | None = None, device: torch.device | str = "cpu", log: Callable[[str], None] = print,
            on_eval: Callable[[dict[str, Any]], None] | None = None, ledger: str | Path | None = None,
            on_record: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Continue `base_checkpoint` on `domain` with replay from `general`; returns summary.json's content.

    The gate's, manifest's and measurements' hashes go to `ledger` (default: cpt_ledger.jsonl beside OUT)
    and to `on_record` at the start and at the end."""
    out, device, base_checkpoint = Path(out), torch.device(device), Path(base_checkpoint)
    for corpus in (domain, general):
        refuse_stale_corpus(corpus, "continued pretraining")
    if (out / MANIFEST_FILE).exists():
        raise FileExistsError(f"{out} already holds a CPT run ({MANIFEST_FILE}); a gate is fixed once per run, choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    criteria, gate_sha256 = write_gate(out, gate)
    tasks = [c for c in criteria if c.metric == "task_accuracy_drop"]

    model, payload = load_model(base_checkpoint, device)
    readers = {"domain": CorpusReader(domain), "general": CorpusReader(general)}
    for name, reader in readers.items():
        check_corpus_tokenizer(payload, base_checkpoint, reader)
        if reader.vocab_size != model.config.vocab_size:
            raise CorpusError(f"{reader.path}: vocab_size {reader.vocab_size}, but the base {base_checkpoint} has {model.config.vocab_size}")
    if tokenizer_identity(readers["domain"]) != tokenizer_identity(readers["general"]):
        raise CorpusError(f"{readers['domain'].path} and {readers['general'].path} were tokenized differently; "
                          "re-tokenize the domain run with the base's tokenizer (hymo retokenize)")
    tokenizer = None
    if tasks:
        entry = readers["domain"].manifest.get("tokenizer", {})
        if not entry.get("path"):
            raise GateError(f"{out / GATE_FILE}: a task criterion needs the corpus tokenizer, and {readers['domain'].path} names none")
        from hymo_core.eval.evaluation import load_tokenizer

        tokenizer = load_tokenizer(readers["domain"].root / entry["path"])
    train_config = config.train_config(payload["train_config"])
    if model.config.max_seq_len < train_config.seq_len:
        raise ValueError(f"seq_len {train_config.seq_len} exceeds the base model's max_seq_len {model.config.max_seq_len}")
    T, B = train_config.seq_len, train_config.batch_size
    held_out = {name: held_out_set(reader, T, B, config.eval_batches) for name, reader in readers.items()}
    for name, held in held_out.items():
        if len(held) < B:
            raise CorpusError(f"{readers[name].path}: no full validation batch of {B} x {T + 1} tokens; the {name} held-out loss needs one")
    replay = ReplayLoader(TokenLoader(readers["domain"], "train", T, B, config.seed),
                          TokenLoader(readers["general"], "train", T, B, config.seed), config.replay_ratio, config.sampler_seed)

    base_groups: dict[str, dict[str, Any]] = {}
    base = measure(model, held_out, tasks, tokenizer, readers["domain"].eos_id, device, base_groups)
    check_sample_sizes(criteria, paired_differences(base, base), str(out / GATE_FILE))  # refuse a ci95 gate before training, not after
    manifest = {
        "run_id": uuid.uuid4().hex,  # how the ledger finds this run's records, wherever the directory is copied
        "gate": {"path": GATE_FILE, "sha256": gate_sha256},
        "base": {"checkpoint": str(base_checkpoint.resolve()), "sha256": sha256_file(base_checkpoint), "weights_sha256": weights_sha256(model),
                 "step": payload["state"]["step"], "corpus_digest": payload["manifest_digest"]},
        "domain": {**corpus_entry(readers["domain"], out)},
        "general": {**corpus_entry(readers["general"], out), "is_base_corpus": readers["general"].digest == payload["manifest_digest"]},
        "recipe": {**asdict(config), "train_config": train_config.to_dict()},
        "written_at_step": 0,  # the optimizer has made no update yet: the ledger's start record proves the order
    }
    write_json(out / MANIFEST_FILE, manifest)  # the gate's hash is on disk before the first update
    ledger = Path(ledger) if ledger else default_ledger(out)
    note({"run": str(out.resolve()), "run_id": manifest["run_id"], "stage": "start", "time": time.time(), "gate_sha256": gate_sha256,
          "manifest_sha256": sha256_file(out / MANIFEST_FILE), "base_checkpoint_sha256": manifest["base"]["sha256"],
          "base_measurements_sha256": canonical_sha256(base)}, ledger, on_record)

    metrics_path = out / METRICS_FILE
    metrics_path.write_text("", encoding="utf-8")

    def record(row: dict[str, Any]) -> None:
        with open(metrics_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")

    def held_out_row(step: int, losses: dict[str, list[float]], groups: dict[str, dict[str, Any]]) -> dict[str, Any]:
        return {"kind": "eval", "step": step, "domain_loss": mean(losses["domain_loss"]), "general_loss": mean(losses["general_loss"]),
                "domain_groups": groups["domain"], "general_groups": groups["general"],  # per source / language
                "replay_actual": replay.actual_ratio}

    record(held_out_row(0, base, base_groups))
    checkpoint_file: list[Path] = []

    def on_update(state: TrainState, loss: float, lr: float) -> None:
        if state.step % config.eval_interval and state.step != train_config.max_steps:
            return
        read_gate(out / GATE_FILE, gate_sha256)  # GateTampered stops the run here
        groups: dict[str, dict[str, Any]] = {}
        row = held_out_row(state.step, measure(model, held_out, [], None, readers["domain"].eos_id, device, groups), groups)
        record(row)
        log(f"step {state.step}: domain {row['domain_loss']:.4f}, general {row['general_loss']:.4f}, lr {lr:.2e}, replay {row['replay_actual']:.3f}")
        if on_eval:
            on_eval(row)

    def on_checkpoint(state: TrainState) -> None:
        checkpoint_file.append(save_checkpoint(out / "checkpoints" / f"step-{state.step:08d}.pt", model, optimizer, state, train_config, replay))

    torch.manual_seed(config.seed)
    optimizer = build_optimizer(model, train_config.optimizer_config(device))  # fresh: the base's moments are not carried over
    hooks = TrainHooks(on_log=lambda row: record({"kind": "train", **row}), on_update=on_update, on_checkpoint=on_checkpoint,
                       on_event=lambda event: record({"kind": "event", **event}))
    started = time.perf_counter()
    try:
        state = train(model, optimizer, replay, None, train_config, TrainState(), device, hooks)
    except GateTampered as exc:
        write_json(out / SUMMARY_FILE, {"verdict": {"status": "refused", "reason": str(exc)}})
        raise
    seconds = time.perf_counter() - started

    adapted = measure(model, held_out, tasks, tokenizer, readers["domain"].eos_id, device)
    write_json(out / MEASUREMENTS_FILE, {
        "base": base, "cpt": adapted, "steps": state.step, "seconds": seconds, "tokens_seen": state.tokens_seen,
        "replay": {"ratio": config.replay_ratio, "actual": replay.actual_ratio, "sequences": replay.steps * B,
                   "general_sequences": replay.general_sequences, "sampler_seed": config.sampler_seed},
        "checkpoint": {"path": checkpoint_file[-1].relative_to(out).as_posix(), "sha256": sha256_file(checkpoint_file[-1]), "weights_sha256": weights_sha256(model)},
    })
    try:
        summary = judge_run(out)
    except GateTampered as exc:
        write_json(out / SUMMARY_FILE, {"verdict": {"status": "refused", "reason": str(exc)}})
        raise
    summary["seconds"] = seconds
    write_json(out / SUMMARY_FILE, summary)
    note({"run": str(out.resolve()), "run_id": manifest["run_id"], "stage": "end", "time": time.time(), "gate_sha256": sha256_file(out / GATE_FILE),
          "manifest_sha256": sha256_file(out / MANIFEST_FILE), "measurements_sha256": summary["measurements"]["sha256"],
          "cpt_checkpoint_sha256": summary["lineage"]["cpt_checkpoint_sha256"], "summary_sha256": sha256_file(out / SUMMARY_FILE),
          "verdict": summary["lineage"]["verdict"]}, ledger, on_record)
    return summary


def note(record: dict[str, Any], ledger: Path, on_record: Callable[[dict[str, Any]], None] | None) -> None:
    """The hashes, into the ledger outside OUT and to the caller (the flow's run log and artifact), with
    the ledger's link to the line before (so the artifact pins the chain too)."""
    written = append_record(ledger, record)
    if on_record:
        on_record(written)


def verdict_lines(summary: dict[str, Any]) -> list[str]:
    """One line per criterion, for the CLI and the flow log."""
    lines = []
    for row in summary["verdict"]["criteria"]:
        lines.append(f"{row['metric']}: {row['value']:+.4f} ± {row['stderr']:.4f} (95 % [{row['ci95_low']:+.4f}, {row['ci95_high']:+.4f}], "
                     f"n={row['n']}) {row['direction']} {row['threshold']:g} [{row['rule']}] -> {'pass' if row['passed'] else 'FAIL'}")
    lines.append(f"verdict: {'PASS' if summary['verdict']['passed'] else 'FAIL'} (gate sha256 {summary['gate']['sha256'][:12]}…)")
    return lines
