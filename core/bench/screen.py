"""Benchmark: the ablation lab's click as the user sees it, in a real browser on this machine.

`python -m core bench screen` serves the app (`streamlit run app.py`, as `make app` does), opens the
ablation lab in Debian's Chromium (Playwright; never downloads a browser) on a zoo model with the
heads typed in, and clicks "Run ablation" `--clicks` times, each with a new control seed (a fresh
study, as a user's next click). In the page, a MutationObserver notes when the candidate's preview
("Running: ...") and the verdict appear, against the click's own timestamp; the browser, the server
and the study all share this machine's cores, as they do for a user running HeadLab locally. It
reports each click's times, their medians, and whether every click met issue 16's targets (candidate
within 1 s, verdict within 3 s). `--url` times the clicks in an app already running (`make app`'s, whose
caches are warm) instead of serving one. `bench live` times the study alone, in one process.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from core.errors import HeadLabError
from core.model.refs import ModelRef, resolve_checkpoint

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
TARGET_CANDIDATE_S, TARGET_VERDICT_S = 1.0, 3.0
RUNNING = '[data-testid="stStatusWidgetRunningIcon"], [data-testid="stStatusWidgetRunningManIcon"]'
# installed before each click: notes (performance.now()) when the candidate's preview and the verdict first show
WATCH = """() => { window.__seen = {};
  window.__watch = new MutationObserver(() => {
    const now = performance.now();
    if (!window.__seen.candidate && [...document.querySelectorAll('p')].some(p => p.textContent.startsWith('Running:')))
      window.__seen.candidate = now;
    if (!window.__seen.verdict && [...document.querySelectorAll('h2, h3')].some(h => h.textContent.trim().startsWith('Verdict'))
        && document.querySelector('[data-testid="stAlertContainer"]'))
      window.__seen.verdict = now;
  });
  window.__watch.observe(document.body, {childList: true, subtree: true, characterData: true}); }"""
CLICK = """() => { const button = [...document.querySelectorAll('button')].find(b => b.innerText.trim() === 'Run ablation');
  const t = performance.now(); button.click(); return t; }"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_app(port: int, log) -> subprocess.Popen:
    """`streamlit run app.py` on 127.0.0.1:port (the project's .streamlit/config.toml, this process's
    environment), returned once it answers; its output goes to `log` (a binary file). The browser tests
    serve the app this way too."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true", "--server.port", str(port),
         "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
        cwd=REPO, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    return proc
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise HeadLabError(f"the app did not start (streamlit's output is in {log.name}); run `make app` to see why.")
        time.sleep(0.5)


def stop_app(proc: subprocess.Popen) -> None:
    """Stop a served app: terminate, and kill it if it has not exited 15 s later."""
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _settle(tab) -> None:
    """Until the script has finished twice in a row 1.5 s apart (a rerun may follow the first: URL sync)."""
    for _ in range(2):
        tab.wait_for_function(f"() => !document.querySelector('{RUNNING}')", polling=200)
        tab.wait_for_timeout(1500)


def app_url(url: str) -> str:
    """`url` without a trailing slash, once an app answers there; a HeadLabError saying what to do otherwise."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise HeadLabError(f"--url {url!r} is not an http:// address; give the app's, e.g. http://127.0.0.1:8501")
    base = url.rstrip("/")
    try:
        with urllib.request.urlopen(f"{base}/_stcore/health", timeout=10) as response:
            if response.status == 200:
                return base
    except (OSError, ValueError):  # refused, timed out, not HTTP
        pass
    raise HeadLabError(f"no HeadLab app answers at {base}: start it with `make app`, or leave --url out to let the "
                       "bench serve its own.")


@contextmanager
def _served(url: str | None):
    """The app's base URL for the with-block: `url` (a running app's, checked), or one served here (stopped after)."""
    if url is not None:
        yield url
        return
    port = free_port()
    with tempfile.NamedTemporaryFile("wb", prefix="headlab-bench-screen-", suffix=".log", delete=False) as log:
        proc = serve_app(port, log)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            stop_app(proc)


def bench_screen(model: str = "induction-neox", revision: str | None = None, heads: str = "L1H1,L1H3,L1H6",
                 clicks: int = 8, n_examples: int = 256, seq_len: int = 64, dtype: str = "float32",
                 url: str | None = None) -> dict:
    """Click-to-screen times [s] of the candidate's preview and of the verdict over `clicks` fresh studies, in an
    app served here, or in the one running at `url` (which must serve the same HEADLAB_HOME)."""
    if int(clicks) < 1:
        raise HeadLabError(f"--clicks must be at least 1, not {clicks}.")
    ref = ModelRef.parse(model)
    checkpoint = resolve_checkpoint(ref, revision)  # a clear error for an unknown model before the browser starts
    url = app_url(url) if url is not None else None
    try:
        from playwright.sync_api import sync_playwright  # optional: only this bench and the browser tests use it
    except ImportError:
        raise HeadLabError("bench screen drives a browser with Playwright, which is not installed here: "
                           "`pip install -r requirements.txt`.") from None
    if not CHROMIUM.exists():
        raise HeadLabError(f"bench screen drives Debian's chromium at {CHROMIUM}, which is missing: `make browser` "
                           "installs it (a browser is never downloaded).")
    query = (f"model={ref.name}&revision={checkpoint.revision}&n={int(n_examples)}&seq_len={int(seq_len)}&heads={heads}"
             f"&dtype={dtype}")
    rows: list[dict[str, float]] = []
    with _served(url) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"])
        tab = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
        tab.set_default_timeout(600_000)  # a cold first page screens the model's checkpoints
        tab.goto(f"{base}/ablation?{query}")
        tab.get_by_role("heading", name="Ablation lab").first.wait_for()
        _settle(tab)
        panel = tab.get_by_text("Probe size: about").first.inner_text()  # what the lab proposes for this model here
        for i in range(int(clicks)):
            seed = tab.locator('input[aria-label="Control seed"]')
            seed.fill(str(1000 + i))
            seed.press("Enter")
            _settle(tab)
            tab.evaluate(WATCH)
            clicked = tab.evaluate(CLICK)
            tab.wait_for_function("() => window.__seen.verdict", polling=100)
            seen = tab.evaluate("() => { window.__watch.disconnect(); return window.__seen; }")
            rows.append({"candidate_s": (seen.get("candidate", seen["verdict"]) - clicked) / 1000,
                         "verdict_s": (seen["verdict"] - clicked) / 1000})
            print(f"click {i + 1}/{clicks}: candidate {rows[-1]['candidate_s']:.2f}s, "
                  f"verdict {rows[-1]['verdict_s']:.2f}s", flush=True)
            _settle(tab)
        browser.close()
    candidate = [r["candidate_s"] for r in rows]
    verdict = [r["verdict_s"] for r in rows]
    return {
        "candidate_s": candidate, "verdict_s": verdict,
        "median_s": {"candidate": statistics.median(candidate), "verdict": statistics.median(verdict)},
        "targets_s": {"candidate": TARGET_CANDIDATE_S, "verdict": TARGET_VERDICT_S},
        "all_within_targets": max(candidate) <= TARGET_CANDIDATE_S and max(verdict) <= TARGET_VERDICT_S,
        "model": ref.name, "revision": checkpoint.revision, "heads": heads, "clicks": int(clicks),
        "n_examples": int(n_examples), "seq_len": int(seq_len), "dtype": dtype, "cpus": os.cpu_count(),
        "probe_size_panel": panel.strip(),
        "app": "running at the given URL" if url is not None else "served by the bench",
    }
