"""Shared fixtures: small real inputs on disk, one Prefect test server per session, and a tiny
run from sources to shards (ingest, extract, a stand-in dedup_fuzzy, split, tokenizer, mixture, shards)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import tempfile
import textwrap
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hymo_core.train.data import _canonical_digest
from manifests.schema import DOC_SCHEMA
from tasks.runner.stage_runner import StageWriter

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HYMO_PROGRESS", "0")
os.environ.setdefault("HYMO_CACHE", tempfile.mkdtemp(prefix="hymo-test-cache-"))  # the session's own decontam index cache

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "manifests" / "sample"


def write_spec(directory: Path, name: str, kind: str, path: str, **extra: str) -> Path:
    """A source-spec TOML in `directory` pointing at `path` (relative to the spec)."""
    lines = [
        f'name = "{name}"', f'kind = "{kind}"', f'path = "{path}"', 'origin = "test fixture"',
        'snapshot = "2026-11-29"', 'license = "CC0-1.0"',
    ]
    lines += [f"{key} = {value!r}".replace("'", '"') for key, value in extra.items()]
    spec = directory / f"{name}.toml"
    spec.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return spec


def page(title: str, body: str, nav: str = "Home | Docs | Blog | Contact | Login") -> str:
    """A real-looking HTML page: navigation, a main article, a footer."""
    return textwrap.dedent(f"""\
        <!DOCTYPE html><html><head><title>{title}</title></head><body>
        <nav><ul>{''.join(f'<li><a href="/{w.strip().lower()}">{w.strip()}</a></li>' for w in nav.split('|'))}</ul></nav>
        <main><article><h1>{title}</h1>{''.join(f'<p>{p}</p>' for p in body.split(chr(10)) if p.strip())}</article></main>
        <footer><p>Copyright 2026 Example Corp. All rights reserved. Privacy policy.</p></footer>
        </body></html>""")


PROSE = [
    "The river ran quietly past the old mill, where the miller's daughter had spent every summer of her childhood watching the water wheel turn.",
    "She remembered the smell of flour and the sound of the stones grinding grain into the soft white powder that the whole village depended on.",
    "When the mill finally closed, the villagers gathered on the bridge to watch the last sacks of flour being loaded onto a cart bound for the city.",
]


@pytest.fixture
def html_dir(tmp_path: Path) -> Path:
    root = tmp_path / "pages"
    root.mkdir()
    for i in range(6):
        (root / f"page{i}.html").write_text(page(f"Story {i}", "\n".join(PROSE[j % 3] + f" Chapter {i}." for j in range(i, i + 3))), encoding="utf-8")
    return root


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    """One real Prefect server (`prefect server start`, SQLite) for every flow-level test of the session.

    Started by the same code as `hymo serve`; yields its API URL, which flows in this process,
    their worker processes, and `hymo serve` subprocesses all report to.
    """
    from flows.server import prefect_api

    with prefect_api(home=tmp_path_factory.mktemp("prefect"), reuse=False) as (api_url, _):
        yield api_url


# --- a tiny run from sources to shards (split, tokenizer, mixture, shards tests) ---

WORDS = ("the river data model token shard corpus window bright quiet garden stone paper light reason "
         "simple careful number little story open road music winter summer learn build test").split()
CHINESE = "数据清洗之后语料由多个来源组成每个来源都有一定数量的唯一词元我们把它们打包成固定长度的序列"
EMOJI = ["🙂", "🚀", "🌍", "👩‍💻", "🎉"]


def english_doc(rng: random.Random, n_sentences: int) -> str:
    return " ".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize() + "." for _ in range(n_sentences))


def mixed_doc(rng: random.Random) -> str:
    start = rng.randint(0, len(CHINESE) - 20)
    return f"{CHINESE[start:start + rng.randint(10, 20)]}。{english_doc(rng, 2)} {rng.choice(EMOJI)} 数字 {rng.randint(0, 99999)}"


def write_sources(root: Path) -> list[Path]:
    rng = random.Random(7)
    prose = [{"url": f"https://prose.example/{i}", "text": english_doc(rng, rng.randint(3, 8))} for i in range(60)]
    # near copies of the first 6 documents: the stand-in dedup stage removes them as one family each
    prose += [{"url": f"https://prose.example/copy-of-{i}", "text": prose[i]["text"] + " Copied."} for i in range(6)]
    mixed = [{"url": f"https://mixed.example/{i}", "text": mixed_doc(rng)} for i in range(40)]
    mixed.append({"url": "https://mixed.example/literal-eos", "text": "A document that mentions <|endoftext|> as plain text."})
    specs = []
    for name, rows, langs in (("prose", prose, ["en"]), ("mixed", mixed, ["zh", "en"])):
        (root / name).mkdir(parents=True)
        (root / name / "docs.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        spec = root / f"{name}.toml"
        spec.write_text(f'name = "{name}"\nkind = "jsonl"\npath = "{root / name}"\norigin = "test://{name}"\n'
                        f'snapshot = "2026-11-29"\nlicense = "CC0-1.0"\nlangs = {json.dumps(langs)}\n'
                        'profile = "prose"\n', encoding="utf-8")  # the profile these fixtures were written for (web is the default)
        specs.append(spec)
    return specs


def stand_in_dedup_fuzzy(previous: Path, out: Path) -> None:
    """What dedup_fuzzy publishes (contract of the dedup issue): removed near copies + clusters.parquet."""
    from manifests.schema import docs_table
    from manifests.stage_manifest import read_manifest
    from tasks.runner.stage_runner import StageWriter, read_stage_docs

    docs = read_stage_docs(previous).to_pylist()
    by_url = {d["url"]: d["id"] for d in docs}
    writer = StageWriter("dedup_fuzzy", "test", {}, "stand-in", [{"stage_dir": previous.name, "digest": read_manifest(previous).digest}], out)
    kept, audit, clusters = [], [], []
    for doc in docs:
        if "/copy-of-" in doc["url"]:
            original = by_url[doc["url"].replace("copy-of-", "")]
            audit.append({"id": doc["id"], "action": "removed", "rule": "near_duplicate", "value": 0.9, "threshold": 0.8,
                          "detail": {"cluster_id": original, "kept_id": original, "matched_id": original, "jaccard": 0.9}})
            clusters += [{"id": doc["id"], "cluster_id": original, "kept_id": original}, {"id": original, "cluster_id": original, "kept_id": original}]
        else:
            kept.append(doc)
    writer.write_shard(0, docs_table(kept), audit, pa.array([d["id"] for d in docs]))
    pq.write_table(pa.Table.from_pylist(clusters), writer.work_dir / "clusters.parquet")
    writer.add_artifact("clusters.parquet", len(clusters))
    writer.publish()


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    from manifests.sources import load_spec_file
    from tasks.ingest.extract import ExtractConfig, run_extract
    from tasks.ingest.ingest import IngestConfig, run_ingest
    from tasks.corpus.mixture import MixtureConfig, run_mixture
    from tasks.corpus.shards import ShardsConfig, run_shards
    from tasks.corpus.split import SplitConfig, run_split
    from tasks.corpus.tokenizer import TokenizerConfig, run_tokenizer

    root = tmp_path_factory.mktemp("tiny")
    specs = [load_spec_file(p) for p in write_sources(root / "sources")]
    run = root / "run"
    run_ingest(specs, IngestConfig(docs_per_shard=40), run / "01_ingest")
    run_extract(ExtractConfig(), run / "01_ingest", run / "02_extract", workers=1)
    stand_in_dedup_fuzzy(run / "02_extract", run / "03_dedup_fuzzy")
    run_split(SplitConfig(validation_fraction=0.2), run / "03_dedup_fuzzy", run / "04_split", workers=1)
    weights = {"prose": 0.5, "mixed": 0.5}
    run_tokenizer(TokenizerConfig(vocab_size=400, pad_to_multiple=64), run / "04_split", run / "05_tokenizer", weights)
    run_mixture(MixtureConfig(weights=weights, total_tokens=30_000, max_epochs=4.0), run / "04_split", run / "05_tokenizer", run / "06_mixture")
    run_shards(ShardsConfig(tokens_per_shard=4096), run / "04_split", run / "05_tokenizer", run / "06_mixture", run / "07_shards")
    return run


# --- orchestration: a tiny real pipeline config, and `hymo serve` against the session's server ---

# The tiny model every pipeline and CLI training test trains (a [model] or [pretrain.model] table's body).
TINY_MODEL_KEYS = """d_model = 32
n_layers = 1
n_heads = 2
n_kv_heads = 2
ffn_dim = 64
max_seq_len = 16
"""


def tiny_recipe(steps: int = 3, eval_batches: int = 2) -> str:
    """A `hymo train` recipe for the tiny run: the tiny model, evaluated and checkpointed at its last update."""
    return f"""
[train]
batch_size = 4
seq_len = 16
max_steps = {steps}
warmup_steps = 1
log_interval = 1
eval_interval = {steps}
checkpoint_interval = {steps}
eval_batches = {eval_batches}

[model]
""" + TINY_MODEL_KEYS


TINY_STAGES = """
[ingest]
docs_per_shard = 25

[langid]
langs = ["*"]
min_score = 0.3

[quality]
min_words = 20
c4_min_sentences = 1
min_stop_words = 1

[split]
validation_fraction = 0.2

[tokenizer]
vocab_size = 320

[mixture]
total_tokens = 20000

[shards]
tokens_per_shard = 4096

[pretrain.train]
batch_size = 4
seq_len = 16
max_steps = 4
warmup_steps = 1
log_interval = 1
eval_interval = 2
checkpoint_interval = 2
eval_batches = 2

[pretrain.model]
""" + TINY_MODEL_KEYS


def write_pipeline_config(root: Path, extra: str = "") -> Path:
    """A pipeline TOML over two small real-text sources, sized for seconds per stage."""
    specs = write_sources(root / "sources")
    path = root / "pipeline.toml"
    sources = ", ".join(json.dumps(str(s)) for s in specs)
    path.write_text(f"[run]\nsources = [{sources}]\nworkers = 2\n{TINY_STAGES}\n{extra}", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tiny_config(tmp_path_factory) -> Path:
    return write_pipeline_config(tmp_path_factory.mktemp("tiny-pipeline"))


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture
def browser():
    """Debian's Chromium, headless, driven by its chromedriver: what a person sees of the UI or of a report page."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(20)
    yield driver
    driver.quit()


@contextlib.contextmanager
def hymo_serve(args: list[str], cwd: Path, env: dict[str, str], log_path: Path):
    """`hymo serve ARGS` until its deployments answer at the Prefect API of the current settings; stopped with Ctrl-C."""
    from prefect.client.orchestration import get_client

    from flows.serve import DEPLOYMENTS

    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "flows", "serve", *args], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 240
            with get_client(sync_client=True) as client:
                while True:
                    try:
                        for name in DEPLOYMENTS:  # `serve` registers them one by one: wait for all
                            client.read_deployment_by_name(name)
                        break
                    except Exception:
                        if process.poll() is not None or time.monotonic() > deadline:
                            raise RuntimeError(f"hymo serve did not come up:\n{log_path.read_text(errors='replace')[-3000:]}")
                        time.sleep(1)
            yield process
        finally:
            stop_hymo_serve(process, log_path)


SERVE_STOP_S = 20  # Ctrl-C to exit: a few seconds when healthy (runner, then the server it started)


def stop_hymo_serve(process: subprocess.Popen, log_path: Path) -> None:
    """Ctrl-C; a serve still up SERVE_STOP_S later prints its threads' stacks into its log (SIGUSR1) and is killed,
    with a warning naming the log: the suite goes on, and whoever reads the warnings sees where it waited."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=SERVE_STOP_S)
        return
    except subprocess.TimeoutExpired:
        pass
    process.send_signal(signal.SIGUSR1)
    time.sleep(2)
    process.kill()
    process.wait()
    warnings.warn(f"hymo serve did not exit within {SERVE_STOP_S} s of Ctrl-C; its threads' stacks are at the end of {log_path}")


@pytest.fixture(scope="session")
def served(prefect_harness, tiny_config, tmp_path_factory):
    """`hymo serve` as a user starts it, against the session's Prefect server."""
    run_root = tmp_path_factory.mktemp("served-runs")
    log_path = run_root / "serve.log"
    args = ["--api-url", prefect_harness, "--config", str(tiny_config), "--run-root", str(run_root)]
    with hymo_serve(args, REPO, {**os.environ, "PREFECT_API_URL": prefect_harness}, log_path) as process:
        yield {"api_url": prefect_harness, "ui_url": prefect_harness.removesuffix("/api"), "run_root": run_root, "process": process, "log": log_path}


# --- stage tests: publish documents as an upstream stage directory ---

def publish_docs(out_dir: Path, texts_by_id: dict[str, str], shards: int = 1) -> Path:
    """An `ingest`-like stage holding these documents, split round-robin over `shards` shards."""
    ids = list(texts_by_id)
    writer = StageWriter("ingest", "test", {}, f"test-{out_dir.name}-{shards}", [], out_dir)
    for shard in range(shards):
        shard_ids = ids[shard::shards]
        n = len(shard_ids)
        table = pa.table({"id": shard_ids, "text": [texts_by_id[i] for i in shard_ids], "source": ["test"] * n,
                          "url": [f"test://{i}" for i in shard_ids], "lang": pa.nulls(n, pa.string()),
                          "lang_score": pa.nulls(n, pa.float32()), "meta": ["{}"] * n}, schema=DOC_SCHEMA)
        writer.write_shard(shard, table, [])
    writer.publish()
    return out_dir


@pytest.fixture
def upstream(tmp_path: Path):
    def make(texts_by_id: dict[str, str], shards: int = 1, name: str = "ingest") -> Path:
        return publish_docs(tmp_path / name, texts_by_id, shards)
    return make


# --- trainer and checkpoint tests: tiny corpora written directly with numpy ---

TINY_VOCAB = 64


def write_corpus(root: Path, seed: int = 0, train_tokens: int = 6000, validation_tokens: int = 1200) -> Path:
    """A corpus of short repeated 'sentences' (so loss can fall) in one train and one validation shard."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(1, TINY_VOCAB, size=rng.integers(4, 9)) for _ in range(12)]

    def stream(n: int) -> np.ndarray:
        out: list[int] = []
        while len(out) < n:
            out += [*phrases[int(rng.integers(len(phrases)))].tolist(), 0]
        return np.asarray(out[:n], dtype="<u2")

    (root / "tokens").mkdir(parents=True, exist_ok=True)
    shards = {}
    for split, n in (("train", train_tokens), ("validation", validation_tokens)):
        path = root / "tokens" / f"{split}-00000.bin"
        stream(n).tofile(path)
        shards[split] = [{"path": f"tokens/{split}-00000.bin", "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "tokens": n}]
    manifest = {"dtype": "uint16", "byte_order": "little", "eos_id": 0, "tokenizer": {"vocab_size": TINY_VOCAB}, "shards": shards}
    manifest["digest"] = _canonical_digest(manifest)
    (root / "corpus.json").write_text(json.dumps(manifest), encoding="utf-8")
    return root


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path / "corpus")


@contextlib.contextmanager
def single_torch_thread():
    """Tiny layers run fastest on one thread: two threads' spin-waits cost seconds on a shared machine."""
    import torch

    threads, chosen = torch.get_num_threads(), os.environ.get("HYMO_THREADS")
    torch.set_num_threads(1)
    os.environ["HYMO_THREADS"] = "1"  # a run_training inside chooses by hymo_core/threads.py's policy
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        if chosen is None:
            os.environ.pop("HYMO_THREADS", None)
        else:
            os.environ["HYMO_THREADS"] = chosen


@pytest.fixture
def one_torch_thread():
    with single_torch_thread():
        yield


@pytest.fixture
def single_rank_mesh():
    """A one-process gloo group and its 1-D CPU mesh: FSDP2-style DTensors without launching ranks."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


# --- checkpoints for the interop tests (tests/hymo_core/interop): one per exported architecture, trained on demand ---

INTEROP_TRAIN = """
[train]
batch_size = 4
seq_len = 64
max_steps = 3
warmup_steps = 1
log_interval = 1
eval_interval = 3
checkpoint_interval = 3
eval_batches = 1
"""

INTEROP_MODELS = {
    # the dense decoder -> LlamaForCausalLM (GQA, tied embeddings); a window of 128 holds every continuation of the
    # lm-eval items the tests score (lm-eval's hf model refuses longer ones) and still cuts long contexts
    "llama": "d_model = 32\nn_layers = 2\nn_heads = 4\nn_kv_heads = 2\nffn_dim = 64\nmax_seq_len = 128\n",
    # QK-norm and an untied head -> Qwen3ForCausalLM
    "qwen3": "d_model = 32\nn_layers = 2\nn_heads = 4\nn_kv_heads = 2\nffn_dim = 64\nmax_seq_len = 64\nqk_norm = true\ntie_embeddings = false\n",
    # the hybrid at its sample size: GDN x 3 + MLA with MoE, MTP depth 2 (training-only)
    "hymo-tiny": 'preset = "hymo-tiny"\n',
}


def two_cloze_items(root: Path) -> Path:
    """The end-of-training cloze score on two items instead of forty: these tests are about the weights."""
    from hymo_core.eval.evaluation import SAMPLE_CLOZE

    path = root / "cloze.jsonl"
    path.write_text("".join(SAMPLE_CLOZE.read_text(encoding="utf-8").splitlines(keepends=True)[:2]), encoding="utf-8")
    return path


def train_checkpoint(tiny_run: Path, root: Path, name: str) -> Path:
    from flows.cli import main

    recipe = root / f"{name}.toml"
    extra = "qk_clip = false\n" if "qk_norm" in INTEROP_MODELS[name] else ""  # QK-Clip and QK-norm exclude each other
    recipe.write_text(INTEROP_TRAIN + extra + "\n[model]\n" + INTEROP_MODELS[name], encoding="utf-8")
    out = root / name
    with single_torch_thread():
        assert main(["train", "--corpus", str(tiny_run), "--config", str(recipe), "--out", str(out), "--cloze", str(two_cloze_items(root))]) == 0
    return out / "checkpoints" / "step-00000003.pt"


class OnDemand(dict):
    """name -> path, made the first time a test asks for it (a test of the dense model never trains the hybrid)."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, name: str) -> Path:
        self[name] = self.make(name)
        return self[name]


@pytest.fixture(scope="session")
def checkpoints(tiny_run: Path, tmp_path_factory) -> OnDemand:
    root = tmp_path_factory.mktemp("interop-train")
    return OnDemand(lambda name: train_checkpoint(tiny_run, root, name))


@pytest.fixture(scope="session")
def exports(checkpoints: OnDemand, tiny_run: Path, tmp_path_factory) -> OnDemand:
    """`hymo export --hf` of each checkpoint."""
    from hymo_core.interop.hf_export import export_hf

    root = tmp_path_factory.mktemp("hf")

    def export(name: str) -> Path:
        with single_torch_thread():
            export_hf(checkpoints[name], root / name, corpus=tiny_run)
        return root / name
    return OnDemand(export)


# ---------------------------------------------------------------- greedy generation tests

class AlphabetTokenizer:
    """One character per id (61 ids), so a stop string is an exact run of tokens; `encode`/`decode` as tokenizers' are called."""

    ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ123456789"

    def encode(self, text: str, add_special_tokens: bool = False):
        from types import SimpleNamespace

        return SimpleNamespace(ids=[self.ALPHABET.index(c) for c in text])

    def decode(self, ids) -> str:
        return "".join(self.ALPHABET[i] for i in ids)


def varied_model(**overrides):
    """A random 61-token model whose greedy continuations vary (init std 0.3, untied head): a 12-token window."""
    import torch

    from hymo_core.models.model import ModelConfig, Transformer

    torch.manual_seed(0)
    config = dict(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48, max_seq_len=12,
                  init_std=0.3, tie_embeddings=False)
    return Transformer(ModelConfig(**{**config, **overrides})).eval()
