"""The `hymo-ablate` flow: one spec's variants x seeds as pipeline runs over shared cached stages, then one verdict each.

OUT/ablation.json             the spec's path and sha256, the rule, seeds and variants (written first)
OUT/runs/VARIANT/seed-S/      one pipeline run per (variant, seed); `base` is the base config
OUT/runs/.../ablation_eval.json  its held-out document bits and suite items (reused while its key holds)
OUT/comparison.json|.md|.png  paired differences, seed spread, verdicts, table and figure

Each run directory starts as hard links of a finished run's stage directories (the base's first seed,
or the variant's own first seed), so the pipeline flow finds every stage whose config and inputs are
unchanged published under its contract key: Prefect reports those task runs "Cached", and only the
changed stage and the stages after it compute. Stage outputs are written once and swapped in as new
directories, so a recomputed stage never writes through a link into another run. The task-run states
of every run are recorded in comparison.json (`states`, `recomputed`).

Every proxy trains the proxy recipe's steps x batch x seq_len tokens; the seed sets init and data order,
so the base and a model variant of one seed read the same windows in the same order. All runs are
measured on the same units: the base's held-out documents that no run trains on (document_bits.py),
and the first `suite_limit` items of each suite task.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from manifests.atomic import atomic_write_text
from manifests.run_dir import list_stage_dirs
from manifests.stage_manifest import StageNotComplete, read_manifest
from manifests.staleness import refuse_stale_corpus

from flows.ablate_spec import BASE, SAMPLE_SPEC, AblationSpec, SpecError, load_spec
from flows.config import PipelineConfig, default_run_root
from flows.pipeline import Runner, hymo_pipeline
from flows.stages import pipeline_stages, stage_dir_names, stage_path

ABLATION_FILE, COMPARISON = "ablation.json", "comparison"
EVAL_FILE = "ablation_eval.json"


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "variant"


def run_dir(out: Path, variant: str, seed: int) -> Path:
    return out / "runs" / slug(variant) / f"seed-{seed}"


def link_stages(source: Path | None, target: Path, config: PipelineConfig) -> list[str]:
    """Hard-link `source`'s complete stage directories that `config`'s stage list names into `target` (copy across
    filesystems); a stage `target` already has is left alone. Returns the linked directory names."""
    if source is None or not source.is_dir():
        return []
    wanted = set(stage_dir_names(pipeline_stages(config)).values())
    linked = []
    target.mkdir(parents=True, exist_ok=True)
    for stage_dir in list_stage_dirs(source):
        if stage_dir.path.name not in wanted or (target / stage_dir.path.name).exists():
            continue
        try:
            read_manifest(stage_dir.path, verify=False)
        except StageNotComplete:
            continue
        partial = target / f".{stage_dir.path.name}.linking"
        shutil.rmtree(partial, ignore_errors=True)
        try:
            shutil.copytree(stage_dir.path, partial, copy_function=os.link)
        except OSError:  # another filesystem: copies (the manifest check falls back to hashing)
            shutil.rmtree(partial, ignore_errors=True)
            shutil.copytree(stage_dir.path, partial)
        partial.rename(target / stage_dir.path.name)
        linked.append(stage_dir.path.name)
    return linked


def record_spec(spec: AblationSpec, out: Path) -> None:
    """ablation.json before the first run; a different spec over the same OUT is refused (its verdicts would mix rules)."""
    path = out / ABLATION_FILE
    record = {"spec": str(spec.path), "sha256": spec.sha256, "rule": spec.rule.__dict__, "seeds": list(spec.seeds),
              "variants": spec.names, "suite": list(spec.suite), "suite_limit": spec.suite_limit}
    if path.is_file():
        recorded = json.loads(path.read_text(encoding="utf-8"))
        if recorded.get("sha256") != spec.sha256:
            raise SpecError(f"{out}: holds the ablation of a spec with sha256 {str(recorded.get('sha256'))[:12]}…, not "
                            f"{spec.path} ({spec.sha256[:12]}…); use another --out")
        return
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")


def base_run_checked(spec: AblationSpec, base_run: str | None) -> AblationSpec:
    """The spec with `base_run` (the CLI's or its own) whose stages the base reuses; refused when a stage of it is stale
    (the base would train on a corpus an upstream rerun has changed since)."""
    if base_run:
        spec = replace(spec, base_run=Path(base_run).resolve())
    if spec.base_run is not None:
        refuse_stale_corpus(spec.base_run, "ablation")
    return spec


def verify_spec(spec: AblationSpec) -> None:
    """The rule is the one fixed before training: the spec file must still hash to what was recorded."""
    now = hashlib.sha256(Path(spec.path).read_bytes()).hexdigest()
    if now != spec.sha256:
        raise SpecError(f"{spec.path}: changed while the ablation ran (sha256 {spec.sha256[:12]}… -> {now[:12]}…); no verdict")


# ---------------------------------------------------------------- held-out documents


def split_documents(run: Path, config: PipelineConfig) -> tuple[list[dict], set[str]]:
    """(held-out documents, ids of training documents) of a run's split stage."""
    from tasks.runner.stage_runner import read_stage_docs

    table = read_stage_docs(stage_path(run, "split", config), columns=["id", "text", "source", "lang", "meta"]).to_pylist()
    held, train = [], set()
    for row in table:
        if json.loads(row["meta"] or "{}").get("split") == "validation":
            held.append({"id": row["id"], "text": row["text"], "source": row["source"], "lang": row["lang"] or "unknown"})
        else:
            train.add(row["id"])
    return held, train


def common_held_out(spec: AblationSpec, out: Path) -> tuple[list[dict], int]:
    """The base's held-out documents that no variant trains on (a variant's own split may choose differently),
    and how many the base held out."""
    base_seed = spec.seeds[0]
    held, _ = split_documents(run_dir(out, BASE, base_seed), spec.config(BASE, base_seed))
    trained: set[str] = set()
    for name in spec.names[1:]:
        trained |= split_documents(run_dir(out, name, base_seed), spec.config(name, base_seed))[1]
    common = [d for d in held if d["id"] not in trained]
    if not common:
        raise SpecError(f"{spec.path}: every held-out document of the base is a training document of some variant; "
                        "raise [split] validation_fraction")
    return common, len(held)


# ---------------------------------------------------------------- tasks


@task(task_run_name="evaluate-{variant}-seed{seed}", cache_policy=NO_CACHE)  # its own key: EVAL_FILE
def evaluate_proxy(run: str, config: PipelineConfig, variant: str, seed: int, documents: list[dict], suite: list[str],
                   suite_limit: int) -> dict[str, Any]:
    """Held-out document bits and suite items of one proxy; reused from EVAL_FILE while checkpoint, documents and suite match."""
    import torch

    from hymo_core.checkpoint.load import load_model
    from hymo_core.eval.document_bits import HeldOutDocument, document_bits, group_summary
    from hymo_core.eval.evaluation import load_tokenizer
    from hymo_core.eval.suite import run_task
    from hymo_core.train.data import CorpusReader

    run_path = Path(run)
    pretrain = stage_path(run_path, "pretrain", config)
    summary = json.loads((pretrain / "summary.json").read_text(encoding="utf-8"))
    checkpoint = pretrain / summary["checkpoint"]
    key = hashlib.sha256(json.dumps([read_manifest(pretrain, verify=False).digest, [d["id"] for d in documents], suite, suite_limit])
                         .encode()).hexdigest()
    path = run_path / EVAL_FILE
    if path.is_file():
        cached = json.loads(path.read_text(encoding="utf-8"))
        if cached.get("key") == key:
            return cached
    reader = CorpusReader(stage_path(run_path, "shards", config), verify=False)
    tokenizer = load_tokenizer(reader.root / reader.manifest["tokenizer"]["path"])
    model, payload = load_model(checkpoint, "cpu")
    seq_len = payload["train_config"]["seq_len"]
    rows = document_bits(model, tokenizer, reader.eos_id, [HeldOutDocument(**d) for d in documents], seq_len, torch.device("cpu"))
    tasks = {}
    for name in suite:
        result = run_task(name, model, tokenizer, limit=suite_limit, eos_id=reader.eos_id, device="cpu")
        tasks[name] = {"per_item": [{k: r[k] for k in ("id", "answer", "pick", "pick_per_char") if k in r} for r in result["per_item"]],
                       "accuracy_per_char": result.get("accuracy_per_char")}
    metrics = [json.loads(line) for line in (pretrain / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    noise = [m["noise_scale"]["b_simple_tokens"] for m in metrics if (m.get("noise_scale") or {}).get("b_simple_tokens")]
    record = {"key": key, "variant": variant, "seed": seed, "checkpoint": str(checkpoint), "documents": rows,
              "groups": group_summary(rows), "suite": tasks, "train_tokens": summary.get("tokens_seen"),
              "final_val_loss": summary.get("final_val_loss"), "b_simple_tokens": noise[-1] if noise else None}
    atomic_write_text(path, json.dumps(record) + "\n")
    get_run_logger().info("%s seed %d: held-out bpb %.4f over %d documents", variant, seed, record["groups"]["all"]["bpb"], len(rows))
    return record


@task(task_run_name="compare", cache_policy=NO_CACHE)
def compare_runs(spec: AblationSpec, out: str, measured: dict[str, dict[int, dict]], states: dict[str, dict[int, dict]],
                 held_out: dict[str, int]) -> dict[str, Any]:
    """comparison.json / .md / .png and the Prefect artifact; the spec is re-hashed before any verdict."""
    from prefect.artifacts import create_markdown_artifact

    from hymo_core.ablate.compare import compare_variant
    from hymo_core.ablate.report import draw, markdown_table, source_table

    from flows.artifacts import embedded_png

    verify_spec(spec)
    out_path = Path(out)
    comparison: dict[str, Any] = {"spec": str(spec.path), "sha256": spec.sha256, "rule": spec.rule.__dict__,
                                  "rule_text": spec.rule.describe(), "seeds": list(spec.seeds), "held_out_documents": held_out,
                                  "variants": {},
                                  "base": {"states": states[BASE], "groups": {s: r["groups"] for s, r in measured[BASE].items()},
                                           "b_simple_tokens": {s: r["b_simple_tokens"] for s, r in measured[BASE].items()}}}
    for name in spec.names[1:]:
        row = compare_variant(spec.rule, measured[BASE], measured[name])
        first_seed = states[name][spec.seeds[0]]
        row.update({"states": states[name], "recomputed": first_seed["recomputed"],
                    "b_simple_tokens": {s: r["b_simple_tokens"] for s, r in measured[name].items()}})
        comparison["variants"][name] = row
    table, sources = markdown_table(comparison), source_table(comparison)
    picture = draw(comparison, out_path / f"{COMPARISON}.png")
    atomic_write_text(out_path / f"{COMPARISON}.json", json.dumps(comparison, indent=2) + "\n")
    atomic_write_text(out_path / f"{COMPARISON}.md", f"Decision rule: {spec.rule.describe()}\n\n{table}\n\n{sources}\n")
    create_markdown_artifact(f"Decision rule: {spec.rule.describe()}\n\n{table}\n\n{sources}\n\n{embedded_png(picture, 'improvements')}",
                             key="hymo-ablation", description=f"ablation of {spec.path.name}")
    return comparison


@flow(name="hymo-ablate", log_prints=True)
def hymo_ablate(spec: str = str(SAMPLE_SPEC), out: str | None = None, base_run: str | None = None, runner: Runner = Runner.process,
                dask_address: str | None = None) -> dict[str, Any]:
    """Every variant of SPEC (and the base) once per seed through the pipeline, reusing cached stages; then the
    paired comparison against the decision rule the spec fixed. `out` empty: $HYMO_HOME/runs/ablate-SPECNAME.
    `base_run`: a finished run of the base config whose stages the base reuses (instead of the spec's base_run)."""
    loaded = base_run_checked(load_spec(spec), base_run)
    out_path = Path(out).resolve() if out else default_run_root() / f"ablate-{slug(loaded.path.stem)}"
    record_spec(loaded, out_path)
    logger = get_run_logger()
    states: dict[str, dict[int, dict]] = {}
    for name in loaded.names:
        states[name] = {}
        for number, seed in enumerate(loaded.seeds):
            config = loaded.config(name, seed)
            run = run_dir(out_path, name, seed)
            if number:
                source = run_dir(out_path, name, loaded.seeds[0])
            else:
                source = loaded.base_run if name == BASE else run_dir(out_path, BASE, loaded.seeds[0])
            linked = link_stages(source, run, config)
            summary = hymo_pipeline.with_options(flow_run_name=f"ablate-{slug(name)}-seed{seed}")(
                config=config, out=str(run), runner=runner, dask_address=dask_address)
            stage_states = {s["stage"]: s["state"] for s in summary["stages"]}
            recomputed = [stage for stage, state in stage_states.items() if state != "Cached"]
            states[name][seed] = {"states": stage_states, "recomputed": recomputed, "linked": linked}
            logger.info("%s seed %d: recomputed %s; cached the rest", name, seed, ", ".join(recomputed) or "nothing")
    documents, held_out = common_held_out(loaded, out_path)
    logger.info("held-out documents: %d of the base's %d pair (the rest some variant trains on)", len(documents), held_out)
    measured = {name: {seed: evaluate_proxy(str(run_dir(out_path, name, seed)), loaded.config(name, seed), name, seed, documents,
                                            list(loaded.suite), loaded.suite_limit)
                       for seed in loaded.seeds} for name in loaded.names}
    comparison = compare_runs(loaded, str(out_path), measured, states, {"base": held_out, "paired": len(documents)})
    for name, row in comparison["variants"].items():
        logger.info("%s: %s", name, row["statement"])
    return {"out": str(out_path), "comparison": str(out_path / f"{COMPARISON}.json"),
            "verdicts": {name: row["verdict"] for name, row in comparison["variants"].items()}}
