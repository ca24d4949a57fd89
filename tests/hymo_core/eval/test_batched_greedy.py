"""Batched greedy generation gives every prompt exactly the tokens it gets decoded alone, one step per token for the batch."""
from __future__ import annotations

import random

import pytest
import torch

from conftest import AlphabetTokenizer, varied_model
from hymo_core.eval.batched_greedy import greedy_tokens_batched
from hymo_core.eval.evaluation import sample_tokens
from hymo_core.eval.lm_scoring import GenerationRequest, generate_until, generate_until_batched

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HYBRID_MOE = dict(layer_pattern="GM", n_kv_heads=4, moe_on="M", moe_n_routed_experts=4, moe_n_activated_experts=2,
                  moe_expert_dim=16)
LENGTHS = (0, 3, 7, 12, 20, 5, 9)  # window 12: an empty prompt (EOS stands in), short ones, a full window, one longer


def prompts(seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(61) for _ in range(n)] for n in LENGTHS]


def one_at_a_time(model, tokenizer, requests, eos_id):
    return [generate_until(model, tokenizer, list(r.prompt_ids), r.stop, r.max_new_tokens, eos_id) for r in requests]


@pytest.mark.parametrize("overrides", [{}, HYBRID_MOE, dict(layer_pattern="GM", n_kv_heads=4, qk_norm=True)],
                         ids=["dense", "gdn-mla-moe", "gdn-mla-qknorm"])
def test_batched_generate_until_equals_one_prompt_at_a_time(overrides):
    """Ragged prompts (one past the window), generations that slide the half window, rows that stop on EOS, on a
    stop string and on their own max_new_tokens, more prompts than rows (finished rows hand their slot on)."""
    model, tokenizer = varied_model(**overrides), AlphabetTokenizer()
    budgets = (30, 30, 30, 4, 30, 0, 30)
    free = [tokenizer.encode(g.text).ids for g in one_at_a_time(
        model, tokenizer, [GenerationRequest(tuple(ids), (), n) for ids, n in zip(prompts(), budgets)], None)]
    # EOS: the token of row 2 (past its third) that the fewest rows meet; the stop string: two tokens of a row EOS
    # leaves alone, and which row 2 never meets
    eos_id = min(free[2][3:], key=lambda token: (sum(token in row for row in free), free[2].index(token)))
    full = next(i for i, row in enumerate(free) if i and len(row) == 30 and eos_id not in row)  # row 0's prompt becomes EOS
    stop = next(text for j in range(8, 28) if (text := tokenizer.decode(free[full][j:j + 2])) not in tokenizer.decode(free[2]))
    requests = [GenerationRequest(tuple(ids), (stop, "never"), n) for ids, n in zip(prompts(), budgets)]
    expected = one_at_a_time(model, tokenizer, requests, eos_id)
    assert generate_until_batched(model, tokenizer, requests, eos_id, batch_size=3) == expected
    assert generate_until_batched(model, tokenizer, requests, eos_id, batch_size=64) == expected
    # the cases the comparison covers
    assert any(g.prompt_truncated for g in expected) and sum(g.window_slid for g in expected) >= 2
    assert any(len(g.text) == g.new_tokens < r.max_new_tokens for g, r in zip(expected, requests) if r.max_new_tokens)  # EOS
    assert any(len(g.text) < g.new_tokens for g in expected)  # cut at the stop string
    assert expected[3].new_tokens == 4 and expected[5].new_tokens == 0


def test_exact_slide_and_per_row_budgets_match_sample_tokens():
    """keep_on_slide None re-prefills a full window for every token once it is full: per row, as sample_tokens does."""
    model = varied_model(layer_pattern="AM", n_kv_heads=4, mla_qk_rope_head_dim=8)
    rows, budgets = prompts(2)[1:5], [25, 1, 16, 9]
    expected = [sample_tokens(model, ids, n, 0.0, 0, torch.Generator(), 17) for ids, n in zip(rows, budgets)]
    assert greedy_tokens_batched(model, rows, budgets, 17, [None] * 4, batch_size=2) == expected


def test_the_batch_pays_one_forward_per_token():
    """Four prompts of one length, no slide: one prefill forward for all four, then one step per new token."""
    model = varied_model(max_seq_len=32)
    rows = [ids[:5] for ids in prompts(3)[2:6]]
    shapes = []
    forward = model.forward
    model.forward = lambda tokens, **kw: (shapes.append(tuple(tokens.shape)), forward(tokens, **kw))[1]
    got = greedy_tokens_batched(model, rows, [6] * 4, None, [None] * 4)
    model.forward = forward
    assert shapes == [(4, 4)] + [(4, 1)] * 6
    assert got == [sample_tokens(model, ids, 6, 0.0, 0, torch.Generator()) for ids in rows]


def test_moe_with_a_capacity_factor_decodes_one_prompt_at_a_time():
    """Capacity dropping depends on how many tokens share a forward, so batching would change tokens: it is not done."""
    model = varied_model(**HYBRID_MOE, moe_capacity_factor=1.0)
    rows = prompts(4)[1:4]
    batches = []
    forward = model.forward
    model.forward = lambda tokens, **kw: (batches.append(tokens.shape[0]), forward(tokens, **kw))[1]
    got = greedy_tokens_batched(model, rows, [8] * 3, None, [None] * 3)
    model.forward = forward
    assert set(batches) == {1}
    assert got == [sample_tokens(model, ids, 8, 0.0, 0, torch.Generator()) for ids in rows]
