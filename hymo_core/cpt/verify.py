"""`hymo cpt verify RUN`: recompute a CPT run's verdict from its checkpoints and its gate, trusting no number in RUN.

Each check compares two records that an edit would have to change together. The ledger outside RUN
is one of them, so editing RUN alone cannot pass:

* the gate's sha256, now, against the manifest and the ledger's start and end records;
* the manifest, the base checkpoint and the final checkpoint against the ledger (and each other);
* measurements.json against the ledger's end record and summary.json;
* the measurements themselves: the base and the final checkpoint are loaded and measured again on
  the same held-out batches and task items, and must reproduce measurements.json (1e-4);
* the verdict: recomputed from the gate and the fresh measurements, against summary.json's;
* the ledger itself: every line linked to the one before, one start and one end record for the run
  (a verdict appended later is refused, not preferred), and, when a Prefect server answers, the
  same records in the run's Prefect artifacts (`artifact_records`, passed in by the CLI).

Paths inside the run (the final checkpoint) are resolved against RUN, so verifying a copy measures
the copy's files; the run's records are found by the manifest's `run_id`. The two corpora are found
by their recorded digest among the places the manifest names (relative to RUN, absolute, as typed,
and as typed from the directory the run was written in), from any working directory; `corpora`
(`--domain` / `--general`) adds a place, and is accepted only if it holds the recorded digest.

The verdict reported is the recomputed one. Whatever is missing or unreadable is a failed check,
never an exception: a verifier (another person, a CI job) gets "verified" or "not verified".
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import torch

from hymo_core.checkpoint.load import load_model
from hymo_core.cpt.gate import GATE_FILE, judge, parse_gate
from hymo_core.cpt.ledger import LedgerError, default_ledger, run_records
from hymo_core.cpt.run import MANIFEST_FILE, MEASUREMENTS_FILE, SUMMARY_FILE, held_out_set, measure, paired_differences
from hymo_core.checkpoint.tokenizer_identity import TOKENIZER_KEY, corpus_tokenizer_sha256
from hymo_core.train.data import CorpusError, CorpusReader
from manifests.digest import sha256_file

TOLERANCE = 1e-4


def _max_difference(recorded: dict[str, list], fresh: dict[str, list]) -> float:
    worst = 0.0
    for key, values in fresh.items():
        old = recorded.get(key)
        if old is None or len(old) != len(values):
            return float("inf")
        worst = max([worst, *(abs(float(a) - float(b)) for a, b in zip(old, values))])
    return worst


def in_run(run: Path, recorded: str, recorded_run: str | None) -> Path:
    """A path the run recorded, resolved against the run being verified: relative ones under RUN, absolute ones
    under the directory the run was written in re-rooted onto RUN; others (the base checkpoint) as recorded."""
    path = Path(recorded)
    if not path.is_absolute():
        return run / path
    if recorded_run and path.is_relative_to(recorded_run):
        return run / path.relative_to(recorded_run)
    return path


def corpus_candidates(run: Path, entry: dict[str, Any], recorded_run: str | None, given: str | Path | None = None) -> list[Path]:
    """Where the manifest's corpus may be now, most specific first, each once."""
    typed = Path(entry["corpus"])
    places = [Path(given)] if given else []
    if entry.get("corpus_from_run"):
        places.append(Path(os.path.normpath(run / entry["corpus_from_run"])))
    if entry.get("corpus_absolute"):
        places.append(Path(entry["corpus_absolute"]))
    places.append(typed)  # absolute as recorded, or relative to this working directory
    if not typed.is_absolute():  # typed relative to the directory `hymo cpt run` ran in: usually the run's parent
        places += [Path(recorded_run).parent / typed] if recorded_run else []
        places.append(run.parent / typed)
    unique: list[Path] = []
    for place in places:
        if place not in unique:
            unique.append(place)
    return unique


def find_recorded_corpus(run: Path, entry: dict[str, Any], recorded_run: str | None,
                         given: str | Path | None = None) -> tuple[CorpusReader | None, str]:
    """The corpus among `corpus_candidates` whose digest is the recorded one (shards re-hashed), and the detail line."""
    tried = []
    for place in corpus_candidates(run, entry, recorded_run, given):
        try:
            if CorpusReader(place, verify=False).digest != entry["digest"]:
                tried.append(f"{place} (another corpus)")
                continue
            reader = CorpusReader(place)
            reader.open_all("validation")  # the held-out windows re-measured: their shards' digests checked now
            return reader, f"{reader.path}: digest {reader.digest[:12]}… as recorded"
        except (CorpusError, OSError, KeyError, ValueError) as exc:
            tried.append(f"{place} ({' '.join(str(exc).split())[:160]})")
    return None, f"no corpus with the recorded digest {entry['digest'][:12]}…; tried {'; '.join(tried)}"


def _same_record(ledger_record: dict[str, Any], artifact: dict[str, str]) -> bool:
    return {k: str(v) for k, v in ledger_record.items()} == artifact


def verify_run(run: str | Path, ledger: str | Path | None = None, device: torch.device | str = "cpu",
               artifact_records: Callable[[str], dict[str, list[dict[str, str]]] | None] | None = None,
               corpora: dict[str, str | Path | None] | None = None) -> dict[str, Any]:
    """{"verified", "checks": [{"check", "ok", "detail"}], "verdict"}: the recomputed verdict (None when it could
    not be recomputed) and every comparison. Never raises for what RUN holds or lacks: that is a failed check.
    `artifact_records(run_id)`: the run's start/end records as Prefect artifacts hold them, None without a server.
    `corpora`: {"domain": PATH, "general": PATH}, places to look first (a verifier's own copies)."""
    checks: list[dict[str, Any]] = []
    try:
        return _verify_run(Path(run), ledger, torch.device(device), artifact_records, corpora or {}, checks)
    except Exception as exc:  # noqa: BLE001 - a verifier answers verified or not; what broke is the failed check
        checks.append({"check": "run", "ok": False, "detail": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"})
        return {"verified": False, "checks": checks, "verdict": None}


def _verify_run(run: Path, ledger: str | Path | None, device: torch.device,
                artifact_records: Callable[[str], dict[str, list[dict[str, str]]] | None] | None,
                corpora: dict[str, str | Path | None], checks: list[dict[str, Any]]) -> dict[str, Any]:
    ledger = Path(ledger) if ledger else default_ledger(run)

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append({"check": name, "ok": bool(ok), "detail": detail})

    manifest = json.loads((run / MANIFEST_FILE).read_text(encoding="utf-8"))
    measurements = json.loads((run / MEASUREMENTS_FILE).read_text(encoding="utf-8"))
    summary = json.loads((run / SUMMARY_FILE).read_text(encoding="utf-8"))
    run_id = manifest.get("run_id")
    try:
        records = run_records(ledger, run, run_id)
        check("ledger", bool(start_end := records.get("start") and records.get("end")),
              f"{ledger}: {'one start and one end record, chain intact' if start_end else 'no start/end record'} for {run.resolve()} ({run_id})")
    except LedgerError as exc:
        records = {}
        check("ledger", False, str(exc))
    start, end = records.get("start", {}), records.get("end", {})
    held = artifact_records(run_id) if artifact_records and run_id else None
    if held is None:
        check("prefect artifacts", True, "skipped: no Prefect server answers (PREFECT_API_URL), or the run was not started by the flow")
    elif not any(held.values()):
        check("prefect artifacts", True, f"skipped: the Prefect server holds no hymo-cpt artifact of run {run_id} (started by the CLI)")
    else:
        agree = all(len(held.get(stage, [])) == 1 and _same_record(record, held[stage][0]) for stage, record in (("start", start), ("end", end)))
        check("prefect artifacts", agree, f"ledger start/end records against the Prefect artifacts: {'equal' if agree else 'they differ'} "
              f"({', '.join(f'{len(v)} {k}' for k, v in sorted(held.items()))})")
    recorded_run = start.get("run") or end.get("run")

    gate_now = sha256_file(run / GATE_FILE)
    check("gate", gate_now == manifest["gate"]["sha256"] == start.get("gate_sha256") == end.get("gate_sha256"),
          f"gate.toml {gate_now[:12]}…, manifest {manifest['gate']['sha256'][:12]}…, ledger start {str(start.get('gate_sha256'))[:12]}…")
    check("manifest", sha256_file(run / MANIFEST_FILE) == start.get("manifest_sha256"), "cpt_manifest.json against the ledger's start record")
    base_path = in_run(run, manifest["base"]["checkpoint"], recorded_run)
    base_now = sha256_file(base_path)
    check("base checkpoint", base_now == manifest["base"]["sha256"] == start.get("base_checkpoint_sha256"), f"{base_path}: {base_now[:12]}…")
    final_path = in_run(run, measurements["checkpoint"]["path"], recorded_run)
    final_now = sha256_file(final_path)
    check("final checkpoint", final_now == measurements["checkpoint"]["sha256"] == end.get("cpt_checkpoint_sha256"), f"{final_path}: {final_now[:12]}…")
    measured_now = sha256_file(run / MEASUREMENTS_FILE)
    check("measurements file", measured_now == end.get("measurements_sha256") == summary.get("measurements", {}).get("sha256"),
          f"measurements.json {measured_now[:12]}… against the ledger's end record and summary.json")

    criteria = parse_gate((run / GATE_FILE).read_text(encoding="utf-8"), str(run / GATE_FILE))
    tasks = [c for c in criteria if c.metric == "task_accuracy_drop"]
    recipe = manifest["recipe"]["train_config"]
    readers = {}
    for name in ("domain", "general"):
        reader, detail = find_recorded_corpus(run, manifest[name], recorded_run, corpora.get(name))
        check(f"{name} corpus", reader is not None, detail)
        if reader is not None:
            readers[name] = reader
    if len(readers) < 2:  # nothing to re-measure on: the verdict cannot be recomputed, so it is not verified
        return {"verified": False, "checks": checks, "verdict": None}
    held_out = {name: held_out_set(reader, recipe["seq_len"], recipe["batch_size"], manifest["recipe"]["eval_batches"])
                for name, reader in readers.items()}
    tokenizer = None
    if tasks:
        from hymo_core.eval.evaluation import load_tokenizer

        tokenizer = load_tokenizer(readers["domain"].root / readers["domain"].manifest["tokenizer"]["path"])
    fresh = {}
    for side, path in (("base", base_path), ("cpt", final_path)):
        model, payload = load_model(path, device)
        if side == "base":  # the corpora's tokenizer must be the one the base was trained with
            recorded, corpus = payload.get(TOKENIZER_KEY), corpus_tokenizer_sha256(readers["domain"])
            check("tokenizer", recorded in (None, corpus),
                  f"base checkpoint {recorded or 'records none (written before checkpoints did)'}, domain corpus {corpus}")
        fresh[side] = measure(model, held_out, tasks, tokenizer, readers["domain"].eos_id, device)
        worst = _max_difference(measurements[side], fresh[side])
        check(f"{side} measurements", worst <= TOLERANCE, f"re-measured {path.name}: largest difference from measurements.json {worst:.2e}")
    verdict = judge(criteria, paired_differences(fresh["base"], fresh["cpt"]))
    recorded = summary.get("verdict", {}).get("passed")
    check("verdict", verdict["passed"] == recorded and ("pass" if recorded else "fail") == end.get("verdict"),
          f"recomputed {'pass' if verdict['passed'] else 'fail'}, summary.json {recorded}, ledger {end.get('verdict')}")
    return {"verified": all(c["ok"] for c in checks), "checks": checks, "verdict": verdict}
