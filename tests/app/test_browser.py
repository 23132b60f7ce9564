"""End to end in a real browser: Playwright driving Debian's chromium against `streamlit run app.py`.

Visits every page on the quick zoo and saves a screenshot of each into test-output/screenshots/;
in the ablation lab it box-selects heads on the grid with the mouse, runs the ablation, waits for
the verdict and screenshots it. Clicks on the lab's grid add and remove heads, degenerate controls give an
"inconclusive" banner, a running ablation can be cancelled, and an idle page costs the server nothing. The
analysis pages' runs are in test_browser_flows.py, which uses this module's server, browser and helpers.
Never downloads a browser: skips when /usr/bin/chromium is missing.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest

from core.bench.screen import CHROMIUM, free_port, serve_app, stop_app
from core.model.loading import load_config
from core.model.refs import ModelRef

pytestmark = [pytest.mark.browser, pytest.mark.zoo]

REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "test-output" / "screenshots"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
MODEL = "induction-neox"
QUERY = f"model={MODEL}&n=32&seq_len=64"
PAGES = [("", "Models & training", "zoo"), ("spectral", "Spectral signal", "spectral"),
         ("screen", "Pattern screen", "screen"), ("ablation", "Ablation lab", "ablation"),
         ("inspector", "Head inspector", "inspector")]
LONG_MS = 600_000  # a cold first page screens every checkpoint on two shared CPUs
RUNNING = '[data-testid="stStatusWidgetRunningIcon"], [data-testid="stStatusWidgetRunningManIcon"]'


class ServerURL(str):
    """The app's base URL, and the process id of the `streamlit run` serving it."""

    pid: int

    def __new__(cls, url: str, pid: int) -> "ServerURL":
        made = super().__new__(cls, url)
        made.pid = pid
        return made


@contextmanager
def served_app(log_name: str):
    """The app served by `streamlit run` with the project's .streamlit/config.toml against the test HEADLAB_HOME,
    as `make app` serves it, for the with-block: its base URL (a ServerURL); the server's output goes to
    test-output/LOG_NAME. Skips without Debian's chromium or Playwright."""
    if not CHROMIUM.exists():
        pytest.skip("the browser test drives Debian's chromium at /usr/bin/chromium, which is not installed "
                    "(`make test` installs it as root; it is never downloaded)")
    pytest.importorskip("playwright.sync_api", reason="pip playwright is not installed in this environment")
    port = free_port()
    SHOTS.mkdir(parents=True, exist_ok=True)
    with open(SHOTS.parent / log_name, "wb") as log:
        proc = serve_app(port, log)
        try:
            yield ServerURL(f"http://127.0.0.1:{port}", proc.pid)
        finally:
            stop_app(proc)


@contextmanager
def launched_chromium():
    """Debian's chromium driven by Playwright, for the with-block (call after `served_app`, which skips without it)."""
    from playwright.sync_api import sync_playwright  # optional: served_app skips when it is missing

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@contextmanager
def opened_tab(chromium):
    """A new tab at 1440 x 1000 (device scale 1, so screenshots match), waiting up to LONG_MS, for the with-block."""
    context = chromium.new_context(viewport={"width": 1440, "height": 1000}, device_scale_factor=1)
    tab = context.new_page()
    tab.set_default_timeout(LONG_MS)
    try:
        yield tab
    finally:
        context.close()


@pytest.fixture(scope="module")
def server(quick_zoo):
    with served_app("streamlit-server.log") as url:
        yield url


@pytest.fixture(scope="module")
def browser(server):
    with launched_chromium() as chromium:
        yield chromium


@pytest.fixture()
def page(browser):
    with opened_tab(browser) as tab:
        yield tab


def wait_until_idle(tab, title: str) -> None:
    """The page's title is drawn, the script has finished, and plotly has drawn the charts."""
    tab.get_by_role("heading", name=title).first.wait_for()
    tab.wait_for_function(f"() => !document.querySelector('{RUNNING}')", timeout=LONG_MS, polling=500)
    tab.wait_for_timeout(1500)  # a rerun may start right after the first one (URL sync); let it settle
    tab.wait_for_function(f"() => !document.querySelector('{RUNNING}')", timeout=LONG_MS, polling=500)
    tab.wait_for_timeout(1000)


def screenshot(tab, name: str) -> Path:
    """A screenshot of the whole page (the app scrolls inside its main area, so grow the viewport to fit)."""
    height = tab.evaluate("() => { const m = document.querySelector('[data-testid=\"stMain\"]');"
                          " return Math.max(document.body.scrollHeight, m ? m.scrollHeight : 0); }")
    tab.set_viewport_size({"width": 1440, "height": int(min(max(height, 1000), 6000))})
    tab.mouse.move(1, 1)  # no chart toolbar or tooltip left over from the last click
    tab.evaluate("() => { const m = document.querySelector('[data-testid=\"stMain\"]'); if (m) m.scrollTo(0, 0); }")
    tab.wait_for_timeout(800)
    path = SHOTS / f"{name}.png"
    tab.screenshot(path=str(path), full_page=True)
    tab.set_viewport_size({"width": 1440, "height": 1000})
    return path


def assert_no_exception(tab) -> None:
    assert tab.locator('[data-testid="stException"]').count() == 0, tab.locator('[data-testid="stException"]').first.inner_text()


@pytest.mark.parametrize("path,title,name", PAGES, ids=[p[2] for p in PAGES])
def test_every_page_in_the_browser(server, page, path, title, name):
    page.goto(f"{server}/{path}?{QUERY}")
    wait_until_idle(page, title)
    assert_no_exception(page)
    page.locator(".js-plotly-plot").first.wait_for(state="attached")  # a busy machine may draw after the script is idle
    shot = screenshot(page, f"{name}")
    assert shot.stat().st_size > 10_000


def test_an_idle_page_costs_the_server_no_cpu(server, page):
    """With a page open and nothing happening, the server sleeps: no file-watcher loop (it once burnt
    40% of a core reconciling an overflowed inotify queue over .venv), no polling."""
    import psutil

    page.goto(f"{server}/?{QUERY}")
    wait_until_idle(page, "Models & training")
    process = psutil.Process(server.pid)
    before = sum(process.cpu_times()[:2])
    page.wait_for_timeout(10_000)
    used = sum(process.cpu_times()[:2]) - before
    assert used < 0.5, f"the idle app used {used:.2f} s of CPU in 10 s (more than 5% of a core)"


def test_ablation_lab_box_select_run_and_verdict(server, page):
    config = load_config(ModelRef.parse(MODEL))
    n_layers, n_heads = int(config.num_hidden_layers), int(config.num_attention_heads)
    layer, first, last = min(1, n_layers - 1), 0, min(3, n_heads // 2 - 1)  # at most half a layer: matched controls exist
    page.goto(f"{server}/ablation?{QUERY}")
    wait_until_idle(page, "Ablation lab")
    grid = page.locator(".st-key-ablation_grid .js-plotly-plot").first
    if grid.count() == 0:
        grid = page.locator(".js-plotly-plot").first
    grid.scroll_into_view_if_needed()
    box = grid.locator(".nsewdrag").first.bounding_box()
    page.mouse.move(box["x"] + 5, box["y"] + 5)  # the chart's toolbar shows on hover
    grid.locator('.modebar-btn[data-title="Box Select"]').first.click()
    cell_w, cell_h = box["width"] / n_heads, box["height"] / n_layers
    x0 = box["x"] + (first + 0.1) * cell_w
    x1 = box["x"] + (last + 0.9) * cell_w
    y0 = box["y"] + (layer + 0.1) * cell_h  # layer 0 is the top row
    y1 = box["y"] + (layer + 0.9) * cell_h
    page.mouse.move(x0, y0)
    page.mouse.down()
    page.mouse.move(x1, y1, steps=15)
    page.mouse.up()
    expected = ",".join(f"L{layer}H{h}" for h in range(first, last + 1))
    heads_box = page.locator('input[aria-label="Heads to ablate"]')
    page.wait_for_function(
        "([sel, want]) => { const el = document.querySelector(sel); return el && el.value === want; }",
        arg=['input[aria-label="Heads to ablate"]', expected], timeout=120_000, polling=500)
    assert heads_box.input_value() == expected
    wait_until_idle(page, "Ablation lab")
    screenshot(page, "ablation-selected")
    page.get_by_role("button", name="Run ablation").click()
    page.get_by_role("heading", name="Verdict").wait_for(timeout=LONG_MS)
    wait_until_idle(page, "Ablation lab")
    assert_no_exception(page)
    verdict_text = page.locator('[data-testid="stAlertContainer"]').all_inner_texts()
    assert any("rule" in text for text in verdict_text)
    screenshot(page, "ablation-verdict")
    # the same session's inspector lists the examples this run hurt most
    page.get_by_role("button", name="Open it in the head inspector").click()
    wait_until_idle(page, "Head inspector")
    assert_no_exception(page)
    screenshot(page, "inspector-after-ablation")


def test_export_menu_downloads_a_paper_png(server, page):
    """The download buttons render the paper figure on click (kaleido + chromium inside the app's server)."""
    page.goto(f"{server}/screen?{QUERY}")
    wait_until_idle(page, "Pattern screen")
    page.locator('[data-testid="stPopover"]').first.locator("button").first.click()
    with page.expect_download(timeout=180_000) as info:
        page.get_by_role("button", name="PNG", exact=True).first.click()
    data = Path(info.value.path()).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width = int.from_bytes(data[16:20], "big")
    assert width >= 2000, (info.value.suggested_filename, width)  # print resolution, not a screen grab
    assert info.value.suggested_filename.endswith(".png")


def test_clicking_a_head_on_a_grid_opens_the_inspector(server, page):
    """Heatmaps carry invisible square click targets: a click names the head and links to the inspector."""
    config = load_config(ModelRef.parse(MODEL))
    n_layers, n_heads = int(config.num_hidden_layers), int(config.num_attention_heads)
    layer, head = min(1, n_layers - 1), 0
    page.goto(f"{server}/screen?{QUERY}")
    wait_until_idle(page, "Pattern screen")
    heat = page.locator(".st-key-screen_heatmap .js-plotly-plot").first
    heat.scroll_into_view_if_needed()
    box = heat.locator(".nsewdrag").first.bounding_box()
    page.mouse.click(box["x"] + (head + 0.5) * box["width"] / n_heads, box["y"] + (layer + 0.5) * box["height"] / n_layers)
    link = page.get_by_role("link", name=f"Inspect L{layer}H{head} in the head inspector")
    link.wait_for(timeout=120_000)
    link.click()
    wait_until_idle(page, "Head inspector")
    assert_no_exception(page)
    assert page.get_by_role("heading", name=f"L{layer}H{head}").count() >= 1


def test_a_running_ablation_can_be_cancelled(server, page):
    """The Cancel button stops a long run (300 matched draws); nothing is stored and the page keeps working."""
    page.goto(f"{server}/ablation?{QUERY}")
    wait_until_idle(page, "Ablation lab")
    heads = page.locator('input[aria-label="Heads to ablate"]')
    heads.fill("L0H0,L1H0,L2H0")
    heads.press("Enter")
    wait_until_idle(page, "Ablation lab")
    draws = page.locator('input[aria-label="Random draws N"]')
    draws.fill("300")
    draws.press("Enter")
    wait_until_idle(page, "Ablation lab")
    page.get_by_role("button", name="Run ablation").click()
    cancel = page.get_by_role("button", name="Cancel run")
    cancel.wait_for(timeout=120_000)
    page.locator('[data-testid="stProgress"]').first.wait_for(timeout=120_000)
    page.wait_for_timeout(2000)
    cancel.click()
    page.get_by_text("The ablation run was cancelled").first.wait_for(timeout=120_000)
    wait_until_idle(page, "Ablation lab")
    assert_no_exception(page)
    assert page.get_by_role("heading", name="Verdict").count() == 0


def assert_no_error(tab) -> None:
    """The app's own navigation, and neither an exception nor an st.error on the page."""
    nav = tab.locator('[data-testid="stSidebarNav"]').inner_text()
    assert "Ablation lab" in nav, ("the sidebar lists files, not the app's pages: Streamlit served pages/ as a legacy "
                                   f"multipage app (a deep link as the first request after start?): {nav!r}")
    assert_no_exception(tab)
    shown = tab.locator('[data-testid="stAlertContentError"]')
    assert shown.count() == 0, shown.first.inner_text()


def test_ablation_lab_clicks_add_heads_and_degenerate_controls_are_inconclusive(server, page):
    """Clicks on the grid add and remove heads one at a time (a non-adjacent set with no lasso); on
    induction-olmoe (2 x 4 heads) half of the heads leave one any-layer control set, and the verdict banner
    says "inconclusive" and why instead of passing on a z of 1e8."""
    config = load_config(ModelRef.parse("induction-olmoe"))
    n_layers, n_heads = int(config.num_hidden_layers), int(config.num_attention_heads)
    assert (n_layers, n_heads) == (2, 4)  # the heads below are half of the model
    title = "Ablation lab"
    page.goto(f"{server}/ablation?model=induction-olmoe&n=32&seq_len=64")
    wait_until_idle(page, title)
    heads_box = page.locator('input[aria-label="Heads to ablate"]')

    def click_head(layer: int, head: int, want: str) -> None:
        grid = page.locator(".st-key-ablation_grid .js-plotly-plot").first  # a fresh chart after every pick
        grid.scroll_into_view_if_needed()
        box = grid.locator(".nsewdrag").first.bounding_box()
        page.mouse.click(box["x"] + (head + 0.5) * box["width"] / n_heads, box["y"] + (layer + 0.5) * box["height"] / n_layers)
        page.wait_for_function("([sel, want]) => document.querySelector(sel)?.value === want",
                               arg=['input[aria-label="Heads to ablate"]', want], timeout=120_000, polling=300)
        wait_until_idle(page, title)

    click_head(0, 0, "L0H0")
    click_head(1, 1, "L0H0,L1H1")  # adds: no shift needed
    click_head(1, 1, "L0H0")  # a second click removes it
    click_head(1, 1, "L0H0,L1H1")
    click_head(0, 1, "L0H0,L0H1,L1H1")
    click_head(1, 0, "L0H0,L0H1,L1H0,L1H1")
    assert heads_box.input_value() == "L0H0,L0H1,L1H0,L1H1"
    page.locator(".st-key-control_kind").get_by_text("any-layer").click()
    wait_until_idle(page, title)
    assert page.get_by_text("Only 1 distinct any-layer control set exists").count() >= 1
    screenshot(page, "ablation-clicked-heads")
    page.get_by_role("button", name="Run ablation").click()
    page.get_by_role("heading", name="Verdict").wait_for(timeout=LONG_MS)
    wait_until_idle(page, title)
    assert_no_error(page)
    alerts = " ".join(page.locator('[data-testid="stAlertContainer"]').all_inner_texts())
    assert "Closure verdict, paper rule [CVC]: inconclusive" in alerts
    assert "only 1 distinct control set was measured" in alerts
    assert "]: pass" not in alerts  # no closure rule passes on one control
    screenshot(page, "ablation-degenerate-verdict")
    page.get_by_role("button", name="Clear selection").click()
    page.wait_for_function("(sel) => document.querySelector(sel)?.value === ''",
                           arg='input[aria-label="Heads to ablate"]', timeout=120_000, polling=300)
