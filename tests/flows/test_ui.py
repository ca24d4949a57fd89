"""A person at the Prefect UI: open the served deployment in a real browser, start a run with the
form's defaults, and watch it reach Completed; and the UI runs the pipeline the CLI runs: after
`hymo run` on the sample, `hymo-pipeline/full` with the form's defaults (through the API, and by a
click on Run in Chromium) finds every stage Cached and leaves the run directory as it was."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import hymo_serve
from prefect_runs import create_from_deployment, task_states, wait_for_flow_run

from flows.config import load_config
from flows.server import free_port
from flows.stages import pipeline_stages

def runs_of_full_deployment() -> set:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("hymo-pipeline/full")
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])))
    return {r.id for r in runs}


def click_when_ready(find, what: str, browser, timeout_s: float = 60) -> None:
    """The page renders in steps and re-renders under our feet: wait until `find(browser)` returns
    an element, and look it up again when the one found a moment ago went stale before the click."""
    from selenium.common.exceptions import StaleElementReferenceException

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            element = find(browser)
            if element is not None:
                element.click()
                return
        except StaleElementReferenceException:
            pass
        assert time.monotonic() < deadline, f"no {what} on {browser.current_url}"
        time.sleep(0.5)


def button(label: str):
    from selenium.webdriver.common.by import By

    return lambda browser: next((b for b in browser.find_elements(By.TAG_NAME, "button") if b.text.strip() == label), None)


def last_with_text(text: str):
    from selenium.webdriver.common.by import By

    return lambda browser: (browser.find_elements(By.XPATH, f"//*[normalize-space(.)='{text}']") or [None])[-1]


def quick_run_from_the_ui(ui_url: str, browser) -> list:
    """Deployments page, `full`, Run, Quick run, as a person clicks them, and again if no run appears (a click that a
    page busy re-rendering swallowed); returns the flow runs it made, finished."""
    from selenium.webdriver.common.by import By

    before = runs_of_full_deployment()
    browser.get(f"{ui_url}/deployments")
    browser.find_element(By.LINK_TEXT, "full").click()
    deadline = time.monotonic() + 60
    while "hymo-pipeline" not in browser.find_element(By.TAG_NAME, "body").text:  # the deployment's page, once it has rendered
        assert time.monotonic() < deadline, f"the deployment page never showed its flow on {browser.current_url}"
        time.sleep(0.5)
    for _ in range(3):
        click_when_ready(button("Run"), "'Run' button", browser)
        click_when_ready(last_with_text("Quick run"), "'Quick run' item", browser)
        deadline = time.monotonic() + 45
        while not (new := runs_of_full_deployment() - before) and time.monotonic() < deadline:
            time.sleep(1)
        if new:
            return [wait_for_flow_run(flow_run_id) for flow_run_id in new]
    raise AssertionError("three Quick run clicks created no flow run")


def test_quick_run_from_the_ui_reaches_completed(served, browser) -> None:
    from selenium.webdriver.common.by import By

    (finished, *_) = runs = quick_run_from_the_ui(served["ui_url"], browser)
    flow_run_id = finished.id
    assert all(r.state.is_completed() for r in runs), served["log"].read_text(errors="replace")[-3000:]

    browser.get(f"{served['ui_url']}/runs/flow-run/{flow_run_id}")
    deadline = time.monotonic() + 60
    while "Completed" not in browser.find_element(By.TAG_NAME, "body").text:
        assert time.monotonic() < deadline, "the flow run page never showed Completed"
        time.sleep(1)


# --- the UI runs the pipeline the CLI runs ---

SAMPLE_STAGES = [entry.name for entry in pipeline_stages(load_config())]


@pytest.fixture(scope="module")
def sample_served(tmp_path_factory):
    """`hymo serve`, then `hymo run`, both with no arguments, as the README has them: HYMO_HOME says where runs go,
    and each is started from a directory of its own, so nothing depends on where a command was typed. The server
    is the one `hymo serve` starts (at PREFECT_API_URL, where nothing answered): not the session's, whose
    `hymo serve` registers deployments of the same names."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    home = tmp_path_factory.mktemp("hymo-home")
    api_url = f"http://127.0.0.1:{free_port()}/api"
    env = {**os.environ, "HYMO_HOME": str(home), "PREFECT_API_URL": api_url}
    log_path = home / "serve.log"
    with temporary_settings(updates={PREFECT_API_URL: api_url}), \
            hymo_serve(["--home", str(home / "prefect")], tmp_path_factory.mktemp("serve-cwd"), env, log_path):
        run = subprocess.run([sys.executable, "-m", "flows", "run"], cwd=tmp_path_factory.mktemp("run-cwd"), env=env,
                             capture_output=True, text=True, timeout=3600)
        assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
        yield {"ui_url": api_url.removesuffix("/api"), "home": home, "run": home / "runs" / "sample", "log": log_path}


def snapshot(home: Path) -> dict:
    """What a run must leave as it found it: every path under HYMO_HOME/runs, and config.json's bytes and stat."""
    runs = home / "runs"
    record = runs / "sample" / "config.json"
    return {"paths": sorted(str(p.relative_to(runs)) for p in runs.rglob("*")), "config.json": record.read_bytes(),
            "config.json stat": (record.stat().st_ino, record.stat().st_mtime_ns)}


def differences(form, cli, where: str) -> list[str]:
    """Field by field: every leaf where the form's value is not `hymo run`'s."""
    if isinstance(form, dict) and isinstance(cli, dict):
        return [d for key in sorted(set(form) | set(cli)) for d in differences(form.get(key, "<missing>"), cli.get(key, "<missing>"), f"{where}.{key}")]
    return [] if form == cli else [f"{where}: form {form!r}, hymo run {cli!r}"]


def full_deployment():
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_deployment_by_name("hymo-pipeline/full")


def assert_every_stage_cached(flow_run, sample_served) -> None:
    assert flow_run.state.is_completed(), sample_served["log"].read_text(errors="replace")[-3000:]
    assert task_states(flow_run.id) == {stage: ["Cached"] for stage in SAMPLE_STAGES}  # and no shard batch ran


def test_the_forms_defaults_are_hymo_runs_config_field_by_field(sample_served) -> None:
    deployment = full_deployment()
    schema = deployment.parameter_openapi_schema["properties"]
    form = {**{name: field.get("default") for name, field in schema.items()}, **deployment.parameters}
    recorded = json.loads((sample_served["run"] / "config.json").read_text(encoding="utf-8"))
    assert differences(form["config"], recorded["config"], "config") == []
    assert differences(schema["config"]["default"], recorded["config"], "config") == []  # the flow's own default, too
    assert form["config"]["quality_model"]["enabled"] is True  # the sample config's, not the config classes' default
    assert form["out"] == str(sample_served["run"]) and Path(form["out"]).is_absolute()
    assert (form["runner"], form["until"], form["dask_address"], form["change_stages"]) == (recorded["runner"], None, None, False)


def test_the_defaults_through_the_api_find_every_stage_cached(sample_served) -> None:
    before = snapshot(sample_served["home"])
    assert_every_stage_cached(wait_for_flow_run(create_from_deployment().id), sample_served)
    assert snapshot(sample_served["home"]) == before


def test_run_clicked_in_chromium_finds_every_stage_cached(sample_served, browser) -> None:
    from selenium.webdriver.common.by import By

    before = snapshot(sample_served["home"])
    for flow_run in quick_run_from_the_ui(sample_served["ui_url"], browser):
        assert_every_stage_cached(flow_run, sample_served)
    assert snapshot(sample_served["home"]) == before

    browser.get(f"{sample_served['ui_url']}/deployments/deployment/{full_deployment().id}/run")  # the custom-run form
    deadline = time.monotonic() + 60
    while str(sample_served["run"]) not in [field.get_attribute("value") for field in browser.find_elements(By.CSS_SELECTOR, "input, textarea")]:  # Prefect 3.9's form: strings in textareas
        assert time.monotonic() < deadline, "the run form does not show the absolute run directory"
        time.sleep(1)


def test_toggling_quality_model_from_the_api_is_refused_and_changes_nothing(sample_served) -> None:
    before = snapshot(sample_served["home"])
    config = full_deployment().parameters["config"]
    config["quality_model"]["enabled"] = False
    finished = wait_for_flow_run(create_from_deployment({"config": config}).id)
    assert finished.state.is_failed()
    message = finished.state.message or ""
    assert "StageListChanged" in message and "change_stages" in message, message
    assert "holds the stages ingest, extract, langid, quality, quality_model, pii," in message
    assert "this run's are ingest, extract, langid, quality, pii," in message
    assert task_states(finished.id) == {}
    assert snapshot(sample_served["home"]) == before
