"""Training the fastText quality classifier (seed 001, "基于模型的质量过滤器"; DCLM, Li et al. 2024).

A linear model over words and word bigrams learns to tell reference text
(positives, label `hq`) from random web text (negatives, label `cc`); the
score of a document is P(hq). Training data are named by SPECs: a bundled
source name or a source-spec TOML path, optionally restricted by document meta
(`generated?label=navigation,spam`). Each spec is ingested and extracted like
the pipeline does, so HTML pages train on the same text the stage will score.

A fifth of the documents (chosen by a hash of the id, so the split is stable)
is held out; precision, recall and ROC AUC on it are written to `model.json`
beside `model.bin`, with the model's sha256, the training-data digests and the
command that reproduces it. Training uses one thread and a fixed seed: the
same data give the same model bytes.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

from multiprocessing import get_context

import numpy as np
import xxhash

from manifests.atomic import atomic_write_text
from manifests.digest import sha256_file
from manifests.sources import load_source
from tasks.filters.fasttext_model import LABEL_PREFIX, one_line

POSITIVE_LABEL = "hq"  # DCLM's labels: high quality vs Common Crawl
NEGATIVE_LABEL = "cc"
MODEL_FILE = "model.bin"
CARD_FILE = "model.json"


@dataclass(frozen=True)
class ClassifierTrainConfig:
    # fastText supervised defaults plus word bigrams and dim 256: the shape of DCLM's released
    # `openhermes_reddit_eli5_vs_rw_v2_bigram_200k_train.bin` classifier.
    lr: float = 0.1
    dim: int = 256
    word_ngrams: int = 2
    epoch: int = 5
    min_count: int = 1
    bucket: int = 2_000_000
    loss: str = "softmax"
    threads: int = 1  # more threads train faster but make the model bytes depend on scheduling
    seed: int = 0
    quantize: bool = False  # product quantisation (.ftz-style): a much smaller file, slightly different scores
    heldout_fraction: float = 0.2
    # Training examples of at most this many words (0: whole documents, as DCLM). On a few hundred long
    # documents a whole-document average barely moves from P = 0.5 in 10 epochs; 64-word pieces learn.
    chunk_words: int = 0
    threshold: float = 0.5  # where held-out precision/recall are measured


@dataclass(frozen=True)
class TrainingSpec:
    """A source (bundled name or spec path) and an optional meta filter `key=value[,value...]`."""

    source: str
    meta_key: str | None = None
    meta_values: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> "TrainingSpec":
        source, _, condition = text.partition("?")
        if not condition:
            return cls(source)
        key, sep, values = condition.partition("=")
        if not sep or not key or not values:
            raise ValueError(f"training spec {text!r}: the filter must read SOURCE?key=value[,value...]")
        return cls(source, key, tuple(values.split(",")))

    def __str__(self) -> str:
        return self.source + (f"?{self.meta_key}={','.join(self.meta_values)}" if self.meta_key else "")

    def wants(self, meta: dict[str, Any]) -> bool:
        return self.meta_key is None or str(meta.get(self.meta_key)) in self.meta_values


def spec_documents(spec: TrainingSpec, work: Path, workers: int = 1) -> list[tuple[str, str]]:
    """(id, text) of the spec's documents after ingest and extract, the text the pipeline would score."""
    from tasks.ingest.extract import ExtractConfig, run_extract
    from tasks.ingest.ingest import IngestConfig, run_ingest
    from tasks.runner.stage_runner import read_stage_docs

    source = load_source(spec.source, Path.cwd())
    where = work / hashlib.sha256(json.dumps(source.public(), sort_keys=True).encode()).hexdigest()[:16]
    run_ingest([source], IngestConfig(), where / "01_ingest")
    run_extract(ExtractConfig(), where / "01_ingest", where / "02_extract", workers)
    docs = read_stage_docs(where / "02_extract", ["id", "text", "meta"]).to_pylist()
    picked = [(d["id"], d["text"]) for d in docs if spec.wants(json.loads(d["meta"]))]
    if not picked:
        raise ValueError(f"training spec {spec}: no documents after ingest + extract (check the source and the meta filter)")
    return picked


def is_heldout(doc_id: str, fraction: float) -> bool:
    return xxhash.xxh64_intdigest(doc_id.encode("utf-8")) / 2.0**64 < fraction


def documents_digest(docs: Iterable[tuple[str, str]]) -> str:
    """sha256 over the sorted (id, text sha256) pairs: what the model was trained on, order-free."""
    digest = hashlib.sha256()
    for doc_id, text in sorted(docs):
        digest.update(f"{doc_id}\t{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()}\n".encode())
    return digest.hexdigest()


def training_lines(label: str, text: str, chunk_words: int) -> str:
    """One fastText example per document, or per `chunk_words` words of it; scoring is always per document."""
    if chunk_words <= 0:
        return f"{LABEL_PREFIX}{label} {one_line(text)}\n"
    words = one_line(text).split()
    return "".join(f"{LABEL_PREFIX}{label} {' '.join(words[i: i + chunk_words])}\n" for i in range(0, len(words), chunk_words))


def positive_scores(model: Any, texts: list[str]) -> np.ndarray:
    """P(hq) per text; one C++ call for the whole list."""
    labels, probs = model.predict([one_line(t) for t in texts], k=2)
    wanted = LABEL_PREFIX + POSITIVE_LABEL
    return np.array([next((min(1.0, float(p)) for lab, p in zip(ls, ps) if lab == wanted), 0.0) for ls, ps in zip(labels, probs)], dtype=np.float64)


def roc_auc(scores: np.ndarray, is_positive: np.ndarray) -> float:
    """Mann-Whitney form: the share of (positive, negative) pairs ranked right, ties counted half."""
    positives, negatives = scores[is_positive], scores[~is_positive]
    if not len(positives) or not len(negatives):
        return float("nan")
    order = np.argsort(np.concatenate([positives, negatives]), kind="mergesort")
    ranks = np.empty(len(order), dtype=np.float64)
    ranks[order] = np.arange(1, len(order) + 1)
    merged = np.concatenate([positives, negatives])
    for value in np.unique(merged):  # average ranks of ties
        tied = merged == value
        if tied.sum() > 1:
            ranks[tied] = ranks[tied].mean()
    return float((ranks[: len(positives)].sum() - len(positives) * (len(positives) + 1) / 2) / (len(positives) * len(negatives)))


def heldout_metrics(scores: np.ndarray, is_positive: np.ndarray, threshold: float) -> dict[str, float | int]:
    predicted = scores >= threshold
    true_positive = int((predicted & is_positive).sum())
    return {
        "docs": int(len(scores)), "positives": int(is_positive.sum()), "threshold": threshold,
        "precision": true_positive / max(1, int(predicted.sum())), "recall": true_positive / max(1, int(is_positive.sum())),
        "auc": roc_auc(scores, is_positive),
    }


def fasttext_params(config: ClassifierTrainConfig) -> dict[str, Any]:
    return {"lr": config.lr, "dim": config.dim, "wordNgrams": config.word_ngrams, "epoch": config.epoch, "minCount": config.min_count,
            "bucket": config.bucket, "loss": config.loss, "thread": config.threads, "seed": config.seed, "verbose": 0}


def fit_and_save(train_file: str, params: dict[str, Any], quantize: bool, path: str) -> None:
    """Train and save in a fresh process: in a process that already trained once, fasttext-numpy2 0.10.4
    sometimes stops with "Encountered NaN" (same data, same seed); in a fresh one it gives the same bytes every time."""
    import fasttext

    model = fasttext.train_supervised(input=train_file, **params)
    if quantize:
        model.quantize(input=train_file, retrain=False, qnorm=True, cutoff=0)
    model.save_model(path)
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def train_classifier(positives: list[str], negatives: list[str], out: Path, config: ClassifierTrainConfig = ClassifierTrainConfig(),
                     work: Path | None = None, command: str | None = None) -> dict[str, Any]:
    """Train, evaluate on the held-out fifth, write model.bin and model.json into `out` atomically."""
    import fasttext

    out = Path(out)
    work = Path(work) if work else Path(tempfile.mkdtemp(prefix="hymo-classifier-"))
    labelled: list[tuple[str, str, str, str]] = []  # (spec, label, id, text)
    sources: dict[str, list[dict[str, Any]]] = {"positives": [], "negatives": []}
    for group, label, specs in (("positives", POSITIVE_LABEL, positives), ("negatives", NEGATIVE_LABEL, negatives)):
        for text_spec in specs:
            spec = TrainingSpec.parse(text_spec)
            docs = spec_documents(spec, work)
            sources[group].append({"spec": str(spec), "docs": len(docs), "digest": documents_digest(docs)})
            labelled += [(str(spec), label, doc_id, text) for doc_id, text in docs]
    labelled.sort(key=lambda row: (row[2], row[1]))  # input order fixed by ids, not by spec order on the command line
    train_rows = [row for row in labelled if not is_heldout(row[2], config.heldout_fraction)]
    heldout_rows = [row for row in labelled if is_heldout(row[2], config.heldout_fraction)]
    if not train_rows or {r[1] for r in train_rows} != {POSITIVE_LABEL, NEGATIVE_LABEL}:
        raise ValueError("classifier training: both positives and negatives need documents outside the held-out split")
    # Shuffle with a fixed seed so SGD does not see one class after the other.
    train_rows = [train_rows[i] for i in np.random.default_rng(config.seed).permutation(len(train_rows))]
    train_file = work / "train.txt"
    train_file.write_text("".join(training_lines(label, text, config.chunk_words) for _, label, _, text in train_rows), encoding="utf-8")
    out.mkdir(parents=True, exist_ok=True)
    partial = out / f".{MODEL_FILE}.partial"
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as fresh_process:
        fresh_process.submit(fit_and_save, str(train_file), fasttext_params(config), config.quantize, str(partial)).result()
    os.replace(partial, out / MODEL_FILE)
    model = fasttext.load_model(str(out / MODEL_FILE))

    scores = positive_scores(model, [text for *_, text in heldout_rows]) if heldout_rows else np.zeros(0)
    card = {
        "model": MODEL_FILE,
        "sha256": sha256_file(out / MODEL_FILE),
        "bytes": (out / MODEL_FILE).stat().st_size,
        "labels": {"positive": POSITIVE_LABEL, "negative": NEGATIVE_LABEL},
        "score": f"P({LABEL_PREFIX}{POSITIVE_LABEL}) of the document folded onto one line",
        "train_config": asdict(config),
        "fasttext_params": fasttext_params(config),
        "training_data": {**sources, "train_docs": len(train_rows), "heldout_docs": len(heldout_rows),
                          "train_file_sha256": sha256_file(train_file)},
        "heldout": heldout_metrics(scores, np.array([r[1] == POSITIVE_LABEL for r in heldout_rows], dtype=bool), config.threshold),
        "command": command or "",
    }
    atomic_write_text(out / CARD_FILE, json.dumps(card, indent=2) + "\n")
    return card


def reproduce_command(argv: list[str] | None = None) -> str:
    return shlex.join(["hymo"] + list(sys.argv[1:] if argv is None else argv))
