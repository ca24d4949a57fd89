"""The block interface: layer patterns, caches (cached decoding == full forward), hooks."""

import pytest
import torch

from hymo_core.models.model import ModelConfig, Transformer

DENSE = dict(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48, max_seq_len=32)


def build(**overrides) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(**{**DENSE, **overrides})).eval()


def cached_logits(model: Transformer, tokens_BT: torch.Tensor, pieces: list[int]) -> torch.Tensor:
    """Feed tokens through one cache in pieces of the given lengths; concatenate the logits."""
    cache = model.new_cache(tokens_BT.shape[0])
    out, start = [], 0
    for length in pieces:
        logits, _ = model(tokens_BT[:, start:start + length], cache=cache)
        out.append(logits)
        start += length
    assert cache.position == start
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("overrides", [{}, dict(qk_norm=True), dict(n_kv_heads=4), dict(layer_pattern="GM"),
                                       dict(layer_pattern="M", qk_norm=True), dict(layer_pattern="GA")])
def test_cached_decoding_equals_full_forward(overrides):
    model = build(**overrides)
    tokens = torch.randint(0, 61, (2, 13), generator=torch.Generator().manual_seed(1))
    full, _ = model(tokens)
    # a multi-token prefill, single steps, then a chunk that continues the cache
    torch.testing.assert_close(cached_logits(model, tokens, [5, 1, 1, 4, 2]), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("overrides", [{}, dict(qk_norm=True), dict(layer_pattern="GM", n_kv_heads=4),
                                       dict(layer_pattern="M", qk_norm=True, n_kv_heads=4)])
def test_a_per_row_cache_steps_ragged_rows_each_as_alone(overrides):
    """Rows filled to different lengths (write_rows), then stepped together one token each at their own positions
    (RoPE angle, key mask, GDN state per row): each row's logits are its own cached decoding's; keep_rows drops rows."""
    model = build(**overrides)
    lengths = [3, 7, 1, 10]
    tokens = [torch.randint(0, 61, (n + 4,), generator=torch.Generator().manual_seed(n)) for n in lengths]
    alone = [cached_logits(model, t[None], [n] + [1] * 4)[0, n - 1:] for t, n in zip(tokens, lengths)]
    rows = model.new_cache(len(lengths), per_row=True)
    for b, (t, n) in enumerate(zip(tokens, lengths)):
        filled = model.new_cache(1)
        if n > 1:
            model(t[None, :n - 1], cache=filled)
        rows.write_rows([b], filled)
    assert rows.row_positions == [n - 1 for n in lengths]
    live = list(range(len(lengths)))
    for k in range(5):
        if k == 3:
            live = [3, 0, 2]
            rows.keep_rows([3, 0, 2])
        logits_BV = model(torch.stack([tokens[b][lengths[b] - 1 + k] for b in live])[:, None], cache=rows)[0][:, 0]
        for row, b in enumerate(live):
            torch.testing.assert_close(logits_BV[row], alone[b][k], rtol=1e-5, atol=1e-5)
    assert rows.row_positions == [n + 4 for n in (10, 3, 1)]
    with pytest.raises(ValueError, match="one token per row"):
        model(torch.zeros(3, 2, dtype=torch.long), cache=rows)


def test_cache_refuses_to_run_past_max_seq_len():
    model = build(max_seq_len=8)
    cache = model.new_cache(1)
    model(torch.zeros(1, 8, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)


def test_layer_pattern_repeats_to_n_layers_and_validates():
    assert ModelConfig(**{**DENSE, "n_layers": 5}).layer_kinds() == ("A",) * 5
    with pytest.raises(ValueError, match="layer_pattern"):
        ModelConfig(**{**DENSE, "layer_pattern": "AX"})
    with pytest.raises(ValueError, match="moe_on"):
        ModelConfig(**{**DENSE, "moe_on": "Q"})


def test_dense_parameter_names_are_unchanged():
    names = set(build().state_dict())
    assert {"layers.1.attn.q_proj.weight", "layers.1.attn.o_proj.weight", "layers.0.ffn.down_proj.weight",
            "layers.0.attn_norm.weight", "layers.0.ffn_norm.weight", "norm.weight", "tok_embeddings.weight"} <= names


@pytest.mark.parametrize("pattern", ["A", "M"])
def test_qk_clip_shrinks_exactly_the_chosen_heads_logits(pattern):
    """The probe's per-head maximum after qk_clip_(scale) is scale x the maximum before, for A and MLA."""
    model = build(layer_pattern=pattern, n_kv_heads=4, n_layers=1)
    tokens = torch.randint(0, 61, (2, 16), generator=torch.Generator().manual_seed(2))
    model.set_attention_probe(True)
    model(tokens)
    before_H = model.attention_max_logits()[0]
    scale_H = torch.tensor([1.0, 0.5, 1.0, 0.25])
    model.softmax_mixers()[0].qk_clip_(scale_H)
    model(tokens)
    torch.testing.assert_close(model.attention_max_logits()[0], before_H * scale_H, rtol=1e-4, atol=1e-6)


def test_hybrid_probe_covers_only_softmax_layers():
    model = build(layer_pattern="GGM", n_layers=6)
    model.set_attention_probe(True)
    model(torch.randint(0, 61, (1, 9)))
    assert model.attention_max_logits().shape == (2, 4)  # the two MLA layers, n_heads each
    assert [block.kind for block in model.layers] == list("GGMGGM")


@pytest.mark.parametrize("pattern", ["A", "GM"])
def test_cached_generation_equals_full_recomputation_also_when_the_window_slides(pattern):
    from hymo_core.eval.evaluation import sample_tokens

    model = build(layer_pattern=pattern, max_seq_len=12)
    prompt = [5, 9, 2, 33, 7]
    expected = []
    for _ in range(15):  # greedy with the whole (windowed) context recomputed at every step
        window = (prompt + expected)[-12:]
        expected.append(int(model(torch.tensor([window]))[0][0, -1].argmax()))
    assert sample_tokens(model, prompt, 15, 0.0, 0, torch.Generator()) == expected


@pytest.mark.parametrize("pattern", ["A", "GM"])
def test_a_half_window_slide_prefills_once_per_half_window_and_sees_what_it_keeps(pattern):
    """The suite's convention: once the window is full, the newest half is prefilled again and decoding goes on
    from it; each token equals a full recomputation over the context the convention kept, and the positions
    fed grow about twice the tokens generated, not a window per token."""
    from hymo_core.eval.evaluation import sample_tokens

    model = build(layer_pattern=pattern, max_seq_len=12)
    prompt, keep = [5, 9, 2, 33, 7], 6
    expected, start = [], 0
    for _ in range(30):
        if len(prompt + expected) - start > 12:  # the window would overflow: keep its newest `keep` tokens
            start = len(prompt + expected) - keep
        expected.append(int(model(torch.tensor([(prompt + expected)[start:]]))[0][0, -1].argmax()))
    fed = []
    forward = model.forward
    model.forward = lambda tokens, **kw: (fed.append(tokens.shape[1]), forward(tokens, **kw))[1]
    assert sample_tokens(model, prompt, 30, 0.0, 0, torch.Generator(), keep_on_slide=keep) == expected
    slides = sum(1 for n in fed[1:] if n > 1)
    assert slides == 4 and sum(fed) == len(prompt) + 29 + slides * (keep - 1)  # exact sliding would feed about 12 per token
    fed.clear()
    assert sample_tokens(model, prompt, 7, 0.0, 0, torch.Generator(), keep_on_slide=keep) == \
        sample_tokens(model, prompt, 7, 0.0, 0, torch.Generator())  # until the window fills, no convention applies


@pytest.mark.parametrize("overrides", [dict(layer_pattern="GGGM"), dict(layer_pattern="GM", qk_norm=True, tie_embeddings=False),
                                       dict(layer_pattern="AM", mla_qk_rope_head_dim=8, n_layers=3)])
def test_planner_counts_the_built_hybrid(overrides):
    from hymo_core.models.model import count_parameters

    model = build(**overrides)
    assert sum(p.numel() for p in model.parameters()) == count_parameters(model.config)


def test_trainer_drives_a_hybrid_qk_clip_on_mla_and_one_hook_call_per_update(tiny_corpus):
    """The loop trains G + M layers, QK-Clip rescales MLA heads, after_optimizer_step runs once per update."""
    from hymo_core.train.data import CorpusReader, TokenLoader
    from hymo_core.train.optim import build_optimizer
    from hymo_core.train.config import TrainConfig
    from hymo_core.train.trainer import TrainHooks, TrainState, train

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, ffn_dim=64,
                                    max_seq_len=16, layer_pattern="GM"))
    config = TrainConfig(batch_size=4, seq_len=16, max_steps=3, warmup_steps=1, log_interval=1, eval_interval=100,
                         checkpoint_interval=100, gradient_accumulation_steps=2, qk_clip_threshold=1e-3)
    calls = []
    model.layers[1].ffn.after_optimizer_step = lambda: calls.append(1)  # where an MoE's gate-bias step would run
    logs = []
    loader = TokenLoader(CorpusReader(tiny_corpus), "train", config.seq_len, config.batch_size, config.seed)
    train(model, build_optimizer(model, config.optimizer_config(torch.device("cpu"))), loader, None, config,
          TrainState(), torch.device("cpu"), TrainHooks(on_log=logs.append))
    assert len(calls) == 3 and [r["step"] for r in logs] == [1, 2, 3]
    # Both MLA heads exceed tau = 1e-3 at init; after a clip they sit at tau, and each later update
    # pushes at least one of them over it again.
    assert logs[0]["qk_clipped_heads"] == 2 and all(r["qk_clipped_heads"] >= 1 for r in logs)
