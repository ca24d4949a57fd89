"""Prefect artifacts people look at instead of reading logs: per-stage tables, removal samples, the funnel.

Every table is capped at a few hundred rows; the funnel is also written as a PNG in the run directory.
"""
from __future__ import annotations

import base64
import contextvars
import inspect
import io
import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from manifests.atomic import atomic_write_bytes
from manifests.audit_query import funnel, sample_by_rule
from manifests.stage_manifest import StageManifest

SAMPLES_PER_RULE = 20
MAX_ROWS = 300


def artifact_key(*parts: str) -> str:
    """Prefect keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")[:100]


def stage_counts_rows(manifest: StageManifest) -> list[dict[str, Any]]:
    counts = manifest.counts
    rows = [{"measure": "in", "rule": "", "documents": counts.get("in", 0)}, {"measure": "kept", "rule": "", "documents": counts.get("kept", 0)}]
    for action in ("removed", "modified", "routed"):
        rows += [{"measure": action, "rule": rule, "documents": n} for rule, n in sorted(counts.get(action, {}).items())]
    return rows[:MAX_ROWS]


def removal_samples(run: Path, stage: str, manifest: StageManifest) -> list[dict[str, Any]]:
    rules = sorted(manifest.counts.get("removed", {}))
    if not rules:
        return []
    return [{"id": row["id"], "rule": row["rule"], "value": row["value"], "threshold": row["threshold"],
             "snippet": (row.get("snippet") or "").replace("\n", " ")[:160]}
            for row in sample_by_rule(run, stage, rules, SAMPLES_PER_RULE)][:MAX_ROWS]


def made_rows(manifest: StageManifest) -> list[dict[str, Any]] | None:
    """What a stage that makes files rather than filtering documents produced (its manifest's extra), as
    (measure, value) rows; None for a document stage. A tokenizer has no "in" or "kept": an "in 0 / kept 0"
    table for it read like data loss."""
    extra, stage = manifest.extra or {}, manifest.stage
    if stage == "tokenizer" and "tokenizer" in extra:
        tokenizer, overall = extra["tokenizer"], extra.get("overall", {})
        rows = [("vocabulary", tokenizer.get("vocab_size")), ("eos id", tokenizer.get("eos_id")), ("sha256", str(tokenizer.get("sha256", ""))[:16]),
                ("documents round-tripped", tokenizer.get("round_trip_documents")), ("chars per token (sample)", overall.get("chars_per_token")),
                ("tokens per word (sample)", overall.get("tokens_per_word"))]
        rows += [(f"chars per token: {source}", row.get("chars_per_token")) for source, row in sorted(extra.get("sample_by_source", {}).items())]
    elif stage == "mixture" and "mixture" in extra:
        table = extra["mixture"]
        rows = [("tokens requested", table.get("total_tokens_requested")), ("tokens contributed", table.get("tokens_contributed")),
                ("shortfall tokens", table.get("shortfall_tokens"))]
        rows += [(f"tokens: {row['name']}", f"{row['tokens_contributed']} (weight {row.get('weight')}, {row.get('epochs')} epochs)")
                 for row in table.get("sources", [])]
    elif stage == "shards" and "corpus_digest" in extra:
        shards = [f.path for f in manifest.outputs if f.path.endswith(".bin")]
        rows = [("train shards", sum("train-" in p for p in shards)), ("train tokens", extra.get("train_tokens")),
                ("validation shards", sum("validation-" in p for p in shards)), ("validation tokens", extra.get("validation_tokens")),
                ("dtype", extra.get("dtype")), ("corpus digest", str(extra.get("corpus_digest", ""))[:16])]
    elif stage == "pretrain" and "final_step" in extra:
        rows = [("steps", extra.get("final_step")), ("tokens seen", extra.get("tokens_seen")), ("parameters", extra.get("parameters")),
                ("final train loss", extra.get("final_train_loss")), ("final validation loss", extra.get("final_val_loss")),
                ("skipped updates", extra.get("skipped_updates")), ("cloze accuracy", extra.get("cloze_accuracy")),
                ("checkpoint", extra.get("checkpoint"))]
    else:
        return None
    return [{"measure": name, "value": value} for name, value in rows if value is not None][:MAX_ROWS]


def made_line(manifest: StageManifest) -> str | None:
    """`made_rows` in one log line: `vocabulary=4096 eos id=0 ...`."""
    rows = made_rows(manifest)
    return None if rows is None else ", ".join(f"{row['measure']} {row['value']}" for row in rows[:8])


def publish_stage_artifacts(run: Path, stage: str, manifest: StageManifest, task_run_id: Any = None) -> None:
    """Counts table (or, for a stage that makes files, what it made), removal samples and a link to the audit files of one
    stage, attached to the stage's own task run (`task_run_id`): the task's Artifacts tab shows them, not only the flow's."""
    from prefect.artifacts import LinkArtifact, TableArtifact

    made = made_rows(manifest)
    if made is not None:
        TableArtifact(table=made, key=artifact_key("hymo", stage, "made"), description=f"{stage}: what it made",
                      task_run_id=task_run_id).create()
    else:
        TableArtifact(table=stage_counts_rows(manifest), key=artifact_key("hymo", stage, "counts"),
                      description=f"{stage}: in / kept / removed and modified per rule", task_run_id=task_run_id).create()
    if manifest.files("audit"):
        samples = removal_samples(run, stage, manifest)
        if samples:
            TableArtifact(table=samples, key=artifact_key("hymo", stage, "removed-samples"),
                          description=f"{stage}: up to {SAMPLES_PER_RULE} removed documents per rule", task_run_id=task_run_id).create()
        audit_dir = manifest.directory / "audit"
        rows = sum(f.rows or 0 for f in manifest.files("audit"))
        # The link text is relative to the run directory; the target a file URL on the machine that ran the stage.
        LinkArtifact(link=audit_dir.resolve().as_uri(), link_text=f"{manifest.directory.name}/audit/", key=artifact_key("hymo", stage, "audit"),
                     description=f"{stage} audit log: {len(manifest.files('audit'))} Parquet files, {rows} rows, one per removed or "
                                 f"modified document. Ask about one document: `hymo audit why RUN DOC_ID`", task_run_id=task_run_id).create()


class BackgroundPublisher:
    """Publishes artifacts on one thread, in order, while the flow goes on with the next stage.

    A stage's artifacts cost API round trips and a read of its audit log and
    upstream text; none of that needs to hold up the next stage. The thread
    runs in a copy of the caller's context, so artifacts still belong to the
    flow run. `drain()` waits for everything and raises the first failure.
    """

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hymo-artifacts")
        self.pending: list[Future] = []

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        self.pending.append(self.pool.submit(contextvars.copy_context().run, fn, *args))

    def drain(self) -> None:
        pending, self.pending = self.pending, []
        for future in pending:
            future.result()

    def __enter__(self) -> "BackgroundPublisher":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if exc[0] is None:
                self.drain()
        finally:
            self.pool.shutdown(wait=True, cancel_futures=exc[0] is not None)


def funnel_png(run: Path, path: Path) -> Path | None:
    """Documents entering each stage, removals stacked by rule."""
    rows = [r for r in funnel(run) if r["documents"]]
    if not rows:
        return None
    import matplotlib
    from matplotlib.figure import Figure  # no pyplot: its global state is not safe beside a training plot in another thread

    stages = [r["stage"] for r in rows]
    fig = Figure(figsize=(max(6, len(stages) * 1.1), 4.5), dpi=100)
    ax = fig.subplots()
    ax.bar(stages, [r["kept"] for r in rows], color="#4c72b0", label="kept")
    bottoms = [r["kept"] for r in rows]
    # Most removals first, ties by name: a set's order changes with each process's string hashing, and so did the picture.
    rules = sorted({rule for r in rows for rule in r["removed"]}, key=lambda rule: (-sum(r["removed"].get(rule, 0) for r in rows), rule))
    top_rules, other = rules[:9], rules[9:]
    palette = matplotlib.colormaps["tab10"]
    for i, rule in enumerate(top_rules + (["other rules"] if other else [])):
        heights = [sum(r["removed"].get(x, 0) for x in other) if rule == "other rules" else r["removed"].get(rule, 0) for r in rows]
        ax.bar(stages, heights, bottom=bottoms, color=palette(i % 10), label=rule)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_ylabel("documents")
    ax.set_title("HyMo funnel: documents per stage, removals by rule")
    ax.legend(fontsize=7, loc="upper right")
    for label in ax.get_xticklabels():
        label.set_rotation(30)
        label.set_horizontalalignment("right")
    fig.tight_layout()
    picture = io.BytesIO()
    fig.savefig(picture, format="png")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, picture.getvalue())
    return path


def embedded_png(path: Path, alt: str) -> str:
    return f"![{alt}](data:image/png;base64,{base64.b64encode(path.read_bytes()).decode()})"


FUNNEL_PICTURE = "funnel.png"


def file_link(run: Path, path: Path) -> str:
    """A markdown link: text relative to the run directory, target a file URL."""
    return f"[{Path(path).resolve().relative_to(Path(run).resolve()).as_posix()}]({Path(path).resolve().as_uri()})"


FUNNEL_KEY = ".funnel.key"  # beside RUN/funnel.png: the funnel rows it was drawn from


def draw_funnel(run: Path) -> Path | None:
    """RUN/funnel.png, drawn once for the run's funnel: a flow whose stages were all "Cached" keeps the picture
    (and does not import matplotlib); a changed row, or another drawing code, draws it again."""
    from manifests.digest import canonical_json, sha256_bytes

    path, key_file = Path(run) / FUNNEL_PICTURE, Path(run) / FUNNEL_KEY
    key = sha256_bytes(canonical_json({"rows": [r for r in funnel(run) if r["documents"]],
                                       "code": sha256_bytes(inspect.getsource(funnel_png).encode("utf-8"))}).encode("utf-8"))
    try:
        if path.exists() and key_file.read_text(encoding="utf-8") == key:
            return path
    except OSError:
        pass
    drawn = funnel_png(run, path)
    if drawn is not None:
        atomic_write_bytes(key_file, key.encode("utf-8"))  # after the picture: a crash between draws it again
    return drawn


def publish_run_summary(run: Path, extra_images: list[Path] | None = None, drawn: bool = False) -> Path | None:
    """Markdown summary of the whole run: funnel table, funnel picture, and e.g. the loss curve.

    `drawn`: the funnel picture was already drawn (`draw_funnel`) once the last document stage ended.
    """
    from prefect.artifacts import create_markdown_artifact

    rows = funnel(run)
    table = ["| stage | in | kept | removed | top removal rules |", "|---|---|---|---|---|"]
    for r in (r for r in rows if r["documents"]):
        top = ", ".join(f"{k} {v}" for k, v in sorted(r["removed"].items(), key=lambda kv: -kv[1])[:4]) or "-"
        table.append(f"| {r['stage']} | {r['in']} | {r['kept']} | {sum(r['removed'].values())} | {top} |")
    png = Path(run) / FUNNEL_PICTURE if drawn else draw_funnel(run)
    png = png if png is not None and png.exists() else None
    parts = [f"## HyMo run `{Path(run).resolve()}`", "\n".join(table)]
    if png:
        parts.append(embedded_png(png, "funnel") + "\n\n" + file_link(run, png))
    for image in extra_images or []:
        if image.exists():
            parts.append(embedded_png(image, image.stem) + "\n\n" + file_link(run, image))
    create_markdown_artifact("\n\n".join(parts), key="hymo-run-summary", description="funnel of the run")
    return png


def publish_data_report(run: Path, after: frozenset[str] = frozenset()) -> Path | None:
    """The run's data report page (`hymo report RUN`), rewritten when a flow ends with what the run holds changed
    (flows.data_report_page.refresh_data_report; `after`: the stages the flow builds it beside, which cannot change it)
    and linked from its artifacts; None for a run with no document stage."""
    from prefect.artifacts import LinkArtifact

    from flows.data_report import is_data_run
    from flows.data_report_page import refresh_data_report

    if not is_data_run(Path(run)):
        return None
    page, _ = refresh_data_report(run, after)
    LinkArtifact(link=page.resolve().as_uri(), link_text=f"{Path(run).name}/{page.name}", key="hymo-data-report",
                 description="the data report: funnel, each rule's distribution with its threshold and a what-if, near-duplicate "
                             "clusters, search by id or URL (one offline HTML page; `hymo report RUN` rewrites it)").create()
    return page
