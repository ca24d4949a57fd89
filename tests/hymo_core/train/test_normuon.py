"""NorMuon + CautiousAdamW (seed 000 §2-3): a slow reference, the cautious mask, batching, partition."""

import copy
import math

import pytest
import torch
import torch.nn as nn

from hymo_core.planner import planner
from hymo_core.models.model import ModelConfig, Transformer
from hymo_core.models.presets import PRESETS
from hymo_core.train.optim import NORMUON_GROUPS, NorMuonAdamW, build_optimizer, gradient_sign_mask, newton_schulz, newton_schulz_batched
from hymo_core.train.partition import UNNAMED_MATRIX_RULE, partition_parameters
from hymo_core.train.optim_config import NorMuonConfig

QUINTIC = (3.4445, -4.7750, 2.0315)


# ---------------------------------------------------------------- the slow, obviously-correct reference


def reference_newton_schulz(m: torch.Tensor, steps: int, coefficients) -> torch.Tensor:
    """Textbook form on one matrix: X <- aX + b(XX^T)X + c(XX^T)(XX^T)X on the wide orientation."""
    a, b, c = coefficients
    x = m.double()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.t()
    x = x / x.norm()
    for _ in range(steps):
        xxt = x @ x.t()
        x = a * x + b * (xxt @ x) + c * (xxt @ xxt @ x)
    return x.t() if tall else x


def reference_normuon_step(param, grad, state, lr, wd, momentum, row_norm, beta2, eps, update_scale):
    """One NorMuon update of one matrix, written out line by line in float64."""
    state["m"] = momentum * state.get("m", torch.zeros_like(param)) + grad
    mask = torch.where(grad * param > 0, 1.0, 0.0).double()
    o = reference_newton_schulz(state["m"], 5, QUINTIC)
    if row_norm:
        rows, cols = o.shape
        v = state.get("v", torch.zeros(rows, dtype=torch.float64))
        v = beta2 * v + (1 - beta2) * torch.tensor([sum(float(o[i, j]) ** 2 for j in range(cols)) / cols for i in range(rows)],
                                                   dtype=torch.float64)
        state["v"] = v
        o = o / (v.sqrt() + eps)[:, None]
    target = 0.2 * math.sqrt(o.numel()) if update_scale == "match_rms_adamw" else float(state["m"].norm())
    o = o * (target / float(o.norm()))
    return param * (1 - lr * wd * mask) - lr * o


@pytest.mark.parametrize("row_norm,update_scale", [(True, "match_rms_adamw"), (False, "match_rms_adamw"),
                                                   (False, "momentum_norm")])
def test_normuon_matches_the_slow_reference(row_norm, update_scale):
    torch.manual_seed(0)
    shapes = [(6, 10), (6, 10), (12, 5), (7, 7)]  # two of one shape (one stack), a tall one, a square one
    params = [nn.Parameter(torch.randn(*s, dtype=torch.float64)) for s in shapes]
    names = [f"layers.{i}.attn.q_proj.weight" for i in range(len(shapes))]
    config = NorMuonConfig(lr=0.05, muon_lr=0.05, muon_weight_decay=0.3, row_normalisation=row_norm,
                           update_scale=update_scale, ns_dtype="float64")
    optimizer = NorMuonAdamW(zip(names, params), config)
    expected = [p.detach().clone() for p in params]
    states = [{} for _ in params]
    for _ in range(3):
        grads = [torch.randn(*s, dtype=torch.float64) for s in shapes]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        optimizer.step()
        expected = [reference_normuon_step(e, g, st, 0.05, 0.3, 0.95, row_norm, 0.95, 1e-8, update_scale)
                    for e, g, st in zip(expected, grads, states)]
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.detach(), e, rtol=1e-9, atol=1e-10)


def test_batched_newton_schulz_equals_the_per_matrix_loop():
    torch.manual_seed(0)
    stack = torch.randn(5, 24, 40)
    batched = newton_schulz_batched(stack, dtype=torch.float64)
    for i in range(5):
        torch.testing.assert_close(batched[i], newton_schulz(stack[i], dtype=torch.float64), rtol=1e-10, atol=1e-12)
    tall = newton_schulz_batched(stack.mT, dtype=torch.float64)
    torch.testing.assert_close(tall, batched.mT)
    cubic = newton_schulz_batched(stack[:1], coefficients=(1.5, -0.5, 0.0), dtype=torch.float64)[0]
    torch.testing.assert_close(cubic, reference_newton_schulz(stack[0], 5, (1.5, -0.5, 0.0)))  # seed 000 §3.1


# ---------------------------------------------------------------- the cautious mask


def test_gradient_sign_mask_on_hand_made_tensors():
    param = torch.tensor([1.0, -1.0, 1.0, -1.0, 0.0, 2.0])
    grad = torch.tensor([0.5, -0.5, -0.5, 0.5, 1.0, 0.0])
    # Decay agrees with the gradient only where both push |param| down: same signs, both non-zero.
    assert gradient_sign_mask(grad, param).tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("name", ["tok_embeddings.weight", "layers.0.attn.q_proj.weight"])  # CautiousAdamW, NorMuon
def test_cautious_decay_applies_exactly_where_the_mask_is_one(name):
    param0 = torch.tensor([[1.0, -1.0, 1.0, -1.0], [2.0, -2.0, 0.5, -0.5]], dtype=torch.float64)
    grad = torch.tensor([[0.5, -0.5, -0.5, 0.5], [1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    results = {}
    for label, wd, cautious in (("none", 0.0, True), ("cautious", 0.5, True), ("plain", 0.5, False)):
        weight = nn.Parameter(param0.clone())
        config = NorMuonConfig(lr=0.1, muon_lr=0.1, muon_weight_decay=wd, embed_weight_decay=wd,
                               cautious_weight_decay=cautious, ns_dtype="float64")
        optimizer = NorMuonAdamW([(name, weight)], config)
        weight.grad = grad.clone()
        optimizer.step()
        results[label] = weight.detach()
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(results["none"] - results["cautious"], 0.1 * 0.5 * param0 * mask)
    torch.testing.assert_close(results["none"] - results["plain"], 0.1 * 0.5 * param0)


def test_non_fp32_parameters_keep_an_fp32_master():
    weight = nn.Parameter(torch.ones(4, 8, dtype=torch.bfloat16))
    optimizer = NorMuonAdamW([("layers.0.attn.q_proj.weight", weight)],
                             NorMuonConfig(lr=1e-4, muon_lr=1e-4, muon_weight_decay=0.0))
    for step in range(4):
        weight.grad = torch.randn(4, 8, generator=torch.Generator().manual_seed(step)).bfloat16()
        optimizer.step()
    master = optimizer.state[weight]["master"]
    assert master.dtype == torch.float32
    assert not torch.equal(master, torch.ones(4, 8))  # updates of ~2e-5 survive in fp32 ...
    assert torch.equal(weight.detach(), master.bfloat16())  # ... and the bf16 weight is its rounding


# ---------------------------------------------------------------- partition


class SeedNamedModule(nn.Module):
    """Parameter names from seed 000's table that the dense model does not have."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.head = nn.Linear(8, 10, bias=False)
        layer = nn.Module()
        layer.gate = nn.Linear(8, 4, bias=True)
        layer.experts = nn.Module()
        for w in ("w1", "w2", "w3"):
            setattr(layer.experts, w, nn.Module())
            getattr(layer.experts, w).weight = nn.Parameter(torch.zeros(4, 16, 8))
        layer.shared_expert = nn.Module()
        layer.shared_expert.w1 = nn.Linear(8, 16, bias=False)
        layer.A_log, layer.dt_bias, layer.D = (nn.Parameter(torch.zeros(3)) for _ in range(3))
        layer.kv_b_proj = nn.Linear(8, 8, bias=False)
        layer.q_norm = nn.Module()
        layer.q_norm.weight = nn.Parameter(torch.ones(8))
        layer.mystery = nn.Linear(8, 8, bias=False)
        self.layers = nn.ModuleList([layer])


def test_partition_follows_the_seed_table():
    assigned = {a.name: (a.group, a.rule) for a, _ in partition_parameters(SeedNamedModule().named_parameters(),
                                                                           NORMUON_GROUPS)}
    assert assigned == {
        "embed.weight": ("adamw_embed_head", "embedding"),
        "head.weight": ("adamw_embed_head", "output_head"),
        "layers.0.gate.weight": ("adamw", "moe_gate"),
        "layers.0.gate.bias": ("adamw", "moe_gate"),
        "layers.0.experts.w1.weight": ("adamw", "routed_experts"),
        "layers.0.experts.w2.weight": ("adamw", "routed_experts"),
        "layers.0.experts.w3.weight": ("adamw", "routed_experts"),
        "layers.0.shared_expert.w1.weight": ("adamw", "shared_expert"),
        "layers.0.A_log": ("adamw", "gdn_scalars"),
        "layers.0.dt_bias": ("adamw", "gdn_scalars"),
        "layers.0.D": ("adamw", "vector"),  # GDN has no D: any other vector is the vector rule's
        "layers.0.kv_b_proj.weight": ("normuon", "dense_matrix"),
        "layers.0.q_norm.weight": ("adamw", "norm_gain"),
        "layers.0.mystery.weight": ("normuon", UNNAMED_MATRIX_RULE),  # the seed's default; models must not have one
    }


GOLDEN_MODELS = {
    "sample (dense, untied)": ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=97,
                                          tie_embeddings=False, qk_norm=True),
    "hymo-tiny": PRESETS["hymo-tiny"],
    "hymo-750m": PRESETS["hymo-750m"],
}


@pytest.mark.parametrize("label", sorted(GOLDEN_MODELS))
def test_golden_partition_names_every_parameter(label):
    """Prints every parameter with its optimizer (pytest -s); fails on one that no rule names."""
    with torch.device("meta"):  # names and shapes only: hymo-750m's 1.5 B parameters are never allocated
        model = Transformer(GOLDEN_MODELS[label])
    optimizer = build_optimizer(model, NorMuonConfig())
    print(f"\n{label}:")
    for a in optimizer.assignments:
        print(f"  {a.name:48s} {str(a.shape):16s} {a.group:18s} {a.rule}")
    unnamed = [a.name for a in optimizer.assignments if a.rule == UNNAMED_MATRIX_RULE]
    assert not unnamed, f"no partition rule names {unnamed}"
    assert sorted(a.name for a in optimizer.assignments) == sorted(n for n, _ in model.named_parameters())
    decay = {g["group"]: g["weight_decay"] for g in optimizer.param_groups}
    assert decay == {"normuon": 0.1, "adamw_embed_head": 0.1, "adamw": 0.0}
    # The planner's NorMuon / AdamW split (optimizer-state memory) is this partition's.
    normuon = sum(p.numel() for g in optimizer.param_groups if g["group"] == "normuon" for p in g["params"])
    assert planner.count_parameters(planner.model_shape(GOLDEN_MODELS[label])).normuon == normuon
    if GOLDEN_MODELS[label].moe_on:  # experts, gates and shared experts are AdamW's, by rule
        rules = {a.rule for a in optimizer.assignments}
        assert {"routed_experts", "shared_expert", "moe_gate"} <= rules


def test_separate_learning_rates_follow_one_schedule():
    torch.manual_seed(0)
    model = Transformer(GOLDEN_MODELS["sample (dense, untied)"])
    optimizer = build_optimizer(model, NorMuonConfig(lr=1e-3, muon_lr=4e-3))
    optimizer.set_learning_rate(5e-4)  # half of AdamW's peak
    lrs = {g["group"]: g["lr"] for g in optimizer.param_groups}
    assert lrs == pytest.approx({"normuon": 2e-3, "adamw_embed_head": 5e-4, "adamw": 5e-4})


def test_state_dict_round_trip_continues_bitwise():
    def run(model, optimizer, seed):
        generator = torch.Generator().manual_seed(seed)
        for _ in range(2):
            tokens = torch.randint(0, 97, (2, 9), generator=generator)
            model(tokens[:, :-1], tokens[:, 1:])[1].backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    torch.manual_seed(0)
    model = Transformer(GOLDEN_MODELS["sample (dense, untied)"])
    optimizer = build_optimizer(model, NorMuonConfig(lr=3e-3, muon_lr=3e-3))
    run(model, optimizer, 1)
    saved = copy.deepcopy((model.state_dict(), optimizer.state_dict()))
    run(model, optimizer, 2)
    torch.manual_seed(5)
    resumed = Transformer(GOLDEN_MODELS["sample (dense, untied)"])
    resumed.load_state_dict(saved[0])
    resumed_optimizer = build_optimizer(resumed, NorMuonConfig(lr=3e-3, muon_lr=3e-3))
    resumed_optimizer.load_state_dict(saved[1])
    run(resumed, resumed_optimizer, 2)
    for (name, a), (_, b) in zip(model.named_parameters(), resumed.named_parameters()):
        assert torch.equal(a, b), name
    assert "row_second_moment" in resumed_optimizer.state[resumed.layers[0].attn.q_proj.weight]


def test_normuon_on_fsdp2_style_dtensor_parameters_matches_plain_tensors(single_rank_mesh):
    """FSDP2 hands the optimizer DTensor shards: the stack is orthogonalised whole, rows normalised per neuron."""
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = single_rank_mesh
    torch.manual_seed(0)
    weights, grads = [torch.randn(24, 40) for _ in range(2)], [torch.randn(24, 40) for _ in range(2)]
    names = ["layers.0.attn.q_proj.weight", "layers.1.attn.q_proj.weight"]  # one stack of two
    plain = [nn.Parameter(w.clone()) for w in weights]
    sharded = [nn.Parameter(distribute_tensor(w.clone(), mesh, [Shard(0)])) for w in weights]
    config = NorMuonConfig(lr=0.05, muon_lr=0.05)
    for params, shard in ((plain, False), (sharded, True)):
        optimizer = NorMuonAdamW(zip(names, params), config)
        for _ in range(2):
            for p, g in zip(params, grads):
                p.grad = distribute_tensor(g.clone(), mesh, [Shard(0)]) if shard else g.clone()
            optimizer.step()
    for s, p in zip(sharded, plain):
        torch.testing.assert_close(s.full_tensor(), p.detach(), rtol=1e-6, atol=1e-7)


def test_gdn_gate_projections_go_to_adamw():
    """hymo-750m's 48 GDN gate projections (a_proj, b_proj: 7 x 896) gain nothing from Newton-Schulz: AdamW, undecayed,
    by their own rule (issue 54; a departure from seed 000's table, documented in partition.py and docs/training.md)."""
    with torch.device("meta"):
        model = Transformer(PRESETS["hymo-750m"])
    optimizer = build_optimizer(model, NorMuonConfig())
    gates = [a for a in optimizer.assignments if a.name.endswith((".a_proj.weight", ".b_proj.weight"))]
    assert len(gates) == 48 and {(a.group, a.rule, a.shape) for a in gates} == {("adamw", "gdn_gates", (7, 896))}
    assert sum(a.group == "normuon" for a in optimizer.assignments) == 250
    assert min(min(a.shape) for a in optimizer.assignments if a.group == "normuon") >= 128
