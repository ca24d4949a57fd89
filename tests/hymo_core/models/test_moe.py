"""DeepSeekMoE: grouped experts equal a per-token reference, bias steers selection only, balancing, drops."""

import pytest
import torch
import torch.nn.functional as F

from hymo_core.models.layers.moe import MoE, MoEConfig, moe_after_optimizer_step

D = 16


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny layers: see tests/conftest.py


def make_moe(seed=0, **overrides) -> MoE:
    torch.manual_seed(seed)
    config = MoEConfig(**{"n_routed_experts": 8, "n_activated_experts": 2, "expert_dim": 12, **overrides})
    return MoE(D, config, init_std=0.3)


def per_token_reference(moe: MoE, x_BTD: torch.Tensor) -> torch.Tensor:
    """The obvious loop: every token, its top-k experts by biased score, weights from unbiased scores."""
    out = []
    for x_D in x_BTD.reshape(-1, D):
        scores = torch.sigmoid(moe.gate.weight @ x_D) if moe.config.score_function == "sigmoid" else \
            torch.softmax(moe.gate.weight @ x_D, dim=0)
        chosen = torch.topk(scores + moe.expert_bias_E, moe.config.n_activated_experts).indices
        normalise = moe.config.score_function == "sigmoid" and moe.config.n_activated_experts > 1
        weights = scores[chosen] / (scores[chosen].sum() if normalise else 1.0)
        y = torch.zeros(D)
        for e, w in zip(chosen.tolist(), weights):
            ex = moe.experts
            y = y + w * (ex.w2.weight[e] @ (F.silu(ex.w1.weight[e] @ x_D) * (ex.w3.weight[e] @ x_D)))
        out.append(y + moe.shared_expert(x_D))
    return torch.stack(out).reshape(x_BTD.shape)


@pytest.mark.parametrize("score_function", ["sigmoid", "softmax"])
def test_grouped_experts_equal_the_per_token_reference(score_function):
    moe = make_moe(score_function=score_function)
    moe.expert_bias_E.copy_(torch.linspace(-0.2, 0.2, 8))
    x = torch.randn(2, 5, D)
    torch.testing.assert_close(moe(x), per_token_reference(moe, x), rtol=1e-5, atol=1e-6)


def aten_routing(moe: MoE, x_BTD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen experts (N, k), the sequence aux loss) by aten ops: the router as an nn.Linear, topk, scatter."""
    B, T, _ = x_BTD.shape
    E, K = moe.config.n_routed_experts, moe.config.n_activated_experts
    logits = F.linear(x_BTD.reshape(-1, D), moe.gate.weight)
    scores = torch.sigmoid(logits) if moe.config.score_function == "sigmoid" else torch.softmax(logits, dim=-1)
    chosen = torch.topk(scores.detach() + moe.expert_bias_E, K).indices
    f_BE = torch.zeros(B * T, E).scatter_(1, chosen, 1.0).view(B, T, E).sum(1) * E / (K * T)
    p_BE = (scores / scores.sum(-1, keepdim=True)).view(B, T, E).mean(1)
    return chosen, moe.config.aux_loss_weight * (f_BE * p_BE).sum(1).mean()


@pytest.mark.parametrize("score_function,E,k", [("sigmoid", 8, 2), ("softmax", 16, 1)])
@pytest.mark.parametrize("layout", ["grouped", "looped", "padded"])
def test_fused_dispatch_equals_the_per_token_reference_in_every_gradient(score_function, E, k, layout):
    """Route (with the router's matmul), plan, permute, experts, combine (hymo_core/kernels/moe_dispatch.py) against
    the loop above and aten's router, through autograd: the input's, the router's (through the combine weights and
    the aux loss's logits), every expert weight's and the shared expert's gradients; the balancing counters the
    plan kernel adds to equal aten's count of the chosen experts."""
    moe = make_moe(score_function=score_function, n_routed_experts=E, n_activated_experts=k, aux_loss_weight=0.1).train()
    moe.expert_bias_E.copy_(torch.linspace(-0.2, 0.2, E))
    moe.experts.layout = layout
    x, upstream = torch.randn(3, 7, D), torch.randn(3, 7, D)
    results = []
    for run in (lambda x_: (moe(x_), moe.aux_loss), lambda x_: (per_token_reference(moe, x_), aten_routing(moe, x_)[1])):
        moe.zero_grad(set_to_none=True)
        leaf = x.clone().requires_grad_()
        out, aux_loss = run(leaf)
        ((out * upstream).sum() + aux_loss).backward()
        results.append([out.detach(), aux_loss.detach(), leaf.grad] + [p.grad for p in moe.parameters()])
    assert all(g is not None and g.abs().sum() > 0 for g in results[0][2:])
    for ours, reference in zip(*results):
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)
    chosen, _ = aten_routing(moe, x)
    assert torch.equal(moe.tokens_per_expert_E, torch.bincount(chosen.reshape(-1), minlength=E).double())


def test_bias_changes_selection_but_never_the_combine_weights():
    moe = make_moe()
    x_ND = torch.randn(32, D)
    plain = moe.route(x_ND)
    moe.expert_bias_E[3] = 10.0  # expert 3 now wins every token's selection
    biased = moe.route(x_ND)
    assert (biased.experts_NK == 3).any(dim=1).all() and not (plain.experts_NK == 3).any(dim=1).all()
    assert not moe.expert_bias_E.requires_grad and "expert_bias_E" not in dict(moe.named_parameters())

    # Gradient test: the router's gradient through the combine weights is that of the unbiased
    # scores gathered at the chosen experts, with no trace of the bias' value.
    def gate_grad(routing_fn):
        moe.zero_grad(set_to_none=True)
        routing_fn().sum().backward()
        return moe.gate.weight.grad.clone()

    def reference():
        scores = torch.sigmoid(x_ND @ moe.gate.weight.T)
        w = scores.gather(1, biased.experts_NK)
        return (w / w.sum(1, keepdim=True) * torch.arange(1.0, 3.0)).sum(1)

    ours = gate_grad(lambda: (moe.route(x_ND).weights_NK * torch.arange(1.0, 3.0)).sum(1))
    torch.testing.assert_close(ours, gate_grad(reference))
    moe.expert_bias_E[3] = 25.0  # another bias value, the same selection: bit-identical gradient
    assert torch.equal(gate_grad(lambda: (moe.route(x_ND).weights_NK * torch.arange(1.0, 3.0)).sum(1)), ours)
    scores = torch.sigmoid(x_ND @ moe.gate.weight.T).detach()
    w = scores.gather(1, biased.experts_NK)
    torch.testing.assert_close(biased.weights_NK.detach(), w / w.sum(1, keepdim=True))


@pytest.mark.parametrize("bias_update", [True, False])
def test_skewed_router_balances_with_bias_updates_and_stays_skewed_without(bias_update):
    torch.manual_seed(1)
    moe = MoE(D, MoEConfig(n_routed_experts=8, n_activated_experts=2, expert_dim=12, bias_update=bias_update,
                           bias_update_rate=0.01, load_ema_decay=0.5), init_std=0.3)
    with torch.no_grad():  # tokens share a mean direction that experts 0 and 1 are aligned with
        moe.gate.weight[:2] += 0.5 * torch.ones(D) / D**0.5
    generator = torch.Generator().manual_seed(0)
    moe.train()
    history = []
    with torch.no_grad():
        for _ in range(100):  # one update = two micro-batches from a fixed stream
            for _ in range(2):
                moe(torch.randn(8, 32, D, generator=generator) + 1.0)
            history.append(moe_after_optimizer_step([("moe", moe)])["moe"])
    assert history[0]["load_max"] > 2.0  # skewed at the start: two experts take most tokens
    recent_load_E = torch.tensor([h["load"] for h in history[-10:]]).mean(dim=0)  # relative to an even share
    if bias_update:
        assert recent_load_E.max() <= 1.3, recent_load_E
        assert history[-1]["bias_norm"] > 0
    else:
        assert recent_load_E.max() > 2.0 and history[-1]["bias_norm"] == 0.0


def test_counts_accumulate_over_micro_batches_and_reset_after_the_update():
    moe = make_moe()
    moe.train()
    x = torch.randn(2, 8, D)
    for _ in range(3):
        moe(x)
    assert float(moe.tokens_per_expert_E.sum()) == 3 * 16 * 2
    moe.eval()
    moe(x)  # evaluation does not count
    assert float(moe.tokens_per_expert_E.sum()) == 3 * 16 * 2
    seen = []
    stats = moe_after_optimizer_step([("a", moe)], reduce=lambda t: seen.append(t.clone()) or t * 2)
    assert float(seen[0][0, :-1].sum()) == 96  # the hook sees all layers' counts in one tensor
    assert stats["a"]["dropped_tokens"] == 0.0 and float(moe.tokens_per_expert_E.sum()) == 0.0


def test_capacity_factor_drops_and_counts_overflow():
    moe = make_moe(capacity_factor=1.0)
    moe.expert_bias_E[0] = 10.0  # everyone wants expert 0: it keeps ceil(1.0 * 64 / 8) = 8 of 32 assignments
    moe.train()
    x = torch.randn(2, 16, D)
    counts_E = torch.bincount(moe.route(x.reshape(-1, D)).experts_NK.reshape(-1), minlength=8)
    expected = float((counts_E - 8).clamp(min=0).sum())
    assert counts_E[0] == 32 and expected >= 24
    y = moe(x)
    assert float(moe.dropped_assignments) == expected
    stats = moe_after_optimizer_step([("m", moe)])["m"]
    assert stats["dropped_tokens"] == expected
    assert torch.isfinite(y).all()
    unlimited = make_moe()
    unlimited.expert_bias_E[0] = 10.0
    unlimited.train()
    unlimited(x)
    assert float(unlimited.dropped_assignments) == 0.0  # default: no dropping


def test_sequence_aux_loss_is_off_by_default_and_differentiable_when_on():
    moe = make_moe()
    moe.train()
    moe(torch.randn(2, 8, D))
    assert moe.aux_loss is None
    moe = make_moe(aux_loss_weight=0.01)
    moe.train()
    moe(torch.randn(2, 8, D))
    moe.aux_loss.backward()
    assert moe.aux_loss > 0 and moe.gate.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("capacity_factor", [0.0, 1.0])
def test_grouped_looped_and_padded_expert_layouts_agree_bit_for_bit(capacity_factor):
    """torch._grouped_mm (CUDA sm_90 bf16 and the CPU) bit for bit with the padded batched matmul (the old layout),
    and the per-expert loop (CUDA without a native grouped matmul) to rounding."""
    moe = make_moe(capacity_factor=capacity_factor)
    moe.expert_bias_E[0] = 0.5  # skewed: with a capacity, expert 0 drops assignments
    moe.train()
    x = torch.randn(2, 9, D, requires_grad=True)
    upstream = torch.linspace(-1, 1, x.numel()).view_as(x)
    results = {}
    for layout in ("padded", "grouped", "looped"):
        moe.experts.layout = layout
        moe.zero_grad(set_to_none=True)
        x.grad = None
        moe.dropped_assignments.zero_()
        y = moe(x)
        (y * upstream).sum().backward()
        results[layout] = [y.detach(), x.grad, moe.experts.w1.weight.grad, moe.experts.w2.weight.grad,
                           moe.gate.weight.grad, moe.dropped_assignments.clone()]
    for padded, grouped, looped in zip(results["padded"], results["grouped"], results["looped"]):
        assert torch.equal(padded, grouped)
        torch.testing.assert_close(looped, padded, rtol=1e-5, atol=1e-6)  # F.linear per expert: the same sums, other blocking
    assert (float(results["padded"][-1]) > 0) == (capacity_factor > 0)
    moe.experts.layout = "auto"
    assert moe.experts.resolved_layout(x) == "grouped"  # CPU: torch's grouped loop; CUDA: sm_90+ bf16, else looped
    moe.experts.layout = "scattered"
    with pytest.raises(ValueError, match="expert layout"):
        moe(x)
