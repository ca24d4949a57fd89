"""`hymo report RUN` on a data run, as a person uses it: the page opened from disk in Debian's Chromium (offline),
its funnel read against `audit summary --json`, a rule's histogram against the documents that reached the rule,
a threshold moved and its prediction checked by a real rerun, and a document found by URL."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest
from conftest import write_sources

from flows.cli import main
from flows.config import PipelineConfig
from flows.pipeline import hymo_pipeline
from manifests.run_dir import find_stage
from tasks.filters.quality_config import QualityConfig
from tasks.runner.stage_runner import read_stage_audit, read_stage_docs

QUALITY = {"min_words": 20, "c4_min_sentences": 1, "min_stop_words": 1}


@pytest.fixture(scope="module")
def data_run(tmp_path_factory: pytest.TempPathFactory, prefect_harness) -> Path:
    """The two small real-text sources through dedup_fuzzy: every part of the page has something to show."""
    root = tmp_path_factory.mktemp("data-report")
    config = PipelineConfig(sources=[str(s) for s in write_sources(root / "sources")], workers=1, quality=QUALITY,
                            langid={"langs": ["*"], "min_score": 0.3})
    hymo_pipeline(config=config, out=str(root / "run"), until="dedup_fuzzy")
    return root / "run"


@pytest.fixture(scope="module")
def page(data_run: Path) -> Path:
    (data_run / "report.html").unlink()  # the flow wrote one (test_the_flow_run_links_the_page_from_its_artifacts): the CLI writes it again
    assert main(["report", str(data_run)]) == 0
    path = data_run / "report.html"
    text = path.read_text(encoding="utf-8")
    assert "http://" not in text.split('id="data"')[0] and "https://" not in text.split('id="data"')[0]  # no CDN, no server: offline
    assert "<script src" not in text and "<link" not in text
    return path


def test_the_flow_run_links_the_page_from_its_artifacts(data_run: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    page = data_run / "report.html"
    with get_client(sync_client=True) as client:
        links = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["hymo-data-report"])))
    assert any(f"({page.resolve().as_uri()})" in link.data for link in links)
    assert 'id="data"' in page.read_text(encoding="utf-8")


def opened(browser, page: Path):
    from selenium.webdriver.common.by import By

    browser.get(page.as_uri())
    assert browser.find_element(By.CSS_SELECTOR, "body[data-ready='1']")
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] if hasattr(browser, "get_log") else []
    assert not errors, errors
    return By


def summary_json(run: Path, capsys) -> list[dict]:
    capsys.readouterr()
    assert main(["audit", "summary", str(run), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_funnel_shows_audit_summarys_numbers(data_run: Path, page: Path, browser, capsys) -> None:
    by = opened(browser, page)
    shown = {g.get_attribute("data-stage"): (int(g.get_attribute("data-in")), int(g.get_attribute("data-kept")), int(g.get_attribute("data-removed")))
             for g in browser.find_elements(by.CSS_SELECTOR, "#funnel g.funnel-stage")}
    expected = {r["stage"]: (r["in"], r["kept"], sum(r["removed"].values())) for r in summary_json(data_run, capsys) if r["documents"]}
    assert shown == expected and set(shown) >= {"ingest", "langid", "quality", "dedup_fuzzy"}
    assert shown["quality"][2] > 0


def test_a_rules_histogram_counts_the_documents_that_reached_it(data_run: Path, page: Path, browser) -> None:
    by = opened(browser, page)
    section = browser.find_element(by.CSS_SELECTOR, "section.rule[data-rule='gopher_too_few_words']")
    histogram = section.find_element(by.CSS_SELECTOR, "svg.histogram")
    bars = sum(int(bar.get_attribute("data-count")) for bar in histogram.find_elements(by.CSS_SELECTOR, "rect.bar"))
    # Counted without the stats: every document entering quality meets this rule first, unless it is empty or its
    # language gets the character rules (spaceless).
    entering = read_stage_docs(find_stage(data_run, "langid")[0].path, ["lang"]).column("lang").to_pylist()
    removed = find_stage(data_run, "quality")[1].counts["removed"]
    reached = len(entering) - sum(lang in QualityConfig().spaceless_langs for lang in entering) - removed.get("quality_empty_text", 0)
    assert int(histogram.get_attribute("data-total")) == bars == reached > removed["gopher_too_few_words"] > 0
    assert section.find_elements(by.CSS_SELECTOR, ".fired") and section.find_elements(by.CSS_SELECTOR, ".passed")  # both sides shown
    langid = browser.find_element(by.CSS_SELECTOR, "section.rule[data-rule='langid_low_score'] svg.histogram")
    counts = find_stage(data_run, "langid")[1].counts
    assert int(langid.get_attribute("data-total")) == counts["in"] - counts["removed"].get("langid_empty_text", 0)


def test_the_search_finds_a_document_by_url_with_audit_whys_answer(data_run: Path, page: Path, browser, capsys) -> None:
    removed = read_stage_audit(find_stage(data_run, "quality")[0].path)
    doc_id = removed.filter(pc.equal(removed.column("rule"), "gopher_too_few_words")).column("id")[0].as_py()
    url = next(d["url"] for d in read_stage_docs(find_stage(data_run, "ingest")[0].path, ["id", "url"]).to_pylist() if d["id"] == doc_id)
    capsys.readouterr()
    assert main(["audit", "why", str(data_run), url, "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    by = opened(browser, page)
    browser.find_element(by.ID, "search").send_keys(url)
    browser.find_element(by.ID, "search-go").click()
    shown = json.loads(browser.find_element(by.ID, "why-json").text)
    assert {k: v for k, v in shown.items() if k != "stale"} == {k: v for k, v in expected.items() if k != "stale"}
    assert shown["stale"] == expected.get("stale", []) == [] and shown["final"] == "removed at quality (gopher_too_few_words)"


def test_moving_a_threshold_predicts_what_the_rerun_removes(data_run: Path, page: Path, browser) -> None:
    """Last in this file: the rerun changes the run the other tests read."""
    by = opened(browser, page)
    control = browser.find_element(by.CSS_SELECTOR, "section.rule[data-rule='gopher_too_few_words'] .control[data-key='quality.min_words']")
    before = int(control.find_element(by.CSS_SELECTOR, ".predicted").get_attribute("data-count"))
    assert before == find_stage(data_run, "quality")[1].counts["removed"]["gopher_too_few_words"]
    typed = control.find_element(by.CSS_SELECTOR, "input.whatif-value")
    typed.clear()
    typed.send_keys("45")
    predicted = int(control.find_element(by.CSS_SELECTOR, ".predicted").get_attribute("data-count"))
    command = control.find_element(by.CSS_SELECTOR, ".command").text
    assert predicted > before
    assert command == f"hymo rerun {data_run} --stage quality --set quality.min_words=45 --until shards"

    # The rerun the page printed, run as printed (`hymo` dropped): the count compared is quality's.
    assert main(command.split()[1:]) == 0
    assert json.loads((data_run / "config.json").read_text(encoding="utf-8"))["config"]["quality"]["min_words"] == 45
    assert find_stage(data_run, "quality")[1].counts["removed"]["gopher_too_few_words"] == predicted
