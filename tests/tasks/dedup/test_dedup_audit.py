"""`hymo audit why` on a document removed as a near-duplicate names the kept document and the Jaccard."""
from __future__ import annotations

import random

from flows.cli import main
from manifests.audit_query import decisions_for
from tasks.dedup.exact import DedupExactConfig, run_dedup_exact
from tasks.dedup.fuzzy import DedupFuzzyConfig, run_dedup_fuzzy


def test_audit_why_names_kept_document_and_jaccard(tmp_path, upstream, capsys):
    rng = random.Random(5)
    words = [f"w{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}{chr(97 + i // 676)}" for i in range(2000)]
    original = " ".join(rng.choice(words) for _ in range(300))
    copy = " ".join("river" if rng.random() < 0.01 else w for w in original.split())
    run = tmp_path / "run"
    run.mkdir()
    ingest = upstream({"a-original": original, "b-copy": copy, "c-exact": original.upper(), "d-other": " ".join(rng.choice(words) for _ in range(300))})
    ingest.rename(run / "01_ingest")
    run_dedup_exact(DedupExactConfig(), run / "01_ingest", run / "02_dedup_exact", workers=1)
    run_dedup_fuzzy(DedupFuzzyConfig(), run / "02_dedup_exact", run / "03_dedup_fuzzy", workers=1)
    answer = decisions_for(run, "b-copy")
    assert answer["final"] == "removed at dedup_fuzzy (near_duplicate)"
    entry = answer["stages"][-1]["entries"][0]
    assert entry["detail"]["kept_id"] == "a-original" and entry["detail"]["matched_id"] == "a-original"
    assert entry["value"] == entry["detail"]["jaccard"] >= 0.8 and entry["threshold"] == 0.8
    assert decisions_for(run, "c-exact")["stages"][-1]["entries"][0]["detail"] == {"kept_id": "a-original"}
    assert main(["audit", "why", str(run), "b-copy"]) == 0
    printed = capsys.readouterr().out
    assert "near_duplicate" in printed and "a-original" in printed and "jaccard" in printed
