"""Where a training step's time goes on one GPU: the MFU rows of bench/gpu_check.py, split.

    python bench/gpu_step_breakdown.py [--models dense-125m,hymo-750m] [--steps 5]   # on a GPU; JSON into $OUT

Per model, under the same FSDP2 one-rank layout and synthetic tokens as gpu_check's MFU rows (compile off):
the whole step; forward + backward alone; the optimizer step alone (NorMuon + CautiousAdamW, on the same
gradients each time); and the whole step with torch's fused AdamW on every parameter instead. The first
H200 run put the dense 125 M step at 134-139 ms where its model matmuls need about 18 ms; this says which
part holds the rest. Every figure is a median of CUDA-event timings after a warm-up.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.gpu_check import DENSE_125M, _fsdp_model, cuda_time  # noqa: E402
from hymo_core.models.presets import PRESETS  # noqa: E402
from hymo_core.planner.planner import model_shape, training_flops_per_token  # noqa: E402
from hymo_core.train.optim import build_optimizer  # noqa: E402
from hymo_core.train.optim_config import NorMuonConfig  # noqa: E402

MODELS = {"dense-125m": (DENSE_125M, 8, 2048), "hymo-750m": (PRESETS["hymo-750m"], 2, 4096)}


def breakdown(name: str, steps: int) -> dict:
    config, batch, seq_len = MODELS[name]
    torch.manual_seed(0)
    model = _fsdp_model(config, compile_blocks=False)
    optimizer = build_optimizer(model, NorMuonConfig(lr=1e-4, muon_lr=1e-4))
    tokens = torch.randint(0, config.vocab_size, (batch, seq_len + 1), device="cuda")
    x, y = tokens[:, :-1], tokens[:, 1:]

    def forward_backward():
        optimizer.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()

    def optimizer_step():
        optimizer.step()

    def whole():
        forward_backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        model.after_optimizer_step(read=False)

    row = {"model": name, "batch": batch, "seq_len": seq_len}
    row["whole_ms"] = cuda_time(whole, warmup=2, repeats=steps)
    row["forward_backward_ms"] = cuda_time(forward_backward, warmup=1, repeats=steps)
    forward_backward()
    row["optimizer_ms"] = cuda_time(optimizer_step, warmup=1, repeats=steps)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    row["whole_fused_adamw_ms"] = cuda_time(whole, warmup=2, repeats=steps)
    flops = training_flops_per_token(model_shape(config), seq_len) * batch * seq_len
    row["model_tflop_per_step"] = flops / 1e12
    row["forward_backward_tflops"] = flops / (row["forward_backward_ms"] / 1e3) / 1e12
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="dense-125m,hymo-750m")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    out = Path(os.environ.get("OUT", "bench/out"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    print("| model | whole ms | fwd+bwd ms | optimizer ms | whole, fused AdamW ms | fwd+bwd TFLOP/s |", flush=True)
    print("|---|---|---|---|---|---|", flush=True)
    for name in args.models.split(","):
        try:
            row = breakdown(name, args.steps)
        except Exception as error:  # one model's failure must not cost the other's figures
            row = {"model": name, "error": f"{type(error).__name__}: {error}"[:500]}
            print(f"| {name} | error: {row['error']} |", flush=True)
        else:
            print(f"| {name} | {row['whole_ms']:.1f} | {row['forward_backward_ms']:.1f} | {row['optimizer_ms']:.1f} | "
                  f"{row['whole_fused_adamw_ms']:.1f} | {row['forward_backward_tflops']:.0f} |", flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
        (out / "gpu_step_breakdown.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
