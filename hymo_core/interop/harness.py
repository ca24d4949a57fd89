"""`hymo eval CKPT --harness lm-eval --tasks ...`: lm-evaluation-harness itself, offline, on HyMo's benchmark files.

A HyMo checkpoint runs through the `hymo` model (lm_eval_adapter); a directory written by
`hymo export --hf` runs through lm-eval's own `hf` model (transformers), so the two routes can be
compared item by item. The task YAMLs (named `hymo_TASK`, `lm_eval_tasks.lm_eval_name`) are written
with their data into OUT/lm_eval_tasks (re-usable with `lm_eval --include_path`, also moved), nothing is fetched from a hub (HF_DATASETS_OFFLINE, HF_HUB_OFFLINE),
and OUT/lm_eval.json keeps lm-eval's metrics with their standard errors, keyed by those names, plus every
item's log-likelihoods or generation.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hymo_core.interop.lm_eval_tasks import lm_eval_name, write_tasks

LM_EVAL_JSON = "lm_eval.json"
TASKS_DIR = "lm_eval_tasks"
# Standard errors: every metric of these tasks aggregates by mean, for which lm-eval uses the closed form
# sd / sqrt(n) whenever bootstrap_iters > 0 (0 turns every stderr off). The iterations only drive the
# bootstrap of other metrics (median, F1, BLEU, ...): 1,000 keeps such a task's error within a few
# per cent of lm-eval's 100,000 at 1 % of the time.
BOOTSTRAP_ITERS = 1000


def go_offline() -> None:
    """No hub access for datasets or models, also when those libraries were imported before."""
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    import datasets.config
    import huggingface_hub.constants

    datasets.config.HF_DATASETS_OFFLINE = True
    datasets.config.HF_HUB_OFFLINE = True
    huggingface_hub.constants.HF_HUB_OFFLINE = True


def is_hf_export(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and (path / "model.safetensors").is_file()


def _item(sample: dict[str, Any]) -> dict[str, Any]:
    """One item of lm-eval's samples log, without the document body (a generation task logs each item once per filter)."""
    row: dict[str, Any] = {"doc_id": sample["doc_id"], "target": sample["target"], "filter": sample.get("filter", "none")}
    responses = sample["filtered_resps"]
    if responses and isinstance(responses[0], (list, tuple)) and len(responses[0]) == 2:  # loglikelihood
        row["loglikelihoods"] = [float(r[0]) for r in responses]
        row["is_greedy"] = [bool(r[1]) for r in responses]
    else:
        row["generation"] = sample["resps"][0][0] if sample["resps"] and sample["resps"][0] else ""
        row["filtered"] = responses
    for metric in ("acc", "acc_norm", "exact_match"):
        if metric in sample:
            row[metric] = sample[metric]
    return row


def run_harness(model_path: str | Path, tasks: list[str], out: str | Path, corpus: str | Path | None = None,
                limit: int | None = None, device: str = "cpu", batch_size: int = 16, model: Any = None) -> dict[str, Any]:
    """Run lm-eval on `tasks`; write OUT/lm_eval.json and return it. `model` may be a ready HymoLM."""
    go_offline()
    import lm_eval
    import lm_eval.models  # noqa: F401  (registers lm-eval's own models, `hf` among them)
    from lm_eval.tasks import TaskManager

    import hymo_core.interop.lm_eval_adapter  # noqa: F401  (registers the `hymo` model)

    model_path, out = Path(model_path), Path(out)
    names = write_tasks(out / TASKS_DIR, tasks)
    lm_tasks = [lm_eval_name(task) for task in tasks]
    manager = TaskManager(include_path=str(out / TASKS_DIR), include_defaults=False)
    if model is not None:
        lm, route = model, "hymo"
    elif is_hf_export(model_path):
        trust = json.loads((model_path / "config.json").read_text(encoding="utf-8")).get("model_type") == "hymo"
        lm, route = "hf", "hf"
        model_args = {"pretrained": str(model_path), "dtype": "float32", "trust_remote_code": trust, "device": device}
    else:
        lm, route = "hymo", "hymo"
        model_args = {"checkpoint": str(model_path), "device": device, **({"corpus": str(corpus)} if corpus else {})}
    evaluated = lm_eval.simple_evaluate(
        model=lm, model_args=None if model is not None else model_args, tasks=lm_tasks, task_manager=manager,
        limit=limit, batch_size=batch_size, log_samples=True, bootstrap_iters=BOOTSTRAP_ITERS, random_seed=0, numpy_random_seed=0,
        torch_random_seed=0, fewshot_random_seed=0)
    report = {
        "model": str(model_path), "route": route, "lm_eval_version": lm_eval.__version__ if hasattr(lm_eval, "__version__") else None,
        "tasks": list(tasks), "lm_eval_tasks": dict(zip(tasks, lm_tasks)), "limit": limit, "task_dir": str(out / TASKS_DIR),
        "written": names, "bootstrap_iters": BOOTSTRAP_ITERS,
        "results": evaluated["results"], "groups": evaluated.get("groups", {}),
        "n_samples": evaluated.get("n-samples", {}),
        "items": {task: [_item(s) for s in samples] for task, samples in evaluated["samples"].items()},
    }
    out.mkdir(parents=True, exist_ok=True)
    temporary = out / f".{LM_EVAL_JSON}.tmp"
    temporary.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    temporary.replace(out / LM_EVAL_JSON)
    return report
