"""`hymo trace`: from a training token back to its document and that document's audit trail.

Also the corpus table `hymo manifest show` prints when the run has a corpus manifest.
"""
from __future__ import annotations

import argparse
import json
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


def cmd_trace(args: argparse.Namespace) -> int:
    from flows.console import console

    try:
        found = trace(Path(args.run), args.shard, args.offset, args.split, args.window)
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
    parser = sub.add_parser("trace", help="which document (and audit trail) a token of a shard comes from")
    parser.add_argument("run")
    parser.add_argument("--shard", type=int, required=True, help="shard number in the corpus manifest's list")
    parser.add_argument("--offset", type=int, required=True, help="token offset inside that shard")
    parser.add_argument("--split", default="train", choices=("train", "validation"))
    parser.add_argument("--window", type=int, default=16, help="tokens decoded on each side")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(func=cmd_trace)
