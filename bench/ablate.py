"""An ablation spec on the bundled sample through `hymo ablate` (the feature itself), tables into docs/benchmarks.md.

Default spec: manifests/configs/ablate_sample.toml, the sample's two ablations: (a) prose sources under
the web profile's quality rules vs the prose profile's; (b) hymo-tiny with MoE on vs off. The recipe
ablation of hymo-tiny (MTP, MoE, NorMuon, all three off) is manifests/configs/ablate_recipe.toml.
`--base-run` points at a finished `hymo run` of the sample; its stages are linked, not recomputed.

    nice -n 10 python bench/ablate.py --base-run runs/sample --out /tmp/ablate-sample [--spec SPEC] [--write]

Writes OUT/comparison.{json,md,png}, and with --write docs/ablate_<spec>.png and the section into docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.report import write_section  # noqa: E402
from flows.ablate_spec import SAMPLE_SPEC, load_spec  # noqa: E402


def evidence_line(name: str, row: dict) -> str:
    """Whether the variant separates from the noise, in words, from the numbers the verdict used."""
    bpb = row["heldout_bpb"]
    ratio = abs(bpb["improvement"]) / bpb["se"] if bpb["se"] > 0 else float("inf")
    k = bpb["multiplier"]
    return (f"- {name}: improvement {bpb['improvement']:+.4f} bpb = {ratio:.1f} se (se {bpb['se']:.4f}: items {bpb['se_items']:.4f}, "
            f"seed sd {bpb['seed_sd']:.4f}; {bpb['df']:.1f} degrees of freedom); per seed {', '.join(f'{v:+.4f}' for v in bpb['per_seed'])}; "
            f"{'separated from' if ratio > k else 'not separated from'} the noise at ±{k:.2f} se; verdict **{row['statement']}**.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default=str(SAMPLE_SPEC))
    parser.add_argument("--base-run", help="a finished sample run (hymo run) whose stages the base reuses")
    parser.add_argument("--out", required=True)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    spec = load_spec(args.spec)
    load_before = os.getloadavg()
    started = time.time()
    command = [sys.executable, "-m", "flows", "ablate", args.spec, "--out", args.out]
    if args.base_run:
        command += ["--base-run", args.base_run]
    subprocess.run(command, cwd=REPO, check=True)
    seconds = time.time() - started
    comparison = json.loads((Path(args.out) / "comparison.json").read_text(encoding="utf-8"))
    table = (Path(args.out) / "comparison.md").read_text(encoding="utf-8").strip()
    evidence = "\n".join(evidence_line(name, row) for name, row in comparison["variants"].items())
    noise = ", ".join(f"{s}: {v:,.0f}" for s, v in comparison["base"]["b_simple_tokens"].items() if v)
    train = spec.base_config.pretrain.train
    note = (f"Load average {load_before[0]:.1f} when it started; {seconds / 60:.1f} min wall in all. Spec `{Path(args.spec).name}` (sha256 "
            f"{spec.sha256[:12]}…): seeds {list(spec.seeds)}, each proxy {train.max_steps} updates of {train.tokens_per_update:,} tokens "
            f"({train.max_steps * train.tokens_per_update:,} tokens), evaluated on the base's held-out documents that no run trains on "
            f"and the first {spec.suite_limit} items of {', '.join(spec.suite)}. Base B_simple (tokens, per seed): {noise or 'not positive yet'}.")
    body = f"{table}\n\n{evidence}"
    if args.write:
        picture = REPO / "docs" / f"ablate_{Path(args.spec).stem.removeprefix('ablate_')}.png"
        shutil.copyfile(Path(args.out) / "comparison.png", picture)
        body += f"\n\n![improvements]({picture.name})"
        write_section(f"Ablation: {Path(args.spec).name} (bench/ablate.py)", body, note)
    print(note + "\n\n" + body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
