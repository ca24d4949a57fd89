"""A person at the Prefect UI: open the served deployment in a real browser, start a run with the
form's defaults, and watch it reach Completed."""
from __future__ import annotations

import shutil
import time

import pytest
from prefect_runs import wait_for_flow_run

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(20)
    yield driver
    driver.quit()


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


def test_quick_run_from_the_ui_reaches_completed(served, browser) -> None:
    from selenium.webdriver.common.by import By

    before = runs_of_full_deployment()
    browser.get(f"{served['ui_url']}/deployments")
    browser.find_element(By.LINK_TEXT, "full").click()
    assert "hymo-pipeline" in browser.find_element(By.TAG_NAME, "body").text
    click_when_ready(button("Run"), "'Run' button", browser)
    click_when_ready(last_with_text("Quick run"), "'Quick run' item", browser)

    deadline = time.monotonic() + 60
    while not (new := runs_of_full_deployment() - before):
        assert time.monotonic() < deadline, "the Quick run click created no flow run"
        time.sleep(1)
    (flow_run_id,) = new
    finished = wait_for_flow_run(flow_run_id)
    assert finished.state.is_completed(), served["log"].read_text(errors="replace")[-3000:]

    browser.get(f"{served['ui_url']}/runs/flow-run/{flow_run_id}")
    deadline = time.monotonic() + 60
    while "Completed" not in browser.find_element(By.TAG_NAME, "body").text:
        assert time.monotonic() < deadline, "the flow run page never showed Completed"
        time.sleep(1)
