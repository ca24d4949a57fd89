"""The model card and the data card of a release, every number read from a file of the bundle.

Cards are written last, from the bundle's own files (never from values held in memory), through
`Facts`: each value shown is looked up as (file, key path) in the bundle, rounded where shown
rounded, and recorded in facts.json with where it came from. A reader (and the release test) can
check every number of README.md and DATA_CARD.md against facts.json, and every fact against its file.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

FACTS_FILE = "facts.json"


class Facts:
    """Values read from bundle files by key path; `show` formats one and remembers where it came from."""

    def __init__(self, bundle: Path):
        self.bundle = bundle
        self.recorded: list[dict[str, Any]] = []
        self._loaded: dict[str, Any] = {}

    def read(self, file: str, *keys: Any) -> Any:
        if file not in self._loaded:
            path = self.bundle / file
            self._loaded[file] = (json.loads(path.read_text(encoding="utf-8")) if path.suffix == ".json"
                                  else [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()])
        value = self._loaded[file]
        for key in keys:
            value = value[key]
        return value

    def show(self, file: str, *keys: Any, digits: int | None = None) -> str:
        value = self.read(file, *keys)
        if digits is not None and isinstance(value, float):
            value = round(value, digits)
        self.recorded.append({"file": file, "keys": list(keys), "digits": digits, "value": value})
        if value is None:
            return "–"
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, list):
            return ", ".join(map(str, value))
        if isinstance(value, int):
            return f"{value:,}".replace(",", " ") if abs(value) >= 10_000 else str(value)
        return str(value)

    def write(self) -> None:
        (self.bundle / FACTS_FILE).write_text(json.dumps(self.recorded, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


SHARE_ALIKE = re.compile(r"GPL|-SA\b|ODbL", re.IGNORECASE)  # copyleft / share-alike licence ids (SPDX)


def _licence_sources(f: Facts) -> dict[str, int]:
    """Each distinct source licence -> the first source (index into corpus.json's sources) under it."""
    seen: dict[str, int] = {}
    for i, source in enumerate(f.read("data/corpus.json", "sources")):
        seen.setdefault(str(source.get("license")), i)
    return seen


def _licence_section(f: Facts) -> str:
    seen = _licence_sources(f)
    names = ", ".join(f.show("data/corpus.json", "sources", i, "license") for i in seen.values())
    copyleft = [name for name in seen if SHARE_ALIKE.search(name)]
    duty = (f"Share-alike or copyleft among them: {', '.join(copyleft)}; whether their terms reach model weights or outputs "
            "is unsettled, so check them before redistributing either." if copyleft else
            "Check their terms before redistributing the weights or their outputs.")
    return (f"The weights carry no licence of their own here (`license: other`). The training sources are under: {names} "
            f"(per source in DATA_CARD.md). {duty}\n")


def _front_matter(f: Facts) -> str:
    """Hugging Face model-card metadata: the weights' licence is left to whoever releases them ("other"), and every
    licence of the training sources is named (source_licenses), share-alike ones included."""
    licences = "\n".join(f"  - {f.show('data/corpus.json', 'sources', i, 'license')}" for i in _licence_sources(f).values())
    return ("---\nlicense: other\nlicense_name: see-training-data-licences\n"
            "license_details: the training data's licences are listed under source_licenses and in DATA_CARD.md\n"
            f"source_licenses:\n{licences}\nlibrary_name: transformers\npipeline_tag: text-generation\ntags:\n  - hymo\n  - base-model\n---\n\n")


def model_card(f: Facts) -> str:
    arch = f.read("model/hymo_export.json", "architecture")
    remote = f.read("model/hymo_export.json", "trust_remote_code")
    load = ("from transformers import AutoModelForCausalLM, AutoTokenizer\n"
            f"model = AutoModelForCausalLM.from_pretrained(\"model\"{', trust_remote_code=True' if remote else ''})\n"
            "tokenizer = AutoTokenizer.from_pretrained(\"model\")\n")
    shape = _table(["", "value"], [
        ["architecture", f.show("model/hymo_export.json", "architecture")],
        ["parameters (exported)", f.show("model/hymo_export.json", "parameters")],
        ["layers", f.show("model/config.json", "num_hidden_layers")],
        ["width", f.show("model/config.json", "hidden_size")],
        ["attention heads", f.show("model/config.json", "num_attention_heads")],
        ["vocabulary", f.show("model/config.json", "vocab_size")],
        ["context", f.show("model/config.json", "max_position_embeddings")],
        ["tied embeddings", f.show("model/config.json", "tie_word_embeddings")],
    ] + ([["layer kinds", f.show("model/config.json", "layer_kinds")]] if arch == "HymoForCausalLM" else []))
    training = _table(["", "value", "file"], [
        ["optimizer steps", f.show("training/summary.json", "final_step"), "training/summary.json"],
        ["tokens seen", f.show("training/summary.json", "tokens_seen"), "training/summary.json"],
        ["final train loss (nats/token)", f.show("training/summary.json", "final_train_loss", digits=4), "training/summary.json"],
        ["final held-out loss (val_loss)", f.show("training/summary.json", "final_val_loss", digits=4), "training/summary.json"],
        ["ln V (uniform guess)", f.show("training/summary.json", "ln_vocab", digits=4), "training/summary.json"],
    ])
    curve = f.read("eval/curve.json")
    eval_rows = []
    for i, point in enumerate(curve["checkpoints"]):
        for task in point["tasks"]:
            eval_rows.append([f.show("eval/curve.json", "checkpoints", i, "step"), task,
                              f.show("eval/curve.json", "checkpoints", i, "tasks", task, "metric"),
                              f.show("eval/curve.json", "checkpoints", i, "tasks", task, "value", digits=4),
                              f.show("eval/curve.json", "checkpoints", i, "tasks", task, "stderr", digits=4),
                              f.show("eval/curve.json", "checkpoints", i, "tasks", task, "chance", digits=4),
                              f.show("eval/curve.json", "checkpoints", i, "tasks", task, "items"),
                              f.show("eval/curve.json", "checkpoints", i, "tasks", task, "contexts_truncated"),
                              f.show("eval/curve.json", "checkpoints", i, "tasks", task, "convention")])
    last = len(curve["checkpoints"]) - 1
    held_out_line = ("" if last < 0 else
                     f"Held-out loss of the last kept checkpoint ({f.show('eval/curve.json', 'checkpoints', last, 'checkpoint')}): "
                     f"{f.show('eval/curve.json', 'checkpoints', last, 'held_out_loss', digits=4)}, on the same held-out windows as the "
                     "training's val_loss above (`hymo eval` and the trainer share one held-out set), so for the final checkpoint "
                     "the two agree.\n")
    check = f.read("model/logit_check.json")
    check_line = (f"Export check: transformers on `model/` against HyMo on {f.show('model/logit_check.json', 'checkpoint')}, "
                  f"largest |logit| difference {f.show('model/logit_check.json', 'max_abs_logit_difference')} over "
                  f"{f.show('model/logit_check.json', 'windows')} held-out windows ({f.show('model/logit_check.json', 'tokens')} tokens, "
                  f"float32, transformers {f.show('model/logit_check.json', 'transformers_version')})."
                  if check["checked"] else f"Export check: not run ({f.show('model/logit_check.json', 'reason')}).")
    decontam = f.read("decontamination/record.json")
    decontam_line = ("No decontamination stage ran in this run." if not decontam["ran"] else
                     f"Training documents sharing a {f.show('decontamination/record.json', 'ngram_size')}-gram with the test items "
                     f"of {f.show('decontamination/record.json', 'benchmarks')} were removed (documents removed: "
                     f"{f.show('decontamination/record.json', 'documents_removed')}; "
                     "decontamination/removal_list.parquet lists each with the benchmark item and n-gram it matched).")
    front = _front_matter(f)
    return front + f"""# {f.show("model/hymo_export.json", "checkpoint")} — a HyMo base model

A base language model pretrained with HyMo, step {f.show("model/hymo_export.json", "step")}. Not instruction-tuned.
Every number on this card is read from a file of this bundle (facts.json says which); SHA256SUMS lists every file.

## Use

```python
{load}```

## Intended use and limitations

Intended for research on pretraining: reproducing this run, studying its data pipeline, comparing checkpoints,
continued pretraining. It is a base model: it continues text, it does not follow instructions, and it has had no
safety tuning, so it can produce false, biased or offensive text. It is small and briefly trained: read its
accuracies beside the chance column below, not as capabilities. It knows only what its training sources hold
(DATA_CARD.md); text longer than its context window is cut (the truncation column counts the benchmark contexts
that were). The training data's licences are below.

## Licence

{_licence_section(f)}
## Model

{shape}
Weights: `model/model.safetensors` (fp32). {check_line} {"The modeling code ships in `model/` (`trust_remote_code=True`); multi-token prediction is training-only and not exported." if remote else "A standard transformers architecture: no remote code."}

## Training

{training}
Per-step logs: `training/metrics.jsonl`; loss curves: `training/loss.png`.

## Evaluation

Over the run's kept checkpoints (`eval/curve.json`, `eval/curve.png`; per-item scores in `eval/STEP/eval.json`):

{_table(["step", "task", "metric", "value", "stderr", "chance", "items", "contexts cut to the window", "convention"], eval_rows)}
{held_out_line}
## Data and decontamination

See DATA_CARD.md. {decontam_line}
"""


def data_card(f: Facts) -> str:
    sources = f.read("data/corpus.json", "sources")
    source_rows = [[f.show("data/corpus.json", "sources", i, key) for key in
                    ("source", "origin", "snapshot", "license", "documents_ingested", "train_documents", "train_unique_tokens",
                     "weight", "epochs", "tokens_contributed", "validation_documents", "validation_tokens")]
                   for i in range(len(sources))]
    funnel = f.read("data/funnel.json")
    funnel_rows = []
    for i, row in enumerate(funnel):
        if not row["documents"]:
            continue  # tokenizer, mixture, shards, pretrain: artifacts, not document stages
        removed = "; ".join(f"{rule} {f.show('data/funnel.json', i, 'removed', rule)}" for rule in row["removed"]) or "–"
        modified = "; ".join(f"{rule} {f.show('data/funnel.json', i, 'modified', rule)}" for rule in row["modified"]) or "–"
        funnel_rows.append([f.show("data/funnel.json", i, "stage"), f.show("data/funnel.json", i, "in"),
                            f.show("data/funnel.json", i, "kept"), removed, modified])
    decontam = f.read("decontamination/record.json")
    if decontam["ran"]:
        bench_rows = [[name, f.show("decontamination/record.json", "per_benchmark", name, "documents_removed"),
                       f.show("decontamination/record.json", "per_benchmark", name, "items_matched")]
                      for name in decontam["per_benchmark"]]
        decontam_text = (f"n-gram size {f.show('decontamination/record.json', 'ngram_size')}; an n-gram in more than "
                         f"{f.show('decontamination/record.json', 'max_benchmark_items_per_ngram')} benchmark items or "
                         f"{f.show('decontamination/record.json', 'max_training_docs_per_ngram')} training documents is not evidence. "
                         f"Documents removed: {f.show('decontamination/record.json', 'documents_removed')}.\n\n"
                         + _table(["benchmark", "documents removed", "items matched"], bench_rows))
    else:
        decontam_text = "No decontamination stage ran in this run.\n"
    return f"""# Data card

The training corpus of this release, from `data/corpus.json` (the corpus manifest: sources, filters, mixture,
shards and their digests) and `data/funnel.json` (every stage's documents in, kept, removed per rule).

## Sources

{_table(["source", "origin", "snapshot", "licence", "documents ingested", "train documents", "train unique tokens",
         "weight", "epochs", "tokens contributed", "validation documents", "validation tokens"], source_rows)}
Training tokens in the shards: {f.show("data/corpus.json", "train_tokens")}; tokenizer vocabulary
{f.show("data/corpus.json", "tokenizer", "vocab_size")} ids, sha256 {f.show("data/corpus.json", "tokenizer", "sha256")}.

## Funnel

{_table(["stage", "in", "kept", "removed (rule count)", "modified (rule count)"], funnel_rows)}
## Decontamination

{decontam_text}"""
