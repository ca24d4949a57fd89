"""Gated delta rule speed: recurrent vs chunked PyTorch on CPU; Triton vs flash-linear-attention on GPU.

CPU (always): forward of one batch (B=1) at T = 256, 1024, 4096 through the token-by-token
oracle and the chunk-64 WY form, at hymo-tiny's GDN shape (H=4, K=V=32) and with wider heads. The chunked form should cost the same per
token at every T (linear in T) and beat the recurrent one by >= 5x at T = 4096.

GPU (when CUDA exists): forward + backward in bf16 at hymo-750m's GDN shape (B=4, T=4096,
H=7, K=128, V=256): hymo_core's Triton kernel vs fla's chunk_gated_delta_rule. Goal: >= 0.8x
fla's speed. Without a GPU nothing is written for it (the earlier "no GPU" note is in docs/benchmarks-history.md).

    nice -n 10 python bench/gdn.py            # prints, and updates docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.report import markdown_table, write_section  # noqa: E402
from hymo_core.kernels.gdn import gated_delta_rule  # noqa: E402

CPU_TITLE = "hymo_core III: gated delta rule on CPU (bench/gdn.py)"
GPU_TITLE = "hymo_core III: gated delta rule on GPU (bench/gdn.py)"


def inputs(B, T, H, K, V, device="cpu", dtype=torch.float32, requires_grad=False):
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(B, T, H, K, generator=g)
    k = F.normalize(torch.randn(B, T, H, K, generator=g), dim=-1)
    v = torch.randn(B, T, H, V, generator=g)
    log_decay = F.logsigmoid(torch.randn(B, T, H, generator=g) + 3)
    beta = torch.rand(B, T, H, generator=g)
    out = [q.to(dtype), k.to(dtype), v.to(dtype), log_decay, beta]
    return [x.to(device).requires_grad_(requires_grad) for x in out]


def median_seconds(fn, repeats: int, sync=lambda: None, clock=time.perf_counter) -> float:
    fn()  # warm-up (and Triton compilation)
    sync()
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        sync()
        times.append(clock() - start)
    return statistics.median(times)


CPU_SHAPES = {"hymo-tiny's GDN (H=4, K=V=32)": (4, 32, 32), "wider heads (H=4, K=V=64)": (4, 64, 64)}


def cpu_section(lengths: list[int], repeats: int) -> None:
    # CPU seconds of this single-threaded process, not wall time: on a shared machine the wall
    # clock mostly measures the other jobs.
    rows = []
    for label, (H, K, V) in CPU_SHAPES.items():
        for T in lengths:
            xs = inputs(1, T, H, K, V)
            with torch.no_grad():
                rec = median_seconds(lambda: gated_delta_rule(*xs, backend="recurrent"), max(1, repeats // 2),
                                     clock=time.process_time)
                chk = median_seconds(lambda: gated_delta_rule(*xs, backend="reference"), repeats,
                                     clock=time.process_time)
            rows.append((label, T, f"{rec * 1e3:,.1f}", f"{chk * 1e3:,.1f}", f"{rec / chk:.1f}x", f"{chk / T * 1e6:.2f}"))
            print(f"{label:32s} T={T:5d}  recurrent {rec * 1e3:9.1f} ms  chunked {chk * 1e3:8.1f} ms  "
                  f"{rec / chk:5.1f}x  chunked {chk / T * 1e6:.2f} us/token", flush=True)
    table = markdown_table(["shape", "T", "recurrent ms", "chunked ms", "speed-up", "chunked us/token"], rows)
    machine = (f"{' '.join(filter(None, (platform.machine(), platform.processor())))}, {os.cpu_count()} cores, "
               f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), load average "
               f"{os.getloadavg()[0]:.1f} at the end")
    note = (f"Forward, no grad, fp32, B=1; CPU time of the (single-threaded) process, median of {repeats} "
            f"(recurrent: {max(1, repeats // 2)}). Machine: {machine}. A flat us/token column means linear in T.")
    write_section(CPU_TITLE, table, note)


def gpu_section(repeats: int) -> None:
    if not torch.cuda.is_available():
        # Nothing measured, so nothing written; the H200 figure against fla is bench/gpu_check.py's.
        print("no GPU: no GPU section written (docs/benchmarks.md, \"GPU check on an H200\", has the H200 figure)")
        return
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    B, T, H, K, V = 4, 4096, 7, 128, 256
    xs = inputs(B, T, H, K, V, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(B, T, H, V, device="cuda", dtype=torch.bfloat16)

    def ours():
        o, _ = gated_delta_rule(*xs, backend="triton")
        o.backward(do)

    def theirs():
        o, _ = chunk_gated_delta_rule(xs[0], xs[1], xs[2], xs[3], xs[4], scale=K ** -0.5)
        o.backward(do)

    sync = torch.cuda.synchronize
    ours_s, theirs_s = median_seconds(ours, repeats, sync), median_seconds(theirs, repeats, sync)
    rows = [("hymo_core Triton", f"{ours_s * 1e3:.2f}", f"{theirs_s / ours_s:.2f}x"),
            ("fla chunk_gated_delta_rule", f"{theirs_s * 1e3:.2f}", "1.00x")]
    print(rows)
    write_section(GPU_TITLE, markdown_table(["kernel", "fwd+bwd ms", "speed vs fla"], rows),
                  f"bf16, B={B}, T={T}, H={H}, K={K}, V={V} (hymo-750m's GDN); median of {repeats}; "
                  f"{torch.cuda.get_device_name()}.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1: on a shared machine a second spinning thread costs more than it gives)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cpu_section(args.lengths, args.repeats)
    gpu_section(args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
