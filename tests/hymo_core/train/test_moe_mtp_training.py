"""MoE + MTP inside the model and the loop: the loss, the once-per-update bias step, checkpoints, bitwise resume."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from hymo_core.checkpoint.single import read_checkpoint
from hymo_core.train.data import CorpusReader, TokenLoader
from hymo_core.models.layers.context import MixerContext
from hymo_core.models.layers.moe import MoE
from hymo_core.models.model import ModelConfig, Transformer
from hymo_core.train.optim import build_optimizer
from hymo_core.train.run import run_training
from hymo_core.train.config import TrainConfig
from hymo_core.train.trainer import TrainHooks, TrainState, train

CPU = torch.device("cpu")
# The full recipe in miniature: a GDN and an MLA layer, MoE on the MLA layer, MTP depth 2.
FULL = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, ffn_dim=48, max_seq_len=16,
                   layer_pattern="GM", moe_on="M", moe_n_routed_experts=4, moe_n_activated_experts=2, moe_expert_dim=16,
                   mtp_depth=2, tie_embeddings=False)
FULL_TRAIN = dict(optimizer="normuon", cautious_weight_decay=True, batch_size=4, seq_len=16, warmup_steps=1, peak_lr=1e-2,
                  log_interval=1, eval_interval=2, checkpoint_interval=2, eval_batches=1)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny layers: see tests/conftest.py


def test_mtp_loss_is_the_weighted_sum_of_independently_computed_cross_entropies():
    torch.manual_seed(0)
    model = Transformer(replace(FULL, moe_on="", layer_pattern="A", mtp_loss_weights=(0.3, 0.1)))
    tokens = torch.randint(0, 64, (2, 13))
    x, y = tokens[:, :-1], tokens[:, 1:]
    model.train()
    _, loss = model(x, y)

    # The same chain by hand: trunk hidden state, then per depth k: embed y[:, k-1:T-1], targets y[:, k:].
    ctx = MixerContext(model.rope_cos_TD2, model.rope_sin_TD2)
    h = model.tok_embeddings(x)
    for block in model.layers:
        h = block(h, ctx)
    main = F.cross_entropy(model.output(model.norm(h)).flatten(0, 1), y.flatten())
    T, expected_ces = y.shape[1], []
    for k, depth in enumerate(model.mtp.depths, start=1):
        e = model.tok_embeddings(y[:, k - 1: T - 1])
        h = depth.block(depth.proj(torch.cat((depth.hidden_norm(h[:, : T - k]), depth.embed_norm(e)), -1)), ctx)
        expected_ces.append(F.cross_entropy(model.output(depth.out_norm(h)).flatten(0, 1), y[:, k:].flatten()))
    torch.testing.assert_close(loss, main + 0.3 * expected_ces[0] + 0.1 * expected_ces[1])
    torch.testing.assert_close(torch.stack(model.last_mtp_ce), torch.stack(expected_ces).detach())

    model.eval()  # dropped for evaluation (and generation): the loss is the next-token CE alone
    _, eval_loss = model(x, y)
    torch.testing.assert_close(eval_loss, main)


def test_gate_bias_steps_exactly_once_per_optimizer_update_under_accumulation(tiny_corpus):
    config = TrainConfig(**{**FULL_TRAIN, "max_steps": 3, "gradient_accumulation_steps": 4, "eval_interval": 100,
                            "checkpoint_interval": 100})
    torch.manual_seed(0)
    model = Transformer(FULL)
    optimizer = build_optimizer(model, config.optimizer_config(CPU))
    loader = TokenLoader(CorpusReader(tiny_corpus), "train", config.seq_len, config.batch_size, config.seed)
    moes = model.moe_layers()
    assert [name for name, _ in moes] == ["layers.1.ffn"]  # MTP blocks carry a dense FFN (seed 000: 8 MoE = the MLA layers)
    with torch.device("meta"):
        routed_mtp = Transformer(replace(FULL, mtp_moe=True))  # DeepSeek-V3's choice, one switch away
    assert [name for name, _ in routed_mtp.moe_layers()] == ["layers.1.ffn", "mtp.depths.0.block.ffn",
                                                              "mtp.depths.1.block.ffn"]
    calls = []

    def spy(name, real):  # records each bias step's counts, then takes the real step
        def apply_bias_update(counts, dropped):
            calls.append((name, float(counts.sum())))
            return real(counts, dropped)
        return apply_bias_update

    for name, moe in moes:
        moe.apply_bias_update = spy(name, moe.apply_bias_update)
    steps_seen, logs = [], []
    hooks = TrainHooks(on_update=lambda state, loss, lr: steps_seen.append((state.step, len(calls))), on_log=logs.append)
    train(model, optimizer, loader, None, config, TrainState(), CPU, hooks)
    # One call per MoE layer per update, never per micro-batch; each saw all 4 micro-batches' tokens.
    assert steps_seen == [(1, 1), (2, 2), (3, 3)]
    trunk = [total for name, total in calls if name == "layers.1.ffn"]
    assert trunk == [4 * 4 * 16 * 2] * 3  # micro-batches x B x T x top-k
    steps_of_gamma = model.layers[1].ffn.expert_bias_E / 1e-3  # each update moves a bias by -gamma, 0 or +gamma
    torch.testing.assert_close(steps_of_gamma, steps_of_gamma.round(), rtol=0, atol=1e-4)
    assert steps_of_gamma.abs().max() <= 3 + 1e-4 and steps_of_gamma.abs().max() >= 1 - 1e-4
    record = logs[-1]
    assert set(record["moe"]["layers.1.ffn"]) >= {"load_min", "load_max", "load_cv", "bias_norm", "dropped_tokens"}
    assert len(record["mtp_ce"]) == 2 and all(ce > 0 for ce in record["mtp_ce"])


def test_full_recipe_resumes_bitwise_and_checkpoints_hold_biases_and_mtp(tiny_corpus, tmp_path):
    config = TrainConfig(**{**FULL_TRAIN, "max_steps": 4, "horizon_steps": 4})
    whole = run_training(tiny_corpus, tmp_path / "whole", config, FULL, resume=False, progress=False, cloze_path=None,
                         log=lambda *_: None)
    run_training(tiny_corpus, tmp_path / "split", replace(config, max_steps=2), FULL, resume=False, progress=False,
                 cloze_path=None, log=lambda *_: None)
    payload = read_checkpoint(tmp_path / "split" / "checkpoints" / "step-00000002.pt")
    assert payload["model"]["layers.1.ffn.expert_bias_E"].abs().sum() > 0  # a gate bias that moved
    assert payload["model"]["layers.1.ffn.load_ema_E"].sum() == pytest.approx(1.0)
    assert any(key.startswith("mtp.depths.1.block.") for key in payload["model"])
    assert "layers.1.ffn.experts.w1.weight" in payload["model"] and payload["optimizer_type"].endswith("NorMuonAdamW")

    split = run_training(tiny_corpus, tmp_path / "split", config, FULL, resume=True, progress=False, cloze_path=None,
                         log=lambda *_: None)
    assert split["resumed_from"].endswith("step-00000002.pt")
    assert split["weights_sha256"] == whole["weights_sha256"]  # model, gate biases and MTP modules, bit for bit
    rows = {name: [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
            for name in ("whole", "split")}
    train_rows = {name: [(r["last_loss"], r["mtp_ce"], r["moe"]) for r in rows[name] if r["kind"] == "train"] for name in rows}
    assert train_rows["whole"] == train_rows["split"]
    assert whole["final_expert_load"]["layers.1.ffn"]["load_max"] >= 1.0 and len(whole["final_mtp_ce"]) == 2
    assert (tmp_path / "whole" / "expert_load.png").stat().st_size > 0

    model = Transformer(FULL)
    model.load_state_dict(payload["model"])  # the checkpoint restores the biases into a fresh model
    torch.testing.assert_close(model.layers[1].ffn.expert_bias_E, payload["model"]["layers.1.ffn.expert_bias_E"])
    assert isinstance(model.layers[1].ffn, MoE)
