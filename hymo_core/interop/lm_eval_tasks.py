"""lm-evaluation-harness task YAMLs over HyMo's bundled benchmark files: offline, same prompts as the suite.

`write_tasks(DIR, names)` writes one YAML per task (MMLU: one per subject plus the `mmlu` group,
macro-averaged like the suite's headline) and a `utils.py` whose `process_docs` functions are the
ones below. Each YAML reads its items from the bundled file by absolute path
(`dataset_path: json`, `data_files`), never from a hub, and records that file's sha256. Task names
are lm-eval's own (`hellaswag`, `arc_easy`, ...): an `--include_path DIR` task wins over the
built-in one of the same name. Prompts are built by `hymo_core.eval.suite` (`hellaswag_item`,
`arc_item`, `mmlu_item`), so a document's `query` and `choices` are exactly the suite's context and
options (the options' leading space is lm-eval's `target_delimiter`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from hymo_core.eval.suite import GSM8K_STOP, arc_item, hellaswag_item, mmlu_item
from manifests.benchmark_sets import EVAL_DIR, read_records
from manifests.digest import sha256_file

TASKS = ("hellaswag", "arc_easy", "arc_challenge", "mmlu", "gsm8k")
MC_METRICS = [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
              {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}]
# lm-eval's gsm8k answer extraction: the strict "#### n" and the flexible last-number filters.
GSM8K_FILTERS = [
    {"name": "strict-match", "filter": [{"function": "regex", "regex_pattern": "#### (\\-?[0-9\\.\\,]+)"}, {"function": "take_first"}]},
    {"name": "flexible-extract", "filter": [{"function": "regex", "group_select": -1,
                                              "regex_pattern": "(-?[$0-9.,]{2,})|(-?[0-9]+)"}, {"function": "take_first"}]},
]
GSM8K_METRICS = [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True, "ignore_case": True,
                  "ignore_punctuation": False, "regexes_to_ignore": [",", "\\$", "(?s).*#### ", "\\.$"]}]


def _choice_doc(item) -> dict[str, Any]:
    if not all(option.startswith(" ") for option in item.options):
        raise ValueError(f"item {item.id}: an option without the leading space lm-eval's target_delimiter adds")
    return {"query": item.context, "choices": [option[1:] for option in item.options], "gold": item.answer}


def _rows(batch: dict[str, list]) -> list[dict[str, Any]]:
    return [dict(zip(batch, values)) for values in zip(*batch.values())]


def _mapped(make_item: Callable) -> Callable:
    """A batched `datasets` map: whole columns in and out, so a 10k-item file costs one pass, not 10k calls."""
    def apply(batch: dict[str, list]) -> dict[str, list]:
        docs = [_choice_doc(make_item(record)) for record in _rows(batch)]
        return {key: [doc[key] for doc in docs] for key in ("query", "choices", "gold")}
    return apply


def process_hellaswag(dataset):
    return dataset.map(_mapped(hellaswag_item), batched=True)


def process_arc(dataset):
    return dataset.map(_mapped(arc_item), batched=True)


def mmlu_subject(subject: str) -> Callable:
    """process_docs of one MMLU subject: its items, in file order, as the suite's cloze (rc) prompts."""
    def process(dataset):
        chosen = dataset.filter(lambda subjects: [s == subject for s in subjects], input_columns="subject", batched=True)
        return chosen.map(_mapped(mmlu_item), batched=True)
    return process


def process_gsm8k(dataset):
    return dataset.map(lambda batch: {"query": [f"Question: {q}\nAnswer:" for q in batch["question"]], "target": batch["short_answer"]},
                       batched=True)


def _data(name: str) -> dict[str, Any]:
    path = EVAL_DIR / f"{name}.jsonl.gz"
    return {"dataset_path": "json", "dataset_name": None, "dataset_kwargs": {"data_files": {"test": str(path)}},
            "test_split": "test", "metadata": {"version": 1.0, "source": path.name, "sha256": sha256_file(path)}}


def _mc(task: str, data: str, process: str) -> dict[str, Any]:
    return {"task": task, "tag": ["hymo"], **_data(data), "output_type": "multiple_choice",
            "process_docs": process, "doc_to_text": "query", "doc_to_choice": "choices", "doc_to_target": "gold",
            "target_delimiter": " ", "metric_list": MC_METRICS}


def mmlu_subjects() -> list[str]:
    return sorted({record["subject"] for _, record in read_records(EVAL_DIR / "mmlu.jsonl.gz")})


def task_configs(names: tuple[str, ...] | list[str]) -> dict[str, dict[str, Any]]:
    """File stem -> YAML content for the asked tasks (MMLU expands to its subjects and the group)."""
    unknown = sorted(set(names) - set(TASKS))
    if unknown:
        raise ValueError(f"lm-eval tasks {unknown} are not bundled; bundled: {', '.join(TASKS)}")
    configs: dict[str, dict[str, Any]] = {}
    for name in names:
        if name == "hellaswag":
            configs[name] = _mc(name, name, "!function utils.process_hellaswag")
        elif name in ("arc_easy", "arc_challenge"):
            configs[name] = _mc(name, name, "!function utils.process_arc")
        elif name == "mmlu":
            subjects = mmlu_subjects()
            for subject in subjects:
                configs[f"mmlu_{subject}"] = _mc(f"mmlu_{subject}", "mmlu", f"!function utils.process_mmlu_{subject}")
            configs["mmlu"] = {"group": "mmlu", "task": [f"mmlu_{s}" for s in subjects],
                               "aggregate_metric_list": [{"metric": m, "weight_by_size": False} for m in ("acc", "acc_norm")],
                               "metadata": {"version": 1.0}}
        else:
            configs[name] = {"task": name, "tag": ["hymo"], **_data(name), "output_type": "generate_until",
                             "process_docs": "!function utils.process_gsm8k", "doc_to_text": "query", "doc_to_target": "target",
                             "target_delimiter": " ", "generation_kwargs": {"until": list(GSM8K_STOP), "do_sample": False,
                                                                            "temperature": 0.0, "max_gen_toks": 256},
                             "filter_list": GSM8K_FILTERS, "metric_list": GSM8K_METRICS}
    return configs


def _yaml(value: Any, indent: int = 0) -> str:
    """The small YAML subset these configs need; `!function` tags stay unquoted, everything else is JSON-quoted."""
    pad = "  " * indent
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{key}:\n{_yaml(item, indent + 1)}")
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
        return "\n".join(lines)
    lines = []
    for item in value:
        if isinstance(item, dict):
            body = _yaml(item, indent + 1).lstrip()
            lines.append(f"{pad}- {body}")
        else:
            lines.append(f"{pad}- {_scalar(item)}")
    return "\n".join(lines)


def _scalar(value: Any) -> str:
    if isinstance(value, str) and value.startswith("!function "):
        return value
    return json.dumps(value)


def write_tasks(directory: str | Path, names: tuple[str, ...] | list[str] = TASKS) -> list[str]:
    """Write the YAMLs and utils.py into `directory`; returns the task (and group) names written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    configs = task_configs(names)
    subjects = [stem.removeprefix("mmlu_") for stem in configs if stem.startswith("mmlu_")]
    utils = ['"""process_docs for the HyMo task YAMLs beside this file (written by hymo_core.interop.lm_eval_tasks)."""',
             "from hymo_core.interop.lm_eval_tasks import mmlu_subject, process_arc, process_gsm8k, process_hellaswag  # noqa: F401", ""]
    utils += [f"process_mmlu_{subject} = mmlu_subject({subject!r})" for subject in subjects]
    (directory / "utils.py").write_text("\n".join(utils) + "\n", encoding="utf-8")
    for stem, config in configs.items():
        (directory / f"{stem}.yaml").write_text(_yaml(config) + "\n", encoding="utf-8")
    return list(configs)
