"""The planner must print Lab 4's numbers (seed 001, module 8) exactly."""

import argparse
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hymo_core.planner import cli as planner_cli, planner
from hymo_core.planner.planner import ModelShape

CASE = ModelShape()  # defaults are the case study
LLAMA3 = ModelShape(n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=128256)
RECIPE = ModelShape(n_layers=12, d_model=768, n_heads=12, n_kv_heads=12, ffn_dim=2048, vocab_size=32000,
                    tie_embeddings=True)
LAPTOP = ModelShape(n_layers=6, d_model=256, n_heads=8, n_kv_heads=8, ffn_dim=688, vocab_size=4096,
                    tie_embeddings=True)
GB = 1e9
REPO_ROOT = Path(__file__).resolve().parents[3]


def run_python(*args: str) -> subprocess.CompletedProcess:
    """A fresh interpreter that finds hymo_core whether or not it is installed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, check=True, env=env,
                          cwd=REPO_ROOT)


@pytest.mark.parametrize(
    "shape, total, blocks",
    [
        (CASE, 9_550_729_216, 8_305_016_832),
        (LLAMA3, 8_030_261_248, 6_979_584_000),
        (RECIPE, 109_529_856, 84_953_088),
        (LAPTOP, 5_795_072, 4_746_240),
    ],
)
def test_parameter_counts_match_lab4(shape, total, blocks):
    counts = planner.count_parameters(shape)
    assert counts.total == total
    assert counts.blocks == blocks
    assert counts.total == counts.blocks + counts.embeddings + shape.d_model  # final norm


def test_qk_norm_adds_two_head_gains_per_layer():
    with_norm = ModelShape(n_layers=6, d_model=256, n_heads=8, n_kv_heads=8, ffn_dim=688, vocab_size=4096,
                           tie_embeddings=True, qk_norm=True)
    assert planner.count_parameters(with_norm).total - 5_795_072 == 6 * 2 * 32


def test_training_flops_and_gpu_time_for_2t_tokens():
    detailed, shortcut = planner.training_flops(CASE, 2e12, 8192)
    assert f"{detailed:.3e}" == "1.216e+23"
    assert f"{shortcut:.3e}" == "1.146e+23"
    assert f"{shortcut / detailed - 1:.1%}" == "-5.8%"
    gpu_hours, hours = planner.gpu_time(detailed, 4e14, 80)
    assert f"{gpu_hours:,.1f}" == "84,465.3"
    assert f"{hours:.2f}" == "1055.82"
    assert f"{hours / 24:.2f}" == "43.99"


def test_training_flops_small_runs():
    detailed, _ = planner.training_flops(CASE, 2e9, 8192)
    gpu_hours, hours = planner.gpu_time(detailed, 4e14, 8)
    assert f"{detailed:.3e}" == "1.216e+20"
    assert f"{gpu_hours:,.1f}" == "84.5" and f"{hours:.2f}" == "10.56"
    recipe, _ = planner.training_flops(RECIPE, 2.5e9, 2048)
    assert f"{recipe:.3e}" == "1.926e+18"


@pytest.mark.parametrize("mfu, days", [(0.30, "59.3"), (0.40, "44.5"), (0.50, "35.6")])
def test_days_at_assumed_mfu(mfu, days):
    detailed, _ = planner.training_flops(CASE, 2e12, 8192)
    _, hours = planner.gpu_time(detailed, 989e12 * mfu, 80)
    assert f"{hours / 24:.1f}" == days


@pytest.mark.parametrize(
    "replicas, expected",
    [(8, "152.8, 52.5, 35.8, 19.1"), (64, "152.8, 40.0, 21.2, 2.4"), (80, "152.8, 39.6, 20.8, 1.9")],
)
def test_model_state_per_gpu(replicas, expected):
    n = planner.count_parameters(CASE).total
    sizes = [planner.model_state_bytes(n, replicas, stage) / GB for stage in planner.ZERO_STAGES]
    assert ", ".join(f"{size:.1f}" for size in sizes) == expected


def test_model_state_rejects_unknown_stage_and_zero_replicas():
    with pytest.raises(ValueError):
        planner.model_state_bytes(10, 8, 4)
    with pytest.raises(ValueError):
        planner.model_state_bytes(10, 0, 3)


def test_activations_and_logits():
    assert f"{planner.activation_bytes(CASE, 8192, 1) / GB:.2f}" == "42.88"
    assert f"{planner.activation_bytes(CASE, 8192, 1, checkpoint=True) / GB:.2f}" == "3.61"
    assert f"{planner.logits_bytes(CASE, 8192, 1) / GB:.2f}" == "4.98"
    without_flash = planner.activation_bytes(CASE, 8192, 1, flash=False)
    probabilities = 2 * CASE.n_layers * CASE.n_heads * 8192**2
    assert without_flash - planner.activation_bytes(CASE, 8192, 1) == probabilities
    assert f"{probabilities / GB:.1f}" == "154.6"


@pytest.mark.parametrize(
    "shape, replicas, stage, seq_len, micro_batch, checkpoint, capacity, parts, fits",
    [
        (CASE, 8, 3, 8192, 1, False, 80, ("19.10", "42.88", "4.98", "66.97"), True),
        (CASE, 8, 3, 8192, 1, True, 80, ("19.10", "3.61", "4.98", "27.69"), True),
        (CASE, 80, 1, 8192, 1, False, 80, ("39.64", "42.88", "4.98", "87.50"), False),
        (RECIPE, 1, "DP", 2048, 16, False, 24, ("1.75", "9.66", "4.19", "15.61"), True),
        (RECIPE, 1, "DP", 2048, 32, False, 24, ("1.75", "19.33", "8.39", "29.47"), False),
    ],
)
def test_memory_fit_rows(shape, replicas, stage, seq_len, micro_batch, checkpoint, capacity, parts, fits):
    estimate = planner.memory_fit(shape, replicas, stage, seq_len, micro_batch, checkpoint, capacity * GB)
    shown = tuple(f"{value / GB:.2f}" for value in
                  (estimate.states, estimate.activations, estimate.logits, estimate.total))
    assert shown == parts
    assert estimate.fits is fits


@pytest.mark.parametrize("stages, micro, shown", [(4, 4, "42.9%"), (4, 16, "15.8%"), (8, 8, "46.7%"),
                                                  (8, 64, "9.9%")])
def test_pipeline_bubble(stages, micro, shown):
    assert f"{planner.pipeline_bubble(stages, micro):.1%}" == shown


@pytest.mark.parametrize("mtbf_hours, minutes, hours, overhead",
                         [(3.09, "19.3", "0.32", "10.4%"), (633, "275.6", "4.59", "0.7%")])
def test_young_checkpoint_interval(mtbf_hours, minutes, hours, overhead):
    interval = planner.young_interval(60, mtbf_hours * 3600)
    assert f"{interval / 60:.1f}" == minutes and f"{interval / 3600:.2f}" == hours
    assert f"{planner.checkpoint_overhead(60, interval, mtbf_hours * 3600):.1%}" == overhead
    # tau* minimises the overhead: nudging it either way costs more.
    for other in (interval * 0.8, interval * 1.25):
        assert planner.checkpoint_overhead(60, other, mtbf_hours * 3600) > \
            planner.checkpoint_overhead(60, interval, mtbf_hours * 3600)


@pytest.mark.parametrize(
    "n, d, gpus, flops, gpu_hours, days",
    [(9.5e9, 190e9, 16, "1.083e+22", "7,520.8", "19.59"), (9.5e9, 2e12, 80, "1.140e+23", "79,166.7", "41.23"),
     (9.5e9, 15e12, 80, "8.550e+23", "593,750.0", "309.24"), (1e9, 20e9, 4, "1.200e+20", "83.3", "0.87")],
)
def test_six_nd_shortcut_table(n, d, gpus, flops, gpu_hours, days):
    compute = 6 * n * d
    hours_gpu, hours = planner.gpu_time(compute, 4e14, gpus)
    assert (f"{compute:.3e}", f"{hours_gpu:,.1f}", f"{hours / 24:.2f}") == (flops, gpu_hours, days)


def test_shape_validation():
    with pytest.raises(ValueError):
        ModelShape(d_model=100, n_heads=32)
    with pytest.raises(ValueError):
        ModelShape(n_heads=32, n_kv_heads=5)


def test_add_cli_registers_model_subcommand(capsys):
    parser = argparse.ArgumentParser(prog="hymo plan")
    planner_cli.add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["model"])
    assert args.layers == 36 and args.vocab == 152064 and not args.tied
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "9,550,729,216" in out
    assert "1.216e+23" in out and "84,465.3 GPU-hours" in out
    # 80 GPUs = 4 pipeline stages x 20 replicas: a quarter of the 152.8 GB of state per stage, sharded 20 ways
    assert "DP 38.2, ZeRO-1 11.0, ZeRO-2 6.4, ZeRO-3 1.91 GB" in out
    assert "10.72 GB, checkpointed 1.80 GB; fp32 logits 4.98 GB" in out  # 9 of the 36 layers per stage


def test_plan_follows_the_gpu_count(capsys):
    """Issue 58: state per GPU, the bubble, the MTBF and the checkpoint interval used to print the same for 1, 8 and 16,384 GPUs."""
    outputs = {}
    for gpus in (1, 8, 16384):
        assert planner_cli.main(["model", "--gpus", str(gpus), "--muon-ranks", ""]) == 0
        outputs[gpus] = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in capsys.readouterr().out.splitlines()
                             if re.search(r"\S\s{2,}\S", line))
    lines = {gpus: {label.strip(): value.strip() for label, value in out.items()} for gpus, out in outputs.items()}
    # the Llama 3 rate: 16,384 x 54 x 24 / 419 GPU-hours per GPU; 3.09 h on the report's 16,384 GPUs, 6,334.63 h on 8
    assert lines[16384]["MTBF on 16,384 GPUs"].startswith("3.09 h") and lines[8]["MTBF on 8 GPUs"].startswith("6,334.63 h")
    assert "419 unexpected interruptions in 54 days on 16,384 GPUs" in lines[8]["MTBF on 8 GPUs"]
    intervals = [lines[g]["checkpoint every (write 60 s, Young/Daly)"] for g in (1, 8, 16384)]
    assert len(set(intervals)) == 3 and intervals[2].startswith("18.6 minutes") and "hours" in intervals[0]
    assert lines[1]["model state/GPU, 1 GPU"] != lines[8]["model state/GPU, 8 GPUs"]
    assert lines[1]["pipeline bubble p=1, m=512"] == "0.0%" and lines[16384]["pipeline bubble p=4, m=1"] == "75.0%"
    assert "below one micro-batch per replica" in lines[16384]["batch advice"]
    assert lines[8]["tokens per parameter"].startswith("209.4 (at or above Chinchilla")
    assert planner_cli.main(["model", "--gpus", "8", "--tokens", "20e9", "--muon-ranks", ""]) == 0
    assert "tokens per parameter                               2.1 (below Chinchilla's compute-optimal ~20" in capsys.readouterr().out


def test_daly_refines_young():
    assert planner.daly_interval(60, 3.09 * 3600) == pytest.approx(1115.7, abs=0.1)  # 1155.37 x 1.01761 - 60, by hand
    assert planner.daly_interval(60, 3.09 * 3600) < planner.young_interval(60, 3.09 * 3600)
    assert planner.daly_interval(7200, 1800) == 1800  # a write longer than 2 M: checkpoint once per MTBF


def test_cli_flags_change_the_shape(capsys):
    assert planner_cli.main(["model", "--layers", "6", "--d-model", "256", "--heads", "8", "--kv-heads", "8",
                         "--ffn-dim", "688", "--vocab", "4096", "--tied"]) == 0
    assert "5,795,072" in capsys.readouterr().out


def test_module_runs_on_its_own():
    result = run_python("-m", "hymo_core.planner", "--layers", "32", "--ffn-dim", "14336", "--vocab", "128256")
    assert "8,030,261,248" in result.stdout


def test_hymo_core_imports_neither_prefect_nor_pipeline_packages():
    code = (
        "import sys, hymo_core.models.model, hymo_core.train.optim, hymo_core.train.schedule, hymo_core.planner.planner, hymo_core.kernels\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('prefect', 'tasks', 'flows')]\n"
        "assert not bad, bad\n"
    )
    run_python("-c", code)


def test_planner_counts_the_kernels_chunk():
    """The planner keeps its own copy of the GDN chunk size to stay torch-free; it must be the kernels' one."""
    from hymo_core.kernels.gdn_chunk import CHUNK

    assert planner.GDN_CHUNK == CHUNK


@pytest.mark.parametrize("preset", ["hymo-tiny", "hymo-750m"])
def test_muon_matrix_shapes_are_the_optimizers_partition(preset):
    """The planner lists the matrices the optimizer orthogonalises, in its order (hymo-750m: 250, 342 M; its MTP
    blocks have a dense FFN since the preset follows seed 000, which adds 6 matrices to issue 24's 292; issue 54
    moved the 48 GDN gate projections, 7 x 896, to AdamW)."""
    import torch

    from hymo_core.models.model import Transformer
    from hymo_core.models.presets import PRESETS
    from hymo_core.planner.muon import muon_matrix_shapes, muon_update_cost
    from hymo_core.train.partition import partition_parameters

    with torch.device("meta"):
        model = Transformer(PRESETS[preset])
    partitioned = [tuple(p.shape) for a, p in partition_parameters(model.named_parameters()) if a.kind == "matrix"]
    shapes = muon_matrix_shapes(planner.model_shape(PRESETS[preset]))
    assert shapes == partitioned
    if preset == "hymo-750m":
        assert len(shapes) == 250 and sum(a * b for a, b in shapes) == 342_458_368
        gather, owned = (muon_update_cost(shapes, 8, scheme, ns_bytes=2) for scheme in ("gather", "owned"))
        assert round(gather.ns_flops / 1e12, 1) == 7.5 and round(gather.bytes_received / 1e9, 2) == 1.20  # issue 24 had 7.2 / 1.16 at 292
        assert owned.ns_flops < gather.ns_flops / 7 and owned.bytes_received < gather.bytes_received / 7


def test_plan_prints_the_muon_update_costs():
    printed = run_python("-m", "hymo_core.planner", "--preset", "hymo-750m", "--muon-ranks", "8,64").stdout
    table = printed[printed.index("Muon / NorMuon update of hymo-750m: 250 matrices"):]
    assert "     8  gather          7.484       1.199" in table and "    64   owned" in table
