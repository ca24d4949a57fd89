"""Context extension on the sample: the sample checkpoint at 4x its window, both position plans.

    python bench/context_extension.py --corpus runs/sample --out /tmp/context-extension [--base CKPT] [--write]

Without --base, trains the sample checkpoint first (SAMPLE_TRAIN / SAMPLE_MODEL, what `hymo run`'s
pretrain stage trains; reused when OUT/sample-checkpoint/summary.json exists). Then `hymo extend` (hymo_core/
context/extend.py) once per position plan into OUT/<plan> (reused when its extend.json exists).
The table has needle accuracy by position before / after, long-context loss and the short-context
loss change; --write puts it into docs/benchmarks.md and the plot into docs/context_extension.png.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HEADING = "Context extension: the sample checkpoint at 4x its window (bench/context_extension.py)"
STAGES = ("before", "position_only", "after")


def plot(results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for (plan, result), colour in zip(results.items(), ("tab:blue", "tab:orange")):
        for stage, style in (("before", ":"), ("after", "-")):
            rows = result["measurements"][stage]["needle"]["by_position"]
            ax.plot([r["position"] for r in rows], [r["gain"] for r in rows], style, marker="o", color=colour,
                    label=f"{plan}, {stage}" if stage == "after" or plan == next(iter(results)) else None)
    first = next(iter(results.values()))
    span = first["measurements"]["after"]["needle"]["span"]
    # right of this line the needle is less than the base's window away from its copy
    ax.axvline(first["new_window"] - span - first["old_window"], color="grey", lw=0.8)
    ax.set_xlabel("needle position (its copy sits at the window's end)")
    ax.set_ylabel("needle log-prob gain over control (nats/token)")
    ax.set_title("needle retrieval across the extended window")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--base", help="the checkpoint to extend (default: train the sample checkpoint into OUT/sample-checkpoint)")
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--plans", default="base,interpolation")
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    import torch

    from hymo_core.context.extend import EXTEND_FILE, run_extend
    from hymo_core.train.config import SAMPLE_TRAIN, SUMMARY_FILE
    from hymo_core.train.run import SAMPLE_MODEL, run_training

    torch.set_num_threads(1)
    out = Path(args.out)
    base = args.base
    if base is None:
        summary_path = out / "sample-checkpoint" / SUMMARY_FILE
        summary = (json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.is_file()
                   else run_training(args.corpus, out / "sample-checkpoint", SAMPLE_TRAIN, SAMPLE_MODEL, cloze_path=None, progress=False,
                                 threads=1))
        base = summary["checkpoint"]
    results = {}
    for plan in args.plans.split(","):
        done = out / plan / EXTEND_FILE
        if done.is_file():
            results[plan] = json.loads(done.read_text(encoding="utf-8"))
            continue
        payload = torch.load(base, map_location="cpu", weights_only=True)
        window = payload["model_config"]["max_seq_len"]
        print(f"extending {base} from {window} to {args.factor * window} tokens ({plan})", flush=True)
        results[plan] = run_extend(base, args.corpus, out / plan, args.factor * window, position=plan, steps=args.steps,
                                   trials=args.trials)
    first = next(iter(results.values()))
    from bench.report import markdown_table

    header = ["needle at (distance): accuracy / gain"] + [f"{plan}: {stage.replace('_', ' ')}" for plan in results for stage in STAGES]
    rows = []
    for i, row in enumerate(first["measurements"]["before"]["needle"]["by_position"]):
        rows.append([f"{row['position']} ({row['distance']})"]
                    + [f"{r['measurements'][s]['needle']['by_position'][i]['accuracy']:.2f} / {r['measurements'][s]['needle']['by_position'][i]['gain']:+.2f}"
                       for r in results.values() for s in STAGES])
    rows.append(["control (no needle)"] + [f"{r['measurements'][s]['needle']['control']:.3f}" for r in results.values() for s in STAGES])
    rows.append([f"long-document loss at {first['new_window']}"]
                + [f"{r['measurements'][s]['long_loss']['loss']:.3f}" for r in results.values() for s in STAGES])
    rows.append(["  last quarter of the window"]
                + [f"{r['measurements'][s]['long_loss']['by_quarter'][-1]:.3f}" for r in results.values() for s in STAGES])
    rows.append([f"short-context held-out loss at {first['old_window']}"]
                + [f"{r['measurements'][s]['short_loss']:.3f}" for r in results.values() for s in STAGES])
    table = markdown_table(header, [tuple(r) for r in rows])
    changes = "; ".join(f"{plan}: short-context loss {r['short_loss_change']:+.3f} nats" for plan, r in results.items())
    data = first["data"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    note = (f"Machine: {platform.machine()} CPU, {os.cpu_count()} cores, shared (load average {os.getloadavg()[0]:.1f} at the end), "
            f"commit {commit}; not measured on a GPU. Base: {base} (step {first['base_step']}, window {first['old_window']}); "
            f"extended to {first['new_window']} for {first['steps']} updates of {first['train_config']['batch_size']} x "
            f"{first['new_window']} tokens at peak LR {first['train_config']['peak_lr']:.1e}, on the {data['windows']} windows of the "
            f"{data['long_documents']} of {data['documents']} train documents that hold {first['new_window'] + 1} tokens. "
            f"Needle: {first['measurements']['after']['needle']['span']} random ids, "
            f"{first['measurements']['after']['needle']['trials']} trials per position; accuracy is top-1 over needle tokens 2..8 "
            f"(chance about 1/8192), gain the log-probability gain in nats per token over the no-needle control. {changes}.")
    print(table)
    print(note)
    picture = out / "context_extension.png"
    plot(results, picture)
    if args.write:
        from bench.report import write_section_with_picture

        write_section_with_picture(HEADING, table, note, picture, "needle retrieval by position")
    return 0


if __name__ == "__main__":
    sys.exit(main())
