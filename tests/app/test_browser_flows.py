"""End to end in a real browser, the analysis pages' runs: each runs to a result on the quick zoo (a co-activation
community's closure test, proposers vs disposer), and both hand heads to the ablation lab; the patching page patches
an uploaded probe file and sends a clicked head there, then runs activation, path and group patching one after
another; `bench screen` times a click from its own browser. The gradient-vs-causal and training-dynamics runs are
checked through AppTest only (test_app_attribution.py, test_app_dynamics.py: the same page scripts and buttons);
in a browser those pages are opened by test_browser_real.py's walk. A module of its own beside test_browser.py (its
server, browser and helpers), so that the two halves run on two workers at once.
"""

from __future__ import annotations

import json
import re
import threading

import pytest

from core.__main__ import main
from core.model.loading import load_config
from core.model.refs import ModelRef
from tests.app.test_browser import (LONG_MS, MODEL, QUERY, REPO, assert_no_error, browser, page, screenshot,  # noqa: F401
                                    server, wait_until_idle)

pytestmark = [pytest.mark.browser, pytest.mark.zoo]

HEAD_LIST = r"^L\d+H\d+(, ?L\d+H\d+)*$"


def assert_one_chart(tab, key: str) -> None:
    """The keyed element holds one drawn plotly chart. Plotly draws in the browser after the script is idle,
    so a busy machine may show the chart a little later: wait for it before counting."""
    chart = tab.locator(f".st-key-{key} .js-plotly-plot")
    chart.first.wait_for(state="attached", timeout=60_000)
    assert chart.count() == 1, key


def click_button(tab, key: str, title: str) -> None:
    """Click the button with widget key `key` once the page is idle."""
    wait_until_idle(tab, title)
    tab.locator(f".st-key-{key} button").first.click()


def set_number(tab, label: str, value: int, title: str) -> None:
    box = tab.locator(f'input[aria-label="{label}"]')
    box.fill(str(value))
    box.press("Enter")
    wait_until_idle(tab, title)


def test_coactivation_closure_test_and_hand_off_to_the_lab(server, page):
    """Co-activation at N = 64 (the Ising fit needs at least as many examples as the 36 heads): the candidate
    community's closure test shows its verdicts, and "Send to the ablation lab" types the community into the lab."""
    title = "Co-activation"
    page.goto(f"{server}/coactivation?model={MODEL}&n=64&seq_len=64")
    wait_until_idle(page, title)
    assert_no_error(page)
    for key in ("coact_graph", "coact_heatmap", "coact_ari"):
        assert_one_chart(page, key)
    chosen = page.locator('input[aria-label="Community (or click a node on the graph)"]').input_value()
    assert "(candidate)" in chosen, chosen  # "community 3 (candidate): L0H1, L1H4"
    community = chosen.split("(candidate):", 1)[1].strip()
    assert re.match(HEAD_LIST, community), community
    click_button(page, "coact_run_closure", title)
    page.get_by_text("Closure test of").first.wait_for(timeout=LONG_MS)
    wait_until_idle(page, title)
    assert_no_error(page)
    verdicts = " ".join(page.locator('[data-testid="stAlertContainer"]').all_inner_texts())
    assert "paper rule:" in verdicts and "reference rule:" in verdicts, verdicts
    assert_one_chart(page, "coact_closure_z")
    screenshot(page, "coactivation")
    click_button(page, "coact_send", title)
    wait_until_idle(page, "Ablation lab")
    assert_no_error(page)
    typed = page.locator('input[aria-label="Heads to ablate"]').input_value()
    assert typed.replace(" ", "") == community.replace(" ", "")


def test_proposers_vs_disposer_runs_and_hands_a_proposal_to_the_lab(server, page):
    """All four proposers judged by one closure test (5 controls each); a proposal goes to the ablation lab."""
    title = "Proposers vs disposer"
    page.goto(f"{server}/proposers?{QUERY}")
    wait_until_idle(page, title)
    assert_no_error(page)
    set_number(page, "Random controls per proposal", 5, title)
    click_button(page, "pvd_run", title)
    page.locator(".st-key-pvd_fig .js-plotly-plot").first.wait_for(timeout=LONG_MS)
    wait_until_idle(page, title)
    assert_no_error(page)
    alerts = " ".join(page.locator('[data-testid="stAlertContainer"]').all_inner_texts())
    assert "Survive closure" in alerts or "No proposal survives closure" in alerts, alerts
    screenshot(page, "proposers")
    click_button(page, "pvd_send_pattern-screen", title)
    wait_until_idle(page, "Ablation lab")
    assert_no_error(page)
    assert re.match(HEAD_LIST, page.locator('input[aria-label="Heads to ablate"]').input_value())


def test_patching_an_uploaded_probe_file_and_clicking_a_head_into_the_lab(server, page):
    """The example probe file uploaded, patched, one head clicked on the heatmap and sent to the ablation lab,
    which ablates it on the file's prompts."""
    title = "Patching"
    config = load_config(ModelRef.parse(MODEL))
    n_layers, n_heads = int(config.num_hidden_layers), int(config.num_attention_heads)
    layer, head = min(1, n_layers - 1), 0
    page.goto(f"{server}/patching?{QUERY}")
    wait_until_idle(page, title)
    page.get_by_text("upload a probe file").first.click()
    wait_until_idle(page, title)
    page.locator('[data-testid="stFileUploader"] input[type="file"]').set_input_files(
        str(REPO / "assets" / "probes" / "ioi_example.jsonl"))
    wait_until_idle(page, title)
    # the example's names barely separate on this model: its gap is refused unless kept, flagged
    page.get_by_text("Keep a small or reversed gap (flagged)").first.click()
    wait_until_idle(page, title)
    click_button(page, "patch_run", title)
    heat = page.locator(".st-key-patch_heads .js-plotly-plot").first
    heat.wait_for(timeout=LONG_MS)
    wait_until_idle(page, title)
    assert_no_error(page)
    labels = " ".join(page.locator('[data-testid="stMetricLabel"]').all_inner_texts())
    assert "identity check" in labels and "Spearman" in labels, labels
    heat.scroll_into_view_if_needed()
    box = heat.locator(".nsewdrag").first.bounding_box()
    page.mouse.click(box["x"] + (head + 0.5) * box["width"] / n_heads, box["y"] + (layer + 0.5) * box["height"] / n_layers)
    chosen = page.locator(".st-key-patch_to_ablation")  # the send button, redrawn once the click is read
    page.wait_for_function(
        "(want) => [...document.querySelectorAll('[data-testid=\"stMultiSelect\"] span')].some(s => s.innerText === want)"
        " && ![...document.querySelectorAll('[data-testid=\"stMultiSelect\"] span')].some(s => /^L\\d+H\\d+$/.test(s.innerText) && s.innerText !== want)",
        arg=f"L{layer}H{head}", timeout=120_000, polling=500)
    screenshot(page, "patching")
    chosen.locator("button").first.click()
    wait_until_idle(page, "Ablation lab")
    assert_no_error(page)
    assert page.locator('input[aria-label="Heads to ablate"]').input_value() == f"L{layer}H{head}"
    click_button(page, "run_ablation", "Ablation lab")  # on the file's prompts: the hand-off chose them
    page.get_by_text("on the 8 prompts of ioi_example.jsonl").first.wait_for(timeout=LONG_MS)
    assert_no_error(page)


def test_activation_path_and_group_patching_one_after_another(server, page):
    """Activation patching, then a path, then a group on the built-in counterfactual, on one page: each run draws
    its figures with no exception (the group's control strip once shared its key with the group's text box)."""
    title = "Patching"
    page.goto(f"{server}/patching?{QUERY}")
    wait_until_idle(page, title)
    click_button(page, "patch_run", title)
    page.locator(".st-key-patch_heads .js-plotly-plot").first.wait_for(timeout=LONG_MS)
    wait_until_idle(page, title)
    assert_no_error(page)
    page.get_by_text("Group against random controls, and path patching").first.click()
    for label, value in (("Path senders", "L0H1"), ("Path receivers", "L1H0")):
        box = page.locator(f'input[aria-label="{label}"]')
        box.fill(value)
        box.press("Enter")
        wait_until_idle(page, title)
    click_button(page, "patch_run", title)
    page.locator(".st-key-patch_strip_path .js-plotly-plot").first.wait_for(timeout=LONG_MS)
    wait_until_idle(page, title)
    assert_no_error(page)
    set_number(page, "Random controls", 5, title)
    group = page.locator('input[aria-label="Group of heads"]')
    group.fill("L1H0,L1H1")
    group.press("Enter")
    click_button(page, "patch_run", title)
    page.locator(".st-key-patch_strip_group .js-plotly-plot").first.wait_for(timeout=LONG_MS)
    wait_until_idle(page, title)
    assert_no_error(page)
    for key in ("patch_heads", "patch_strip_path", "patch_strip_group"):
        assert_one_chart(page, key)
    screenshot(page, "patching-group-and-path")


def test_bench_screen_times_a_click_from_its_own_browser(server, tmp_path, capsys):
    """`python -m core bench screen --url` (core.__main__.main, in a thread of this process: Playwright's sync API
    runs one instance per thread, and this module's own runs in the main thread) drives its own browser in this
    module's app and times one click on the quick zoo; the candidate's preview shows before the verdict. (Without
    --url the bench serves the app with `serve_app`, as this module's `server` does.)"""
    out = tmp_path / "screen.json"
    argv = ["bench", "screen", "--model", MODEL, "--heads", "L1H0,L1H2", "--clicks", "1", "--n-examples", "32",
            "--url", server, "--json", str(out)]
    status: list[int] = []
    bench = threading.Thread(target=lambda: status.append(main(argv)))
    bench.start()
    bench.join(timeout=900)
    printed = capsys.readouterr()
    assert status == [0], printed.err[-2000:]
    result = json.loads(out.read_text())
    assert len(result["candidate_s"]) == len(result["verdict_s"]) == 1  # one click: the loop is the same for more
    assert all(0 < c <= v for c, v in zip(result["candidate_s"], result["verdict_s"]))
    assert result["median_s"]["verdict"] == result["verdict_s"][0]
    assert result["all_within_targets"] == (max(result["candidate_s"]) <= 1.0 and max(result["verdict_s"]) <= 3.0)
    assert result["app"] == "running at the given URL"
    assert "every click within the targets" in printed.out  # its bad inputs: tests/test_bad_inputs.py
