"""muP (hymo_core/models/mup.py): the coordinate check, init equal on meta and eager, per-role LR groups.

The coordinate check is Yang et al.'s: train the same model at three widths for a few steps at one LR
and read the RMS of how far each layer's output has moved since init. Under muP it stays flat
across widths; under the standard parametrisation the logits and the deeper layers grow with width.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from hymo_core.models.init import build_on_meta, materialise_
from hymo_core.models.model import ModelConfig, Transformer
from hymo_core.models.mup import widen, width_mult, width_role
from hymo_core.train.optim import build_optimizer
from hymo_core.train.optim_config import NorMuonConfig, OptimizerConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DENSE = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, ffn_dim=64, max_seq_len=32)
HYBRID = replace(DENSE, layer_pattern="GM", moe_on="M", moe_n_routed_experts=4, moe_expert_dim=32)
WIDTHS = (1, 2, 4)


def _batch(vocab: int, seed: int, B: int = 8, T: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Arithmetic progressions mod V with 10 % noise: a pattern a few steps can start to learn."""
    g = torch.Generator().manual_seed(seed)
    start, stride = torch.randint(0, vocab, (B, 1), generator=g), torch.randint(1, 4, (B, 1), generator=g)
    x = (start + stride * torch.arange(T + 1)) % vocab
    x = torch.where(torch.rand(B, T + 1, generator=g) < 0.1, torch.randint(0, vocab, (B, T + 1), generator=g), x)
    return x[:, :-1], x[:, 1:]


def coordinate_sizes(config: ModelConfig, optimizer: str, steps: int = 5, lr: float = 1e-2) -> dict[str, float]:
    """RMS of (output at step k - output at init) on a fixed batch, per trunk layer and for the logits."""
    torch.manual_seed(0)
    model = Transformer(config)
    outputs: dict[str, torch.Tensor] = {}
    for i, block in enumerate(model.layers):
        block.register_forward_hook(lambda module, args, out, i=i: outputs.__setitem__(f"layer{i}", out.detach()))
    opt_config = (NorMuonConfig(lr=lr, muon_lr=lr, ns_dtype="float32") if optimizer == "normuon"
                  else OptimizerConfig(lr=lr, ns_dtype="float32"))
    opt = build_optimizer(model, opt_config)
    probe, _ = _batch(config.vocab_size, 999)
    with torch.no_grad():
        outputs["logits"] = model(probe)[0]
    at_init = dict(outputs)
    for step in range(steps):
        model(*_batch(config.vocab_size, step))[1].backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        outputs["logits"] = model(probe)[0]
    return {name: (outputs[name] - at_init[name]).pow(2).mean().sqrt().item() for name in at_init}


def _growth(base: ModelConfig, parametrisation: str, optimizer: str) -> dict[str, float]:
    """Each coordinate's size at 4x width over its size at 1x."""
    sizes = []
    for factor in WIDTHS:
        config = widen(base, factor)
        if parametrisation == "standard":
            config = replace(config, parametrisation="standard", mup_base_width=0)
        sizes.append(coordinate_sizes(config, optimizer))
    assert all(v > 0 for s in sizes for v in s.values())
    return {name: sizes[-1][name] / sizes[0][name] for name in sizes[0]}


def test_coordinate_check_dense_muon_adamw_flat_under_mup_and_growing_without():
    mup, standard = _growth(DENSE, "mup", "muon_adamw"), _growth(DENSE, "standard", "muon_adamw")
    assert all(0.75 < ratio < 1.33 for ratio in mup.values()), mup
    assert standard["logits"] > 2.0, standard  # the head's updates add up over a 4x wider hidden state
    assert standard["layer1"] > 1.3, standard  # Muon's RMS-matched update has a sqrt(width) larger spectral norm


def test_coordinate_check_hybrid_normuon_moe_flat_under_mup():
    mup = _growth(HYBRID, "mup", "normuon")
    assert all(0.75 < ratio < 1.33 for ratio in mup.values()), mup


def test_mup_init_on_meta_equals_eager_and_scales_hidden_matrices_only():
    config = widen(replace(HYBRID, mtp_depth=1, tie_embeddings=False), 2)
    assert width_mult(config) == 2.0 and config.head_dim == DENSE.head_dim
    torch.manual_seed(3)
    eager = Transformer(config)
    torch.manual_seed(3)
    meta = materialise_(build_on_meta(config), "cpu")
    for name, value in eager.state_dict().items():
        assert torch.equal(value, meta.state_dict()[name]), name
    torch.manual_seed(3)
    standard = Transformer(replace(config, parametrisation="standard", mup_base_width=0))
    plain = dict(standard.named_parameters())
    for name, param in eager.named_parameters():
        expected = 2 ** -0.5 if width_role(name, param.ndim) == "hidden" else 1.0
        assert torch.allclose(param, plain[name] * expected), name
    hidden = {width_role(n, p.ndim) for n, p in eager.named_parameters() if "experts" in n or n.endswith("gate.weight")}
    assert hidden == {"hidden"}
    x = torch.randint(0, config.vocab_size, (1, 8))
    assert torch.allclose(eager(x)[0], standard.output(standard.norm(_trunk(eager, x))) / 2.0, atol=1e-6)


def _trunk(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    captured = {}
    handle = model.norm.register_forward_hook(lambda module, args, out: captured.setdefault("x", args[0]))
    model(tokens)
    handle.remove()
    return captured["x"]


@pytest.mark.parametrize("optimizer", ["muon_adamw", "normuon"])
def test_mup_lr_groups_scale_by_role(optimizer):
    model = Transformer(widen(HYBRID, 4))  # m = 4
    opt_config = NorMuonConfig(lr=1.0, muon_lr=1.0) if optimizer == "normuon" else OptimizerConfig(lr=1.0)
    groups = {g["group"]: g for g in build_optimizer(model, opt_config).param_groups}
    matrix = "normuon" if optimizer == "normuon" else "muon"
    assert groups[matrix]["lr"] == pytest.approx(0.5)  # RMS-matched update: 1/sqrt(m)
    hidden = [g for name, g in groups.items() if name.endswith("_mup_hidden")]
    assert hidden and all(g["lr"] == pytest.approx(0.25) for g in hidden)  # AdamW on router / experts: 1/m
    # router, routed and shared experts, and GDN's gate projections (AdamW since issue 54; fan-in d: hidden)
    assert all(".ffn." in n or n.endswith((".a_proj.weight", ".b_proj.weight")) for g in hidden for n in g["param_names"])
    plain = [g for g in groups.values() if g["group"] != matrix and g not in hidden]
    assert plain and all(g["lr"] == 1.0 for g in plain)  # embedding, head, gains: Theta(1)
    standard = build_optimizer(Transformer(HYBRID), opt_config)
    assert not any(g["group"].endswith("_mup_hidden") for g in standard.param_groups)
