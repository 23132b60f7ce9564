"""The app on a real pretrained model (SmolLM2-135M: 30 layers x 9 heads, one checkpoint), in a real browser.

Walks every page on SmolLM2 with a small probe (8 examples of 16 tokens): each opens with no error box
and no exception, and each is screenshotted into test-output/screenshots/real-*.png. In the ablation
lab it reads the proposed probe size and its cost in power, then runs a 3-control ablation of two heads
to a verdict. Needs the imported model: a HEADLAB_HOME whose zoo holds smollm2-135m, named by
HEADLAB_TEST_REAL_HOME, or imported once by the suite's `real_smollm2` fixture from the wheel `make test` fetched;
skips cleanly without either.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.workspace import zoo_dir
from tests.app.test_browser import (assert_no_exception, launched_chromium, opened_tab, screenshot, served_app,
                                    wait_until_idle)

pytestmark = [pytest.mark.browser]

MODEL = "smollm2-135m"
QUERY = f"model={MODEL}&n=8&seq_len=16"
PAGES = [("", "Models & training"), ("spectral", "Spectral signal"), ("screen", "Pattern screen"),
         ("ablation", "Ablation lab"), ("inspector", "Head inspector"), ("coactivation", "Co-activation"),
         ("proposers", "Proposers vs disposer"), ("attribution", "Gradient vs causal"), ("patching", "Patching"),
         ("graph", "Circuit graph"), ("dynamics", "Training dynamics"), ("benchmark", "Known-circuit benchmark")]
ERROR_BOX = '[data-testid="stAlertContentError"]'


@pytest.fixture(scope="module")
def real_zoo(request) -> Path:
    """The imported SmolLM2 in this session's zoo (read only: never written).

    HEADLAB_TEST_REAL_HOME names a HEADLAB_HOME whose zoo already holds it (linked, no import); otherwise the
    suite's shared fixture imports it once from the wheel `make test` fetched, and skips without that wheel.
    """
    home = os.environ.get("HEADLAB_TEST_REAL_HOME")
    source = Path(home) / "zoo" / MODEL if home else None
    if source is None or not (source / "manifest.json").is_file():
        request.getfixturevalue("real_smollm2")
        return zoo_dir() / MODEL
    target = zoo_dir() / MODEL
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        target.symlink_to(source.resolve(), target_is_directory=True)
    return target


@pytest.fixture(scope="module")
def server(real_zoo):
    with served_app("streamlit-server-real.log") as url:
        yield url


@pytest.fixture(scope="module")
def tab(server):
    with launched_chromium() as chromium, opened_tab(chromium) as page:
        yield page


def test_every_page_opens_on_smollm2_without_an_error(server, tab):
    for path, title in PAGES:
        tab.goto(f"{server}/{path}?{QUERY}")
        wait_until_idle(tab, title)
        assert_no_exception(tab)
        errors = tab.locator(ERROR_BOX).all_inner_texts()
        assert errors == [], (title, errors)
        screenshot(tab, f"real-{path or 'zoo'}")


def test_the_lab_proposes_a_probe_size_and_runs_a_verdict_on_smollm2(server, tab):
    tab.goto(f"{server}/ablation?{QUERY}")
    wait_until_idle(tab, "Ablation lab")
    panel = tab.get_by_text("Probe size: about").first
    panel.wait_for()
    assert "per study at N = 8" in panel.inner_text()
    heads = tab.locator('input[aria-label="Heads to ablate"]')
    heads.fill("L17H3,L17H4")
    heads.press("Enter")
    wait_until_idle(tab, "Ablation lab")
    draws = tab.locator('input[aria-label="Random draws N"]')
    draws.fill("3")
    draws.press("Enter")
    wait_until_idle(tab, "Ablation lab")
    power = tab.get_by_text("cannot go below 1/(controls + 1) = 0.25", exact=False).first  # 1 / (3 controls + 1)
    if not power.is_visible():  # the panel opens by itself only when a study is slow
        tab.get_by_text("Probe size: about").first.click()
    power.wait_for()
    tab.get_by_role("button", name="Run ablation").click()
    tab.get_by_role("heading", name="Verdict").wait_for()
    wait_until_idle(tab, "Ablation lab")
    assert_no_exception(tab)
    assert tab.locator(ERROR_BOX).all_inner_texts() == []
    screenshot(tab, "real-ablation-verdict")
