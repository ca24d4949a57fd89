"""The whole data half beside datatrove, in one run: `hymo run --until shards` vs FineWeb's chain in datatrove.

    python bench/data_half.py --scale large            # the 50k labelled corpus (the goals are stated for it)
    python bench/data_half.py --scale small --no-write # the 5k one, to check the script
    python bench/data_half.py --scale large --misses   # after a run: its dedup misses, judged on the text dedup saw

Input: the anchor harness's labelled corpus (--bench-dir, ../shared/bench copied to a scratch directory with its
corpus and datatrove venv), its 8 JSONL shards, read by both sides. HyMo reads them as one `jsonl` source declared
with the documentation profile (they are documentation pages with labelled junk, and that is the profile a user
declares for documentation; `--profile web` runs FineWeb's published rules instead, datatrove's own chain), the id
field as the URL so decisions map back to the labels, the quality classifier off (it is trained on the sample).
HyMo runs first, `python -m flows run --until shards` in a child process against a Prefect server that is already
up (as under `hymo serve`; its start-up is reported apart). datatrove runs second, in its own venv, on the same
cores with the same worker count (bench/datatrove_half_worker.py): langid with the same lid.176.ftz file, Gopher
repetition and quality, C4, FineWeb, the 4-stage MinHash, PII and tokenisation with the tokenizer.json HyMo trained
in this run. Nothing is downloaded.

Measured per side: wall seconds of the child process; CPU seconds of its whole process tree (workers included: the
larger of the reaped children's rusage and a 100 ms psutil sample of every live process, both lower bounds), for
HyMo also the Prefect server's CPU during the run; peak RSS of the tree and of its largest process. Per stage the
same from the stage's window: HyMo's from the Prefect task runs' start and end, datatrove's from the worker's clock
around each executor. Scores: the harness's score_filter (truth: navigation/spam/repeated_line/short) on every
document removed before dedup, and score_dedup (truth: exact copies and near copies with true 5-gram Jaccard >= 0.8)
on the documents that reached dedup, with the truth restricted to them.
"""
from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.process_tree import tree_pids, usage  # noqa: E402  (after the path fix)

DEFAULT_BENCH_DIR = Path("/work/scratch/bench")
WORK = Path(os.environ.get("HYMO_BENCH_WORK", "/tmp/hymo-bench-data-half"))
TITLE = "The data half beside datatrove (`python bench/data_half.py`)"
DATATROVE_FILES = 8  # the harness's JSONL shards; HyMo's ingest cuts as many (the default, 128 MB, makes one shard of this corpus)
GOALS = {"whole half": 6.0, "quality": 20.0, "dedup": 15.0}  # issue 57: HyMo at least this many times faster (wall; beyond: 8x whole)
# (row, HyMo stages, datatrove stages): datatrove reads JSONL inside every stage; its PII formatter runs in its tokenize stage.
GROUPS = [
    ("ingest + extract", ["ingest", "extract"], []),
    ("langid", ["langid"], ["langid"]),
    ("quality", ["quality"], ["quality"]),
    ("pii", ["pii"], []),
    ("dedup", ["dedup_exact", "dedup_fuzzy"], ["minhash_signatures", "minhash_buckets", "minhash_cluster", "minhash_filter"]),
    ("decontam", ["decontam"], []),
    ("split + tokenizer + mixture + shards / PII + tokenize", ["split", "tokenizer", "mixture", "shards"], ["tokenize"]),
]


def previous_hymo_walls(title: str) -> tuple[str, dict[str, str]]:
    """The section this run replaces: its stamp's commit and load, and its HyMo wall per row, so the new stage table
    keeps the previous one beside it."""
    from bench.report import DOC

    text = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    start = text.find(f"## {title}\n")
    if start == -1:
        return "", {}
    end = text.find("\n## ", start + 1)
    section = text[start: end if end != -1 else len(text)]
    stamp = re.search(r"Measured (\S+) on commit (\w+),.*?load average ([\d.]+)", section)
    walls, column = {}, 1
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] == "stage":  # that table has a previous column of its own: its run's is "HyMo wall s"
            column = cells.index("HyMo wall s") if "HyMo wall s" in cells else 1
        elif line.startswith("| ") and len(cells) > column and cells[0] != "tool" and not cells[0].startswith("---"):
            walls.setdefault(cells[0], cells[column])
    return (f"{stamp.group(2)}, {stamp.group(1)}, load {stamp.group(3)}" if stamp else "the previous run"), walls


class TreeClock:
    """Every 100 ms: time, CPU seconds so far and RSS of the process trees under `roots` (pids).

    A process's CPU is its last sampled user + system; one that exits between two samples loses at most 100 ms.
    """

    def __init__(self, roots: dict[str, int]) -> None:
        self.roots = dict(roots)
        self.cpu: dict[str, dict[int, float]] = {name: {} for name in roots}
        self.base: dict[str, dict[int, float]] = {name: {} for name in roots}
        self.times: list[float] = []
        self.samples: list[dict[str, tuple[float, float, float]]] = []  # name -> (cpu so far, tree MB, largest MB)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def sample(self) -> None:
        row = {}
        for name, root in self.roots.items():
            sizes = []
            for pid in tree_pids(root):
                read = usage(pid)
                if read is not None:
                    sizes.append(read[0])
                    self.cpu[name][pid] = read[1]
            row[name] = (sum(self.cpu[name].values()) - sum(self.base[name].values()), sum(sizes), max(sizes, default=0.0))
        self.times.append(time.time())
        self.samples.append(row)

    def run(self) -> None:
        while not self.stop.wait(0.1):
            self.sample()

    def window(self, name: str, start: float, end: float) -> dict[str, float]:
        """CPU seconds and peak RSS of tree `name` between two time.time() stamps."""
        first = max(0, bisect.bisect_left(self.times, start) - 1)
        last = min(len(self.times) - 1, bisect.bisect_right(self.times, end))
        rows = [s[name] for s in self.samples[first: last + 1]]
        return {"cpu_s": rows[-1][0] - rows[0][0], "tree_mb": max(r[1] for r in rows), "largest_mb": max(r[2] for r in rows)}

    def total(self, name: str) -> dict[str, float]:
        return self.window(name, self.times[0], self.times[-1])

    def __enter__(self) -> "TreeClock":
        self.sample()
        self.base = {name: dict(cpu) for name, cpu in self.cpu.items()}  # a server's CPU before the run is not the run's
        self.samples = []
        self.times = []
        self.sample()
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def measured(command: list[str], log: Path, also: dict[str, int] | None = None, env: dict | None = None) -> tuple[dict, TreeClock]:
    """Run `command` (stdout+stderr to `log`), sampling its tree (and the trees of `also`): wall, CPU, peak RSS."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        with TreeClock({"side": process.pid, **(also or {})}) as clock:
            code = process.wait()
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        sys.stderr.write(log.read_text()[-6000:])
        raise SystemExit(f"{command[:3]} failed with exit code {code}; log {log}")
    reaped = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    total = clock.total("side")
    return {"wall_s": wall, "cpu_s": max(reaped, total["cpu_s"]), "reaped_cpu_s": reaped, "sampled_cpu_s": total["cpu_s"],
            "tree_mb": total["tree_mb"], "largest_mb": total["largest_mb"]}, clock


def write_config(root: Path, shards: Path, workers: int, profile: str, docs_per_shard: int, tokenizer: Path | None = None,
                 name: str = "pipeline.toml") -> Path:
    """The run's pipeline config; with `tokenizer`, the tokenizer stage adopts that file (`tokenizer.from_file`) instead of training."""
    spec = root / "labelled.toml"
    spec.write_text("\n".join([
        'name = "labelled"', 'kind = "jsonl"', f'path = "{shards}"', 'glob = "*.jsonl"', 'url_field = "id"',
        'origin = "the anchor harness make_corpus.py (Debian documentation packages, labelled junk and copies)"',
        'snapshot = "seed 1234"', 'license = "various (Debian doc packages)"', f'profile = "{profile}"']) + "\n", encoding="utf-8")
    config = root / name
    given = f'\n[tokenizer]\nfrom_file = "{tokenizer}"\n' if tokenizer else ""
    config.write_text(f'[run]\nsources = ["{spec}"]\nworkers = {workers}\n\n[ingest]\ndocs_per_shard = {docs_per_shard}\n\n'
                      '[quality_model]\nenabled = false\n' + given, encoding="utf-8")
    return config


def stage_windows(api_url: str, names: list[str]) -> dict[str, tuple[float, float]]:
    """Start and end (time.time()) of every stage task run on the server (only this run's flow reports to it)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(any_=names)), limit=200)
    return {run.name: (run.start_time.timestamp(), run.end_time.timestamp()) for run in runs if run.start_time and run.end_time}


def run_hymo(args, root: Path, shards: Path, tokenizer: Path | None = None) -> dict:
    """`hymo run --until shards` into root/hymo-run; with `tokenizer`, into root/hymo-run-given, adopting that tokenizer."""
    from flows.config import load_config
    from flows.server import LocalServer, free_port
    from flows.stages import pipeline_stages, stage_path

    suffix = "-given" if tokenizer else ""
    config_path = write_config(root, shards, args.workers, args.profile, -(-args.documents // DATATROVE_FILES), tokenizer,
                               f"pipeline{suffix}.toml")
    config = load_config(str(config_path))
    names = [e.name for e in pipeline_stages(config)]
    names = names[: names.index("shards") + 1]
    run = root / f"hymo-run{suffix}"
    server = LocalServer(home=root / f"prefect{suffix}", port=free_port()).start()
    try:
        env = {**os.environ, "PREFECT_API_URL": server.api_url}
        side, clock = measured([sys.executable, "-m", "flows", "run", "--config", str(config_path), "--out", str(run), "--until", "shards",
                                "--api-url", server.api_url], root / f"hymo{suffix}.log", also={"server": server.process.pid}, env=env)
        windows = stage_windows(server.api_url, names)
    finally:
        server.stop()
    side["server_cpu_s"] = clock.total("server")["cpu_s"]
    side["server_startup_s"] = server.startup_s
    stages = {name: {"start": windows[name][0], "wall_s": windows[name][1] - windows[name][0], **clock.window("side", *windows[name])}
              for name in names}
    side["started"] = clock.times[0]
    return {"side": side, "stages": stages, "run": run, "config": config, "stage_path": lambda name: stage_path(run, name, config)}


def stage_column(hymo: dict, stage: str, column: str) -> list:
    """One column of a HyMo stage's data shards, in manifest order."""
    import pyarrow.parquet as pq

    from manifests.stage_manifest import read_manifest

    manifest = read_manifest(hymo["stage_path"](stage), verify=False)
    return [v for f in manifest.files("data") for v in pq.read_table(manifest.path_of(f), columns=[column]).column(column).to_pylist()]


def hymo_urls(hymo: dict) -> dict[str, str]:
    """HyMo document id -> the corpus id (the source's id field is ingested as the URL)."""
    return dict(zip(stage_column(hymo, "ingest", "id"), stage_column(hymo, "ingest", "url")))


def hymo_decisions(hymo: dict) -> tuple[set[str], set[str]]:
    """(corpus ids that reached dedup, removed by dedup), HyMo ids mapped back through ingest's url."""
    from tasks.runner.stage_runner import read_stage_audit

    url_of = hymo_urls(hymo)
    reached = {url_of[i] for i in stage_column(hymo, "pii", "id")}
    removed_dedup = set()
    for stage in ("dedup_exact", "dedup_fuzzy"):
        audit = read_stage_audit(hymo["stage_path"](stage)).to_pylist()
        removed_dedup |= {url_of[row["id"]] for row in audit if row["action"] == "removed"}
    return reached, removed_dedup


def run_datatrove(args, root: Path, shards: Path, tokenizer: Path) -> dict:
    from tasks.filters.langid import bundled_model_path

    work = root / "datatrove"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    result = root / "datatrove.json"
    side, clock = measured([str(args.datatrove_python), str(REPO / "bench" / "datatrove_half_worker.py"), str(shards), str(work), str(result),
                            "--lid-model", str(bundled_model_path()), "--tokenizer", str(tokenizer), "--workers", str(args.workers)],
                           root / "datatrove.log")
    worker = json.loads(result.read_text())
    stages = {name: {"start": start, "wall_s": end - start, **clock.window("side", start, end)} for name, (start, end) in worker["timeline"].items()}
    side["started"] = clock.times[0]
    return {"side": side, "stages": stages, "worker": worker}


def median_run(runs: list[dict]) -> dict:
    """The run whose process wall is the median (the lower middle of an even count): a whole run, so its stage rows,
    decisions and totals stay one run's."""
    return sorted(runs, key=lambda run: run["side"]["wall_s"])[(len(runs) - 1) // 2]


def grouped(stages: dict[str, dict], names: list[str]) -> dict | None:
    rows = [stages[n] for n in names if n in stages]
    if not rows:
        return None
    return {"wall_s": sum(r["wall_s"] for r in rows), "cpu_s": sum(r["cpu_s"] for r in rows),
            "tree_mb": max(r["tree_mb"] for r in rows), "largest_mb": max(r["largest_mb"] for r in rows)}


def ratio(theirs: dict | None, ours: dict | None, key: str) -> float | None:
    return theirs[key] / ours[key] if theirs and ours and ours[key] > 0 else None


def dedup_misses(common, root: Path) -> str:
    """For a finished run under `root`: HyMo's missed dedup truth groups (with the truth restricted to the documents
    that reached dedup, an unreached source dropped from its group), each explained by its source's pair with a copy
    left in: under the harness's 5-gram Jaccard of 0.8 on the text dedup saw (the pii stage's output, after the
    quality stage's line removals and PII masking; the stages that changed the pair are named), at or above it there
    but under 0.8 by HyMo's own shingle sets (the two tokenisations differ), or at or above 0.8 by both and never an
    LSH candidate (no band of the 14 × 8 agrees: probability 1 - P(s), 7.6 % at s = 0.8). Recall on the text dedup
    saw counts only the groups still at or above 0.8 there."""
    from flows.config import load_config
    from flows.stages import stage_path
    from tasks.runner.stage_runner import read_stage_audit

    config, run = load_config(root / "pipeline.toml"), root / "hymo-run"
    hymo = {"stage_path": lambda name: stage_path(run, name, config)}
    reached, removed = hymo_decisions(hymo)
    corpus = {record["id"]: record for record in common.iter_jsonl(common.corpus_path(root.name))}
    url_of = hymo_urls(hymo)
    seen = {url_of[i]: text for i, text in zip(stage_column(hymo, "pii", "id"), stage_column(hymo, "pii", "text"))}
    changed_by: dict[str, set[str]] = {}
    for stage in ("quality", "pii"):
        for row in read_stage_audit(hymo["stage_path"](stage)).to_pylist():
            if row["action"] == "modified":
                changed_by.setdefault(url_of[row["id"]], set()).add(f"{stage} {row['rule']}")
    groups = {source: members & reached for source, members in common.truth_groups({i: corpus[i] for i in reached}).items()}
    needed = sum(len(g) - 1 for g in groups.values() if len(g) > 1)
    causes: dict[str, list[int]] = {}  # cause -> [groups, removals missed]
    for source, group in groups.items():
        if len(group) < 2 or len(group & removed) >= len(group) - 1:
            continue
        source = source if source in group else min(group)
        left = sorted(group - removed - {source}) or sorted(group - {source})
        cause = missed_pair_cause(common, config.dedup_fuzzy, seen[source], seen[left[0]], changed_by.get(source, set()) | changed_by.get(left[0], set()))
        tally = causes.setdefault(cause, [0, 0])
        tally[0] += 1
        tally[1] += len(group - removed) - 1
    missed = sum(removals for _, removals in causes.values())
    under = sum(removals for cause, (_, removals) in causes.items() if cause.startswith("under"))
    lines = [f"{root}: {needed} removals needed by the truth restricted to what reached dedup; {sum(g for g, _ in causes.values())} groups "
             f"missed ({missed} removals); on the text dedup saw (groups still at or above "
             f"{common.JACCARD_THRESHOLD} there): {needed - under - (missed - under)} of {needed - under}, recall "
             f"{1 - (missed - under) / max(needed - under, 1):.4f}"]
    lines += [f"  {groups_missed} groups, {removals} removals: {cause}" for cause, (groups_missed, removals) in sorted(causes.items())]
    return "\n".join(lines)


def missed_pair_cause(common, config, text_a: str, text_b: str, changed_by: set[str]) -> str:
    """Why a source and its copy were not linked, judged on the text dedup saw (see dedup_misses)."""
    import pyarrow as pa

    from tasks.dedup.byte_tokens import batch_token_hashes
    from tasks.dedup.minhash import HashFamily, band_keys, signatures
    from tasks.dedup.shingles import TokenHashCache, jaccard_of_sets, ngram_hashes_by_document, sorted_set

    if common.jaccard(common.shingles(text_a), common.shingles(text_b)) < common.JACCARD_THRESHOLD:
        return f"under {common.JACCARD_THRESHOLD} on the text dedup saw, changed by " + (" + ".join(sorted(changed_by)) or "no stage")
    hashes, offsets = ngram_hashes_by_document(*batch_token_hashes(pa.array([text_a, text_b]), config.fold_numbers, TokenHashCache()),
                                               config.shingle_size)
    if jaccard_of_sets(sorted_set(hashes[:offsets[1]]), sorted_set(hashes[offsets[1]:])) < config.jaccard_threshold:
        return f"at or above {common.JACCARD_THRESHOLD} by the harness's shingles, under it by HyMo's (tokenisations differ)"
    keys = band_keys(signatures(hashes, offsets, HashFamily.from_seed(config.num_hashes, config.seed)), config.bands, config.rows)
    if not (keys[:, 0] == keys[:, 1]).any():
        return f"at or above {config.jaccard_threshold} by both, no band of {config.bands} x {config.rows} agrees (an LSH miss)"
    return "a candidate at or above the threshold, yet not linked"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", choices=["small", "large"], default="large")
    parser.add_argument("--bench-dir", type=Path, default=DEFAULT_BENCH_DIR)
    parser.add_argument("--datatrove-python", type=Path, default=None, help="default: BENCH_DIR/venv/bin/python")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--profile", default="documentation", help="the HyMo source's quality profile (default: documentation)")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--hymo-only", action="store_true", help="only HyMo's side and its stage table (to profile it; writes nothing)")
    parser.add_argument("--misses", action="store_true", help="after a run: HyMo's missed dedup groups, judged on the text dedup saw")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the three sides this many times, in turn; each side's row is its median run by process wall "
                             "(this machine's speed drifts by a quarter over minutes, and one side runs minutes after the other)")
    args = parser.parse_args(argv)
    args.datatrove_python = args.datatrove_python or args.bench_dir / "venv" / "bin" / "python"
    sys.path.insert(0, str(args.bench_dir))
    import common  # the harness: corpus paths, labels, scoring

    from bench.report import markdown_table, write_section

    if args.misses:
        print(dedup_misses(common, WORK / args.scale))
        return 0
    labels = common.load_labels(args.scale)
    shards = common.shard_dir(args.scale)
    args.documents = len(labels)
    root = WORK / args.scale
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    load_start = os.getloadavg()[0]

    runs: dict[str, list[dict]] = {"hymo": [], "given": [], "datatrove": []}
    for round_number in range(1, args.rounds + 1):
        where = root if round_number == 1 else root / f"round-{round_number}"  # round 1 where --misses reads
        where.mkdir(parents=True, exist_ok=True)
        hymo = run_hymo(args, where, shards)
        print(f"round {round_number}: HyMo: {hymo['side']['wall_s']:.1f} s wall, {hymo['side']['cpu_s']:.1f} CPU s", flush=True)
        if args.hymo_only:
            for name, stage in hymo["stages"].items():
                print(f"{name:12s} starts at {stage['start'] - hymo['side']['started']:6.1f} s: {stage['wall_s']:6.1f} s wall, {stage['cpu_s']:6.1f} CPU s")
            last = max(stage["start"] + stage["wall_s"] for stage in hymo["stages"].values()) - hymo["side"]["started"]
            print(f"process: {hymo['side']['wall_s']:.1f} s wall, {hymo['side']['cpu_s']:.1f} CPU s; after the last stage {hymo['side']['wall_s'] - last:.1f} s")
            return 0
        tokenizer = hymo["stage_path"]("tokenizer") / "tokenizer.json"
        given = run_hymo(args, where, shards, tokenizer)  # like for like: datatrove is handed this tokenizer, so HyMo is too
        print(f"round {round_number}: HyMo, tokenizer given: {given['side']['wall_s']:.1f} s wall, {given['side']['cpu_s']:.1f} CPU s", flush=True)
        datatrove = run_datatrove(args, where, shards, tokenizer)
        print(f"round {round_number}: datatrove: {datatrove['side']['wall_s']:.1f} s wall, {datatrove['side']['cpu_s']:.1f} CPU s", flush=True)
        for side, run in (("hymo", hymo), ("given", given), ("datatrove", datatrove)):
            runs[side].append(run)
    hymo, given, datatrove = (median_run(runs[side]) for side in ("hymo", "given", "datatrove"))

    every = set(labels)
    reached, hymo_removed_dedup = hymo_decisions(hymo)
    dt_reached = set(datatrove["worker"]["kept_quality"])
    scores = {
        "HyMo": (common.score_filter(every - reached, labels),
                 common.score_dedup(hymo_removed_dedup, {i: labels[i] for i in reached})),
        "datatrove": (common.score_filter(every - dt_reached, labels),
                      common.score_dedup(set(datatrove["worker"]["removed_dedup"]), {i: labels[i] for i in dt_reached})),
    }

    def cells(entry: dict | None) -> list[str]:
        if entry is None:
            return ["–"] * 4
        return [f"{entry['wall_s']:.1f}", f"{entry['cpu_s']:.1f}", f"{entry['tree_mb']:.0f}", f"{entry['largest_mb']:.0f}"]

    rows = []
    per_group = {}
    for label, ours_names, their_names in GROUPS:
        ours, theirs = grouped(hymo["stages"], ours_names), grouped(datatrove["stages"], their_names)
        per_group[label] = (ours, theirs)
        wall = ratio(theirs, ours, "wall_s")
        cpu = ratio(theirs, ours, "cpu_s")
        rows.append((label, *cells(ours), *cells(theirs), f"{wall:.1f}x" if wall else "–", f"{cpu:.1f}x" if cpu else "–"))
    in_stages = {side: sum(s["wall_s"] for s in d["stages"].values()) for side, d in (("HyMo", hymo), ("datatrove", datatrove))}
    rows.append(("between stages (start-up, imports, flow/executor)", f"{hymo['side']['wall_s'] - in_stages['HyMo']:.1f}", "", "", "",
                 f"{datatrove['side']['wall_s'] - in_stages['datatrove']:.1f}", "", "", "", "", ""))
    whole_wall = datatrove["side"]["wall_s"] / hymo["side"]["wall_s"]
    whole_cpu = datatrove["side"]["cpu_s"] / (hymo["side"]["cpu_s"] + hymo["side"]["server_cpu_s"])
    rows.append(("**whole half**, HyMo training its tokenizer (process wall; CPU: tree, HyMo's incl. the Prefect server's)", *cells(
        {**hymo["side"], "cpu_s": hymo["side"]["cpu_s"] + hymo["side"]["server_cpu_s"]}), *cells(datatrove["side"]),
        f"{whole_wall:.1f}x", f"{whole_cpu:.1f}x"))
    tail_label, tail_stages, _ = GROUPS[-1]
    given_tail, their_tail = grouped(given["stages"], tail_stages), per_group[tail_label][1]
    rows.append((f"{tail_label}, HyMo adopting the tokenizer (second HyMo run)", *cells(given_tail), *cells(their_tail),
                 *(f"{r:.1f}x" if r else "–" for r in (ratio(their_tail, given_tail, "wall_s"), ratio(their_tail, given_tail, "cpu_s")))))
    given_wall = datatrove["side"]["wall_s"] / given["side"]["wall_s"]
    given_cpu = datatrove["side"]["cpu_s"] / (given["side"]["cpu_s"] + given["side"]["server_cpu_s"])
    rows.append(("**whole half, the tokenizer given to both** (second HyMo run: `tokenizer.from_file`)", *cells(
        {**given["side"], "cpu_s": given["side"]["cpu_s"] + given["side"]["server_cpu_s"]}), *cells(datatrove["side"]),
        f"**{given_wall:.1f}x**", f"{given_cpu:.1f}x"))
    title = TITLE if args.profile == "documentation" else TITLE.replace("`)", f" --profile {args.profile}`)")
    previous, previous_walls = previous_hymo_walls(title)
    rows = [(row[0], previous_walls.get(row[0], "–"), *row[1:]) for row in rows]
    table = markdown_table(["stage", f"HyMo wall s, previous run ({previous})", "HyMo wall s", "HyMo CPU s", "HyMo tree MB",
                            "HyMo largest MB", "datatrove wall s", "datatrove CPU s", "datatrove tree MB", "datatrove largest MB",
                            "wall: datatrove / HyMo", "CPU: datatrove / HyMo"], rows)

    score_rows = []
    for side, (filt, dedup) in scores.items():
        score_rows.append((side, f"{filt['precision']:.4f}", f"{filt['recall']:.4f}", filt["removed"],
                           f"{dedup['precision']:.4f}", f"{dedup['recall']:.4f}", dedup["removed"], dedup["needed_removals"]))
    score_table = markdown_table(["tool", "filter precision", "filter recall", "removed before dedup",
                                  "dedup precision", "dedup recall", "dedup removed", "dedup truth (of its input)"], score_rows)

    def better_or_equal(i: int, key: str) -> bool:
        return scores["HyMo"][i][key] >= scores["datatrove"][i][key]

    pr_ok = all(better_or_equal(i, key) for i in (0, 1) for key in ("precision", "recall"))
    measured_ratio = {"whole half": given_wall, "quality": ratio(*reversed(per_group["quality"]), "wall_s"),
                      "dedup": ratio(*reversed(per_group["dedup"]), "wall_s")}
    what = {"whole half": "whole half, the tokenizer given to both"}
    goal_lines = [f"- {what.get(name, name)}: datatrove / HyMo wall = {measured_ratio[name]:.1f}x, goal >= {goal:.0f}x: "
                  f"**{'met' if measured_ratio[name] >= goal else 'not met'}**" for name, goal in GOALS.items()]
    goal_lines.insert(1, f"- whole half, HyMo training its tokenizer (datatrove trains none): {whole_wall:.1f}x")
    goal_lines.append(f"- P/R equal or better than datatrove's on both filter and dedup truth: **{'met' if pr_ok else 'not met'}** ("
                      + "; ".join(f"{kind} {key} {'>=' if better_or_equal(i, key) else '<'}" for i, kind in ((0, "filter"), (1, "dedup"))
                                  for key in ("precision", "recall")) + ")")
    rates = "; ".join(f"{side}: " + ", ".join(f"{k} {v:.3f}" for k, v in filt["removal_rate_by_label"].items())
                      for side, (filt, _) in scores.items())
    body = "\n".join([
        table, "", score_table, "", *goal_lines, "",
        f"Removal rate before dedup, by label — {rates}.",
        f"HyMo's Prefect server (already up, as under `hymo serve`) took {hymo['side']['server_startup_s']:.1f} s to start, not counted; "
        f"its CPU during the run, {hymo['side']['server_cpu_s']:.1f} s, is counted in the whole half's CPU. "
        f"HyMo CPU: reaped {hymo['side']['reaped_cpu_s']:.1f} s, sampled {hymo['side']['sampled_cpu_s']:.1f} s; datatrove: reaped "
        f"{datatrove['side']['reaped_cpu_s']:.1f} s, sampled {datatrove['side']['sampled_cpu_s']:.1f} s (the larger counts). "
        f"datatrove {datatrove['worker']['version']} wrote {datatrove['worker']['tokens']:,} tokens.",
    ])
    rounds = "" if args.rounds == 1 else (
        f" {args.rounds} rounds, each side in turn; each side's row is its median run by process wall (HyMo: "
        + ", ".join(f"{r['side']['wall_s']:.1f}" for r in runs["hymo"]) + " s; HyMo, tokenizer given: "
        + ", ".join(f"{r['side']['wall_s']:.1f}" for r in runs["given"]) + " s; datatrove: "
        + ", ".join(f"{r['side']['wall_s']:.1f}" for r in runs["datatrove"]) + " s).")
    note = (f"`python bench/data_half.py --scale {args.scale}{' --rounds ' + str(args.rounds) if args.rounds > 1 else ''}` on the anchor harness's {args.scale}.jsonl ({len(labels):,} labelled documents, "
            f"8 JSONL shards read by both; HyMo's ingest cuts 8 shards too, docs_per_shard = {-(-args.documents // DATATROVE_FILES)}), {args.workers} workers each, HyMo's source with the `{args.profile}` profile, one side after "
            f"the other (HyMo, HyMo again with the tokenizer given, datatrove); 1-min load {load_start:.1f} at start. HyMo: "
            "`python -m flows run --until shards` (process runner); its second run adopts the first run's tokenizer.json "
            "(`tokenizer.from_file`) instead of training one, as datatrove is given it; the stage rows are the first run's. "
            "datatrove: langid (the same lid.176.ftz) -> Gopher repetition -> Gopher quality -> C4 (filter_no_terminal_punct=False) -> "
            "FineWeb -> MinHash 4 stages -> PII -> DocumentTokenizer with HyMo's tokenizer.json from this run. Stage windows: HyMo's "
            "Prefect task runs, datatrove's executor runs; CPU of the process tree in each window (100 ms samples)." + rounds)
    print(note + "\n\n" + body)
    (root / "result.json").write_text(json.dumps({"hymo": {k: hymo[k] for k in ("side", "stages")},
                                                  "hymo_tokenizer_given": {k: given[k] for k in ("side", "stages")}, "datatrove": {k: datatrove[k] for k in ("side", "stages")},
                                                  "scores": scores}, indent=1, default=str))
    if not args.no_write:
        write_section(title, body, note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
