"""`hymo trace`: from a training token back to its document and that document's audit trail.

Also the corpus table `hymo manifest show` prints when the run has a corpus manifest.
"""
from __future__ import annotations

import argparse
import json
import sys
from bisect import bisect_right
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from rich.table import Table

from manifests.audit_query import decisions_for
from manifests.corpus import CorpusManifestError, locate_corpus_manifest, read_corpus_manifest
from manifests.run_dir import find_stage


def document_record(run: Path, doc_id: str) -> dict[str, Any]:
    """The document as the split stage published it (the text that was tokenised)."""
    _, manifest = find_stage(run, "split")
    for data_file in manifest.files("data"):
        table = pq.read_table(manifest.path_of(data_file), columns=["id", "source", "url", "text"], filters=[("id", "=", doc_id)])
        if table.num_rows:
            return table.to_pylist()[0]
    raise KeyError(f"{run}: document {doc_id!r} is in the shards but not in the split stage")


def trace(run: Path, shard: int, offset: int, split: str, window: int) -> dict[str, Any]:
    from tasks.corpus.shards import trace_token

    found = trace_token(run, shard, offset, split, window)
    document = document_record(run, found["doc_id"])
    found.update({"source": document["source"], "url": document["url"], "document_chars": len(document["text"])})
    found["audit"] = decisions_for(run, found["doc_id"])
    return found


class TraceRefused(ValueError):
    """The trace cannot answer truthfully: a training directory without its corpus, a changed corpus, a step never trained."""


def training_directory(path: Path) -> dict[str, Any] | None:
    """summary.json of a `hymo train --out` directory (which records its corpus), else None (a pipeline run)."""
    summary = path / "summary.json"
    if not path.is_dir() or not summary.is_file() or (path / "config.json").is_file():
        return None
    return json.loads(summary.read_text(encoding="utf-8"))


def corpus_run_of(path: Path, summary: dict[str, Any]) -> Path:
    """The run directory holding the corpus a training directory recorded, after checking it is still that corpus
    (digest) with that tokenizer."""
    recorded = summary.get("corpus")
    if not recorded:
        raise TraceRefused(f"{path / 'summary.json'}: written before summaries recorded the corpus; trace the run directory the "
                           "corpus came from, with --config (as given to `hymo train`)")
    manifest_path = Path(recorded["path"])
    if not manifest_path.is_file():
        raise TraceRefused(f"{path / 'summary.json'}: the corpus it trained on, {manifest_path}, is not there any more")
    corpus = read_corpus_manifest(manifest_path)
    if corpus["digest"] != recorded["digest"]:
        raise TraceRefused(f"{manifest_path}: digest {corpus['digest'][:12]}…, but {path} trained on {recorded['digest'][:12]}…")
    now = (corpus.get("tokenizer") or {}).get("sha256")
    if recorded.get("tokenizer_sha256") and now != recorded["tokenizer_sha256"]:
        raise TraceRefused(f"{path}: trained with tokenizer sha256 {recorded['tokenizer_sha256']}, but {manifest_path} has {now}")
    return manifest_path.parent.parent  # RUN/NN_shards/corpus.json -> RUN


def last_trained_step(run: Path, summary: dict[str, Any] | None) -> tuple[int, str] | None:
    """The last update the training run made, and where that is recorded: a training directory's summary or the
    run's pretrain stage; None while training has not finished (nothing says how far it will go)."""
    if summary is not None:
        return summary["final_step"], "summary.json"
    try:
        stage_dir, _ = find_stage(run, "pretrain")
        return json.loads((stage_dir.path / "summary.json").read_text(encoding="utf-8"))["final_step"], str(stage_dir.path / "summary.json")
    except (KeyError, FileNotFoundError):
        return None


def training_recipe(run: Path, config: str | None, overrides: list[str]) -> tuple[dict[str, Any], str]:
    """The recipe that read the data, and where it came from: --config (with --set); else the run's pretrain stage
    (summary.json); else the pretrain section of the run's config.json (a run still training)."""
    from hymo_core.train.recipe import load_run_config

    if config or overrides:
        return load_run_config(config, overrides)[0].to_dict(), config or "--set"
    try:
        stage_dir, _ = find_stage(run, "pretrain")
        return json.loads((stage_dir.path / "summary.json").read_text(encoding="utf-8"))["train_config"], str(stage_dir.path / "summary.json")
    except (KeyError, FileNotFoundError):
        pass
    saved = run / "config.json"
    if saved.is_file():
        return json.loads(saved.read_text(encoding="utf-8"))["config"]["pretrain"]["train"], f"{saved} [pretrain.train]"
    raise KeyError(f"{run}: no pretrain stage and no config.json; pass the training recipe with --config (as given to `hymo train`)")


def step_documents(run: Path, step: int, recipe: dict[str, Any]) -> dict[str, Any]:
    """The documents update `step` read: each with its tokens in that update, its windows, source and URL."""
    from hymo_core.train.window_order import update_windows

    manifest_path = locate_corpus_manifest(run)
    corpus = read_corpus_manifest(manifest_path)
    shards = corpus["shards"]["train"]
    seq_len, windows_per_update = recipe["seq_len"], recipe["batch_size"] * recipe.get("gradient_accumulation_steps", 1)
    epoch, windows = update_windows([entry["tokens"] for entry in shards], seq_len, recipe.get("seed", 0), windows_per_update, step)
    tokens: dict[str, int] = {}
    seen_in: dict[str, set[int]] = {}
    indexes: dict[int, Any] = {}
    for number, (shard, start) in enumerate(windows.tolist()):
        if shard not in indexes:
            indexes[shard] = pq.read_table(manifest_path.parent / shards[shard]["index_path"], columns=["doc_id", "offset", "length"]).to_pydict()
        index = indexes[shard]
        end = start + seq_len + 1  # a window reads T + 1 tokens
        first = max(0, bisect_right(index["offset"], start) - 1)
        for row in range(first, len(index["offset"])):
            lo, hi = index["offset"][row], index["offset"][row] + index["length"][row]
            if lo >= end:
                break
            overlap = min(hi, end) - max(lo, start)
            if overlap > 0:
                doc = index["doc_id"][row]
                tokens[doc] = tokens.get(doc, 0) + overlap
                seen_in.setdefault(doc, set()).add(number)
    records = documents_by_id(run, set(tokens))
    documents = [{"doc_id": doc, "tokens": n, "windows": len(seen_in[doc]), "source": records.get(doc, {}).get("source"),
                  "url": records.get(doc, {}).get("url")} for doc, n in sorted(tokens.items(), key=lambda kv: (-kv[1], kv[0]))]
    return {"step": step, "epoch": epoch, "seq_len": seq_len, "windows": [[int(s), int(o)] for s, o in windows.tolist()],
            "documents": documents}


def documents_by_id(run: Path, ids: set[str]) -> dict[str, dict[str, Any]]:
    """Source and URL of these documents, from the split stage (one filtered read per data file)."""
    try:
        _, manifest = find_stage(run, "split")
    except (KeyError, FileNotFoundError):
        return {}
    found: dict[str, dict[str, Any]] = {}
    for data_file in manifest.files("data"):
        table = pq.read_table(manifest.path_of(data_file), columns=["id", "source", "url"], filters=[("id", "in", sorted(ids))])
        found.update({row["id"]: row for row in table.to_pylist()})
    return found


def print_step(found: dict[str, Any], recipe_from: str) -> None:
    from flows.console import console

    console.print(f"[bold]update {found['step']}[/bold] (epoch {found['epoch']}): {len(found['windows'])} windows of "
                  f"{found['seq_len'] + 1} tokens, {len(found['documents'])} documents (recipe: {recipe_from})")
    table = Table(show_edge=False)
    for column in ("tokens", "windows", "document", "source", "url"):
        table.add_column(column, justify="right" if column in ("tokens", "windows") else "left",
                         no_wrap=column == "document", overflow="fold")
    for doc in found["documents"]:
        table.add_row(str(doc["tokens"]), str(doc["windows"]), doc["doc_id"], str(doc["source"]), str(doc["url"]))
    console.print(table)
    console.print("`hymo audit why RUN DOC_ID` shows every stage's decision about one of them", markup=False)


def cmd_trace(args: argparse.Namespace) -> int:
    from flows.console import console

    given = Path(args.run)
    try:
        trained = training_directory(given)
        run = corpus_run_of(given, trained) if trained is not None else given
    except TraceRefused as exc:
        print(f"hymo trace: {exc}", file=sys.stderr)
        return 2
    if args.step is not None:
        if args.shard is not None or args.offset is not None:
            raise SystemExit("hymo trace: --step, or --shard with --offset, not both")
        if trained is not None and not (args.config or args.set):
            recipe, recipe_from = trained["train_config"], str(given / "summary.json")
        else:
            recipe, recipe_from = training_recipe(run, args.config, args.set)
        last = None if args.config or args.set else last_trained_step(run, trained)  # another recipe: another run's steps
        if last is not None and args.step > last[0]:
            print(f"hymo trace: update {args.step} is past the run's last update, {last[0]} ({last[1]}): training never read "
                  "that batch", file=sys.stderr)
            return 2
        found = step_documents(run, args.step, recipe)
        if args.json:
            print(json.dumps(found, indent=2, ensure_ascii=False))
        else:
            print_step(found, recipe_from)
        return 0
    if args.shard is None or args.offset is None:
        raise SystemExit("hymo trace: give --shard and --offset (one token), or --step N (one update's batch)")
    try:
        found = trace(run, args.shard, args.offset, args.split, args.window)
    except (KeyError, IndexError, CorpusManifestError) as exc:
        console.print(f"[red]{exc}[/red]")
        return 1
    if args.json:
        print(json.dumps(found, indent=2, ensure_ascii=False))
        return 0
    where = "EOS closing the document" if found["is_eos"] else f"token {found['position_in_document']} of the document"
    console.print(f"[bold]{found['split']} shard {found['shard']} offset {found['offset']}[/bold]: id {found['token_id']} {found['token']!r} — {where}", markup=True)
    console.print(f"  document  {found['doc_id']}  (source {found['source']}, repeat {found['repeat']})", markup=False)
    console.print(f"  url       {found['url']}", markup=False)
    console.print(f"  window    {found['window_before']!r} [[ {found['window_token']!r} ]] {found['window_after']!r}", markup=False)
    audit = found["audit"]
    console.print(f"  audit     {audit['final']}", markup=False)
    for step in audit["stages"]:
        console.print(f"    {step['stage']:<12} {step['decision']}", markup=False)
        for entry in step["entries"]:
            console.print(f"      {entry['action']}: {entry['rule']} {json.dumps(entry['detail'], ensure_ascii=False)[:200]}", markup=False)
    return 0


def print_corpus_table(run: Path) -> None:
    """The per-source corpus table, when the run has reached the shards stage."""
    from flows.console import console

    try:
        path = locate_corpus_manifest(run)
        corpus = read_corpus_manifest(path)
    except CorpusManifestError:
        return
    console.print(f"[bold]corpus[/bold] {path}  digest {corpus['digest'][:12]}  {corpus['dtype']}  vocab {corpus['tokenizer']['vocab_size']}")
    longest = max((len(r["source"]) for r in corpus["sources"]), default=6)
    provenance = Table(title="sources (removed: documents removed by the filters before the split)")
    for column in ("source", "license", "snapshot", "removed", "docs", "val"):
        provenance.add_column(column, overflow="ellipsis", no_wrap=True, min_width=longest if column == "source" else None,
                              max_width={"license": 16, "snapshot": 14}.get(column))
    mixture = Table(title=f"mixture (max {corpus['mixture']['max_epochs']:g} epochs; chars/token and tokens/word on the tokenizer sample)")
    for column in ("source", "unique", "weight", "epochs", "tokens", "short", "c/tok", "tok/w"):
        mixture.add_column(column, justify="left" if column == "source" else "right", no_wrap=True, min_width=longest if column == "source" else None)
    for row in corpus["sources"]:
        removed = sum(c["removed"] for c in row["filters"].values())
        provenance.add_row(row["source"], str(row.get("license")), str(row.get("snapshot")), str(removed), str(row["train_documents"]),
                           str(row["validation_documents"]))
        mixture.add_row(row["source"], str(row["train_unique_tokens"]), f"{row['weight']:.3f}", f"{row['epochs']:.2f}",
                        str(row["tokens_contributed"]), str(row["shortfall_tokens"]),
                        "" if row["chars_per_token"] is None else f"{row['chars_per_token']:.2f}",
                        "" if row["tokens_per_word"] is None else f"{row['tokens_per_word']:.2f}")
    console.print(provenance)
    console.print(mixture)
    shards = corpus["shards"]
    console.print(f"train: {len(shards['train'])} shards, {sum(s['tokens'] for s in shards['train'])} tokens; "
                  f"validation: {len(shards['validation'])} shards, {corpus['validation']['tokens']} tokens, {corpus['validation']['documents']} documents")


def add_commands(sub: Any) -> None:
    parser = sub.add_parser("trace", help="which document (and audit trail) a token of a shard comes from; --step N: the documents "
                                          "of training update N's batch")
    parser.add_argument("run", help="run directory (with a shards stage), or a `hymo train --out` directory (its summary.json names "
                                    "the corpus and the recipe)")
    parser.add_argument("--shard", type=int, help="shard number in the corpus manifest's list (with --offset)")
    parser.add_argument("--offset", type=int, help="token offset inside that shard")
    parser.add_argument("--step", type=int, help="list the documents training update N read (N as metrics.jsonl and alerts count)")
    parser.add_argument("--config", help="with --step: the training recipe TOML (default: the run's pretrain stage, else its config.json)")
    parser.add_argument("--set", action="append", default=[], metavar="TABLE.KEY=VALUE",
                        help="with --step: a recipe override given to `hymo train --set` (repeatable)")
    parser.add_argument("--split", default="train", choices=("train", "validation"), help="which shards (default: train)")
    parser.add_argument("--window", type=int, default=16, help="tokens decoded on each side")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(func=cmd_trace)
