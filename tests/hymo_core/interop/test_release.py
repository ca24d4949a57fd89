"""`hymo release`: the bundle loads in transformers, its checksums hold, and every number on its cards
is read from a file of the bundle."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

NUMBER = re.compile(r"(?<![\w.\-/])\d[\d ]*(?:\.\d+)?(?![\w.])")


@pytest.fixture(scope="module")
def release_run(tmp_path_factory) -> Path:
    """Sources -> ... -> decontam -> split -> tokenizer -> mixture -> shards -> pretrain, one ARC item leaked into a source."""
    from conftest import single_torch_thread, write_sources

    from manifests.benchmark_sets import eval_items

    root = tmp_path_factory.mktemp("release")
    specs = write_sources(root / "sources")
    leaked = next(r for r in eval_items("arc_easy")[0] if len(r["question"].split()) >= 16)
    with open(root / "sources" / "prose" / "docs.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"url": "https://prose.example/leak", "text": f"Quiz night. {leaked['question']} Good luck to all."}) + "\n")
    run = root / "run"
    with single_torch_thread():
        build_run(run, specs, root)
    return run


def build_run(run: Path, specs: list[Path], root: Path) -> None:
    from conftest import stand_in_dedup_fuzzy, two_cloze_items

    from hymo_core.models.configs import ModelConfig
    from hymo_core.train.config import TrainConfig
    from manifests.sources import load_spec_file
    from tasks.corpus.mixture import MixtureConfig, run_mixture
    from tasks.corpus.shards import ShardsConfig, run_shards
    from tasks.corpus.split import SplitConfig, run_split
    from tasks.corpus.tokenizer import TokenizerConfig, run_tokenizer
    from tasks.dedup.decontam import DecontamConfig, run_decontam
    from tasks.ingest.extract import ExtractConfig, run_extract
    from tasks.ingest.ingest import IngestConfig, run_ingest
    from tasks.pretrain import PretrainConfig, run_pretrain

    run_ingest([load_spec_file(p) for p in specs], IngestConfig(docs_per_shard=40), run / "01_ingest")
    run_extract(ExtractConfig(), run / "01_ingest", run / "02_extract", workers=1)
    stand_in_dedup_fuzzy(run / "02_extract", run / "03_dedup_fuzzy")
    run_decontam(DecontamConfig(benchmarks=("arc_easy",)), run / "03_dedup_fuzzy", run / "04_decontam", workers=1)
    run_split(SplitConfig(validation_fraction=0.2), run / "04_decontam", run / "05_split", workers=1)
    weights = {"prose": 0.5, "mixed": 0.5}
    run_tokenizer(TokenizerConfig(vocab_size=400, pad_to_multiple=64), run / "05_split", run / "06_tokenizer", weights)
    run_mixture(MixtureConfig(weights=weights, total_tokens=30_000, max_epochs=4.0), run / "05_split", run / "06_tokenizer", run / "07_mixture")
    run_shards(ShardsConfig(tokens_per_shard=4096), run / "05_split", run / "06_tokenizer", run / "07_mixture", run / "08_shards")
    train = TrainConfig(batch_size=4, seq_len=32, max_steps=4, warmup_steps=1, log_interval=1, eval_interval=2,
                        checkpoint_interval=2, eval_batches=1)
    model = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)
    run_pretrain(PretrainConfig(train=train, model=model, cloze=str(two_cloze_items(root))), run / "08_shards", run / "09_pretrain")


@pytest.fixture(scope="module")
def bundle(release_run: Path, tmp_path_factory) -> Path:
    from flows.cli import main

    from conftest import single_torch_thread

    out = tmp_path_factory.mktemp("bundle") / "release"
    with single_torch_thread():
        assert main(["release", str(release_run), "--out", str(out), "--eval-limit", "2"]) == 0
    return out


def test_bundle_loads_in_transformers_with_the_runs_final_weights(bundle: Path, release_run: Path):
    from hymo_core.checkpoint.load import load_model

    summary = json.loads((release_run / "09_pretrain" / "summary.json").read_text())
    model, _ = load_model(release_run / "09_pretrain" / summary["checkpoint"])
    hf = transformers.AutoModelForCausalLM.from_pretrained(bundle / "model", dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(bundle / "model")
    ids = torch.tensor([tokenizer("The river ran quietly past the old mill")["input_ids"]])
    with torch.no_grad():
        assert (hf(ids).logits - model(ids)[0]).abs().max().item() <= 1e-5


def test_checksums_cover_every_file(bundle: Path):
    listed = {}
    for line in (bundle / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ", 1)
        listed[name] = digest
    present = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()} - {"SHA256SUMS"}
    assert set(listed) == present
    for name, digest in listed.items():
        assert hashlib.sha256((bundle / name).read_bytes()).hexdigest() == digest, name
    for needed in ("model/config.json", "model/model.safetensors", "model/tokenizer.json", "training/metrics.jsonl",
                   "training/loss.png", "data/corpus.json", "data/funnel.json", "decontamination/record.json",
                   "decontamination/removal_list.parquet", "eval/curve.json", "eval/curve.png", "README.md", "DATA_CARD.md"):
        assert needed in present, needed


def test_every_number_on_the_cards_is_read_from_a_bundle_file(bundle: Path):
    facts = json.loads((bundle / "facts.json").read_text())
    for fact in facts:  # each fact is what its file says, rounded as shown
        value = json.loads((bundle / fact["file"]).read_text()) if fact["file"].endswith(".json") else \
            [json.loads(line) for line in (bundle / fact["file"]).read_text().splitlines()]
        for key in fact["keys"]:
            value = value[key]
        if fact["digits"] is not None and isinstance(value, float):
            value = round(value, fact["digits"])
        assert value == fact["value"], fact
    shown = set()
    for fact in facts:
        value = fact["value"]
        for item in (value if isinstance(value, list) else [value]):
            shown.add(str(item))
            if isinstance(item, int) and not isinstance(item, bool):
                shown.add(f"{item:,}".replace(",", " "))
    for card in ("README.md", "DATA_CARD.md"):
        text = (bundle / card).read_text()
        numbers = [m.group(0).strip() for m in NUMBER.finditer(text)]
        assert numbers, card
        for number in numbers:
            assert number in shown or any(number in s for s in shown if not s.replace(".", "").isdigit()), (card, number)


def test_decontamination_record_names_the_removed_document(bundle: Path):
    record = json.loads((bundle / "decontamination" / "record.json").read_text())
    assert record["ran"] and record["ngram_size"] == 13 and record["benchmarks"] == ["arc_easy"]
    assert record["documents_removed"] >= 1 and record["per_benchmark"]["arc_easy"]["documents_removed"] >= 1
    removed = pq.read_table(bundle / "decontamination" / "removal_list.parquet").to_pylist()
    assert removed and all(row["benchmark"] == "arc_easy" for row in removed)
    funnel = {row["stage"]: row for row in json.loads((bundle / "data" / "funnel.json").read_text())}
    assert funnel["decontam"]["removed"]["contaminated"] == record["documents_removed"]
    card = (bundle / "DATA_CARD.md").read_text()
    assert "| arc_easy |" in card and "CC0-1.0" in card  # per-benchmark removals, the sources' licence


def test_eval_curve_has_a_point_per_kept_checkpoint(bundle: Path, release_run: Path):
    curve = json.loads((bundle / "eval" / "curve.json").read_text())
    kept = sorted(p.name for p in (release_run / "09_pretrain" / "checkpoints").iterdir())
    assert [p["checkpoint"] for p in curve["checkpoints"]] == kept
    assert [p["step"] for p in curve["checkpoints"]] == sorted(p["step"] for p in curve["checkpoints"])
    assert set(curve["checkpoints"][0]["tasks"]) == {"hellaswag", "arc_easy", "arc_challenge", "mmlu"}
    assert [v["step"] for v in curve["validation_loss"]] == [2, 4]


def test_the_model_card_names_licences_use_chance_truncation_and_the_export_check(bundle: Path, release_run: Path):
    import yaml

    card = (bundle / "README.md").read_text()
    assert card.startswith("---\n")
    front = yaml.safe_load(card.split("---\n")[1])
    licences = {source["license"] for source in json.loads((bundle / "data" / "corpus.json").read_text())["sources"]}
    assert front["license"] == "other" and set(front["source_licenses"]) == licences and licences
    assert "## Intended use and limitations" in card and "## Licence" in card
    header = next(line for line in card.splitlines() if line.startswith("| step | task |"))
    assert "| chance |" in header and "| contexts cut to the window |" in header
    curve = json.loads((bundle / "eval" / "curve.json").read_text())
    point = curve["checkpoints"][-1]
    evaluated = json.loads((bundle / "eval" / Path(point["eval"])).read_text())
    for task, row in point["tasks"].items():  # the chance and truncation counts are the eval's
        assert row["chance"] == evaluated["tasks"][task]["chance"] and row["contexts_truncated"] == evaluated["tasks"][task]["contexts_truncated"]
    assert point["tasks"]["mmlu"]["chance"] == 0.25
    check = json.loads((bundle / "model" / "logit_check.json").read_text())
    assert check["checked"] and check["max_abs_logit_difference"] <= 1e-5 and check["tokens"] > 0
    assert "largest |logit| difference" in card


def test_the_held_out_loss_of_the_final_checkpoint_is_the_trainings_val_loss(bundle: Path):
    """One held-out set: eval/curve.json's held-out loss of the last checkpoint equals training/summary.json's final
    val_loss (the trainer's windows), not a second number from other windows."""
    summary = json.loads((bundle / "training" / "summary.json").read_text())
    curve = json.loads((bundle / "eval" / "curve.json").read_text())
    assert curve["checkpoints"][-1]["step"] == summary["final_step"]
    assert curve["checkpoints"][-1]["held_out_loss"] == pytest.approx(summary["final_val_loss"], abs=1e-5)


def test_the_licence_section_names_share_alike_sources(tmp_path: Path):
    """A sample with GPL-3.0 and CC-BY-SA-4.0 sources: the front matter names both, the card says they are copyleft."""
    import yaml

    from hymo_core.interop.cards import Facts, _front_matter, _licence_section

    (tmp_path / "data").mkdir()
    sources = [{"source": name, "license": licence} for name, licence in
               (("code", "GPL-3.0"), ("wiki", "CC-BY-SA-4.0"), ("web", "ODC-By-1.0"), ("wiki2", "CC-BY-SA-4.0"))]
    (tmp_path / "data" / "corpus.json").write_text(json.dumps({"sources": sources}))
    facts = Facts(tmp_path)
    front = yaml.safe_load(_front_matter(facts).split("---\n")[1])
    assert front["source_licenses"] == ["GPL-3.0", "CC-BY-SA-4.0", "ODC-By-1.0"]
    section = _licence_section(facts)
    assert "Share-alike or copyleft among them: GPL-3.0, CC-BY-SA-4.0;" in section and "ODC-By-1.0" in section


def test_bundle_is_readable_by_others(bundle: Path):
    """Issue 58: mkdtemp made model/ 0700 and model.safetensors 0600; a release is meant to be read by others."""
    import os

    umask = os.umask(0o022)  # read, then put back
    os.umask(umask)
    assert umask & 0o044 == 0, f"this check needs a umask that lets others read (got {umask:03o})"
    for path in [bundle, *bundle.rglob("*")]:
        mode = path.stat().st_mode & 0o777
        assert mode == (0o777 if path.is_dir() else 0o666) & ~umask, (path, oct(mode))
    assert (bundle / "model").stat().st_mode & 0o777 == 0o755 if umask == 0o022 else True
