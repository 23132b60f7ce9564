"""Every page of the app on the quick zoo, through streamlit's AppTest (no browser).

Each page must render without an exception; a figure's data must be exactly what core returns for
the chosen checkpoint, pattern or PR definition; the ablation lab's run button must produce a
verdict; and errors a user can cause (a typo in a head list, a checkpoint that vanished from disk,
a local folder that is not a model, a probe too long for the model) must show st.error while the
page keeps working. Probes are small (N = 32) so the suite stays quick on two CPUs.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from streamlit.runtime.pages_manager import PagesManager
from streamlit.testing.v1 import AppTest

import core.zoo.presets
from core.ablation.spec import PROBE_MODES
from core.ablation.study import (PROBE_LENGTHS, STUDY_TARGET_SECONDS, ablate_alone, example_damage,
                                 worst_examples)
from core.heads import head_name
from core.model.loading import load_model
from core.model.refs import ModelRef, list_checkpoints
from core.pipelines.recipe import ScreenSettings, screen
from core.stats.controls import count_matched_sets
from core.stats.selectivity import classify
from core.tasks.specs import probe_spec
import pages._cache
from pages._state import WORKSPACE

pytestmark = pytest.mark.zoo

APP = str(Path(__file__).resolve().parents[2] / "app.py")
MODEL = "induction-neox"
N = 32
T = 64
PAGES = ("zoo", "spectral", "screen", "ablation", "inspector")
ANALYSIS_PAGES = PAGES[1:]
EXPORTS_PER_FIGURE = 5  # PNG, SVG, PDF, CSV, JSON


def make_app(model: str = MODEL, **params) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=900)
    at.query_params["model"] = model
    at.query_params["n"] = str(params.pop("n", N))
    at.query_params["seq_len"] = str(params.pop("seq_len", T))
    for key, value in params.items():
        at.query_params[key] = str(value)
    return at


def open_page(at: AppTest, page: str) -> AppTest:
    """Run the app (first time), then switch to `page` and run it."""
    at.run()
    at.switch_page(f"pages/{page}.py")
    at.run()
    return at


def chart(at: AppTest, key: str) -> dict:
    """The plotly figure (as JSON) of the chart drawn with widget key `key`."""
    for element in at.get("plotly_chart"):
        if element.proto.id.endswith(key):
            return json.loads(element.proto.spec)
    raise AssertionError(f"no chart {key!r}; charts: {[e.proto.id[-30:] for e in at.get('plotly_chart')]}")


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


@pytest.fixture(scope="module")
def report(quick_zoo):
    """What core returns for the app's default probe at N = 32."""
    return screen(ModelRef.parse(MODEL), probe_spec("induction", N, T), ScreenSettings(n_null_draws=200))


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_with_export_buttons(quick_zoo, report, page):
    at = open_page(make_app(), page)
    assert not at.exception, at.exception
    assert errors(at) == []
    charts = at.get("plotly_chart")
    assert len(charts) >= 1
    if page in ANALYSIS_PAGES:  # every figure offers PNG, SVG, PDF, CSV and JSON
        assert len(at.download_button) == EXPORTS_PER_FIGURE * len(charts)
        labels = {b.proto.label for b in at.download_button}
        assert {"PNG", "SVG", "PDF", "CSV (data)", "JSON (data + provenance)"} <= labels


def test_screen_heatmap_follows_checkpoint_and_pattern(report):
    at = open_page(make_app(), "screen")
    revisions = [c.revision for c in report.checkpoints]
    patterns = list(report.final.patterns)
    seen = []
    for index, pattern in ((len(revisions) // 2, "previous-token"), (len(revisions) - 1, "induction"),
                           (len(revisions) // 3, "self")):
        at.select_slider(key="_w_revision").set_value(revisions[index])
        next(r for r in at.radio if r.label == "Pattern").set_value(pattern)
        at.run()
        assert not at.exception and errors(at) == []
        heat = chart(at, "screen_heatmap")["data"][0]
        expected = report.selectivity_by_checkpoint[index, patterns.index(pattern)]  # [layer, head]
        np.testing.assert_array_equal(np.asarray(heat["customdata"], dtype=float), expected)
        assert revisions[index] in chart(at, "screen_heatmap")["layout"]["title"]["text"]
        seen.append(np.asarray(heat["customdata"], dtype=float))
        # the class map shows core's classes at that checkpoint
        classes = chart(at, "screen_classes")["data"][0]["customdata"]
        assert classes == classify(report.selectivity_by_checkpoint[index], patterns, report.final.threshold).tolist()
        assert at.query_params["revision"] == [revisions[index]] or at.query_params["revision"] == revisions[index]
    assert not np.array_equal(seen[0], seen[1])


def test_ablation_previous_token_preset_is_cores_circuit(report):
    at = open_page(make_app(), "ablation")
    at.button(key="preset_prev").click().run()
    assert not at.exception and errors(at) == []
    assert len(report.final.previous_token_circuit) > 0
    assert at.text_input(key="heads_text").value == str(report.final.previous_token_circuit)


def test_app_opens_on_the_induction_model_and_screens_the_duplicate_model(quick_zoo):
    at = AppTest.from_file(APP, default_timeout=900)
    at.query_params["n"] = str(N)
    at.run()
    assert at.session_state["model"] == MODEL  # not the alphabetically first zoo model
    assert [w.value for w in at.warning] == []  # a link without a revision is not "revision=None" (a bug once)
    at = open_page(make_app("duplicate-neox"), "screen")
    next(r for r in at.radio if r.label == "Pattern").set_value("duplicate-token")
    at.run()
    assert not at.exception and errors(at) == []
    classes = np.asarray(chart(at, "screen_classes")["data"][0]["customdata"])
    assert (classes == "duplicate-token").sum() >= 2


def test_spectral_page_switches_pr_definition(report):
    at = open_page(make_app(), "spectral")
    tokens = np.asarray(report.spectral.tokens)
    keep = tokens > 0
    for definition in ("entropy", "classic"):
        at.radio(key="_w_pr_definition").set_value(definition).run()
        assert not at.exception and errors(at) == []
        expected = screen(ModelRef.parse(MODEL), probe_spec("induction", N, T),
                          ScreenSettings(definition=definition, n_null_draws=0)).spectral
        fig = chart(at, "spectral_trajectories")
        assert definition in fig["layout"]["title"]["text"]
        assert any(definition in c.value for c in list(at.caption) + list(at.markdown))  # named in the caption
        n_heads = expected.pr.shape[2]
        for index, trace in enumerate(fig["data"]):
            layer, head = divmod(index, n_heads)
            np.testing.assert_array_equal(np.asarray(trace["y"]), expected.pr[keep, layer, head])
        ranking = chart(at, "spectral_ranking")["data"][0]
        assert ranking["x"][: expected.k] == [f"L{l}H{h}" for l, h in expected.top_heads]


def test_ablation_run_button_produces_a_verdict(report):
    at = open_page(make_app(), "ablation")
    mode = at.selectbox(key="ablation_mode")
    assert mode.options == list(PROBE_MODES) and mode.value == "zero"  # every probe ablation type; zero by default
    at.button(key="preset_circuit").click().run()
    typed = at.text_input(key="heads_text").value
    assert typed == str(report.candidate_circuit)  # the preset is core's screened circuit (may be empty)
    if not typed:
        at.text_input(key="heads_text").set_value("L1H0,L1H3").run()
        typed = "L1H0,L1H3"
    at.button(key="run_ablation").click().run()
    assert not at.exception, at.exception
    assert errors(at) == []
    assert "Verdict" in [s.value for s in at.subheader]
    result = at.session_state["ablation_history"][0]["result"]
    assert str(result.selection) == typed
    assert len(result.controls) == min(20, count_matched_sets(result.selection, report.shape[1]))
    assert result.upper_bound is not None
    shown = " ".join(b.value for b in [*at.success, *at.info, *at.warning])
    for name, verdict in result.verdicts.items():
        assert f": {verdict.label}**" in shown and verdict.rule in shown
    strip = chart(at, "ablation_strip")
    candidates = [t for t in strip["data"] if t["name"] == "candidate"]
    assert [c["y"][0] for c in candidates] == [result.stats[m]["candidate_delta"] for m in result.stats]
    # a second identical run comes from the cache and is listed in the history
    at.button(key="run_ablation").click().run()
    assert len(at.session_state["ablation_history"]) == 2
    assert at.session_state["ablation_history"][0]["result"] is result
    # the hand-off to the head inspector opens it on the ablated head, with this run's damage table
    first = head_name(result.selection.heads[0])
    assert at.selectbox(key="inspect_ablated").value == first
    at.button(key="open_inspector").click().run()
    assert not at.exception, at.exception
    assert [t.value for t in at.title] == ["Head inspector"]
    assert at.session_state["head"] == at.selectbox(key="_w_head").value == first
    assert any(f"Group ablation **{result.selection}**" in m.value for m in at.markdown)


def test_typo_in_typed_heads_shows_error_and_page_keeps_working(report):
    at = open_page(make_app(), "ablation")
    at.text_input(key="heads_text").set_value("L1H0, LxH2").run()
    assert any('cannot read head "LxH2"' in e for e in errors(at))
    assert at.button(key="run_ablation").disabled
    n_layers, n_heads = report.shape
    at.text_input(key="heads_text").set_value(f"L{n_layers}H0").run()  # a layer the model does not have
    assert any("outside this model" in e for e in errors(at))
    at.text_input(key="heads_text").set_value("L1H0, L1H1").run()
    assert errors(at) == [] and not at.exception
    assert not at.button(key="run_ablation").disabled


def test_the_lab_proposes_shorter_sequences_when_even_8_examples_miss_its_target(report, monkeypatch):
    # one example "timed" at 0.2 s per 64 tokens: 8 examples, their clean run and 22 conditions take about 20 s, and
    # one of PROBE_LENGTHS fits the 10 s target (propose_probe_size's unit test has the arithmetic)
    monkeypatch.setattr(pages._cache, "cached_forward_seconds", lambda *args: 0.2 * args[-1] / 64)  # args[-1]: seq_len
    at = open_page(make_app(n=8, seq_len=64), "ablation")
    label = next(e.proto.label for e in at.get("expander") if e.proto.label.startswith("Probe size"))
    found = re.search(r"about (\d+) s per study at N = 8 here; N = 8 of (\d+) tokens answers in about (\d+) s", label)
    assert found, label
    now, length, then = (int(g) for g in found.groups())
    assert now > STUDY_TARGET_SECONDS >= then and length in PROBE_LENGTHS
    at.button(key="use_proposed_n").click().run()
    spec = at.session_state[WORKSPACE].spec
    assert (spec.n_examples, spec.seq_len) == (8, length) and errors(at) == [] and not at.exception


def test_backend_choice_is_serial_unless_the_user_picks_ray(report):
    at = open_page(make_app(), "ablation")
    box = at.selectbox(key="_w_backend")
    assert box.value == "serial" and box.options == ["serial", "ray"]
    assert at.session_state[WORKSPACE].backend == "serial"
    assert "backend" not in at.query_params  # a shared link must not start Ray on its reader's server


def test_inspector_shows_the_chosen_head(report):
    at = open_page(make_app(head="L1H3"), "inspector")
    assert not at.exception and errors(at) == []
    assert any("L1H3" in m.value for m in at.markdown)
    scores = chart(at, "inspector_scores")["data"][0]
    index = len(report.checkpoints) - 1
    expected = report.selectivity_by_checkpoint[index][:, 1, 3]
    np.testing.assert_allclose(scores["y"], np.maximum(expected, 1e-3))
    # the full pattern is one run_with_cache on the chosen example; its query row is the probe's row
    batch = probe_spec("induction", N, T).build()
    model = load_model(ModelRef.parse(MODEL))
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.tokens[[0]], names_filter=lambda n: n == "blocks.1.attn.hook_pattern")
    full = cache["blocks.1.attn.hook_pattern"][0, 3].numpy()
    np.testing.assert_allclose(chart(at, "inspector_pattern_0")["data"][0]["z"], full, atol=1e-6)
    row = chart(at, "inspector_row_0")["data"][0]["y"]
    q = int(batch.query_pos[0])
    np.testing.assert_allclose(row, full[q, : q + 1], atol=1e-5)
    # ablating the head alone: core's single-head ablation, its mean damage and the examples it hurt most
    at.button(key="inspector_single").click().run()
    assert not at.exception and errors(at) == []
    clean, alone = ablate_alone(model, batch, (1, 3))
    assert any(f"mean Δ loss {float(alone.delta(clean, 'loss').mean()):+.4f}" in m.value for m in at.markdown)
    damage = example_damage(clean, alone, "loss")  # [example]
    np.testing.assert_allclose(at.dataframe[-1].value["Δ loss"], damage[worst_examples(damage, 8)])
    at.run()  # the next run shows the kept result, with no button to run it again
    assert not any(b.key == "inspector_single" for b in at.button)
    np.testing.assert_allclose(at.dataframe[-1].value["Δ loss"], damage[worst_examples(damage, 8)])


SIDEBAR_WIDGETS = ("selectbox", "select_slider", "radio", "number_input", "text_input")


def sidebar_widgets(at: AppTest) -> dict[str, str]:
    """Widget key -> element id of every widget in the sidebar (the id includes the script that drew it)."""
    return {w.key: w.proto.id for kind in SIDEBAR_WIDGETS for w in at.sidebar.get(kind)}


def test_sidebar_is_drawn_once_by_the_app(quick_zoo):
    """app.py draws the workspace sidebar once per run, before the page: every page shows the same widgets
    (same keys and same element ids, which a page drawing its own sidebar would not have), and a choice made
    on one page is still there on the next."""
    at = make_app(model="induction-neox", task="text")  # the dynamics page stops early on a text probe
    at.run()
    home = sidebar_widgets(at)
    assert {"_w_model", "_w_revision", "_w_task", "_w_n", "_w_seq_len", "_w_seed"} <= set(home)
    at.number_input(key="_w_seq_len").set_value(T + 8).run()
    for page in ("attribution", "dynamics"):
        at.switch_page(f"pages/{page}.py")
        at.run()
        assert not at.exception, at.exception
        assert [h.value for h in at.sidebar.header] == ["Workspace"]  # one sidebar, not one per page
        assert sidebar_widgets(at) == home, page
        assert at.number_input(key="_w_seq_len").value == T + 8
        assert at.session_state[WORKSPACE].spec.seq_len == T + 8


def test_a_deep_link_as_first_request_runs_through_app_py(quick_zoo, monkeypatch, navigation_runs_app_py):
    """The first request after a server starts, if it is a deep link, is served as a legacy pages/ app (the page
    file alone); the page then reruns through app.py, so it has the sidebar and a fresh workspace."""
    monkeypatch.setattr(PagesManager, "__init__", navigation_runs_app_py)  # Streamlit's own behaviour
    at = make_app(task="text")  # the dynamics page stops early on a text probe
    at.switch_page("pages/dynamics.py")  # before the first run: the page is found by its file name
    at.run()
    assert not at.exception, at.exception
    assert [t.value for t in at.title] == ["Training dynamics"]
    assert [h.value for h in at.sidebar.header] == ["Workspace"]
    assert at.session_state[WORKSPACE].task == "text"


def test_url_holds_the_view(report):
    at = open_page(make_app(), "screen")
    revision = report.checkpoints[1].revision
    at.select_slider(key="_w_revision").set_value(revision).run()
    params = {k: at.query_params[k] for k in ("model", "revision", "n", "seq_len", "task")}
    flat = {k: v[0] if isinstance(v, list) else v for k, v in params.items()}
    assert flat == {"model": MODEL, "revision": revision, "n": str(N), "seq_len": str(T), "task": "induction"}
    again = open_page(make_app(revision=revision), "screen")  # the link reopens the same view
    assert revision in chart(again, "screen_heatmap")["layout"]["title"]["text"]


def test_vanished_checkpoint_shows_error_on_every_page(quick_zoo):
    name = "vanished-neox"
    target = quick_zoo / name
    if not target.exists():
        shutil.copytree(quick_zoo / MODEL, target)
    try:
        revision = list_checkpoints(ModelRef.parse(name))[-1].revision
        shutil.rmtree(target / "checkpoints" / revision)
        at = make_app(model=name, revision=revision)
        for page in ANALYSIS_PAGES:
            open_page(at, page)
            assert not at.exception, at.exception
            assert any("missing" in e for e in errors(at)), (page, errors(at))
        # the page keeps working: pick a healthy model in the sidebar
        at.selectbox(key="_w_model").set_value(MODEL).run()
        assert not at.exception and errors(at) == []
    finally:
        shutil.rmtree(target, ignore_errors=True)  # later tests (and screenshots) see the plain zoo


def test_local_folder_that_is_not_a_model(quick_zoo, tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    at = make_app(model=str(tmp_path))
    for page in ANALYSIS_PAGES:
        open_page(at, page)
        assert not at.exception, at.exception
        assert any("config.json" in e for e in errors(at)), (page, errors(at))
    assert at.sidebar.header[0].value == "Workspace"  # the sidebar is still there


def test_probe_too_long_for_the_model(quick_zoo):
    at = make_app(seq_len=128)
    for page in ANALYSIS_PAGES:
        open_page(at, page)
        assert not at.exception, at.exception
        assert any("longer than the model's context" in e for e in errors(at)), (page, errors(at))
        assert not any("--seq-len" in e for e in errors(at))  # no command-line advice in the app


def test_first_launch_offers_to_train_the_zoo(tmp_path, monkeypatch):
    """With an empty zoo the first page offers training and reports its progress."""
    calls = []

    def fake_train_zoo(preset="quick", progress=True, only=None):
        calls.append(only)
        progress(5, 10, 1.25)  # the signature train_model calls a progress callable with
        return []

    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path))
    monkeypatch.setattr(core.zoo.presets, "train_zoo", fake_train_zoo)
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    assert not at.exception
    assert any("zoo is empty" in i.value for i in at.info)
    at.button[0].click().run()
    assert not at.exception, at.exception
    assert calls == [name for name, _, _ in core.zoo.presets.ZOO_PRESETS["quick"]]
