"""Continued pretraining: replay sampling, the gate fixed before training, tamper refusal, lineage."""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import hymo_core.cpt.run as cpt
from hymo_core.cpt.run import CptConfig, judge_run, run_cpt
from hymo_core.train.data import CorpusReader, TokenLoader
from hymo_core.cpt.gate import Criterion, GateError, GateTampered, judge, parse_gate
from hymo_core.cpt.replay import ReplayLoader
from hymo_core.train.run import run_training
from hymo_core.train.config import SAMPLE_TRAIN
from hymo_core.models.model import ModelConfig, Transformer
from tests.conftest import write_corpus

TINY_MODEL = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=64, max_seq_len=16)
TINY_TRAIN = replace(SAMPLE_TRAIN, batch_size=4, seq_len=16, max_steps=12, warmup_steps=2, log_interval=4, eval_interval=12,
                     checkpoint_interval=12, eval_batches=2, peak_lr=1e-2)
CONFIG = CptConfig(replay_ratio=0.3, peak_lr=5e-3, steps=6, warmup_steps=1, eval_interval=3, eval_batches=3)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cpt")
    general, domain = write_corpus(root / "general", seed=0), write_corpus(root / "domain", seed=5)
    run_training(general, root / "base", TINY_TRAIN, TINY_MODEL, resume=False, cloze_path=None, device=torch.device("cpu"), log=lambda *_: None)
    return {"general": general, "domain": domain, "base": root / "base" / "checkpoints" / "step-00000012.pt"}


def test_held_out_losses_run_on_the_training_runs_held_out_machinery(tiny_run):
    """The gate's units (the validation prefix, per sequence and per document) and, from the same tokens, per-group rows."""
    from hymo_core.eval.heldout import evaluate_heldout
    from hymo_core.train.data import ValidationLoader

    reader = CorpusReader(tiny_run / "07_shards")
    held = cpt.held_out_set(reader, 16, 4, 2)
    assert held.selection == "prefix" and (held.windows == ValidationLoader(reader, 16, 4, max_batches=2).windows[:8]).all()
    torch.manual_seed(0)
    model = Transformer(replace(TINY_MODEL, vocab_size=reader.vocab_size))
    losses = cpt.held_out_losses(model, held, torch.device("cpu"), reader.eos_id)
    assert sum(losses["doc_tokens"]) == 2 * 4 * 16 and len(losses["doc_tokens"]) >= 2  # a document boundary inside the prefix
    assert losses["sequences"] == pytest.approx(evaluate_heldout(model, held, torch.device("cpu")).window_losses, rel=1e-6)
    sources = {n: g for n, g in losses["groups"].items() if n.startswith("source:")}
    assert sources and sum(g["tokens"] for g in sources.values()) == 2 * 4 * 16
    mean_loss = sum(g["loss"] * g["tokens"] for g in sources.values()) / (2 * 4 * 16)
    assert mean_loss == pytest.approx(sum(losses["sequences"]) / 8, rel=1e-6)


def loaders(corpora, ratio: float, seed: int = 0) -> ReplayLoader:
    make = lambda name: TokenLoader(CorpusReader(corpora[name]), "train", 16, 8, seed=0)
    return ReplayLoader(make("domain"), make("general"), ratio, sampler_seed=seed)


def test_replay_is_a_seeded_per_sequence_coin(corpora):
    replay = loaders(corpora, 0.3)
    domain, general = loaders(corpora, 0.0), loaders(corpora, 1.0)
    for step in range(40):
        x_BT, _ = replay.next_batch()
        dx_BT, _ = domain.next_batch()
        gx_BT, _ = general.next_batch()
        mask_B = replay.general_mask(step)
        assert torch.equal(x_BT[torch.from_numpy(mask_B)], gx_BT[torch.from_numpy(mask_B)])
        assert torch.equal(x_BT[torch.from_numpy(~mask_B)], dx_BT[torch.from_numpy(~mask_B)])
    assert replay.general_sequences == sum(int(replay.general_mask(s).sum()) for s in range(40))
    assert abs(replay.actual_ratio - 0.3) < 4 * (0.3 * 0.7 / 320) ** 0.5  # a binomial coin, not an exact quota
    assert domain.actual_ratio == 0.0 and general.actual_ratio == 1.0
    # the same sampler seed gives nested coins across ratios (Lab 5's aligned comparison)
    low, high = loaders(corpora, 0.1), loaders(corpora, 0.3)
    assert all((low.general_mask(s) <= high.general_mask(s)).all() for s in range(40))
    assert not all((loaders(corpora, 0.3, seed=1).general_mask(s) == high.general_mask(s)).all() for s in range(40))


def test_gate_file_errors_name_the_criterion():
    with pytest.raises(GateError, match="criterion 1 needs metric"):
        parse_gate("[[criterion]]\nmetric = 'general_loss_rise'\n")
    with pytest.raises(GateError, match="paired_items"):
        parse_gate("[[criterion]]\nmetric = 'task_accuracy_drop'\ndirection = '<='\nthreshold = 0.01\ntask = 'hellaswag'\n")
    with pytest.raises(GateError, match="at least one"):
        parse_gate("title = 'no criteria'\n")


def test_verdict_uses_paired_uncertainty():
    rise = Criterion("general_loss_rise", "<=", 0.20)
    strict = Criterion("general_loss_rise", "<=", 0.20, rule="ci95")
    differences = {"general_loss_rise": [0.1, 0.3] * 16}  # mean 0.2, sd sqrt(0.32 / 31), se 0.017961
    point, interval = judge([rise], differences), judge([strict], differences)
    assert point["passed"] and not interval["passed"]
    assert point["criteria"][0]["stderr"] == pytest.approx(0.0179605, rel=1e-5) and point["criteria"][0]["n"] == 32


def test_a_ci95_gate_on_too_few_documents_or_items_is_refused():
    strict = Criterion("general_loss_rise", "<=", 0.20, rule="ci95")
    one_document = {"general_loss_rise": {"difference_sums": [0.1 * 16], "tokens": [16]}}  # stderr 0: "+- 0.0000" used to pass
    with pytest.raises(GateError, match="only 1 held-out documents; a 95 % interval needs at least 30"):
        judge([strict], one_document)
    with pytest.raises(GateError, match="only 29 held-out items"):
        judge([strict], {"general_loss_rise": [0.0] * 29})
    assert judge([strict], {"general_loss_rise": [0.0] * 30})["passed"]
    assert judge([Criterion("general_loss_rise", "<=", 0.20)], one_document)["passed"]  # a point rule needs no interval


def test_cpt_run_records_gate_before_training_and_lineage_after(corpora, tmp_path, monkeypatch):
    out = tmp_path / "cpt"
    real_train = cpt.train
    seen_before_first_step = {}

    def train_spy(*args, **kwargs):  # observe the disk at the moment the loop starts
        seen_before_first_step.update(json.loads((out / "cpt_manifest.json").read_text()))
        return real_train(*args, **kwargs)

    monkeypatch.setattr(cpt, "train", train_spy)
    summary = run_cpt(corpora["base"], corpora["domain"], corpora["general"], out, CONFIG, log=lambda *_: None)
    gate_sha = hashlib.sha256((out / "gate.toml").read_bytes()).hexdigest()
    assert seen_before_first_step["gate"]["sha256"] == gate_sha == summary["gate"]["sha256"]
    lineage = summary["lineage"]
    assert lineage["base_checkpoint_sha256"] == hashlib.sha256(corpora["base"].read_bytes()).hexdigest()
    assert lineage["cpt_checkpoint_sha256"] == hashlib.sha256(Path(lineage["cpt_checkpoint"]).read_bytes()).hexdigest()
    assert lineage["verdict"] in ("pass", "fail") and lineage["base_weights_sha256"] != lineage["cpt_weights_sha256"]
    measured = json.loads((out / "measurements.json").read_text())
    reduction = summary["verdict"]["criteria"][0]
    documents = measured["base"]["domain_doc_tokens"]
    assert reduction["metric"] == "domain_loss_reduction" and reduction["unit"] == "documents" and reduction["n"] == len(documents) > 12
    assert sum(documents) == 3 * 4 * 16  # 3 fixed batches of the base recipe's 4 sequences of 16 targets, each in one document
    assert reduction["value"] == pytest.approx(summary["losses"]["base"]["domain_loss"] - summary["losses"]["cpt"]["domain_loss"], abs=1e-6)
    assert measured["replay"]["sequences"] == 6 * 4 and 0 <= measured["replay"]["actual"] <= 1
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"eval"' in line]
    assert [row["step"] for row in evals] == [0, 3, 6]
    assert all("domain_groups" in row and "general_groups" in row for row in evals)  # per source / language (below)
    # the verdict is a function of the gate file and the measurements only: judging again gives the same
    assert judge_run(out)["verdict"] == summary["verdict"]
    # an edited gate is refused, and a second run into the same directory too
    (out / "gate.toml").write_text((out / "gate.toml").read_text().replace("threshold = 0.2", "threshold = 5.0"))
    with pytest.raises(GateTampered, match="edited after the run started"):
        judge_run(out)
    with pytest.raises(FileExistsError, match="a gate is fixed once per run"):
        run_cpt(corpora["base"], corpora["domain"], corpora["general"], out, CONFIG)


def test_editing_the_gate_during_training_stops_the_run(corpora, tmp_path):
    out = tmp_path / "cpt"

    def loosen_gate(row):
        (out / "gate.toml").write_text("[[criterion]]\nmetric = 'general_loss_rise'\ndirection = '<='\nthreshold = 9.0\n")

    with pytest.raises(GateTampered):
        run_cpt(corpora["base"], corpora["domain"], corpora["general"], out, CONFIG, log=lambda *_: None, on_eval=loosen_gate)
    assert json.loads((out / "summary.json").read_text())["verdict"]["status"] == "refused"
    assert not (out / "measurements.json").exists()


def test_the_document_bootstrap_does_not_understate_correlated_windows():
    """Two documents, each spanning many windows whose differences move together: the windows' naive
    error is small, the documents' is not."""
    from hymo_core.cpt.gate import document_estimate, paired_estimate

    windows = [0.5] * 10 + [1.5] * 10  # ten windows of document A, ten of document B, 16 tokens each
    naive = paired_estimate(windows)
    documents = document_estimate([0.5 * 160, 1.5 * 160], [160, 160])
    assert documents["value"] == pytest.approx(naive["value"]) == pytest.approx(1.0)
    assert documents["n"] == 2 and documents["stderr"] > 3 * naive["stderr"]
    assert document_estimate([0.5 * 160, 1.5 * 160], [160, 160]) == documents  # seeded: the same error every time


def test_verify_recomputes_the_verdict_and_catches_edits_of_the_gate_or_the_measurements(corpora, tmp_path):
    from hymo_core.cpt.ledger import run_records
    from hymo_core.cpt.verify import verify_run

    out = tmp_path / "cpt"
    seen = []
    summary = run_cpt(corpora["base"], corpora["domain"], corpora["general"], out, CONFIG, log=lambda *_: None, on_record=seen.append)
    ledger = tmp_path / "cpt_ledger.jsonl"  # outside OUT
    records = run_records(ledger, out)
    assert [r["stage"] for r in seen] == ["start", "end"] and records["start"] == seen[0] and records["end"] == seen[1]
    assert records["start"]["time"] < records["end"]["time"] and records["end"]["measurements_sha256"] == summary["measurements"]["sha256"]
    report = verify_run(out)
    assert report["verified"], report["checks"]
    assert report["verdict"]["passed"] == summary["verdict"]["passed"]

    # the edit: loosen the gate and rewrite its hash in the manifest; judge_run is satisfied, verify is not
    original_gate, original_manifest = (out / "gate.toml").read_bytes(), (out / "cpt_manifest.json").read_bytes()
    loose = "[[criterion]]\nmetric = 'general_loss_rise'\ndirection = '<='\nthreshold = 9.0\n"
    (out / "gate.toml").write_text(loose)
    manifest = json.loads(original_manifest)
    manifest["gate"]["sha256"] = hashlib.sha256(loose.encode()).hexdigest()
    (out / "cpt_manifest.json").write_text(json.dumps(manifest))
    assert judge_run(out)["verdict"]["passed"]
    report = verify_run(out)
    failed = {c["check"] for c in report["checks"] if not c["ok"]}
    assert not report["verified"] and {"gate", "manifest"} <= failed
    (out / "gate.toml").write_bytes(original_gate), (out / "cpt_manifest.json").write_bytes(original_manifest)

    # edit the measured losses so the CPT model looks better, and re-judge: the checkpoints say otherwise
    measured = json.loads((out / "measurements.json").read_text())
    measured["cpt"]["general_loss"] = [v - 1.0 for v in measured["cpt"]["general_loss"]]
    measured["cpt"]["general_doc_loss_sums"] = [v - t for v, t in zip(measured["cpt"]["general_doc_loss_sums"], measured["cpt"]["general_doc_tokens"])]
    (out / "measurements.json").write_text(json.dumps(measured))
    judge_run(out)
    report = verify_run(out)
    failed = {c["check"] for c in report["checks"] if not c["ok"]}
    assert not report["verified"] and {"measurements file", "cpt measurements"} <= failed
    assert report["verdict"]["passed"] == summary["verdict"]["passed"]  # recomputed from the checkpoint, not the edit


def _forge_a_pass(out: Path, ledger: Path) -> None:
    """The issue's forgery: loosen the gate, rewrite its hash in the manifest, re-judge, and append a new
    start and end record whose links are right (a forger who writes the lines by hand, not via append_record)."""
    from hymo_core.cpt.ledger import line_sha256

    loose = "[[criterion]]\nmetric = 'general_loss_rise'\ndirection = '<='\nthreshold = 9.0\n"
    (out / "gate.toml").write_text(loose)
    manifest = json.loads((out / "cpt_manifest.json").read_text())
    manifest["gate"]["sha256"] = hashlib.sha256(loose.encode()).hexdigest()
    (out / "cpt_manifest.json").write_text(json.dumps(manifest))
    summary = judge_run(out)
    assert summary["verdict"]["passed"]
    lines = ledger.read_text().splitlines()
    start, end = (json.loads(line) for line in lines[-2:])
    start.update(gate_sha256=manifest["gate"]["sha256"], manifest_sha256=hashlib.sha256((out / "cpt_manifest.json").read_bytes()).hexdigest(),
                 prev_sha256=line_sha256(lines[-1]))
    start_line = json.dumps(start, sort_keys=True)
    end.update(gate_sha256=manifest["gate"]["sha256"], manifest_sha256=start["manifest_sha256"], verdict="pass",
               summary_sha256=hashlib.sha256((out / "summary.json").read_bytes()).hexdigest(), prev_sha256=line_sha256(start_line))
    with open(ledger, "a") as handle:
        handle.write(start_line + "\n" + json.dumps(end, sort_keys=True) + "\n")


def test_a_forged_pass_appended_to_the_ledger_is_refused(corpora, tmp_path):
    from hymo_core.cpt.ledger import LedgerError, append_record, read_ledger
    from hymo_core.cpt.verify import verify_run

    out, ledger = tmp_path / "cpt", tmp_path / "cpt_ledger.jsonl"
    failing = [Criterion("domain_loss_reduction", ">=", 50.0)]
    summary = run_cpt(corpora["base"], corpora["domain"], corpora["general"], out, CONFIG, failing, log=lambda *_: None)
    assert not summary["verdict"]["passed"] and verify_run(out)["verified"]
    records = read_ledger(ledger)
    with pytest.raises(LedgerError, match="already holds the start record"):  # the writer refuses a second start
        append_record(ledger, {**records[0], "time": records[0]["time"] + 1})

    _forge_a_pass(out, ledger)
    assert len(read_ledger(ledger)) == 4  # the forged lines link correctly
    report = verify_run(out)
    failed = {c["check"]: c["detail"] for c in report["checks"] if not c["ok"]}
    assert not report["verified"] and "two start records" in failed["ledger"]
    assert report["verdict"]["passed"]  # what the loosened gate on disk gives; verified is False, so the CLI refuses it (exit 4)

    # editing a line in the middle (the first end record says "pass") breaks the next link
    lines = ledger.read_text().splitlines()
    lines[1] = lines[1].replace('"verdict": "fail"', '"verdict": "pass"')
    ledger.write_text("\n".join(lines) + "\n")
    with pytest.raises(LedgerError, match=r"cpt_ledger.jsonl:3: prev_sha256 .* is not the sha256 of the line before it"):
        read_ledger(ledger)
    assert "the ledger was edited" in {c["check"]: c["detail"] for c in verify_run(out)["checks"]}["ledger"]


def test_verifying_a_copied_run_measures_the_copy(corpora, tmp_path):
    import shutil

    from hymo_core.cpt.verify import verify_run

    out, ledger = tmp_path / "cpt", tmp_path / "cpt_ledger.jsonl"
    run_cpt(corpora["base"], corpora["domain"], corpora["general"], out, CONFIG, log=lambda *_: None)
    assert not Path(json.loads((out / "measurements.json").read_text())["checkpoint"]["path"]).is_absolute()
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(out, copy)
    report = verify_run(copy, ledger)  # found by its run_id in the original's ledger
    assert report["verified"], report["checks"]
    final = next(c for c in report["checks"] if c["check"] == "final checkpoint")
    assert final["detail"].startswith(str(copy))
    checkpoint = next((copy / "checkpoints").glob("*.pt"))
    checkpoint.write_bytes(checkpoint.read_bytes() + b"\0")  # only the copy changes: the copy's files are what is measured
    failed = {c["check"] for c in verify_run(copy, ledger)["checks"] if not c["ok"]}
    assert "final checkpoint" in failed
    assert verify_run(out)["verified"]


def test_a_ledger_line_without_a_link_is_named(tmp_path):
    from hymo_core.cpt.ledger import LedgerError, append_record, read_ledger

    ledger = tmp_path / "cpt_ledger.jsonl"
    append_record(ledger, {"run": "/a", "run_id": "a", "stage": "start"})
    append_record(ledger, {"run": "/a", "run_id": "a", "stage": "end"})
    assert [r["stage"] for r in read_ledger(ledger)] == ["start", "end"]
    with open(ledger, "a") as handle:  # a line added by hand, without the link
        handle.write(json.dumps({"run": "/b", "run_id": "b", "stage": "start"}) + "\n")
    with pytest.raises(LedgerError, match=r"cpt_ledger.jsonl:3: no prev_sha256"):
        append_record(ledger, {"run": "/c", "run_id": "c", "stage": "start"})


def test_verify_a_copied_run_from_another_directory_finds_its_corpora_by_digest(corpora, tmp_path, monkeypatch, capsys):
    """Issue 58, part 2: corpora typed as relative paths; the run, its corpora and its ledger copied elsewhere;
    `hymo cpt verify` run from an unrelated directory exits 0, and 4 (never 1) when a corpus cannot be found."""
    import shutil

    from flows.cli import main

    written = tmp_path / "written"
    for name in ("general", "domain"):
        shutil.copytree(corpora[name], written / name)
    monkeypatch.chdir(written)
    run_cpt(corpora["base"], Path("domain"), Path("general"), Path("cpt"), CONFIG, log=lambda *_: None)
    assert json.loads((written / "cpt" / "cpt_manifest.json").read_text())["domain"]["corpus"] == "domain/corpus.json"
    copied = tmp_path / "copied"
    shutil.copytree(written, copied)
    shutil.rmtree(written)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["cpt", "verify", str(copied / "cpt")]) == 0, capsys.readouterr().out
    printed = capsys.readouterr().out.replace("\n", "")  # rich wraps long lines at the terminal's width
    assert f"ok   domain corpus: {copied / 'domain' / 'corpus.json'}" in printed and "ok   tokenizer" in printed
    moved = tmp_path / "moved"
    (copied / "domain").rename(moved)  # the domain corpus is no longer where anything recorded it
    assert main(["cpt", "verify", str(copied / "cpt")]) == 4
    printed = capsys.readouterr().out.replace("\n", "")
    assert "FAIL domain corpus: no corpus with the recorded digest" in printed and "NOT VERIFIED" in printed
    assert main(["cpt", "verify", str(copied / "cpt"), "--domain", str(moved)]) == 0  # the verifier says where it is now
    assert main(["cpt", "verify", str(copied / "cpt"), "--domain", str(copied / "general")]) == 4  # not the recorded corpus
    (copied / "cpt" / "measurements.json").unlink()
    assert main(["cpt", "verify", str(copied / "cpt"), "--domain", str(moved)]) == 4  # a damaged run: not verified, no crash
    assert "FAIL run: FileNotFoundError" in capsys.readouterr().out.replace("\n", "")
