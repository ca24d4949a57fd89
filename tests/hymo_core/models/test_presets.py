"""HyMo presets: chosen by `preset =` in a [model] table, counted and explained by the planner."""

import pytest

from hymo_core.planner import cli as planner_cli, planner
from hymo_core.models.configs import SAMPLE_MODEL
from hymo_core.models.presets import PRESETS, model_config_from_table
from hymo_core.train.run import load_run_config


def test_preset_in_a_training_recipe_with_overrides(tmp_path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('[model]\npreset = "hymo-tiny"\nffn_dim = 96\n[train]\nmax_steps = 30\n')
    train, model = load_run_config(recipe)
    assert model == PRESETS["hymo-tiny"].__class__(**{**PRESETS["hymo-tiny"].__dict__, "ffn_dim": 96})
    assert model.layer_kinds() == ("G", "G", "G", "M") and train.max_steps == 30


def test_unknown_preset_and_keys_name_the_file(tmp_path):
    with pytest.raises(ValueError, match="r.toml: unknown model preset 'hymo-9b'"):
        model_config_from_table({"preset": "hymo-9b"}, SAMPLE_MODEL, "r.toml")
    with pytest.raises(ValueError, match=r"r.toml: unknown \[model\] keys \['colour'\]"):
        model_config_from_table({"preset": "hymo-tiny", "colour": 1}, SAMPLE_MODEL, "r.toml")


def test_pipeline_pretrain_model_table_takes_a_preset(tmp_path):
    from flows.config import load_config

    path = tmp_path / "run.toml"
    path.write_text('[pretrain.model]\npreset = "hymo-tiny"\nn_layers = 8\n')
    model = load_config(path).pretrain.model
    assert model.layer_pattern == "GGGM" and model.n_layers == 8 and model.ffn_dim == PRESETS["hymo-tiny"].ffn_dim


def test_hymo_tiny_matches_the_dense_sample_model_in_size():
    from dataclasses import replace

    dense = planner.count_parameters(planner.model_shape(replace(SAMPLE_MODEL, vocab_size=8192))).total
    # The hybrid trunk alone (the preset's MoE and MTP switched off) is the dense model's size.
    trunk = replace(PRESETS["hymo-tiny"], vocab_size=8192, moe_on="", mtp_depth=0)
    hybrid = planner.count_parameters(planner.model_shape(trunk)).total
    assert abs(hybrid - dense) / dense < 0.01


def test_plan_of_the_production_preset(capsys):
    assert planner_cli.main(["model", "--preset", "hymo-750m"]) == 0
    out = capsys.readouterr().out
    shape = planner.model_shape(PRESETS["hymo-750m"])
    assert shape.d_model == 896 and shape.vocab_size == 64_256 and shape.layer_kinds() == tuple("GGGM" * 8)
    assert f"{planner.count_parameters(shape).total:,}" in out
    breakdown = planner.training_flops_breakdown(shape, 4096)
    assert set(breakdown) == {"GDN", "MLA", "dense FFN", "MoE", "head", "MTP (training only)"}
    counts = planner.count_parameters(shape)
    assert f"{counts.active:,} (1 of 16 routed + 1 shared experts" in out and counts.active < counts.total - counts.mtp
    assert "optimizer state, NorMuon partition" in out and "optimizer state, AdamW on everything" in out
    assert f"{sum(breakdown.values()) / 1e6:,.1f} M" in out and "seed total ~340 M" in out
    assert "G: recurrent state" in out and "M: latent cache" in out


def test_gdn_cost_and_state_do_not_grow_with_context_but_attention_does():
    shape = planner.model_shape(PRESETS["hymo-750m"])
    short, long = planner.training_flops_breakdown(shape, 1024), planner.training_flops_breakdown(shape, 4096)
    assert short["GDN"] == long["GDN"] and long["MLA"] > short["MLA"]
    cache_short, cache_long = planner.decode_cache_bytes(shape, 1024), planner.decode_cache_bytes(shape, 4096)
    assert cache_short["G: recurrent state"] == cache_long["G: recurrent state"]
    assert cache_long["M: latent cache"] == 4 * cache_short["M: latent cache"]


def test_dense_125m_is_a_preset_a_recipe_trains_and_the_gpu_check_measures(tmp_path):
    from bench.gpu_check import DENSE_125M

    recipe = tmp_path / "recipe.toml"
    recipe.write_text('[model]\npreset = "dense-125m"\n[train]\nmax_steps = 300\n')
    train, model = load_run_config(recipe)
    assert model == PRESETS["dense-125m"] and DENSE_125M is PRESETS["dense-125m"]
    assert train.optimizer == "normuon" and train.cautious_weight_decay  # the preset's optimizer, as the MFU rows run
    assert 120e6 < planner.count_parameters(planner.model_shape(model)).total < 130e6  # GPT-2 small's size
