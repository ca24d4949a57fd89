"""The shards stage's flow-host peak RSS, phase by phase, on run directories built through the mixture stage.

    hymo run --config CFG --out RUN --until mixture        # e.g. bench/scale.py's synthetic corpus at two sizes
    python bench/shards_host_rss.py RUN_SMALL RUN_LARGE [--write]

Why: the size run (bench/scale.py) reads one peak per stage from a 100 ms sampler of a
Dask flow host, and a rise of a few tens of MB between two sizes cannot tell a
per-document term from a lazy import or Arrow's memory pool. This runs the stage in
this process with the local worker pool, samples RSS every 20 ms, and names the phase
each rise happens in, so a per-document term shows as the same phase growing with N.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:] = [str(REPO)] + [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]

PAGE = os.sysconf("SC_PAGE_SIZE")
PHASES = ("load_tokenizer", "plan_parts", "pack_side", "documents_by_source", "corpus_sources", "write_corpus_manifest")
TITLE = "Shards stage: the flow host's RSS by phase (bench/shards_host_rss.py)"


def rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE / 2**20


class PhaseSampler:
    """RSS every 20 ms, kept as the peak of the phase running at the time and the RSS at each phase's end."""

    def __init__(self) -> None:
        self.phase, self.peaks, self.ends = "start", {}, []
        threading.Thread(target=self.sample, daemon=True).start()

    def sample(self) -> None:
        while True:
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0.0), rss_mb())
            time.sleep(0.02)

    def wrap(self, name: str, fn):
        def wrapped(*args, **kwargs):
            count = sum(1 for phase, _ in self.ends if phase.split(" #")[0] == name)
            label = name if count == 0 else f"{name} #{count + 1}"
            self.phase = label
            try:
                return fn(*args, **kwargs)
            finally:
                self.ends.append((label, rss_mb()))
                self.phase = f"after {label}"
        return wrapped


def measure(run: Path) -> dict:
    """One shards-stage build on `run` (its published stages untouched: the output goes to a temporary directory)."""
    import tasks.corpus.shards as shards

    sampler = PhaseSampler()
    for name in PHASES:
        setattr(shards, name, sampler.wrap(name, getattr(shards, name)))
    shards.HeldOutSide.__init__ = sampler.wrap("held-out side", shards.HeldOutSide.__init__)
    shards.HeldOutSide.write_documents = sampler.wrap("validation_documents", shards.HeldOutSide.write_documents)
    stages = {p.name.split("_", 1)[1]: p for p in run.iterdir() if p.is_dir() and p.name[:1].isdigit()}
    start = time.time()
    with tempfile.TemporaryDirectory() as out:
        manifest = shards.run_shards(shards.ShardsConfig(), stages["split"], stages["tokenizer"], stages["mixture"], Path(out) / "shards", workers=2)
    documents = read_documents(stages["split"])
    time.sleep(0.05)
    return {"run": str(run), "documents": documents, "seconds": time.time() - start, "ends": sampler.ends,
            "peak": max(sampler.peaks.values()), "train_tokens": manifest.extra.get("train_tokens")}


def read_documents(split_dir: Path) -> int:
    from manifests.stage_manifest import read_manifest

    return sum(f.rows or 0 for f in read_manifest(split_dir, verify=False).files("data"))


def child(run: Path) -> dict:
    """measure() in a fresh interpreter, so imports and Arrow's pool start empty for each run."""
    import json
    import subprocess

    done = subprocess.run([sys.executable, __file__, "--child", str(run)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help="run directories with split, tokenizer and mixture published")
    parser.add_argument("--write", action="store_true", help="replace this section of docs/benchmarks.md")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        import json

        print(json.dumps(measure(args.child)))
        return 0
    from bench.report import markdown_table, refuse_if_loaded, write_section

    load = os.getloadavg()[0]
    results = [child(run) for run in args.runs]
    labels = [label for label, _ in results[0]["ends"]]
    header = ["phase (RSS at its end)"] + [f"{r['documents']:,} documents" for r in results]
    rows = [(label, *(f"{dict(r['ends']).get(label, float('nan')):.0f} MB" for r in results)) for label in labels]
    rows.append(("peak of the whole stage", *(f"**{r['peak']:.0f} MB**" for r in results)))
    rows.append(("stage wall", *(f"{r['seconds']:.1f} s" for r in results)))
    table = markdown_table(header, rows)
    note = (f"The shards stage built in one process with 2 local pool workers (`run_shards`, output to a temporary directory), RSS "
            f"sampled every 20 ms, each run in a fresh interpreter; load {load:.2f} at start. Runs: "
            + "; ".join(f"{r['run']} ({r['train_tokens']:,} training tokens)" for r in results) + ".")
    print(f"{note}\n\n{table}")
    if args.write and not refuse_if_loaded(load):
        write_section(TITLE, table, note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
