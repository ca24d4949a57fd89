"""The web profile: FineWeb's published chain, the default for a source without a profile, on a held-out labelled web set."""
from __future__ import annotations

import json

from bench.web_rules import heldout_records, outcome
from manifests.sources import SourceSpec
from manifests.schema import docs_table
from tasks.filters import quality as q
from tasks.filters.quality import QualityConfig
from tasks.runner.stage_runner import StageWriter, read_stage_audit, run_stage

CONFIGS = q.profile_configs(QualityConfig())


def test_web_is_the_default_profile_of_documents_and_sources():
    assert QualityConfig().default_profile == "web"
    assert SourceSpec("s", "jsonl", "x.jsonl", "o", "snap", "CC0").profile == "web"


def test_web_profile_is_fineweb_at_published_numbers():
    web = CONFIGS["web"]
    assert not web.skip_rules and web.report_rules == ("fineweb_too_many_newlines_per_word",)  # not in the FineWeb paper
    assert (web.min_terminal_punct_line_fraction, web.max_short_line_fraction, web.short_line_max_chars) == (0.12, 0.67, 30)
    assert web.max_fineweb_duplicate_line_char_fraction == 0.1  # FineWeb paper §3.6
    assert not web.c4_drop_unpunctuated_lines and (web.c4_min_words_per_line, web.c4_min_sentences) == (5, 3)
    assert (web.min_words, web.min_stop_words, web.max_duplicate_line_fraction) == (50, 2, 0.3)  # Gopher Table A1


def test_a_document_without_a_profile_gets_web_rules(tmp_path):
    """A product listing: prose lets FineWeb's line-shape rules only report; web removes it."""
    listing = "\n".join(f"Premium Coffee Maker {i} - Black\n$49.99\n★★★★☆ ({i * 7})\nAdd to cart" for i in range(20))
    prose_line = "The river basin was restored over ten years by the committee and the people who live there."
    rows = [{"id": "listing", "text": listing + "\n" + prose_line, "source": "crawl", "lang": "en", "meta": {}}]
    writer = StageWriter("langid", "test", {}, "key", [], tmp_path / "in")
    writer.write_shard(0, docs_table(rows), [])
    writer.publish()
    run_stage(q.QUALITY, QualityConfig(), tmp_path / "in", tmp_path / "out", workers=1)
    [row] = read_stage_audit(tmp_path / "out").to_pylist()
    assert row["action"] == "removed" and json.loads(row["detail"])["profile"] == "web"


def test_held_out_web_set_figures_in_docs_quality():
    """docs/quality.md, "The web profile": counts on data no threshold was chosen on (bench/web_rules.py)."""
    records = heldout_records()
    web, prose = outcome(records, CONFIGS["web"]), outcome(records, CONFIGS["prose"])
    assert sum(web["clean"].values()) == 202 and sum(web["junk"].values()) == 320
    assert sum(web["junk_caught"].values()) == 320
    assert sum(web["clean_removed"].values()) == 31
    assert sum(prose["junk_caught"].values()) == 257 and prose["junk_caught"]["consent_wall"] == 0
