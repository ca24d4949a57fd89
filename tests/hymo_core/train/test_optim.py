"""MuonAdamW: partition rules, parity with torch.optim, Newton-Schulz, decay, state."""

import copy

import pytest
import torch
import torch.nn as nn

from hymo_core.models.model import ModelConfig, Transformer
from hymo_core.train.optim import MUON_ADAMW_GROUPS, MuonAdamW, build_optimizer, muon_lr_scale, newton_schulz
from hymo_core.train.partition import partition_parameters
from hymo_core.train.optim_config import NorMuonConfig, OptimizerConfig

TINY = dict(vocab_size=97, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, max_seq_len=32,
            tie_embeddings=False)


def tiny_model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(**TINY))


def train(model, optimizer, steps, seed=0):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        tokens = torch.randint(0, 97, (2, 17), generator=generator)
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


class MoELikeBlock(nn.Module):
    """Parameter names from seed 000's table that the dense model does not have."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.wq = nn.Linear(8, 8, bias=True)
        self.gate = nn.Linear(8, 4, bias=False)
        self.experts = nn.Module()
        self.experts.w1 = nn.Linear(8, 16, bias=False)
        self.stacked = nn.Parameter(torch.zeros(4, 8, 8))
        self.A_log = nn.Parameter(torch.zeros(3))
        self.attn_norm = nn.Module()
        self.attn_norm.weight = nn.Parameter(torch.ones(8))
        self.head = nn.Linear(8, 10, bias=False)
        self.frozen = nn.Parameter(torch.zeros(8, 8), requires_grad=False)


def test_partition_follows_the_rule_table():
    """MuonAdamW reads the one table (hymo_core/train/partition.py): gates, experts, 3-D weights and
    scalars are AdamW's and never decayed; embedding and head are AdamW's and decayed."""
    assigned = {a.name: (a.group, a.rule) for a, _ in partition_parameters(MoELikeBlock().named_parameters(), MUON_ADAMW_GROUPS)}
    assert assigned == {
        "embed.weight": ("adamw", "embedding"),
        "wq.weight": ("muon", "dense_matrix"),
        "wq.bias": ("adamw_no_decay", "vector"),
        "gate.weight": ("adamw_no_decay", "moe_gate"),
        "experts.w1.weight": ("adamw_no_decay", "routed_experts"),
        "stacked": ("adamw_no_decay", "tensor_3d_or_more"),
        "A_log": ("adamw_no_decay", "gdn_scalars"),
        "attn_norm.weight": ("adamw_no_decay", "norm_gain"),
        "head.weight": ("adamw", "output_head"),
    }  # the frozen parameter is not optimised at all


def test_both_optimizers_split_and_decay_alike():
    """One table, one decay rule set: the two optimizers differ only in their group names."""
    model = MoELikeBlock()
    muon = {a.name: (a.kind, a.rule) for a in build_optimizer(model, OptimizerConfig()).assignments}
    normuon = {a.name: (a.kind, a.rule) for a in build_optimizer(model, NorMuonConfig()).assignments}
    assert muon == normuon
    for config in (OptimizerConfig(weight_decay=0.1), NorMuonConfig(muon_weight_decay=0.1, embed_weight_decay=0.1)):
        optimizer = build_optimizer(model, config)
        kinds = {a.name: a.kind for a in optimizer.assignments}
        decay = {name: group["weight_decay"] for group in optimizer.param_groups for name in group["param_names"]}
        assert {name for name, wd in decay.items() if wd == 0.0} == {name for name, kind in kinds.items() if kind == "no_decay"}


def test_model_layout_groups_and_decay():
    model = tiny_model()
    optimizer = build_optimizer(model)
    layout = optimizer.layout()
    names = [name for _, name, _ in layout]
    assert sorted(names) == sorted(name for name, _ in model.named_parameters())
    by_name = {name: (group, shape) for group, name, shape in layout}
    assert by_name["tok_embeddings.weight"] == ("adamw", (97, 64))
    assert by_name["output.weight"] == ("adamw", (97, 64))
    assert by_name["layers.1.attn.k_proj.weight"] == ("muon", (32, 64))
    assert by_name["layers.0.ffn_norm.weight"] == ("adamw_no_decay", (64,))
    decay = {group["group"]: group["weight_decay"] for group in optimizer.param_groups}
    assert decay == {"muon": 0.1, "adamw": 0.1, "adamw_no_decay": 0.0}
    betas = {group["group"]: group.get("betas") for group in optimizer.param_groups}
    assert betas["adamw"] == (0.9, 0.95)


def test_matches_torch_muon_and_adamw_where_configurations_coincide():
    model = tiny_model()
    reference = copy.deepcopy(model)
    ours = build_optimizer(model, OptimizerConfig(lr=1e-2))
    params = dict(reference.named_parameters())
    pick = lambda group: [params[n] for g, n, _ in ours.layout() if g == group]  # noqa: E731
    torch_muon = torch.optim.Muon(pick("muon"), lr=1e-2, weight_decay=0.1, momentum=0.95, nesterov=True,
                                  adjust_lr_fn="match_rms_adamw")
    torch_adamw = torch.optim.AdamW(
        [{"params": pick("adamw"), "weight_decay": 0.1}, {"params": pick("adamw_no_decay"), "weight_decay": 0.0}],
        lr=1e-2, betas=(0.9, 0.95), eps=1e-8, fused=True,  # our AdamW groups run torch's fused kernel
    )

    class Both:
        def step(self):
            torch_muon.step()
            torch_adamw.step()

        def zero_grad(self, set_to_none=True):
            torch_muon.zero_grad(set_to_none)
            torch_adamw.zero_grad(set_to_none)

    train(model, ours, 3)
    train(reference, Both(), 3)
    for (name, a), (_, b) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_newton_schulz_output_is_nearly_orthogonal_in_every_dtype():
    torch.manual_seed(0)
    g = torch.randn(40, 72) * 3.0
    outputs = {}
    for name, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32), ("float64", torch.float64)):
        out = newton_schulz(g, dtype=dtype)
        assert out.dtype == dtype and out.shape == g.shape
        singular = torch.linalg.svdvals(out.double())
        # The quintic trades exactness for speed: singular values land around 1, not on it.
        assert singular.min() > 0.5 and singular.max() < 1.3
        outputs[name] = out.double()
    torch.testing.assert_close(outputs["float32"], outputs["float64"], rtol=1e-4, atol=1e-5)
    assert (outputs["bfloat16"] - outputs["float64"]).abs().max() < 0.05
    tall = newton_schulz(g.T.contiguous(), dtype=torch.float64)
    torch.testing.assert_close(tall, outputs["float64"].T)  # orientation-symmetric


def test_muon_update_rms_matches_adamw_scale():
    """0.2 sqrt(max(A, B)) scaling makes the per-element RMS of a Muon update ~0.2 * lr."""
    torch.manual_seed(0)
    layer = nn.Linear(160, 48, bias=False)
    before = layer.weight.detach().clone()
    optimizer = MuonAdamW([("block.proj.weight", layer.weight)],
                          OptimizerConfig(lr=1.0, weight_decay=0.0, ns_dtype="float32"))
    layer.weight.grad = torch.randn(48, 160)
    optimizer.step()
    rms = (layer.weight.detach() - before).pow(2).mean().sqrt().item()
    assert 0.15 < rms < 0.25
    assert muon_lr_scale((48, 160), "match_rms_adamw") == pytest.approx(0.2 * 160**0.5)
    assert muon_lr_scale((160, 48), "original") == pytest.approx((160 / 48) ** 0.5)


@pytest.mark.parametrize("name", ["block.proj.weight", "tok_embeddings.weight"])  # a Muon and an AdamW group
def test_cautious_weight_decay_skips_coordinates_the_update_pushes_away_from_zero(name):
    torch.manual_seed(0)
    weights = [nn.Parameter(torch.randn(12, 20, dtype=torch.float64)) for _ in range(2)]
    weights[1].data.copy_(weights[0].data)
    grad = torch.randn(12, 20, dtype=torch.float64)
    plain = MuonAdamW([(name, weights[0])], OptimizerConfig(lr=0.1, weight_decay=0.5, ns_dtype="float64"))
    cautious = MuonAdamW([(name, weights[1])], OptimizerConfig(lr=0.1, weight_decay=0.5, ns_dtype="float64",
                                                             cautious_weight_decay=True))
    start = weights[0].detach().clone()
    for weight, optimizer in zip(weights, (plain, cautious)):
        weight.grad = grad.clone()
        optimizer.step()
    plain_step, cautious_step = weights[0].detach() - start, weights[1].detach() - start
    decay = -0.1 * 0.5 * start
    # Where the two agree, decay was applied in both; elsewhere cautious skipped exactly `decay`.
    same = torch.isclose(plain_step, cautious_step, rtol=0, atol=1e-12)
    skipped = torch.isclose(plain_step - cautious_step, decay, rtol=1e-9, atol=1e-12)
    assert (same | skipped).all()
    assert same.any() and (~same).any()
    # Skipped coordinates are those whose update moves the parameter away from zero.
    assert (plain_step[~same] - decay[~same]).sign().eq(start[~same].sign()).all()


def test_state_dict_round_trip_continues_bitwise():
    model = tiny_model()
    optimizer = build_optimizer(model, OptimizerConfig(lr=3e-3, cautious_weight_decay=True, ns_dtype="float32"))
    train(model, optimizer, 2, seed=1)
    saved_model = copy.deepcopy(model.state_dict())
    saved_optimizer = copy.deepcopy(optimizer.state_dict())
    train(model, optimizer, 2, seed=2)

    resumed = tiny_model(seed=123)  # different init, fully overwritten
    resumed.load_state_dict(saved_model)
    resumed_optimizer = build_optimizer(resumed, OptimizerConfig(lr=3e-3, cautious_weight_decay=True,
                                                                 ns_dtype="float32"))
    resumed_optimizer.load_state_dict(saved_optimizer)
    train(resumed, resumed_optimizer, 2, seed=2)
    for (name, a), (_, b) in zip(model.named_parameters(), resumed.named_parameters()):
        assert torch.equal(a, b), name
    assert resumed_optimizer.layout() == optimizer.layout()
    assert saved_optimizer["param_groups"][0]["param_names"][0] == optimizer.layout()[0][1]


def test_load_state_dict_rejects_a_different_layout():
    model = tiny_model()
    optimizer = build_optimizer(model)
    train(model, optimizer, 1)
    other = Transformer(ModelConfig(**{**TINY, "n_layers": 3}))
    with pytest.raises(ValueError, match="layout"):
        build_optimizer(other).load_state_dict(optimizer.state_dict())


def test_config_validation():
    with pytest.raises(ValueError):
        OptimizerConfig(ns_dtype="float16")
    with pytest.raises(ValueError):
        OptimizerConfig(muon_lr_adjustment="spectral")


def test_muon_on_fsdp2_style_dtensor_parameters_matches_plain_tensors(single_rank_mesh):
    """FSDP2 hands the optimizer DTensor shards; Muon must orthogonalise the whole matrix."""
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = single_rank_mesh
    torch.manual_seed(0)
    weight, grad = torch.randn(24, 40), torch.randn(24, 40)
    plain = nn.Parameter(weight.clone())
    sharded = nn.Parameter(distribute_tensor(weight.clone(), mesh, [Shard(0)]))
    config = OptimizerConfig(lr=0.05, ns_dtype="float32", cautious_weight_decay=True)
    for param, g in ((plain, grad), (sharded, distribute_tensor(grad.clone(), mesh, [Shard(0)]))):
        optimizer = MuonAdamW([("block.proj.weight", param)], config)
        for _ in range(2):
            param.grad = g.clone()
            optimizer.step()
    torch.testing.assert_close(sharded.full_tensor(), plain.detach(), rtol=1e-6, atol=1e-7)
