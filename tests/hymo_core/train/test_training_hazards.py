"""The GPU hazards of issue 14, part 6, held on CPU: a cheap logit probe that runs only when needed, a
vectorised QK-Clip, and the activation-checkpointing and compile switches that must not change the math."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from hymo_core.models.configs import ModelConfig
from hymo_core.train.config import TrainConfig
from hymo_core.train.data import CorpusReader, TokenLoader
from hymo_core.distributed.process_group import Runtime
from hymo_core.kernels.logit_probe import causal_max_logits
from hymo_core.models.layers import attention
from hymo_core.models.model import Transformer
from hymo_core.train.optim import build_optimizer
from hymo_core.distributed.parallelize import parallelize
from hymo_core.train.trainer import TrainHooks, TrainState, train

SHAPE = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48, max_seq_len=16)
RECIPE = TrainConfig(batch_size=2, seq_len=16, max_steps=4, warmup_steps=1, horizon_steps=8, log_interval=2, qk_clip=False)


def full_scores_max(q_BHTD, k_BKTD, sqrt_d):
    """The probe as it was: every score of the batch at once."""
    k_BHTD = k_BKTD.repeat_interleave(q_BHTD.shape[1] // k_BKTD.shape[1], dim=1)
    T = q_BHTD.shape[2]
    scores_BHTT = (q_BHTD @ k_BHTD.transpose(-2, -1)).abs() / sqrt_d
    return scores_BHTT.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), 0.0).amax(dim=(0, 2, 3))


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("chunk_elements", [1, 200, 1 << 26])
def test_chunked_probe_equals_the_full_score_matrix(heads, kv_heads, chunk_elements):
    generator = torch.Generator().manual_seed(heads * 10 + kv_heads)
    q_BHTD = torch.randn(2, heads, 13, 8, generator=generator)
    k_BKTD = torch.randn(2, kv_heads, 13, 8, generator=generator)
    k_BKTD[:, :, -1] *= 50  # a huge last key: visible only to the last query, so the causal mask matters
    chunked = causal_max_logits(q_BHTD, k_BKTD, math.sqrt(8), chunk_elements=chunk_elements)
    torch.testing.assert_close(chunked, full_scores_max(q_BHTD, k_BKTD, math.sqrt(8)), rtol=1e-6, atol=1e-6)


def per_head_reference(model: Transformer, maxima_LH: torch.Tensor, threshold: float) -> None:
    """QK-Clip as a loop over heads (the semantics the vectorised version must keep)."""
    for maxima_H, attn in zip(maxima_LH.tolist(), model.softmax_mixers()):
        group, d = attn.n_heads // attn.n_kv_heads, attn.head_dim
        for head, peak in enumerate(maxima_H):
            if peak <= threshold:
                continue
            gamma, rows = threshold / peak, slice(head * d, (head + 1) * d)
            if group == 1:
                attn.q_proj.weight.data[rows] *= math.sqrt(gamma)
                attn.k_proj.weight.data[rows] *= math.sqrt(gamma)
            else:
                attn.q_proj.weight.data[rows] *= gamma


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_vectorised_qk_clip_equals_the_per_head_loop(kv_heads):
    from hymo_core.train.trainer import QKClip

    torch.manual_seed(0)
    model = Transformer(replace(SHAPE, n_kv_heads=kv_heads))
    reference = Transformer(replace(SHAPE, n_kv_heads=kv_heads))
    reference.load_state_dict(model.state_dict())
    maxima_LH = torch.tensor([[0.5, 3.0, 1.0, 9.0], [2.5, 0.1, 4.0, 2.0]])
    clip = QKClip(model, threshold=2.0, enabled=True)
    clip.maxima_LH = maxima_LH.clone()
    assert clip.apply() == 4  # 3, 9, 2.5 and 4 exceed tau = 2; 2.0 itself does not
    per_head_reference(reference, maxima_LH, 2.0)
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0, msg=name)


def run(tiny_corpus, config: TrainConfig, shape: ModelConfig = SHAPE):
    reader = CorpusReader(tiny_corpus)
    torch.manual_seed(0)
    model = parallelize(Transformer(replace(shape, vocab_size=reader.vocab_size)), Runtime(), config)
    optimizer = build_optimizer(model, config.optimizer_config(torch.device("cpu")))
    loader = TokenLoader(reader, "train", config.seq_len, config.batch_size, config.seed)
    losses: list[float] = []
    hooks = TrainHooks(on_update=lambda state, loss, lr: losses.append(float(loss)))
    train(model, optimizer, loader, None, config, TrainState(), torch.device("cpu"), hooks)
    return losses, {name: t.detach().clone() for name, t in model.state_dict().items()}


def test_probe_runs_only_on_logging_steps_without_qk_clip(tiny_corpus, monkeypatch):
    calls: list[int] = []
    real = attention.causal_max_logits

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, "causal_max_logits", counted)
    records: list[dict] = []
    reader = CorpusReader(tiny_corpus)
    model = Transformer(replace(SHAPE, vocab_size=reader.vocab_size))
    optimizer = build_optimizer(model, RECIPE.optimizer_config(torch.device("cpu")))
    loader = TokenLoader(reader, "train", RECIPE.seq_len, RECIPE.batch_size, RECIPE.seed)
    train(model, optimizer, loader, None, RECIPE, TrainState(), torch.device("cpu"), TrainHooks(on_log=records.append))
    assert len(calls) == 2 * SHAPE.n_layers  # steps 2 and 4 are logged, 1 and 3 are not
    assert all(r["max_attention_logit"] > 0 for r in records)
    calls.clear()
    with_clip = replace(RECIPE, qk_clip=True)
    train(model, optimizer, loader, None, with_clip, TrainState(step=0), torch.device("cpu"))
    assert len(calls) == with_clip.max_steps * SHAPE.n_layers  # QK-Clip needs every update's maxima


def test_activation_checkpointing_changes_memory_not_math(tiny_corpus):
    plain_losses, plain_weights = run(tiny_corpus, RECIPE)
    losses, weights = run(tiny_corpus, replace(RECIPE, activation_checkpointing=True))
    assert losses == plain_losses
    assert all(torch.equal(weights[name], plain_weights[name]) for name in plain_weights)


@pytest.mark.parametrize("scope, units", [("blocks", "Block"), ("auto", "Transformer")])
def test_compile_trains_the_same_model(tiny_corpus, monkeypatch, scope, units):
    """Dynamo traces every block (or, by default on one process, the whole model) and AOTAutograd builds its
    backward; inductor's C++ code generation would add minutes on a 2-core CPU, so this test lowers through
    aot_eager (bench/distributed.py compiles with inductor on GPU; tests/hymo_core/models/test_whole_model_compile.py
    the whole model with inductor)."""
    from hymo_core.distributed import parallelize as parallel

    monkeypatch.setattr(parallel, "COMPILE_BACKEND", "aot_eager")
    compiled: list[str] = []
    real = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: (compiled.append(type(self).__name__), real(self, **kw))[1])
    shape = replace(SHAPE, n_layers=1)
    config = replace(RECIPE, max_steps=2)
    eager_losses, eager_weights = run(tiny_corpus, config, shape)
    losses, weights = run(tiny_corpus, replace(config, compile=True, compile_scope=scope), shape)
    assert compiled == ([units] * shape.n_layers if units == "Block" else [units])
    assert losses == pytest.approx(eager_losses, rel=1e-4)
    for name in eager_weights:
        torch.testing.assert_close(weights[name], eager_weights[name], rtol=1e-3, atol=1e-5)
