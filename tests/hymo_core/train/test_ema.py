"""The training EMA of the weights: the update rule, evaluation on the same windows, checkpoints that resume it bitwise."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from hymo_core.checkpoint.common import weights_sha256
from hymo_core.models.model import ModelConfig, Transformer
from hymo_core.train.config import SAMPLE_TRAIN, TrainConfig
from hymo_core.train.ema import WeightEMA
from hymo_core.train.run import run_training, session_config
from tests.conftest import write_corpus

MODEL = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=64, max_seq_len=16)
RECIPE = replace(SAMPLE_TRAIN, batch_size=4, seq_len=16, max_steps=4, warmup_steps=1, log_interval=2, eval_interval=2,
                 checkpoint_interval=2, eval_batches=2, peak_lr=1e-2, ema_decay=0.5)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_update_is_the_moving_average_and_swapping_restores_the_weights():
    torch.manual_seed(0)
    model = Transformer(replace(MODEL, vocab_size=64))
    ema = WeightEMA(model, 0.75)
    first = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update()
    name = "output.weight" if "output.weight" in first else next(iter(first))
    assert torch.allclose(ema.state_dict()["weights"][name], first[name] + 0.25, atol=1e-6)
    own = weights_sha256(model)
    with ema.swapped_in():
        assert torch.allclose(dict(model.named_parameters())[name], first[name] + 0.25, atol=1e-6)
    assert weights_sha256(model) == own
    with pytest.raises(ValueError, match="ema_decay must lie in"):
        TrainConfig(ema_decay=1.0)


def test_training_evaluates_the_ema_and_a_resume_continues_it_bitwise(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    quiet = dict(cloze_path=None, device=torch.device("cpu"), log=lambda *_: None, progress=False)
    whole = run_training(corpus, tmp_path / "whole", RECIPE, MODEL, resume=False, **quiet)
    evals = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines() if '"eval"' in line]
    assert [e["step"] for e in evals] == [2, 4] and all(e["ema_val_loss"] != e["val_loss"] for e in evals)
    assert whole["final_ema_val_loss"] == evals[-1]["ema_val_loss"] and whole["ema_weights_sha256"] != whole["weights_sha256"]
    assert "ema" in torch.load(tmp_path / "whole" / "checkpoints" / "step-00000004.pt", weights_only=True)
    ema_checkpoint = torch.load(whole["ema_checkpoint"], weights_only=True)  # ema.pt: the averaged weights, for hymo eval
    model = Transformer(replace(MODEL, vocab_size=ema_checkpoint["vocab_size"]))
    model.load_state_dict(ema_checkpoint["model"])
    assert weights_sha256(model) == whole["ema_weights_sha256"]

    run_training(corpus, tmp_path / "split", session_config(RECIPE, max_steps=2), MODEL, resume=False, **quiet)
    resumed = run_training(corpus, tmp_path / "split", RECIPE, MODEL, resume=True, **quiet)
    assert resumed["resumed_from"] and resumed["weights_sha256"] == whole["weights_sha256"]
    assert resumed["ema_weights_sha256"] == whole["ema_weights_sha256"]
