"""lm-evaluation-harness task YAMLs over HyMo's bundled benchmark files: offline, same prompts as the suite.

`write_tasks(DIR, names)` writes one YAML per task (MMLU: one per subject plus a group,
macro-averaged like the suite's headline), a `utils.py` whose `process_docs` functions are the ones
below, and a copy of each benchmark file under DIR/data/. Each YAML names its file relative to DIR
(`dataset_kwargs.data_files`) and loads it with `custom_dataset: !function utils.load_...`, which
resolves the path against utils.py's own directory and checks the file's sha256 (in `metadata`),
so the directory works moved or copied, without the checkout it was written from (the `hymo`
package still provides the prompt code) and never from a hub.

Task names carry a `hymo_` prefix (`hymo_hellaswag`, `hymo_arc_easy`, `hymo_mmlu_rc`, ...,
`lm_eval_name`): these are the suite's prompts (MMLU as the OLMES cloze "rc" form, subjects
unweighted), not lm-eval's own tasks of the bare names (MMLU lettered, weighted by size), which an
`--include_path` task of the same name would silently replace. Prompts are built by
`hymo_core.eval.suite` (`hellaswag_item`, `arc_item`, `mmlu_item`), so a document's `query` and
`choices` are exactly the suite's context and options (the options' leading space is lm-eval's
`target_delimiter`).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

from hymo_core.eval.suite import GSM8K_STOP, arc_item, hellaswag_item, mmlu_item
from manifests.benchmark_sets import EVAL_DIR, read_records
from manifests.digest import sha256_file

TASKS = ("hellaswag", "arc_easy", "arc_challenge", "mmlu", "gsm8k")
PREFIX = "hymo_"
DATA_DIR = "data"


def lm_eval_name(task: str) -> str:
    """The name HyMo's version of `task` has in lm-eval (MMLU: the cloze form's group)."""
    return f"{PREFIX}mmlu_rc" if task == "mmlu" else f"{PREFIX}{task}"


def local_dataset(here: str | Path, name: str) -> Callable:
    """`custom_dataset` of one task: the benchmark file named (relative to `here`, the task directory) in the
    YAML's dataset_kwargs, loaded with `datasets`' json builder after checking its sha256 against metadata."""
    def load(data_files: dict[str, str] | None = None, sha256: str | None = None, **_: Any):
        import datasets

        files = {split: str(Path(here) / path) for split, path in (data_files or {"test": f"{DATA_DIR}/{name}.jsonl.gz"}).items()}
        for path in files.values():
            if sha256 is not None and sha256_file(Path(path)) != sha256:
                raise ValueError(f"{path}: sha256 {sha256_file(Path(path))[:12]}… but the task YAML recorded {sha256[:12]}…")
        return datasets.load_dataset("json", data_files=files)
    return load
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
    return {"custom_dataset": f"!function utils.load_{name}", "dataset_kwargs": {"data_files": {"test": f"{DATA_DIR}/{path.name}"}},
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
        task = lm_eval_name(name)
        if name == "hellaswag":
            configs[task] = _mc(task, name, "!function utils.process_hellaswag")
        elif name in ("arc_easy", "arc_challenge"):
            configs[task] = _mc(task, name, "!function utils.process_arc")
        elif name == "mmlu":
            subjects = mmlu_subjects()
            for subject in subjects:
                configs[f"{task}_{subject}"] = _mc(f"{task}_{subject}", "mmlu", f"!function utils.process_mmlu_{subject}")
            configs[task] = {"group": task, "task": [f"{task}_{s}" for s in subjects],
                             "aggregate_metric_list": [{"metric": m, "weight_by_size": False} for m in ("acc", "acc_norm")],
                             "metadata": {"version": 1.0}}
        else:
            configs[task] = {"task": task, "tag": ["hymo"], **_data(name), "output_type": "generate_until",
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
    """Write the YAMLs, utils.py and the benchmark files they read into `directory`; returns the task (and group) names written."""
    directory = Path(directory)
    (directory / DATA_DIR).mkdir(parents=True, exist_ok=True)
    configs = task_configs(names)
    mmlu_prefix = f"{lm_eval_name('mmlu')}_"
    subjects = [stem.removeprefix(mmlu_prefix) for stem in configs if stem.startswith(mmlu_prefix)]
    files = sorted({"mmlu" if name == "mmlu" else name for name in names})
    for name in files:
        shutil.copyfile(EVAL_DIR / f"{name}.jsonl.gz", directory / DATA_DIR / f"{name}.jsonl.gz")
    utils = ['"""process_docs and datasets for the HyMo task YAMLs beside this file (written by hymo_core.interop.lm_eval_tasks)."""',
             "from pathlib import Path", "",
             "from hymo_core.interop.lm_eval_tasks import local_dataset, mmlu_subject, process_arc, process_gsm8k, process_hellaswag  # noqa: F401",
             "", "HERE = Path(__file__).resolve().parent  # data paths in the YAMLs are relative to this directory", ""]
    utils += [f"load_{name} = local_dataset(HERE, {name!r})" for name in files]
    utils += [f"process_mmlu_{subject} = mmlu_subject({subject!r})" for subject in subjects]
    (directory / "utils.py").write_text("\n".join(utils) + "\n", encoding="utf-8")
    for stem, config in configs.items():
        (directory / f"{stem}.yaml").write_text(_yaml(config) + "\n", encoding="utf-8")
    return list(configs)
